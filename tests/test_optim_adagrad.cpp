// Adagrad: the reference kernel on a hand-computed case and against float64
// formulas, the CPU kernel against the reference bitwise, and the functional
// API's checks.
#include <catch2/catch.hpp>
#include <cmath>
#include <vector>

#include "kernels/adagrad.hpp"
#include "optim_helpers.hpp"
#include "shardopt/optim.hpp"

using namespace shardopt;
using namespace shardopt::test;
using kernels::AdagradBuffers;
using kernels::AdagradScalars;

TEST_CASE("Adagrad reference kernel: steps computed by hand", "[optim][adagrad]") {
  // p = 1, g = 0.5, sum = 0, lr = 0.1, lr_decay 1, eps 0:
  // step 1: sum = 0.25, p = 1 - 0.1 * 0.5 / 0.5 = 0.9
  // step 2 (clr = 0.1 / 2): sum = 0.5, p = 0.9 - 0.05 * 0.5 / sqrt(0.5)
  float p = 1.0f, g = 0.5f, sum = 0.0f;
  auto b = one_element<AdagradBuffers>(p, g, {&sum});
  CHECK(kernels::reference::step<Adagrad>(
      b, kernels::make_adagrad_scalars(0.1, 1, 0, 0, false, 1, 1)));
  CHECK(sum == 0.25f);
  CHECK(p == Approx(0.9f).epsilon(1e-7));
  kernels::reference::step<Adagrad>(b, kernels::make_adagrad_scalars(0.1, 1, 0, 0, false, 2, 1));
  CHECK(sum == 0.5f);
  CHECK(p == Approx(0.9 - 0.05 * 0.5 / std::sqrt(0.5)).epsilon(1e-6));
}

TEST_CASE("Adagrad reference kernel follows the float64 formulas over 30 steps",
          "[optim][adagrad]") {
  const std::size_t n = 257;
  for (int mode = 0; mode < 8; ++mode) {
    const double lr = 0.01, lr_decay = (mode & 1) ? 0.05 : 0.0, wd = (mode & 2) ? 0.05 : 0.0;
    const double init = (mode & 4) ? 0.1 : 0.0, eps = 1e-10;
    const bool maximize = mode % 3 == 0;
    OneState st{uniform(n, 3, -1, 1), std::vector<float>(n, static_cast<float>(init)), {}};
    std::vector<double> p(st.p.begin(), st.p.end()), sum(n, static_cast<float>(init));
    for (int step = 1; step <= 30; ++step) {
      const Grads g(uniform(n, 100 + step, -1, 1));
      kernels::reference::step<Adagrad>(
          one_state_buffers<AdagradBuffers>(st, g, DType::f32, 0),
          kernels::make_adagrad_scalars(lr, lr_decay, wd, eps, maximize, step, 1.0));
      for (std::size_t i = 0; i < n; ++i) {
        double d = maximize ? -double(g.f32[i]) : double(g.f32[i]);
        d += wd * p[i];
        sum[i] += d * d;
        p[i] -= lr / (1 + (step - 1) * lr_decay) * d / (std::sqrt(sum[i]) + eps);
      }
    }
    const double worst = max_abs_diff(st.p, p);
    INFO("mode " << mode);
    CHECK(worst < 5e-6);
  }
}

TEST_CASE("Adagrad CPU kernel equals the reference bitwise, every type and mode",
          "[optim][adagrad]") {
  for (std::size_t n : awkward_sizes()) {
    const Grads g(uniform(n, n + 1, -1, 1));
    for (DType gt : {DType::f32, DType::bf16, DType::f16}) {
      for (int out = 0; out < 3; ++out) {
        for (int mode = 0; mode < 2; ++mode) {
          const AdagradScalars s = kernels::make_adagrad_scalars(
              0.01, 0.01, mode ? 0.1 : 0.0, 1e-10, (mode + out) % 2 == 1, 3, out == 2 ? 0.5 : 1.0);
          OneState a{uniform(n, 2 * n, -1, 1), uniform(n, 3 * n, 0, 0.1f),
                     std::vector<std::uint16_t>(n)};
          OneState c = a;
          const bool fa = kernels::reference::step<Adagrad>(
              one_state_buffers<AdagradBuffers>(a, g, gt, out), s);
          const bool fc =
              kernels::cpu::step<Adagrad>(one_state_buffers<AdagradBuffers>(c, g, gt, out), s);
          INFO("n " << n << " grad " << dtype_name(gt) << " out " << out << " mode " << mode);
          check_same_run(fa, fc, a, c, {&OneState::p, &OneState::state});
        }
      }
    }
  }
}

TEST_CASE("functional adagrad: bad hyper-parameters and buffers are clear errors",
          "[optim][adagrad]") {
  std::vector<float> p(8, 1.0f), g(8, 0.5f), sum(8);
  auto step = [&](Adagrad o, std::int64_t t = 1) { functional::adagrad(p, g, sum, t, o); };
  const auto bad = ErrorCode::invalid_argument;
  CHECK(rejects([&] { step(Adagrad{.lr = -0.1}); }, bad, "Adagrad: invalid learning rate (lr)"));
  CHECK(rejects([&] { step(Adagrad{.lr_decay = -1}); }, bad, "invalid lr_decay value: -1"));
  CHECK(rejects([&] { step(Adagrad{.weight_decay = -1}); }, bad, "invalid weight_decay value"));
  CHECK(rejects([&] { step(Adagrad{.initial_accumulator_value = -1}); }, bad,
                "invalid initial_accumulator_value value"));
  CHECK(rejects([&] { step(Adagrad{.eps = -1}); }, bad, "invalid epsilon value (eps)"));
  CHECK(rejects([&] { step(Adagrad{}, 0); }, bad, "step 0 is not a step count"));
  CHECK(rejects([&] { functional::adagrad(p, g, std::span<float>(sum).first(2), 1, {}); }, bad,
                "state_sum has 2 elements, params have 8"));
  CHECK(p == std::vector<float>(8, 1.0f));
  CHECK(Adagrad{}.lr == 1e-2);
  CHECK(Adagrad{}.eps == 1e-10);
}

TEST_CASE("functional adagrad: f16 gradients in, fp32 master and f16 copy out",
          "[optim][adagrad]") {
  const std::size_t n = 1001;
  std::vector<float> p(n), sum(n, 0.1f);
  std::vector<float16> g(n), out(n);
  for (std::size_t i = 0; i < n; ++i) {
    p[i] = std::sin(0.01f * i);
    g[i] = f16_from_float(std::cos(0.03f * i));
  }
  std::vector<float> p_ref = p, sum_ref = sum, gf(n);
  for (std::size_t i = 0; i < n; ++i) gf[i] = to_float(g[i]);
  functional::StepOptions extra;
  extra.param_out = out.data();
  extra.param_out_dtype = DType::f16;
  const Adagrad o{.lr = 0.05, .weight_decay = 0.1};
  CHECK(functional::adagrad(p, std::span<const float16>(g), sum, 2, o, extra).grads_finite);
  functional::adagrad(p_ref, gf, sum_ref, 2, o);
  CHECK(count_diff(p, p_ref) == 0);
  std::size_t wrong = 0;
  for (std::size_t i = 0; i < n; ++i) wrong += out[i].bits != f16_from_float(p[i]).bits;
  CHECK(wrong == 0);
}
