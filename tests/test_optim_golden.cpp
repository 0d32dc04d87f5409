// The functional optimizers against PyTorch: every golden trajectory of
// tests/data/golden (made by scripts/make_golden.py with torch 1.13's CPU
// optimizers) is replayed step by step and compared at every step.
#include <catch2/catch.hpp>
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
