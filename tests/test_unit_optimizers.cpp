// The optimizers' descriptors (shardopt/optimizers.hpp) against what is
// derived from them: OptimizerConfig's alternatives, and every field of each
// options struct. A descriptor that misses a member, or a list that
// disagrees with the variant, fails here.
#include <catch2/catch.hpp>
#include <cctype>
#include <cmath>
#include <set>
#include <span>
#include <string>
#include <variant>
#include <vector>

#include "shardopt/error.hpp"
#include "shardopt/optim.hpp"
#include "shardopt/zero.hpp"

using namespace shardopt;

namespace {

// Converts to anything: O{AnyField{}, ...} compiles with as many values as
// the aggregate O has members, and no more.
struct AnyField {
  template <class T>
  operator T() const;
};

template <class O, class... A>
constexpr std::size_t member_count() {
  if constexpr (requires { O{A{}..., AnyField{}}; })
    return member_count<O, A..., AnyField>();
  else
    return sizeof...(A);
}

template <std::size_t I = 0>
void check_alternatives(std::vector<std::string>& names) {
  if constexpr (I < std::variant_size_v<OptimizerConfig> - 1) {
    using O = std::variant_alternative_t<I, OptimizerConfig>;
    names.push_back(O::name);
    check_alternatives<I + 1>(names);
  }
}

}  // namespace

TEST_CASE("OptimizerConfig's alternatives are the optimizers' list, then CustomOptimizer",
          "[unit][optimizers]") {
  STATIC_REQUIRE(std::variant_size_v<OptimizerConfig> == Optimizers::size + 1);
  STATIC_REQUIRE(std::is_same_v<std::variant_alternative_t<Optimizers::size, OptimizerConfig>,
                                CustomOptimizer>);
  std::vector<std::string> listed, alternatives;
  Optimizers::each([&]<class O>() { listed.push_back(O::name); });
  check_alternatives(alternatives);
  CHECK(listed == alternatives);
  CHECK(listed.size() >= 7);
}

TEST_CASE("every descriptor names every member once, with a unique name and key",
          "[unit][optimizers]") {
  std::set<std::string> names, keys;
  Optimizers::each([&]<class O>() {
    INFO(O::name);
    CHECK(names.insert(O::name).second);
    CHECK(keys.insert(O::key).second);
    std::string lower = O::name;
    for (char& ch : lower) ch = static_cast<char>(std::tolower(static_cast<unsigned char>(ch)));
    CHECK(lower == O::key);
    std::set<std::string> fields;
    O::fields([&](const char* name, auto, const char* what, Check) {
      CHECK(fields.insert(name).second);
      CHECK(std::string(what).size() > 0);
    });
    CHECK(fields.size() == member_count<O>());
    CHECK(fields.count("lr") == 1);
    std::set<std::string> slots;
    int count = 0;
    O{}.slots([&](const Slot& s) {
      CHECK(slots.insert(s.name).second);
      ++count;
    });
    CHECK(count == slot_count<O>());
  });
}

TEST_CASE("each field's range check rejects a value outside it, naming the field",
          "[unit][optimizers]") {
  Optimizers::each([&]<class O>() {
    O::fields([&](const char* name, auto member, const char*, Check check) {
      if (check == Check::none) return;
      INFO(O::name << "." << name);
      O bad{};
      auto& v = bad.*member;
      if constexpr (requires { v.first; })
        v.second = 1.0;  // outside [0, 1)
      else
        v = check == Check::finite ? INFINITY : -1.0;
      bool rejected = false;
      try {
        functional::check_options(bad);
      } catch (const InvalidArgument& e) {
        rejected = std::string(e.what()).find(name) != std::string::npos;
        UNSCOPED_INFO(e.what());
      }
      CHECK(rejected);
      CHECK_NOTHROW(functional::check_options(O{}));
    });
  });
}

TEST_CASE("the generic step wants one state span per slot, and says which", "[unit][optimizers]") {
  std::vector<float> p(4, 0.5f), g(4, 0.25f), m(4), v(4);
  const std::span<float> one[] = {m};
  bool rejected = false;
  try {
    functional::step(functional::ParamView(p), functional::GradView(g), one, 1, Adam{});
  } catch (const InvalidArgument& e) {
    UNSCOPED_INFO(e.what());
    rejected = std::string(e.what()).find(
                   "got 1 state buffer(s); Adam has 3: exp_avg, exp_avg_sq, max_exp_avg_sq") !=
               std::string::npos;
  }
  CHECK(rejected);
  CHECK(p == std::vector<float>(4, 0.5f));  // nothing written
  const std::span<float> all[] = {m, v, {}};
  CHECK(
      functional::step(functional::ParamView(p), functional::GradView(g), all, 1, Adam{}).applied);
  CHECK(p[0] != 0.5f);
}
