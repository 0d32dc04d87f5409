// Lion: the reference kernel on a hand-computed case and against float64
// formulas, the CPU kernel against the reference bitwise, and the functional
// API's checks.
#include <catch2/catch.hpp>
#include <cmath>
#include <vector>

#include "kernels/lion.hpp"
#include "optim_helpers.hpp"
#include "shardopt/optim.hpp"

using namespace shardopt;
using namespace shardopt::test;
using kernels::LionBuffers;
using kernels::LionScalars;

TEST_CASE("Lion reference kernel: one step computed by hand", "[optim][lion]") {
  // p = (1, 1, 1), g = (0.5, -0.5, 0), m = (0, 0, 0.1), lr 0.1, wd 0.5, betas (0.9, 0.99):
  // p *= 0.95; c = (0.05, -0.05, 0.09): p = (0.85, 1.05, 0.85);
  // m = (0.005, -0.005, 0.099).
  OneState st{{1, 1, 1}, {0, 0, 0.1f}, {}};
  const Grads g({0.5f, -0.5f, 0.0f});
  CHECK(kernels::reference::step<Lion>(one_state_buffers<LionBuffers>(st, g, DType::f32, 0),
                                       kernels::make_lion_scalars(0.1, 0.9, 0.99, 0.5, false, 1)));
  CHECK(st.p[0] == Approx(0.85f).epsilon(1e-6));
  CHECK(st.p[1] == Approx(1.05f).epsilon(1e-6));
  CHECK(st.p[2] == Approx(0.85f).epsilon(1e-6));
  CHECK(st.state[0] == Approx(0.005f).epsilon(1e-5));
  CHECK(st.state[1] == Approx(-0.005f).epsilon(1e-5));
  CHECK(st.state[2] == Approx(0.099f).epsilon(1e-6));
  // A zero interpolation leaves p to the decay alone.
  OneState z{{2}, {0}, {}};
  kernels::reference::step<Lion>(one_state_buffers<LionBuffers>(z, Grads({0.0f}), DType::f32, 0),
                                 kernels::make_lion_scalars(0.1, 0.9, 0.99, 0.5, false, 1));
  CHECK(z.p[0] == 1.9f);
}

TEST_CASE("Lion reference kernel follows the float64 formulas over 30 steps", "[optim][lion]") {
  const std::size_t n = 257;
  for (int mode = 0; mode < 4; ++mode) {
    const double lr = 0.01, b1 = 0.9, b2 = 0.99, wd = (mode & 1) ? 0.1 : 0.0;
    const bool maximize = mode & 2;
    OneState st{uniform(n, 3, -1, 1), std::vector<float>(n), {}};
    std::vector<double> p(st.p.begin(), st.p.end()), m(n);
    for (int step = 1; step <= 30; ++step) {
      const Grads g(uniform(n, 100 + step, -1, 1));
      kernels::reference::step<Lion>(one_state_buffers<LionBuffers>(st, g, DType::f32, 0),
                                     kernels::make_lion_scalars(lr, b1, b2, wd, maximize, 1.0));
      for (std::size_t i = 0; i < n; ++i) {
        const double d = maximize ? -double(g.f32[i]) : double(g.f32[i]);
        const double c = b1 * m[i] + (1 - b1) * d;
        p[i] = p[i] * (1 - lr * wd) - lr * (c > 0 ? 1 : c < 0 ? -1 : 0);
        m[i] = b2 * m[i] + (1 - b2) * d;
      }
    }
    const double worst = max_abs_diff(st.p, p);
    INFO("mode " << mode);
    CHECK(worst < 5e-6);
  }
}

TEST_CASE("Lion CPU kernel equals the reference bitwise, every type", "[optim][lion]") {
  for (std::size_t n : awkward_sizes()) {
    const Grads g(uniform(n, n + 1, -1, 1));
    for (DType gt : {DType::f32, DType::bf16, DType::f16}) {
      for (int out = 0; out < 3; ++out) {
        const LionScalars s =
            kernels::make_lion_scalars(1e-3, 0.9, 0.99, out == 1 ? 0.0 : 0.1, out == 2, 0.5);
        OneState a{uniform(n, 2 * n, -1, 1), uniform(n, 3 * n, -0.1f, 0.1f),
                   std::vector<std::uint16_t>(n)};
        OneState c = a;
        const bool fa =
            kernels::reference::step<Lion>(one_state_buffers<LionBuffers>(a, g, gt, out), s);
        const bool fc = kernels::cpu::step<Lion>(one_state_buffers<LionBuffers>(c, g, gt, out), s);
        INFO("n " << n << " grad " << dtype_name(gt) << " out " << out);
        check_same_run(fa, fc, a, c, {&OneState::p, &OneState::state});
      }
    }
  }
}

TEST_CASE("functional lion: bad hyper-parameters and buffers are clear errors", "[optim][lion]") {
  std::vector<float> p(8, 1.0f), g(8, 0.5f), m(8);
  auto step = [&](Lion o) { functional::lion(p, g, m, o); };
  const auto bad = ErrorCode::invalid_argument;
  CHECK(rejects([&] { step(Lion{.lr = -1}); }, bad, "Lion: invalid learning rate (lr)"));
  CHECK(rejects([&] { step(Lion{.betas = {1.0, 0.99}}); }, bad, "beta parameter at index 0"));
  CHECK(rejects([&] { step(Lion{.betas = {0.9, -1}}); }, bad, "beta parameter at index 1"));
  CHECK(rejects([&] { step(Lion{.weight_decay = -1}); }, bad, "invalid weight_decay value"));
  CHECK(rejects([&] { functional::lion(p, g, {}, Lion{}); }, bad, "exp_avg has 0 elements"));
  CHECK(p == std::vector<float>(8, 1.0f));
  CHECK(Lion{}.lr == 1e-4);
  CHECK(Lion{}.betas.second == 0.99);
}
