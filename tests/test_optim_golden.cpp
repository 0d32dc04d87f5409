// The functional optimizers against PyTorch: every golden trajectory of
// tests/data/golden (made by scripts/make_golden.py with torch 1.13's CPU
// optimizers) is replayed step by step and compared at every step.
#include <catch2/catch.hpp>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "golden.hpp"
#include "shardopt/optim.hpp"

using namespace shardopt;
namespace golden = shardopt::test::golden;

namespace {

// Replays an Adam or AdamW case; returns "" or the first mismatch. With
// rel_tol = abs_tol = 0 the parameters must equal torch's bitwise.
std::string replay_adam(const golden::Case& c, double rel_tol, double abs_tol) {
  const bool adamw = c.optimizer == "adamw";
  const std::size_t n = c.numel;
  std::vector<float> p = golden::initial_params(c);
  std::vector<float> m(n, 0.0f), v(n, 0.0f), vmax;
  const bool amsgrad = c.flag("amsgrad");
  if (amsgrad) vmax.assign(n, 0.0f);
  if (std::string bad = golden::compare(c, 0, p.data(), 0, 0); !bad.empty()) return bad;
  for (int step = 1; step <= c.steps; ++step) {
    const std::vector<float> g = golden::grads(c, step);  // as computed, before rounding
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
    const std::pair<double, double> betas{c.option("beta1"), c.option("beta2")};
    if (adamw) {
      functional::adamw(p, view, m, v, vmax, step,
                        AdamW{.lr = c.option("lr"),
                              .betas = betas,
                              .eps = c.option("eps"),
                              .weight_decay = c.option("weight_decay"),
                              .amsgrad = amsgrad,
                              .maximize = c.flag("maximize")});
    } else {
      functional::adam(p, view, m, v, vmax, step,
                       Adam{.lr = c.option("lr"),
                            .betas = betas,
                            .eps = c.option("eps"),
                            .weight_decay = c.option("weight_decay"),
                            .amsgrad = amsgrad,
                            .maximize = c.flag("maximize")});
    }
    if (std::string bad = golden::compare(c, step, p.data(), rel_tol, abs_tol); !bad.empty())
      return bad;
  }
  return {};
}

}  // namespace

TEST_CASE("Adam and AdamW reproduce PyTorch's trajectories bitwise, every case and step",
          "[optim][golden]") {
  for (const char* opt : {"adam", "adamw"}) {
    const auto cases = golden::load(golden::path(opt));
    REQUIRE(cases.size() > 100);
    std::size_t replayed = 0;
    for (const auto& c : cases) {
      INFO(c.name);
      CHECK(replay_adam(c, 0.0, 0.0) == "");
      ++replayed;
    }
    CHECK(replayed == cases.size());
  }
}

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

TEST_CASE("SGD reproduces PyTorch's trajectories bitwise, every case and step", "[optim][golden]") {
  replay_all(
      "sgd",
      [](const golden::Case& c) -> StepFn {
        const SGD o{.lr = c.option("lr"),
                    .momentum = c.option("momentum"),
                    .dampening = c.option("dampening"),
                    .weight_decay = c.option("weight_decay"),
                    .nesterov = c.flag("nesterov"),
                    .maximize = c.flag("maximize")};
        auto buf = std::make_shared<std::vector<float>>(o.momentum != 0 ? c.numel : 0);
        return [o, buf](std::vector<float>& p, functional::GradView g, int step) {
          functional::sgd(p, g, *buf, step, o);
        };
      },
      0.0, 0.0);
}

TEST_CASE("Adagrad reproduces PyTorch's trajectories bitwise, every case and step",
          "[optim][golden]") {
  replay_all(
      "adagrad",
      [](const golden::Case& c) -> StepFn {
        const Adagrad o{.lr = c.option("lr"),
                        .lr_decay = c.option("lr_decay"),
                        .weight_decay = c.option("weight_decay"),
                        .initial_accumulator_value = c.option("initial_accumulator_value"),
                        .eps = c.option("eps"),
                        .maximize = c.flag("maximize")};
        auto sum = std::make_shared<std::vector<float>>(
            c.numel, static_cast<float>(o.initial_accumulator_value));
        return [o, sum](std::vector<float>& p, functional::GradView g, int step) {
          functional::adagrad(p, g, *sum, step, o);
        };
      },
      0.0, 0.0);
}

TEST_CASE("RMSprop reproduces PyTorch's trajectories bitwise, every case and step",
          "[optim][golden]") {
  replay_all(
      "rmsprop",
      [](const golden::Case& c) -> StepFn {
        const RMSprop o{.lr = c.option("lr"),
                        .alpha = c.option("alpha"),
                        .eps = c.option("eps"),
                        .weight_decay = c.option("weight_decay"),
                        .momentum = c.option("momentum"),
                        .centered = c.flag("centered"),
                        .maximize = c.flag("maximize")};
        auto sq = std::make_shared<std::vector<float>>(c.numel, 0.0f);
        auto ga = std::make_shared<std::vector<float>>(o.centered ? c.numel : 0, 0.0f);
        auto buf = std::make_shared<std::vector<float>>(o.momentum != 0 ? c.numel : 0, 0.0f);
        return [o, sq, ga, buf](std::vector<float>& p, functional::GradView g, int) {
          functional::rmsprop(p, g, *sq, *ga, *buf, o);
        };
      },
      0.0, 0.0);
}

// Lion and LAMB are float64 trajectories (torch 1.13 has neither): a float32
// step stays within 1e-6 of them over 20 steps (tests/data/golden/README.md);
// the tolerance leaves a factor of two.
TEST_CASE("Lion stays within 2e-6 (abs) + 2e-6 (rel) of the float64 trajectories",
          "[optim][golden]") {
  replay_all(
      "lion",
      [](const golden::Case& c) -> StepFn {
        const Lion o{.lr = c.option("lr"),
                     .betas = {c.option("beta1"), c.option("beta2")},
                     .weight_decay = c.option("weight_decay")};
        auto m = std::make_shared<std::vector<float>>(c.numel, 0.0f);
        return [o, m](std::vector<float>& p, functional::GradView g, int) {
          functional::lion(p, g, *m, o);
        };
      },
      2e-6, 2e-6);
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
