// SGD: the reference kernel on hand-computed cases and against float64
// formulas, the CPU kernel against the reference bitwise, and the functional
// API's checks.
#include <catch2/catch.hpp>
#include <cmath>
#include <vector>

#include "kernels/sgd.hpp"
#include "optim_helpers.hpp"
#include "shardopt/optim.hpp"

using namespace shardopt;
using namespace shardopt::test;
using kernels::SgdBuffers;
using kernels::SgdScalars;

TEST_CASE("SGD reference kernel: steps computed by hand", "[optim][sgd]") {
  // p = 1, g = 0.5, lr = 0.1, momentum 0.5, dampening 0.5:
  // step 1: buf = g = 0.5 (no dampening), p = 1 - 0.1 * 0.5 = 0.95
  // step 2: buf = 0.5 * 0.5 + 0.5 * 0.5 = 0.5, p = 0.95 - 0.05 = 0.9
  float p = 1.0f, g = 0.5f, buf = 123.0f;  // buf's contents do not matter on step 1
  auto b = one_element<SgdBuffers>(p, g, {&buf});
  CHECK(kernels::reference::step<SGD>(
      b, kernels::make_sgd_scalars(0.1, 0.5, 0.5, 0, false, false, 1, 1)));
  CHECK(buf == 0.5f);
  CHECK(p == Approx(0.95f).epsilon(1e-7));
  kernels::reference::step<SGD>(b, kernels::make_sgd_scalars(0.1, 0.5, 0.5, 0, false, false, 2, 1));
  CHECK(buf == 0.5f);
  CHECK(p == Approx(0.9f).epsilon(1e-7));
  // Nesterov, weight decay 0.1, maximize: g' = -0.5 + 0.1 * 0.9 = -0.41;
  // buf = 0.5 * 0.5 + 1 * (-0.41) = -0.16; step with g' + 0.5 * buf = -0.49:
  // p = 0.9 + 0.1 * 0.49 = 0.949
  kernels::reference::step<SGD>(b, kernels::make_sgd_scalars(0.1, 0.5, 0.0, 0.1, true, true, 3, 1));
  CHECK(buf == Approx(-0.16f).epsilon(1e-6));
  CHECK(p == Approx(0.949f).epsilon(1e-6));
}

TEST_CASE("SGD reference kernel follows the float64 formulas over 30 steps", "[optim][sgd]") {
  const std::size_t n = 257;
  for (int mode = 0; mode < 16; ++mode) {
    const double momentum = (mode & 1) ? 0.9 : 0.0;
    const double dampening = (mode & 2) && !(mode & 8) ? 0.1 : 0.0;
    const double wd = (mode & 4) ? 0.05 : 0.0;
    const bool nesterov = (mode & 8) && momentum > 0;
    const bool maximize = mode % 3 == 0;
    const double lr = 0.01;
    OneState st{uniform(n, 3, -1, 1), std::vector<float>(n), {}};
    std::vector<double> p(st.p.begin(), st.p.end()), buf(n);
    for (int step = 1; step <= 30; ++step) {
      const Grads g(uniform(n, 100 + step, -1, 1));
      kernels::reference::step<SGD>(
          one_state_buffers<SgdBuffers>(st, g, DType::f32, 0, momentum != 0),
          kernels::make_sgd_scalars(lr, momentum, dampening, wd, nesterov, maximize, step, 1.0));
      for (std::size_t i = 0; i < n; ++i) {
        double d = maximize ? -double(g.f32[i]) : double(g.f32[i]);
        d += wd * p[i];
        if (momentum != 0) {
          buf[i] = step == 1 ? d : momentum * buf[i] + (1 - dampening) * d;
          d = nesterov ? d + momentum * buf[i] : buf[i];
        }
        p[i] -= lr * d;
      }
    }
    // Each step rounds p (half an ulp, <= 1.2e-7 for |p| < 2) and the update a
    // few times; momentum 0.9 keeps about ten steps of those roundings alive.
    const double worst = max_abs_diff(st.p, p);
    INFO("mode " << mode);
    CHECK(worst < 5e-6);
  }
}

TEST_CASE("SGD CPU kernel equals the reference bitwise, every type and mode", "[optim][sgd]") {
  for (std::size_t n : awkward_sizes()) {
    const Grads g(uniform(n, n + 1, -1, 1));
    for (DType gt : {DType::f32, DType::bf16, DType::f16}) {
      for (int out = 0; out < 3; ++out) {
        for (int mode = 0; mode < 8; ++mode) {
          if (n > 65537 && out != 0 && mode % 2 == 0) continue;  // keep the big size short
          const bool momentum = mode & 1, wd = mode & 2, nesterov = (mode & 4) && momentum;
          const double dampening = (mode & 4) && !momentum ? 0.1 : 0.0;
          for (std::int64_t step : {1, 2}) {
            const SgdScalars s = kernels::make_sgd_scalars(
                0.01, momentum ? 0.9 : 0.0, dampening, wd ? 0.1 : 0.0, nesterov,
                (mode + out) % 2 == 1, step, out == 2 ? 0.5 : 1.0);
            OneState a{uniform(n, 2 * n, -1, 1), uniform(n, 3 * n, -0.1f, 0.1f),
                       std::vector<std::uint16_t>(n)};
            OneState c = a;
            const bool fa = kernels::reference::step<SGD>(
                one_state_buffers<SgdBuffers>(a, g, gt, out, momentum), s);
            const bool fc =
                kernels::cpu::step<SGD>(one_state_buffers<SgdBuffers>(c, g, gt, out, momentum), s);
            INFO("n " << n << " grad " << dtype_name(gt) << " out " << out << " mode " << mode
                      << " step " << step);
            check_same_run(fa, fc, a, c, {&OneState::p, &OneState::state});
          }
        }
      }
    }
  }
}

TEST_CASE("SGD kernels flag non-finite gradients after grad_mul", "[optim][sgd]") {
  std::vector<float> gv = uniform(100, 5, -1, 1);
  gv[63] = NAN;
  const Grads g(gv);
  OneState st{uniform(100, 6, -1, 1), std::vector<float>(100), {}};
  OneState c = st;
  const SgdScalars s = kernels::make_sgd_scalars(0.01, 0.9, 0, 0, false, false, 1, 1.0);
  CHECK_FALSE(
      kernels::reference::step<SGD>(one_state_buffers<SgdBuffers>(st, g, DType::f32, 0, true), s));
  CHECK_FALSE(kernels::cpu::step<SGD>(one_state_buffers<SgdBuffers>(c, g, DType::f32, 0, true), s));
  std::vector<float> big = uniform(100, 7, -1, 1);
  big[10] = 3e38f;  // finite, but not after multiplying by 1e3
  const Grads gb(big);
  const SgdScalars s2 = kernels::make_sgd_scalars(0.01, 0, 0, 0, false, false, 1, 1e3);
  CHECK_FALSE(
      kernels::cpu::step<SGD>(one_state_buffers<SgdBuffers>(st, gb, DType::f32, 0, false), s2));
  const Grads fine(uniform(100, 8, -1, 1));
  CHECK(kernels::cpu::step<SGD>(one_state_buffers<SgdBuffers>(st, fine, DType::f32, 0, false), s2));
}

TEST_CASE("functional sgd: bad hyper-parameters and buffers are clear errors", "[optim][sgd]") {
  std::vector<float> p(8, 1.0f), g(8, 0.5f), buf(8);
  auto step = [&](SGD o, std::int64_t t = 1) {
    functional::sgd(p, g, o.momentum != 0 ? std::span<float>(buf) : std::span<float>(), t, o);
  };
  const auto bad = ErrorCode::invalid_argument;
  CHECK(rejects([&] { step(SGD{.lr = -0.1}); }, bad, "SGD: invalid learning rate (lr): -0.1"));
  CHECK(rejects([&] { step(SGD{.lr = NAN}); }, bad, "learning rate"));
  CHECK(rejects([&] { step(SGD{.momentum = -0.5}); }, bad, "invalid momentum value: -0.5"));
  CHECK(rejects([&] { step(SGD{.weight_decay = -1}); }, bad, "invalid weight_decay value"));
  CHECK(rejects([&] { step(SGD{.nesterov = true}); }, bad,
                "Nesterov momentum requires a momentum and zero dampening"));
  CHECK(rejects([&] { step(SGD{.momentum = 0.9, .dampening = 0.1, .nesterov = true}); }, bad,
                "Nesterov momentum requires a momentum and zero dampening"));
  CHECK(rejects([&] { step(SGD{}, 0); }, bad, "step 0 is not a step count"));
  CHECK(rejects([&] { functional::sgd(p, g, {}, 1, SGD{.momentum = 0.9}); }, bad,
                "momentum_buffer has 0 elements, params have 8"));
  CHECK(rejects([&] { functional::sgd(p, g, buf, 1, SGD{}); }, bad,
                "momentum_buffer was given but momentum is 0"));
  CHECK(rejects([&] { functional::sgd(p, std::span<const float>(g).first(7), {}, 1, {}); }, bad,
                "grads has 7 elements, params have 8"));
  CHECK(
      rejects([&] { functional::sgd(p, functional::GradView(g.data(), 8, DType::i32), {}, 1, {}); },
              ErrorCode::unsupported, "gradients of type i32"));
  CHECK(p == std::vector<float>(8, 1.0f));  // nothing changed by the rejected calls
  // torch's defaults, lr aside.
  CHECK(SGD{}.momentum == 0.0);
  CHECK(SGD{}.dampening == 0.0);
  CHECK_FALSE(SGD{}.nesterov);
}

TEST_CASE("functional sgd: bf16 gradients in, fp32 master and bf16 copy out", "[optim][sgd]") {
  const std::size_t n = 1001;
  std::vector<float> p(n), buf(n), p_ref;
  std::vector<bfloat16> g(n), out(n);
  for (std::size_t i = 0; i < n; ++i) {
    p[i] = std::sin(0.01f * i);
    g[i] = bf16_from_float(std::cos(0.03f * i));
  }
  p_ref = p;
  functional::StepOptions extra;
  extra.param_out = out.data();
  extra.grad_mul = 0.25;
  const SGD o{.lr = 0.01, .momentum = 0.9, .nesterov = true};
  const auto r = functional::sgd(p, std::span<const bfloat16>(g), buf, 1, o, extra);
  CHECK(r.grads_finite);
  std::size_t wrong = 0;
  for (std::size_t i = 0; i < n; ++i) wrong += out[i].bits != bf16_from_float(p[i]).bits;
  CHECK(wrong == 0);
  // The same step from fp32 gradients (bf16 values, pre-multiplied exactly by 1/4).
  std::vector<float> gf(n), buf2(n);
  for (std::size_t i = 0; i < n; ++i) gf[i] = to_float(g[i]) * 0.25f;
  functional::sgd(p_ref, gf, buf2, 1, o);
  CHECK(count_diff(p, p_ref) == 0);
}
