// The golden-trajectory files and their reader (tests/golden.hpp): every file
// loads, its cases are sane, the generator reproduces the inputs the script
// recorded (initial parameters and the step-1 gradients, bf16/fp16 rounding
// included), and a damaged file is a clear error.
#include <unistd.h>

#include <algorithm>
#include <catch2/catch.hpp>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <iterator>
#include <set>
#include <string>
#include <vector>

#include "golden.hpp"

namespace golden = shardopt::test::golden;
using Catch::Matchers::Contains;

namespace {

std::uint32_t bits(float f) {
  std::uint32_t u;
  std::memcpy(&u, &f, sizeof u);
  return u;
}

std::vector<char> read_bytes(const std::string& file) {
  std::ifstream in(file, std::ios::binary);
  return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
}

// A scratch file removed at the end of the test.
struct TempFile {
  std::string path;
  explicit TempFile(const std::string& tag)
      : path("/tmp/shardopt_golden_" + tag + "_" + std::to_string(::getpid()) + ".bin") {}
  ~TempFile() { std::remove(path.c_str()); }
  void write(const std::vector<char>& bytes) const {
    std::ofstream out(path, std::ios::binary | std::ios::trunc);
    out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
  }
};

// The option names of each optimizer, as make_golden.py writes them.
// Every field of the optimizer's descriptor, betas as beta1 and beta2, as
// make_golden.py records them; the float64 references (no maximize) record
// all but maximize.
std::set<std::string> expected_options(const std::string& optimizer) {
  std::set<std::string> keys;
  shardopt::Optimizers::each([&]<class O>() {
    if (optimizer != O::key) return;
    O::fields([&](const char* name, auto member, const char*, shardopt::Check) {
      if constexpr (requires(O o) { (o.*member).first; }) {
        keys.insert({"beta1", "beta2"});
      } else {
        keys.insert(name);
      }
    });
  });
  if (golden::float64_reference(optimizer)) keys.erase("maximize");
  return keys;
}

}  // namespace

TEST_CASE("golden: value() is the script's generator", "[golden]") {
  // splitmix64 of 0, the first output of the reference generator (Vigna).
  CHECK(golden::splitmix64(0) == 0xE220A8397B1DCDAFull);
  // Values are k / 2^23 for integer k in [-2^23, 2^23): exact floats in [-1, 1).
  for (std::uint64_t i = 0; i < 4096; ++i) {
    const float v = golden::value(12345, 3, i);
    REQUIRE(v >= -1.0f);
    REQUIRE(v < 1.0f);
    const float k = v * 8388608.0f;
    REQUIRE(k == std::floor(k));
  }
}

TEST_CASE("golden: bf16 and fp16 rounding", "[golden]") {
  CHECK(golden::round_bf16(1.0f) == 1.0f);
  CHECK(golden::round_bf16(1.0f + 0x1p-8f) == 1.0f);                // a tie: to even
  CHECK(golden::round_bf16(1.0f + 3 * 0x1p-8f) == 1.0f + 0x1p-6f);  // a tie: to even
  CHECK(golden::round_bf16(1.0f + 0x1p-8f + 0x1p-20f) == 1.0f + 0x1p-7f);
  CHECK(std::isinf(golden::round_bf16(3.4e38f)));
  CHECK(golden::round_f16(1.0f + 0x1p-11f) == 1.0f);
  CHECK(golden::round_f16(1.0f + 3 * 0x1p-11f) == 1.0f + 0x1p-9f);
  CHECK(golden::round_f16(65504.0f) == 65504.0f);
  CHECK(golden::round_f16(65519.0f) == 65504.0f);
  CHECK(std::isinf(golden::round_f16(65520.0f)));
  CHECK(golden::round_f16(0x1p-24f) == 0x1p-24f);  // the smallest subnormal
  CHECK(golden::round_f16(0x1p-25f) == 0.0f);      // a tie: to even (zero)
  CHECK(golden::round_f16(0x1.8p-25f) == 0x1p-24f);
  CHECK(golden::round_f16(-0x1.8p-24f) == -0x1p-23f);  // 1.5 quanta: a tie, to even
}

TEST_CASE("golden: every file loads and its cases are sane", "[golden]") {
  std::size_t total = 0;
  for (const std::string& optimizer : golden::optimizers()) {
    const std::string file = golden::path(optimizer);
    INFO(file);
    std::vector<golden::Case> cases;
    REQUIRE_NOTHROW(cases = golden::load(file));
    CHECK(cases.size() >= 4);
    total += cases.size();
    std::set<std::string> names;
    std::set<std::size_t> sizes;
    for (const golden::Case& c : cases) {
      INFO(c.name);
      CHECK(c.optimizer == optimizer);
      CHECK(names.insert(c.name).second);  // names are unique
      sizes.insert(c.numel);
      CHECK(c.steps >= 20);
      std::set<std::string> keys;
      for (const auto& [key, value] : c.options) {
        keys.insert(key);
        CHECK(std::isfinite(value));
      }
      CHECK(keys == expected_options(optimizer));
      CHECK(c.option("lr") > 0.0);
      int exponent = 0;
      CHECK(std::frexp(c.grad_scale, &exponent) == 0.5f);  // a power of two
      REQUIRE(c.values.size() == static_cast<std::size_t>(c.steps) + 1);
      REQUIRE(c.final_full.size() == c.numel);
      REQUIRE(c.grad1.size() == c.sample.size());
      if (c.sampled()) {
        CHECK(c.sample.size() == 1024);
        CHECK(c.sample.front() == 0);
        CHECK(c.sample.back() == c.numel - 1);
        // The final row of the sample agrees with the full final parameters.
        for (std::size_t k = 0; k < c.sample.size(); ++k)
          REQUIRE(bits(c.values.back()[k]) == bits(c.final_full[c.sample[k]]));
      }
      // Every value finite, and nearly every step moves the parameters well
      // past rounding (Lion's steps of +-lr may come back to where they were,
      // so this looks at each step, not at the distance travelled).
      std::size_t moved = 0;
      for (const auto& row : c.values)
        for (float v : row) REQUIRE(std::isfinite(v));
      for (std::size_t s = 1; s < c.values.size(); ++s) {
        for (std::size_t k = 0; k < c.sample.size(); ++k) {
          const float before = c.values[s - 1][k], after = c.values[s][k];
          if (std::fabs(after - before) > 1e-6f * (1.0f + std::fabs(before))) ++moved;
        }
      }
      CHECK(moved * 10 >= c.sample.size() * static_cast<std::size_t>(c.steps) * 9);
    }
    CHECK(sizes.count(1) == 1);
    CHECK(sizes.count(7) == 1);
    CHECK(sizes.count(1000) == 1);
    CHECK(sizes.count(65537) == 1);
  }
  CHECK(total > 100);
}

TEST_CASE("golden: the generator reproduces the recorded inputs", "[golden]") {
  for (const std::string& optimizer : golden::optimizers()) {
    for (const golden::Case& c : golden::load(golden::path(optimizer))) {
      INFO(c.name);
      const std::vector<float> p0 = golden::initial_params(c);
      const std::vector<float> g1 = golden::grads(c, 1);
      std::size_t wrong_p = 0, wrong_g = 0;
      for (std::size_t k = 0; k < c.sample.size(); ++k) {
        const std::uint32_t i = c.sample[k];
        if (bits(p0[i]) != bits(c.values[0][k])) ++wrong_p;
        if (bits(g1[i]) != bits(c.grad1[k])) ++wrong_g;
        if (bits(golden::grad(c, 1, i)) != bits(c.grad1[k])) ++wrong_g;
      }
      CHECK(wrong_p == 0);
      CHECK(wrong_g == 0);
      // The last step's gradient exists; one past it does not.
      CHECK(golden::grads(c, c.steps).size() == c.numel);
      CHECK_THROWS_AS(golden::grads(c, c.steps + 1), std::out_of_range);
    }
  }
}

TEST_CASE("golden: compare() reports the worst element", "[golden]") {
  const auto cases = golden::load(golden::path("adam"));
  const golden::Case* sampled = nullptr;
  for (const auto& c : cases)
    if (c.sampled()) sampled = &c;
  REQUIRE(sampled != nullptr);
  const golden::Case& c = *sampled;

  // Step 0 against the regenerated initial parameters: equal.
  std::vector<float> p = golden::initial_params(c);
  CHECK(golden::compare(c, 0, p.data(), 0.0, 0.0).empty());
  // The last step is compared over all elements, not just the sample.
  p = c.final_full;
  CHECK(golden::compare(c, c.steps, p.data(), 0.0, 0.0).empty());
  std::size_t unsampled = 1;
  while (
      std::binary_search(c.sample.begin(), c.sample.end(), static_cast<std::uint32_t>(unsampled)))
    ++unsampled;
  p[unsampled] += 0.5f;
  const std::string msg = golden::compare(c, c.steps, p.data(), 1e-6, 1e-7);
  CHECK_THAT(msg, Contains(c.name));
  CHECK_THAT(msg, Contains("1 of " + std::to_string(c.numel)));
  CHECK_THAT(msg, Contains("element " + std::to_string(unsampled)));
  p[unsampled] = std::nanf("");
  CHECK_FALSE(golden::compare(c, c.steps, p.data(), 1e-6, 1e-7).empty());
}

TEST_CASE("golden: a damaged or missing file is a clear error", "[golden]") {
  const std::string file = golden::path("sgd");
  const std::vector<char> good = read_bytes(file);
  REQUIRE(good.size() > 1000);

  SECTION("missing") {
    REQUIRE_THROWS_WITH(golden::load("/nonexistent/golden.bin"),
                        Contains("/nonexistent/golden.bin") && Contains("cannot open"));
  }
  SECTION("truncated in the middle of a case") {
    TempFile tmp("truncated");
    tmp.write(std::vector<char>(good.begin(), good.begin() + good.size() / 2));
    REQUIRE_THROWS_WITH(golden::load(tmp.path),
                        Contains(tmp.path) && Contains("truncated") && Contains("case "));
  }
  SECTION("truncated by one byte") {
    TempFile tmp("short");
    tmp.write(std::vector<char>(good.begin(), good.end() - 1));
    REQUIRE_THROWS_WITH(golden::load(tmp.path), Contains(tmp.path) && Contains("truncated"));
  }
  SECTION("truncated in the header") {
    TempFile tmp("header");
    tmp.write(std::vector<char>(good.begin(), good.begin() + 10));
    REQUIRE_THROWS_WITH(golden::load(tmp.path), Contains("truncated") && Contains("header"));
  }
  SECTION("bad magic") {
    TempFile tmp("magic");
    std::vector<char> bad = good;
    bad[0] = 'X';
    tmp.write(bad);
    REQUIRE_THROWS_WITH(golden::load(tmp.path), Contains(tmp.path) && Contains("bad magic"));
  }
  SECTION("another format version") {
    TempFile tmp("version");
    std::vector<char> bad = good;
    bad[8] = 99;  // the version follows the 8-byte magic
    tmp.write(bad);
    REQUIRE_THROWS_WITH(golden::load(tmp.path),
                        Contains(tmp.path) && Contains("format version 99"));
  }
  SECTION("bytes after the last case") {
    TempFile tmp("trailing");
    std::vector<char> bad = good;
    bad.push_back('\0');
    tmp.write(bad);
    REQUIRE_THROWS_WITH(golden::load(tmp.path), Contains("1 unexpected bytes"));
  }
}
