// Adam and AdamW: the reference kernel on a hand-computed case and against a
// float64 implementation, the CPU kernel against the reference bitwise, and
// the functional API's checks.
#include <catch2/catch.hpp>
#include <cmath>
#include <cstdint>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "kernels/adam.hpp"
#include "optim_helpers.hpp"
#include "shardopt/error.hpp"
#include "shardopt/optim.hpp"

using namespace shardopt;
using kernels::AdamBuffers;
using kernels::AdamScalars;
using test::max_abs_diff;
using test::rejects;

namespace {

struct State {
  std::vector<float> p, m, v, vmax;
  test::Grads g{std::vector<float>{}};
  std::vector<std::uint16_t> out;
};

State make_state(std::size_t n, std::uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::uniform_real_distribution<float> u(-1.0f, 1.0f);
  State s;
  s.p.resize(n);
  s.m.resize(n);
  s.v.resize(n);
  s.vmax.resize(n);
  std::vector<float> g(n);
  s.out.assign(n, 0);
  for (std::size_t i = 0; i < n; ++i) {
    s.p[i] = u(rng);
    s.m[i] = 0.1f * u(rng);
    s.v[i] = 0.01f * std::fabs(u(rng));
    s.vmax[i] = s.v[i] * 1.5f;
    g[i] = u(rng);
  }
  s.g = test::Grads(std::move(g));
  return s;
}

// Adam's buffers over s: the gradient in grad_type, the parameter copy of
// `out` (kernel_buffers).
AdamBuffers buffers(State& s, DType grad_type, bool amsgrad, int out = 0) {
  auto b = test::kernel_buffers<AdamBuffers>(s.p, s.g, grad_type, out, &s.out);
  b.exp_avg = s.m.data();
  b.exp_avg_sq = s.v.data();
  b.max_exp_avg_sq = amsgrad ? s.vmax.data() : nullptr;
  return b;
}

}  // namespace

TEST_CASE("Adam reference kernel: one step computed by hand", "[optim][adam]") {
  // p = 1, g = 0.5, m = v = 0, lr = 0.1, betas (0.9, 0.999), eps 1e-8:
  // m = 0.05, v = 0.00025, m_hat = 0.5, v_hat = 0.25, p = 1 - 0.1 * 0.5 / (0.5 + 1e-8) = 0.9
  float p = 1.0f, g = 0.5f, m = 0.0f, v = 0.0f;
  auto b = test::one_element<AdamBuffers>(p, g, {&m, &v});
  const AdamScalars s =
      kernels::make_adam_scalars(0.1, 0.9, 0.999, 1e-8, 0.0, false, false, false, 1, 1.0);
  CHECK(kernels::reference::step<Adam>(b, s));
  CHECK(m == Approx(0.05f).epsilon(1e-6));
  CHECK(v == Approx(0.00025f).epsilon(1e-6));
  CHECK(p == Approx(0.9f).epsilon(1e-6));
}

TEST_CASE("Adam and AdamW reference kernels follow the float64 formulas over 30 steps",
          "[optim][adam]") {
  for (const bool decoupled : {false, true}) {
    for (const bool amsgrad : {false, true}) {
      for (const bool maximize : {false, true}) {
        const std::size_t n = 257;
        State st = make_state(n, 99);
        std::fill(st.m.begin(), st.m.end(), 0.0f);
        std::fill(st.v.begin(), st.v.end(), 0.0f);
        std::fill(st.vmax.begin(), st.vmax.end(), 0.0f);
        std::vector<double> p(st.p.begin(), st.p.end()), m(n, 0.0), v(n, 0.0), vmax(n, 0.0);
        const double lr = 0.01, b1 = 0.9, b2 = 0.99, eps = 1e-6, wd = 0.05;
        std::mt19937_64 rng(7);
        std::uniform_real_distribution<float> u(-1.0f, 1.0f);
        for (int step = 1; step <= 30; ++step) {
          for (auto& g : st.g.f32) g = u(rng);
          const AdamScalars s = kernels::make_adam_scalars(lr, b1, b2, eps, wd, decoupled, amsgrad,
                                                           maximize, step, 1.0);
          kernels::reference::step<Adam>(buffers(st, DType::f32, amsgrad), s);
          for (std::size_t i = 0; i < n; ++i) {
            double g = maximize ? -double(st.g.f32[i]) : double(st.g.f32[i]);
            if (decoupled)
              p[i] *= 1 - lr * wd;
            else
              g += wd * p[i];
            m[i] = b1 * m[i] + (1 - b1) * g;
            v[i] = b2 * v[i] + (1 - b2) * g * g;
            vmax[i] = std::max(vmax[i], v[i]);
            const double second = amsgrad ? vmax[i] : v[i];
            const double denom = std::sqrt(second) / std::sqrt(1 - std::pow(b2, step)) + eps;
            p[i] -= lr / (1 - std::pow(b1, step)) * m[i] / denom;
          }
        }
        // |p| <= ~1.3 and each of the 30 steps rounds a few float operations:
        // each step adds about one rounding of p (half an ulp, 1.2e-7 for |p| < 2) and
        // one of the update: 30 steps stay well inside 5e-6 of the float64 result.
        const double worst = max_abs_diff(st.p, p);
        INFO("decoupled " << decoupled << " amsgrad " << amsgrad << " maximize " << maximize);
        CHECK(worst < 5e-6);
      }
    }
  }
}

TEST_CASE("Adam CPU kernel equals the reference bitwise, every type and mode", "[optim][adam]") {
  for (std::size_t n : test::awkward_sizes()) {
    for (DType gt : {DType::f32, DType::bf16, DType::f16}) {
      for (int out = 0; out < 3; ++out) {  // none, bf16, f16
        for (int mode = 0; mode < 3; ++mode) {
          for (bool amsgrad : {false, true}) {
            if (n > 65537 && (out != 0 || amsgrad)) continue;  // keep the big size short
            const bool maximize = (mode + out) % 2 == 1;
            const AdamScalars s =
                kernels::make_adam_scalars(0.01, 0.9, 0.999, 1e-8, mode == 0 ? 0.0 : 0.1, mode == 2,
                                           amsgrad, maximize, 3, out == 2 ? 0.5 : 1.0);
            State a = make_state(n, n * 31 + static_cast<std::size_t>(gt));
            State c = a;
            const bool fa = kernels::reference::step<Adam>(buffers(a, gt, amsgrad, out), s);
            const bool fc = kernels::cpu::step<Adam>(buffers(c, gt, amsgrad, out), s);
            INFO("n " << n << " grad " << dtype_name(gt) << " out " << out << " mode " << mode
                      << " amsgrad " << amsgrad);
            test::check_same_run(fa, fc, a, c, {&State::p, &State::m, &State::v, &State::vmax});
          }
        }
      }
    }
  }
}

TEST_CASE("Adam kernels flag non-finite gradients after grad_mul", "[optim][adam]") {
  State st = make_state(100, 5);
  st.g.f32[63] = INFINITY;
  const AdamScalars s =
      kernels::make_adam_scalars(0.01, 0.9, 0.999, 1e-8, 0, false, false, false, 1, 1.0);
  State c = st;
  CHECK_FALSE(kernels::reference::step<Adam>(buffers(st, DType::f32, false), s));
  CHECK_FALSE(kernels::cpu::step<Adam>(buffers(c, DType::f32, false), s));
  State big = make_state(100, 6);
  big.g.f32[10] = 3e38f;  // finite, but not after multiplying by 1e3
  const AdamScalars s2 =
      kernels::make_adam_scalars(0.01, 0.9, 0.999, 1e-8, 0, false, false, false, 1, 1e3);
  CHECK_FALSE(kernels::cpu::step<Adam>(buffers(big, DType::f32, false), s2));
  State fine = make_state(100, 7);
  CHECK(kernels::cpu::step<Adam>(buffers(fine, DType::f32, false), s2));
}

TEST_CASE("functional adam/adamw: bad hyper-parameters and buffers are clear errors",
          "[optim][adam]") {
  std::vector<float> p(8, 1.0f), g(8, 0.5f), m(8), v(8), vmax(8);
  auto step = [&](Adam o, std::int64_t t = 1) { functional::adam(p, g, m, v, {}, t, o); };
  const auto bad = ErrorCode::invalid_argument;
  CHECK(rejects([&] { step(Adam{.lr = -0.1}); }, bad, "invalid learning rate (lr): -0.1"));
  CHECK(rejects([&] { step(Adam{.eps = -1e-8}); }, bad, "invalid epsilon value (eps)"));
  CHECK(rejects([&] { step(Adam{.betas = {1.0, 0.999}}); }, bad, "beta parameter at index 0"));
  CHECK(rejects([&] { step(Adam{.betas = {0.9, -0.1}}); }, bad, "beta parameter at index 1"));
  CHECK(rejects([&] { step(Adam{.weight_decay = -1}); }, bad, "invalid weight_decay value"));
  CHECK(rejects([&] { step(Adam{}, 0); }, bad, "step 0 is not a step count"));
  CHECK(rejects([&] { step(Adam{.lr = NAN}); }, bad, "learning rate"));
  CHECK(rejects([&] { functional::adam(p, std::span<const float>(g).first(7), m, v, {}, 1, {}); },
                bad, "grads has 7 elements, params have 8"));
  CHECK(rejects([&] { functional::adam(p, g, m, v, {}, 1, Adam{.amsgrad = true}); }, bad,
                "max_exp_avg_sq (amsgrad) has 0 elements"));
  CHECK(rejects([&] { functional::adam(p, g, m, v, vmax, 1, Adam{}); }, bad,
                "max_exp_avg_sq (amsgrad) was given but amsgrad is off"));
  CHECK(rejects([&] { functional::adamw(p, g, m, std::span<float>(v).first(3), {}, 1, {}); }, bad,
                "exp_avg_sq has 3 elements"));
  CHECK(rejects(
      [&] { functional::adam(p, functional::GradView(g.data(), 8, DType::i32), m, v, {}, 1, {}); },
      ErrorCode::unsupported, "gradients of type i32"));
  // Nothing changed by the rejected calls.
  CHECK(p == std::vector<float>(8, 1.0f));
  CHECK(m == std::vector<float>(8, 0.0f));
}

TEST_CASE("functional adamw writes the low-precision copy in the same pass", "[optim][adam]") {
  std::vector<float> p(1001), m(1001), v(1001);
  std::vector<bfloat16> g(1001), out(1001);
  for (std::size_t i = 0; i < p.size(); ++i) {
    p[i] = std::sin(0.01f * i);
    g[i] = bf16_from_float(std::cos(0.03f * i));
  }
  functional::StepOptions extra;
  extra.param_out = out.data();
  extra.param_out_dtype = DType::bf16;
  const auto r =
      functional::adamw(p, std::span<const bfloat16>(g), m, v, {}, 1, AdamW{.lr = 0.01}, extra);
  CHECK(r.grads_finite);
  std::size_t wrong = 0;
  for (std::size_t i = 0; i < p.size(); ++i) wrong += out[i].bits != bf16_from_float(p[i]).bits;
  CHECK(wrong == 0);
}
