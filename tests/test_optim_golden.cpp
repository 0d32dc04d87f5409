// The functional optimizers against their golden trajectories
// (tests/data/golden, made by scripts/make_golden.py): every case of every
// optimizer is replayed step by step and compared at every step, bitwise
// where the file is torch's float32 trajectory, within a tolerance where it
// is a float64 one (golden::float64_reference).
#include <catch2/catch.hpp>
#include <functional>
#include <memory>
#include <string>
#include <type_traits>
#include <vector>

#include "golden.hpp"
#include "shardopt/optim.hpp"

using namespace shardopt;
namespace golden = shardopt::test::golden;

namespace {

// One step of a case on p with the gradient view of step `step`.
using StepFn = std::function<void(std::vector<float>& p, functional::GradView g, int step)>;

// Replays a case through `step_fn`, the gradients in the case's precision;
// returns "" or the first mismatch (rel_tol = abs_tol = 0: bitwise).
std::string replay(const golden::Case& c, const StepFn& step_fn, double rel_tol, double abs_tol) {
  std::vector<float> p = golden::initial_params(c);
  if (std::string bad = golden::compare(c, 0, p.data(), 0, 0); !bad.empty()) return bad;
  for (int step = 1; step <= c.steps; ++step) {
    const std::vector<float> g = golden::grads(c, step);
    std::vector<bfloat16> gb;
    std::vector<float16> gh;
    functional::GradView view(g);
    if (c.precision == "bf16grad") {
      for (float x : g) gb.push_back(bf16_from_float(x));
      view = functional::GradView(gb);
    } else if (c.precision == "f16grad") {
      for (float x : g) gh.push_back(f16_from_float(x));
      view = functional::GradView(gh);
    }
    step_fn(p, view, step);
    if (std::string bad = golden::compare(c, step, p.data(), rel_tol, abs_tol); !bad.empty())
      return bad;
  }
  return {};
}

// Replays every case of an optimizer's file; make(c) gives the case's step.
void replay_all(const char* opt, const std::function<StepFn(const golden::Case&)>& make,
                double rel_tol, double abs_tol) {
  const auto cases = golden::load(golden::path(opt));
  REQUIRE(cases.size() > 20);
  for (const auto& c : cases) {
    INFO(c.name);
    CHECK(replay(c, make(c), rel_tol, abs_tol) == "");
  }
}

}  // namespace

namespace {

// O's options in a golden case: each field by name (betas from beta1 and
// beta2, flags from 0 or 1); a field the case does not list keeps its default.
template <class O>
O options_of(const golden::Case& c) {
  O o{};
  O::fields([&](const char* name, auto member, const char*, Check) {
    auto& v = o.*member;
    using T = std::remove_cvref_t<decltype(v)>;
    if constexpr (std::is_same_v<T, std::pair<double, double>>) {
      v = {c.option("beta1"), c.option("beta2")};
    } else if (c.options.count(name) != 0) {
      if constexpr (std::is_same_v<T, bool>)
        v = c.flag(name);
      else
        v = c.option(name);
    }
  });
  return o;
}

// The functional step of O on a case, its states as torch starts them.
template <class O>
StepFn step_of(const golden::Case& c) {
  const O o = options_of<O>(c);
  auto states = std::make_shared<std::vector<std::vector<float>>>();
  o.slots([&](const Slot& s) {
    states->emplace_back(s.used ? c.numel : 0, static_cast<float>(s.initial));
  });
  return [o, states](std::vector<float>& p, functional::GradView g, int step) {
    std::vector<std::span<float>> spans(states->begin(), states->end());
    functional::step(p, g, spans, step, o);
  };
}

}  // namespace

// torch's trajectories (SGD, Adam, AdamW, Adagrad, RMSprop: torch.optim 1.13;
// NAdam, RAdam: torch's steps in torch's float32 operations) are matched
// bitwise. Lion's is float64 (torch has none): a float32 step stays within
// 1e-6 of it over 20 steps (tests/data/golden/README.md); the tolerance
// leaves a factor of two.
TEST_CASE("every element-wise optimizer reproduces its golden trajectories, every case and step",
          "[optim][golden]") {
  int optimizers = 0;
  Optimizers::each([&]<class O>() {
    if constexpr (is_elementwise<O>) {
      INFO(O::name);
      const double tol = golden::float64_reference(O::key) ? 2e-6 : 0.0;
      replay_all(
          O::key, [](const golden::Case& c) { return step_of<O>(c); }, tol, tol);
      ++optimizers;
    }
  });
  CHECK(optimizers >= 6);
}

TEST_CASE("LAMB stays within 2e-6 (abs) + 2e-6 (rel) of the float64 trajectories",
          "[optim][golden]") {
  replay_all(
      "lamb",
      [](const golden::Case& c) -> StepFn {
        const Lamb o{.lr = c.option("lr"),
                     .betas = {c.option("beta1"), c.option("beta2")},
                     .eps = c.option("eps"),
                     .weight_decay = c.option("weight_decay")};
        auto m = std::make_shared<std::vector<float>>(c.numel, 0.0f);
        auto v = std::make_shared<std::vector<float>>(c.numel, 0.0f);
        auto r = std::make_shared<std::vector<float>>(c.numel, 0.0f);
        return [o, m, v, r](std::vector<float>& p, functional::GradView g, int step) {
          functional::lamb(p, g, *m, *v, *r, step, o);
        };
      },
      2e-6, 2e-6);
}
