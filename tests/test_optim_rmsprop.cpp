// RMSprop: the reference kernel on a hand-computed case and against float64
// formulas, the CPU kernel against the reference bitwise, and the functional
// API's checks.
#include <catch2/catch.hpp>
#include <cmath>
#include <vector>

#include "kernels/rmsprop.hpp"
#include "optim_helpers.hpp"
#include "shardopt/optim.hpp"

using namespace shardopt;
using namespace shardopt::test;
using kernels::RmspropBuffers;
using kernels::RmspropScalars;

namespace {

struct RmspropState {
  std::vector<float> p, sq, ga, buf;
  std::vector<std::uint16_t> out;
};

RmspropState make_state(std::size_t n, std::uint64_t seed) {
  return {uniform(n, seed, -1, 1), uniform(n, seed + 1, 0.5f, 1), uniform(n, seed + 2, -0.1f, 0.1f),
          uniform(n, seed + 3, -0.1f, 0.1f), std::vector<std::uint16_t>(n)};
}

RmspropBuffers rmsprop_buffers(RmspropState& st, const Grads& g, DType gt, const RmspropScalars& s,
                               int out) {
  auto b = kernel_buffers<RmspropBuffers>(st.p, g, gt, out, &st.out);
  b.square_avg = st.sq.data();
  b.grad_avg = s.centered ? st.ga.data() : nullptr;
  b.momentum_buffer = s.momentum != 0 ? st.buf.data() : nullptr;
  return b;
}

}  // namespace

TEST_CASE("RMSprop reference kernel: one step computed by hand", "[optim][rmsprop]") {
  // p = 1, g = 0.5, alpha 0.75, eps 0, lr 0.1, states 0:
  // sq = 0.25 * 0.25 = 0.0625, avg = 0.25, p = 1 - 0.1 * 0.5 / 0.25 = 0.8.
  // Centered: grad_avg = 0.125, avg = sqrt(0.0625 - 0.015625) = sqrt(0.046875).
  // Momentum 0.5 (buf 0): buf = 0.5 / avg, p = 1 - 0.1 * buf.
  for (int mode = 0; mode < 4; ++mode) {
    const bool centered = mode & 1, momentum = mode & 2;
    float p = 1.0f, g = 0.5f, sq = 0.0f, ga = 0.0f, buf = 0.0f;
    auto b = one_element<RmspropBuffers>(
        p, g, {&sq, centered ? &ga : nullptr, momentum ? &buf : nullptr});
    CHECK(kernels::reference::step<RMSprop>(
        b, kernels::make_rmsprop_scalars(0.1, 0.75, 0, 0, momentum ? 0.5 : 0, centered, false, 1)));
    const double avg = centered ? std::sqrt(0.046875) : 0.25;
    INFO("mode " << mode);
    CHECK(sq == 0.0625f);
    if (centered) CHECK(ga == 0.125f);
    if (momentum) CHECK(buf == Approx(0.5 / avg).epsilon(1e-6));
    CHECK(p == Approx(1 - 0.1 * 0.5 / avg).epsilon(1e-6));
  }
}

TEST_CASE("RMSprop reference kernel follows the float64 formulas over 30 steps",
          "[optim][rmsprop]") {
  const std::size_t n = 257;
  for (int mode = 0; mode < 8; ++mode) {
    const bool centered = mode & 1;
    const double lr = 0.003, alpha = 0.9, eps = 1e-3, momentum = (mode & 2) ? 0.9 : 0.0;
    const double wd = (mode & 4) ? 0.05 : 0.0;
    const bool maximize = mode % 3 == 0;
    RmspropState st = make_state(n, 3);
    std::fill(st.sq.begin(), st.sq.end(), 0.0f);
    std::fill(st.ga.begin(), st.ga.end(), 0.0f);
    std::fill(st.buf.begin(), st.buf.end(), 0.0f);
    std::vector<double> p(st.p.begin(), st.p.end()), sq(n), ga(n), buf(n);
    const RmspropScalars s =
        kernels::make_rmsprop_scalars(lr, alpha, eps, wd, momentum, centered, maximize, 1.0);
    for (int step = 1; step <= 30; ++step) {
      const Grads g(uniform(n, 100 + step, -1, 1));
      kernels::reference::step<RMSprop>(rmsprop_buffers(st, g, DType::f32, s, 0), s);
      for (std::size_t i = 0; i < n; ++i) {
        double d = maximize ? -double(g.f32[i]) : double(g.f32[i]);
        d += wd * p[i];
        sq[i] = alpha * sq[i] + (1 - alpha) * d * d;
        ga[i] = alpha * ga[i] + (1 - alpha) * d;
        const double avg = std::sqrt(centered ? sq[i] - ga[i] * ga[i] : sq[i]) + eps;
        if (momentum != 0) {
          buf[i] = momentum * buf[i] + d / avg;
          p[i] -= lr * buf[i];
        } else {
          p[i] -= lr * d / avg;
        }
      }
    }
    const double worst = max_abs_diff(st.p, p);
    INFO("mode " << mode);
    CHECK(worst < 5e-6);
  }
}

TEST_CASE("RMSprop CPU kernel equals the reference bitwise, every type and mode",
          "[optim][rmsprop]") {
  for (std::size_t n : awkward_sizes()) {
    const Grads g(uniform(n, n + 1, -1, 1));
    for (DType gt : {DType::f32, DType::bf16, DType::f16}) {
      for (int out = 0; out < 3; ++out) {
        for (int mode = 0; mode < 8; ++mode) {
          if (n > 65537 && out != 0 && mode % 3 != 0) continue;  // keep the big size short
          const RmspropScalars s = kernels::make_rmsprop_scalars(
              0.01, 0.99, 1e-8, (mode & 4) ? 0.1 : 0.0, (mode & 2) ? 0.9 : 0.0, mode & 1,
              (mode + out) % 2 == 1, out == 2 ? 0.5 : 1.0);
          RmspropState a = make_state(n, 2 * n);
          RmspropState c = a;
          const bool fa = kernels::reference::step<RMSprop>(rmsprop_buffers(a, g, gt, s, out), s);
          const bool fc = kernels::cpu::step<RMSprop>(rmsprop_buffers(c, g, gt, s, out), s);
          INFO("n " << n << " grad " << dtype_name(gt) << " out " << out << " mode " << mode);
          check_same_run(
              fa, fc, a, c,
              {&RmspropState::p, &RmspropState::sq, &RmspropState::ga, &RmspropState::buf});
        }
      }
    }
  }
}

TEST_CASE("functional rmsprop: bad hyper-parameters and buffers are clear errors",
          "[optim][rmsprop]") {
  std::vector<float> p(8, 1.0f), g(8, 0.5f), sq(8), ga(8), buf(8);
  auto step = [&](RMSprop o) { functional::rmsprop(p, g, sq, {}, {}, o); };
  const auto bad = ErrorCode::invalid_argument;
  CHECK(rejects([&] { step(RMSprop{.lr = -0.1}); }, bad, "RMSprop: invalid learning rate (lr)"));
  CHECK(rejects([&] { step(RMSprop{.eps = -1}); }, bad, "invalid epsilon value (eps)"));
  CHECK(rejects([&] { step(RMSprop{.momentum = -1}); }, bad, "invalid momentum value"));
  CHECK(rejects([&] { step(RMSprop{.weight_decay = -1}); }, bad, "invalid weight_decay value"));
  CHECK(rejects([&] { step(RMSprop{.alpha = -0.5}); }, bad, "invalid alpha value: -0.5"));
  CHECK(rejects([&] { functional::rmsprop(p, g, sq, {}, {}, RMSprop{.centered = true}); }, bad,
                "grad_avg (centered) has 0 elements"));
  CHECK(rejects([&] { functional::rmsprop(p, g, sq, ga, {}, RMSprop{}); }, bad,
                "grad_avg (centered) was given but centered is off"));
  CHECK(rejects([&] { functional::rmsprop(p, g, sq, {}, {}, RMSprop{.momentum = 0.9}); }, bad,
                "momentum_buffer has 0 elements"));
  CHECK(rejects([&] { functional::rmsprop(p, g, {}, {}, {}, RMSprop{}); }, bad,
                "square_avg has 0 elements"));
  CHECK(p == std::vector<float>(8, 1.0f));
  CHECK(RMSprop{}.alpha == 0.99);
  CHECK(RMSprop{}.eps == 1e-8);
}
