// Golden optimizer trajectories recorded from PyTorch, for checking shardopt's
// optimizers step by step (header-only; the tests only).
//
// tests/data/golden/<optimizer>.bin holds, for every case (an optimizer, its
// options, a gradient precision and a size), the parameters after each step,
// made by scripts/make_golden.py; the format is in tests/data/golden/README.md.
// The inputs are not stored: initial_params() and grads() regenerate them,
// bit for bit, from the case's seed. A test runs shardopt's optimizer on them
// and compares its parameters after step s with values[s]:
//
//   for (const auto& c : golden::load(golden::path("adam"))) {
//     std::vector<float> p = golden::initial_params(c);
//     for (int s = 1; s <= c.steps; ++s) {
//       const std::vector<float> g = golden::grads(c, s);
//       ... one optimizer step on p with g, the options c.options ...
//       const std::string bad = golden::compare(c, s, p.data(), 1e-6, 1e-7);
//       INFO(c.name);
//       REQUIRE(bad.empty());
//     }
//   }
//
// The files are found through SHARDOPT_SOURCE_DIR, the repository root, which
// tests/meson.build passes to the compiler.
#pragma once

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <iterator>
#include <limits>
#include <map>
#include <sstream>
#include <stdexcept>
#include <string>
#include <vector>

#ifndef SHARDOPT_SOURCE_DIR
#error "tests/golden.hpp needs -DSHARDOPT_SOURCE_DIR=\"<repository root>\""
#endif

#include "shardopt/optimizers.hpp"

namespace shardopt::test::golden {

// The first 8 bytes of every golden file, and the layout version it follows.
inline constexpr char kMagic[8] = {'S', 'H', 'O', 'P', 'T', 'G', 'L', 'D'};
inline constexpr std::uint32_t kVersion = 1;

// Every optimizer has a golden file, named by its key.
inline const std::vector<std::string>& optimizers() {
  static const std::vector<std::string> names = [] {
    std::vector<std::string> v;
    Optimizers::each([&]<class O>() { v.push_back(O::key); });
    return v;
  }();
  return names;
}

// Whether an optimizer's file holds float64 trajectories rounded to float32
// (the optimizers torch lacks a reference for: Lion and LAMB) rather than
// torch's own float32 ones, matched bitwise.
inline bool float64_reference(const std::string& key) { return key == "lion" || key == "lamb"; }

// One recorded trajectory.
struct Case {
  std::string optimizer;  // "sgd", "adam", "adamw", "adagrad", "rmsprop", "lion", "lamb"
  std::string name;       // for messages, e.g. "adam lr=0.01 amsgrad=1 n=1000"
  // "f32": the optimizer received g_s. "bf16grad" / "f16grad": it received
  // g_s rounded to bfloat16 / float16 (to nearest, ties to even) and back to
  // float, and updated float32 master parameters; values are the masters.
  std::string precision;
  // Every option of the optimizer, defaults included, as passed to torch:
  // booleans are 0 or 1, torch's betas are beta1 and beta2.
  std::map<std::string, double> options;
  std::uint64_t seed = 0;
  float grad_scale = 1.0f;  // a power of two
  std::size_t numel = 0;
  int steps = 0;
  // The recorded element indices, increasing: all of them (0..numel-1) for
  // the small cases, a fixed sample (block edges, ends, a spread) otherwise.
  std::vector<std::uint32_t> sample;
  // values[s][k]: the parameter sample[k] after step s; values[0] holds the
  // initial parameters (steps + 1 rows of sample.size() values).
  std::vector<std::vector<float>> values;
  // The gradient of step 1 at the sample, as the optimizer received it.
  std::vector<float> grad1;
  // All numel parameters after the last step (for every case: where the file
  // stores only the sample, it also stores these).
  std::vector<float> final_full;

  bool sampled() const { return sample.size() < numel; }

  // The option `key`; throws std::out_of_range naming the case if absent.
  double option(const std::string& key) const {
    const auto it = options.find(key);
    if (it == options.end())
      throw std::out_of_range("golden case \"" + name + "\" has no option \"" + key + "\"");
    return it->second;
  }
  bool flag(const std::string& key) const { return option(key) != 0.0; }
};

// ------------------------------------------------------------------- inputs

inline constexpr std::uint64_t kGoldenGamma = 0x9E3779B97F4A7C15ull;

// splitmix64 (Steele, Lea, Flood 2014), all arithmetic mod 2^64.
constexpr std::uint64_t splitmix64(std::uint64_t x) {
  x += kGoldenGamma;
  std::uint64_t z = x;
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

namespace detail {
constexpr std::uint64_t stream_key(std::uint64_t seed, std::uint64_t stream) {
  return splitmix64(seed + stream * kGoldenGamma);
}
// 24 random bits as (k - 2^23) / 2^23: exact in float, in [-1, 1).
constexpr float unit_value(std::uint64_t key, std::uint64_t i) {
  const std::uint64_t u = splitmix64(key + i);
  return static_cast<float>(static_cast<double>(u >> 40) * 0x1p-23 - 1.0);
}
}  // namespace detail

// Element i of stream `stream` of seed `seed`, the generator of the script:
// stream 0 gives the initial parameters, stream s the gradient of step s
// (before grad_scale).
constexpr float value(std::uint64_t seed, std::uint64_t stream, std::uint64_t i) {
  return detail::unit_value(detail::stream_key(seed, stream), i);
}

namespace detail {
// x rounded to the nearest value with `digits` significant bits, normal
// exponents down to min_exp (subnormals below), ties to even; past
// max_finite it is inf. Worked out in double, independently of the library's
// bit-level conversions.
inline float round_to(float x, int digits, int min_exp, double max_finite) {
  if (!std::isfinite(x) || x == 0.0f) return x;
  int e = 0;
  std::frexp(x, &e);  // |x| in [2^(e-1), 2^e)
  const int quantum = std::max(e - 1, min_exp) - (digits - 1);
  const double y = std::ldexp(std::nearbyint(std::ldexp(static_cast<double>(x), -quantum)),
                              quantum);  // nearbyint: ties to even
  if (std::fabs(y) > max_finite) return std::copysign(std::numeric_limits<float>::infinity(), x);
  return static_cast<float>(y);
}
}  // namespace detail

// x rounded to bfloat16 and back to float (to nearest, ties to even, as
// torch's .to(torch.bfloat16)). Needs the default rounding mode.
inline float round_bf16(float x) { return detail::round_to(x, 8, -126, 0x1.FEp127); }

// x rounded to float16 and back to float (subnormals below 2^-14).
inline float round_f16(float x) { return detail::round_to(x, 11, -14, 65504.0); }

// Element i of the gradient of step `step` (1..c.steps) as the optimizer
// received it: value(seed, step, i) * grad_scale, rounded through the
// case's gradient precision.
inline float grad(const Case& c, int step, std::size_t i) {
  const float g = value(c.seed, static_cast<std::uint64_t>(step), i) * c.grad_scale;
  if (c.precision == "bf16grad") return round_bf16(g);
  if (c.precision == "f16grad") return round_f16(g);
  return g;
}

// The initial parameters of a case (numel values).
inline std::vector<float> initial_params(const Case& c) {
  const std::uint64_t key = detail::stream_key(c.seed, 0);
  std::vector<float> p(c.numel);
  for (std::size_t i = 0; i < c.numel; ++i) p[i] = detail::unit_value(key, i);
  return p;
}

// The gradient of step `step` (1..c.steps), numel values, as grad() gives them.
inline std::vector<float> grads(const Case& c, int step) {
  if (step < 1 || step > c.steps)
    throw std::out_of_range("golden case \"" + c.name + "\": step " + std::to_string(step) +
                            " is not in 1.." + std::to_string(c.steps));
  const std::uint64_t key = detail::stream_key(c.seed, static_cast<std::uint64_t>(step));
  std::vector<float> g(c.numel);
  for (std::size_t i = 0; i < c.numel; ++i) g[i] = detail::unit_value(key, i) * c.grad_scale;
  if (c.precision == "bf16grad") {
    for (float& x : g) x = round_bf16(x);
  } else if (c.precision == "f16grad") {
    for (float& x : g) x = round_f16(x);
  }
  return g;
}

// ------------------------------------------------------------------ loading

// The golden file of an optimizer ("adam" -> <source>/tests/data/golden/adam.bin).
inline std::string path(const std::string& optimizer) {
  return std::string(SHARDOPT_SOURCE_DIR) + "/tests/data/golden/" + optimizer + ".bin";
}

namespace detail {

// Little-endian reads from the file's bytes; every read is bounds-checked so
// that a short file is an error naming what was being read.
class Reader {
 public:
  Reader(std::string file, std::vector<unsigned char> bytes)
      : file_(std::move(file)), bytes_(std::move(bytes)) {}

  [[noreturn]] void fail(const std::string& what) const {
    throw std::runtime_error("golden file " + file_ + ": " + what +
                             " (remake it with: /usr/bin/python3 scripts/make_golden.py)");
  }

  // Where we are, for messages: "case 3 (adam ...)".
  void set_context(std::string context) { context_ = std::move(context); }

  void need(std::size_t n, const char* what) const {
    if (n > bytes_.size() - pos_) {
      std::ostringstream msg;
      msg << "truncated: " << context_ << (context_.empty() ? "" : ": ") << what << " needs " << n
          << " bytes at offset " << pos_ << ", but the file has " << bytes_.size() << " bytes";
      fail(msg.str());
    }
  }
  // An unsigned little-endian integer of U's size.
  template <class U>
  U little_endian(const char* what) {
    need(sizeof(U), what);
    U v = 0;
    for (std::size_t b = sizeof(U); b-- > 0;) v = (v << 8) | bytes_[pos_ + b];
    pos_ += sizeof(U);
    return v;
  }
  std::uint32_t u32(const char* what) { return little_endian<std::uint32_t>(what); }
  std::uint64_t u64(const char* what) { return little_endian<std::uint64_t>(what); }
  float f32(const char* what) {
    const std::uint32_t u = u32(what);
    float f;
    std::memcpy(&f, &u, sizeof f);
    return f;
  }
  double f64(const char* what) {
    const std::uint64_t u = u64(what);
    double d;
    std::memcpy(&d, &u, sizeof d);
    return d;
  }
  std::string str(const char* what) {
    const std::uint32_t n = u32(what);
    if (n > 4096) fail(context_ + ": " + what + " has an implausible length " + std::to_string(n));
    need(n, what);
    std::string s(reinterpret_cast<const char*>(bytes_.data() + pos_), n);
    pos_ += n;
    return s;
  }
  // count float32 values (count already checked against the file's size).
  void floats(float* out, std::size_t count, const char* what) {
    need(count * 4, what);
    for (std::size_t k = 0; k < count; ++k) out[k] = f32(what);
  }
  void bytes(char* out, std::size_t n, const char* what) {
    need(n, what);
    std::memcpy(out, bytes_.data() + pos_, n);
    pos_ += n;
  }
  std::size_t left() const { return bytes_.size() - pos_; }
  const std::string& context() const { return context_; }

 private:
  std::string file_;
  std::vector<unsigned char> bytes_;
  std::size_t pos_ = 0;
  std::string context_;
};

inline Case read_case(Reader& r) {
  Case c;
  c.optimizer = r.str("the optimizer name");
  c.name = r.str("the case name");
  r.set_context(r.context() + " (" + c.name + ")");
  c.precision = r.str("the precision tag");
  if (c.precision != "f32" && c.precision != "bf16grad" && c.precision != "f16grad")
    r.fail(r.context() + ": unknown precision \"" + c.precision + "\"");
  const std::uint32_t n_options = r.u32("the option count");
  if (n_options > 64)
    r.fail(r.context() + ": implausible option count " + std::to_string(n_options));
  for (std::uint32_t k = 0; k < n_options; ++k) {
    std::string key = r.str("an option name");
    c.options[key] = r.f64("an option value");
  }
  c.seed = r.u64("the seed");
  c.grad_scale = r.f32("grad_scale");
  const std::uint64_t numel = r.u64("numel");
  const std::uint32_t steps = r.u32("the step count");
  const std::uint32_t n_sample = r.u32("the sample count");
  if (numel == 0 || numel > 0xFFFFFFFFull) r.fail(r.context() + ": numel " + std::to_string(numel));
  if (steps == 0 || steps > 100000) r.fail(r.context() + ": step count " + std::to_string(steps));
  if (n_sample == 0 || n_sample > numel)
    r.fail(r.context() + ": sample count " + std::to_string(n_sample) + " for numel " +
           std::to_string(numel));
  c.numel = static_cast<std::size_t>(numel);
  c.steps = static_cast<int>(steps);

  // Check the whole block's size before allocating anything.
  const std::size_t ns = n_sample;
  r.need(ns * 4 + (std::size_t{steps} + 1) * ns * 4 + ns * 4, "the sample and values");
  c.sample.resize(ns);
  for (std::size_t k = 0; k < ns; ++k) {
    c.sample[k] = r.u32("a sample index");
    if (c.sample[k] >= numel || (k > 0 && c.sample[k] <= c.sample[k - 1]))
      r.fail(r.context() + ": sample index " + std::to_string(c.sample[k]) + " at position " +
             std::to_string(k) + " is out of range or out of order");
  }
  c.values.assign(std::size_t{steps} + 1, std::vector<float>(ns));
  for (auto& row : c.values) r.floats(row.data(), ns, "the recorded values");
  c.grad1.resize(ns);
  r.floats(c.grad1.data(), ns, "the step-1 gradient");

  const std::uint64_t n_full = r.u64("the final-parameter count");
  if (n_full != (c.sampled() ? numel : 0))
    r.fail(r.context() + ": " + std::to_string(n_full) + " final parameters, expected " +
           std::to_string(c.sampled() ? numel : 0));
  if (c.sampled()) {
    c.final_full.resize(c.numel);
    r.floats(c.final_full.data(), c.numel, "the final parameters");
  } else {
    c.final_full = c.values.back();
  }
  return c;
}

}  // namespace detail

// Reads every case of a golden file. Throws std::runtime_error naming the
// file and the problem if it cannot be read, is not a golden file, has
// another format version, is truncated or has bytes after its last case.
inline std::vector<Case> load(const std::string& file) {
  std::ifstream in(file, std::ios::binary);
  if (!in) {
    throw std::runtime_error("golden file " + file + ": cannot open it (" + std::strerror(errno) +
                             "); the files are made by scripts/make_golden.py");
  }
  std::vector<unsigned char> bytes((std::istreambuf_iterator<char>(in)),
                                   std::istreambuf_iterator<char>());
  if (in.bad()) throw std::runtime_error("golden file " + file + ": read error");
  detail::Reader r(file, std::move(bytes));

  char magic[sizeof kMagic];
  r.set_context("the header");
  r.bytes(magic, sizeof magic, "the magic string");
  if (std::memcmp(magic, kMagic, sizeof kMagic) != 0)
    r.fail("bad magic: not a shardopt golden file (expected \"SHOPTGLD\")");
  const std::uint32_t version = r.u32("the format version");
  if (version != kVersion)
    r.fail("format version " + std::to_string(version) + ", but this reader knows version " +
           std::to_string(kVersion) + " (tests/golden.hpp)");
  const std::uint32_t n_cases = r.u32("the case count");

  std::vector<Case> cases;
  cases.reserve(std::min<std::uint32_t>(n_cases, 4096));
  for (std::uint32_t k = 0; k < n_cases; ++k) {
    r.set_context("case " + std::to_string(k) + " of " + std::to_string(n_cases));
    cases.push_back(detail::read_case(r));
  }
  if (r.left() != 0)
    r.fail(std::to_string(r.left()) + " unexpected bytes after the last of " +
           std::to_string(n_cases) + " cases");
  return cases;
}

// Compares parameters after step `step` (0..c.steps) with the recording:
// params holds all numel values; the recorded elements (the sample; all of
// them after the last step) must satisfy |got - want| <= abs_tol + rel_tol *
// |want|. Returns "" if they do, else a message naming the case, the step,
// the number of elements out of tolerance and the worst of them.
inline std::string compare(const Case& c, int step, const float* params, double rel_tol,
                           double abs_tol) {
  if (step < 0 || step > c.steps)
    throw std::out_of_range("golden case \"" + c.name + "\": step " + std::to_string(step) +
                            " is not in 0.." + std::to_string(c.steps));
  std::size_t bad = 0, worst_i = 0, checked = 0;
  double worst_excess = -1.0, worst_want = 0.0, worst_got = 0.0;
  const auto check = [&](std::size_t i, float want) {
    ++checked;
    const double got = params[i];
    const double err = std::fabs(got - static_cast<double>(want));
    const double tol = abs_tol + rel_tol * std::fabs(static_cast<double>(want));
    if (err <= tol) return;  // a NaN falls through: it is never within tolerance
    ++bad;
    const double excess = std::isnan(err) ? std::numeric_limits<double>::infinity() : err / tol;
    if (excess > worst_excess) {
      worst_excess = excess;
      worst_i = i;
      worst_want = want;
      worst_got = got;
    }
  };
  if (step == c.steps && c.sampled()) {
    for (std::size_t i = 0; i < c.numel; ++i) check(i, c.final_full[i]);
  } else {
    const auto& row = c.values[static_cast<std::size_t>(step)];
    for (std::size_t k = 0; k < c.sample.size(); ++k) check(c.sample[k], row[k]);
  }
  if (bad == 0) return {};
  char worst[160];
  std::snprintf(worst, sizeof worst, "worst at element %zu: got %.9g, torch %.9g (diff %.3g)",
                worst_i, worst_got, worst_want, std::fabs(worst_got - worst_want));
  return c.name + ", step " + std::to_string(step) + ": " + std::to_string(bad) + " of " +
         std::to_string(checked) + " recorded elements out of tolerance; " + worst;
}

}  // namespace shardopt::test::golden
