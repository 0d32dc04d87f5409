// LAMB: the direction and apply kernels on a hand-computed case and against
// float64 formulas, the CPU kernels against the reference bitwise for any
// thread count (the norms included), and the functional API's checks.
#include <omp.h>

#include <catch2/catch.hpp>
#include <cmath>
#include <vector>

#include "kernels/lamb.hpp"
#include "optim_helpers.hpp"
#include "shardopt/optim.hpp"

using namespace shardopt;
using namespace shardopt::test;
using kernels::LambBuffers;
using kernels::LambNorms;

namespace {

struct LambState {
  std::vector<float> p, m, v, r;
};

LambBuffers lamb_buffers(LambState& st, const Grads& g, DType gt) {
  auto b = kernel_buffers<LambBuffers>(st.p, g, gt);
  b.exp_avg = st.m.data();
  b.exp_avg_sq = st.v.data();
  b.update = st.r.data();
  return b;
}

}  // namespace

TEST_CASE("LAMB: one step computed by hand", "[optim][lamb]") {
  // p = (3, 4), g = (0.5, 0.5), lr 0.1, betas (0.9, 0.999), eps 0, wd 0:
  // m_hat = 0.5, v_hat = 0.25, r = (1, 1); ||p|| = 5, ||r|| = sqrt(2);
  // p -= 0.1 * 5 / sqrt(2) * r.
  std::vector<float> p = {3, 4}, g = {0.5f, 0.5f}, m(2), v(2), r(2);
  const auto res = functional::lamb(p, g, m, v, r, 1, Lamb{.lr = 0.1, .eps = 0, .weight_decay = 0});
  CHECK(res.grads_finite);
  CHECK(r[0] == Approx(1.0f).epsilon(1e-6));
  CHECK(p[0] == Approx(3 - 0.5 / std::sqrt(2.0)).epsilon(1e-6));
  CHECK(p[1] == Approx(4 - 0.5 / std::sqrt(2.0)).epsilon(1e-6));
  // Zero parameters: trust 1.
  std::vector<float> z = {0, 0}, m2(2), v2(2), r2(2);
  functional::lamb(z, g, m2, v2, r2, 1, Lamb{.lr = 0.1, .eps = 0, .weight_decay = 0});
  CHECK(z[0] == Approx(-0.1f).epsilon(1e-6));
}

TEST_CASE("LAMB follows the float64 formulas over 30 steps", "[optim][lamb]") {
  const std::size_t n = 5000;  // three norm blocks
  for (int mode = 0; mode < 4; ++mode) {
    const double lr = 0.01, b1 = 0.9, b2 = 0.999, eps = 1e-6, wd = (mode & 1) ? 0.1 : 0.0;
    const bool maximize = mode & 2;
    LambState st{uniform(n, 3, -1, 1), std::vector<float>(n), std::vector<float>(n),
                 std::vector<float>(n)};
    std::vector<double> p(st.p.begin(), st.p.end()), m(n), v(n), r(n);
    for (int step = 1; step <= 30; ++step) {
      const std::vector<float> g = uniform(n, 100 + step, -1, 1);
      functional::lamb(
          st.p, g, st.m, st.v, st.r, step,
          Lamb{.lr = lr, .betas = {b1, b2}, .eps = eps, .weight_decay = wd, .maximize = maximize});
      double pn = 0, rn = 0;
      for (std::size_t i = 0; i < n; ++i) {
        const double d = maximize ? -double(g[i]) : double(g[i]);
        m[i] = b1 * m[i] + (1 - b1) * d;
        v[i] = b2 * v[i] + (1 - b2) * d * d;
        r[i] =
            m[i] / (1 - std::pow(b1, step)) / (std::sqrt(v[i] / (1 - std::pow(b2, step))) + eps) +
            wd * p[i];
        pn += p[i] * p[i];
        rn += r[i] * r[i];
      }
      const double trust = std::sqrt(pn) / std::sqrt(rn);
      for (std::size_t i = 0; i < n; ++i) p[i] -= lr * trust * r[i];
    }
    const double worst = max_abs_diff(st.p, p);
    INFO("mode " << mode);
    CHECK(worst < 5e-6);
  }
}

TEST_CASE("LAMB CPU kernels equal the reference bitwise, norms included, any thread count",
          "[optim][lamb]") {
  const int max_threads = omp_get_max_threads();
  for (std::size_t n : awkward_sizes()) {
    const Grads g(uniform(n, n + 1, -1, 1));
    for (DType gt : {DType::f32, DType::bf16, DType::f16}) {
      const auto s = kernels::make_lamb_scalars(0.9, 0.999, 1e-6, gt == DType::f16 ? 0.0 : 0.01,
                                                gt == DType::bf16, 3, 0.5);
      LambState a{uniform(n, 2 * n, -1, 1), uniform(n, 3 * n, -0.1f, 0.1f),
                  uniform(n, 4 * n, 0, 0.01f), std::vector<float>(n)};
      const LambNorms na = kernels::reference::lamb_direction(lamb_buffers(a, g, gt), s);
      // The norms against a plain double sum.
      double psq = 0, rsq = 0;
      for (std::size_t i = 0; i < n; ++i) {
        psq += double(a.p[i]) * a.p[i];
        rsq += double(a.r[i]) * a.r[i];
      }
      CHECK(na.param_sq == Approx(psq).epsilon(1e-12));
      CHECK(na.update_sq == Approx(rsq).epsilon(1e-12));
      for (int threads : {1, 2, 3, 7}) {
        if (n < 65537 && threads > 1) continue;  // one thread below the threading threshold
        omp_set_num_threads(threads);
        LambState c{uniform(n, 2 * n, -1, 1), uniform(n, 3 * n, -0.1f, 0.1f),
                    uniform(n, 4 * n, 0, 0.01f), std::vector<float>(n)};
        const LambNorms nc = kernels::cpu::lamb_direction(lamb_buffers(c, g, gt), s);
        INFO("n " << n << " grad " << dtype_name(gt) << " threads " << threads);
        CHECK(na.grads_finite == nc.grads_finite);
        CHECK(na.param_sq == nc.param_sq);
        CHECK(na.update_sq == nc.update_sq);
        CHECK(count_diff(a.m, c.m) == 0);
        CHECK(count_diff(a.v, c.v) == 0);
        CHECK(count_diff(a.r, c.r) == 0);
        for (int out = 0; out < 3; ++out) {
          std::vector<float> pa = a.p, pc = c.p;
          std::vector<std::uint16_t> oa(n), oc(n);
          kernels::LambApplyBuffers ba{pa.data(), a.r.data(), out ? oa.data() : nullptr,
                                       out == 2 ? DType::f16 : DType::bf16, n};
          kernels::LambApplyBuffers bc = ba;
          bc.param = pc.data();
          bc.update = c.r.data();
          bc.param_out = out ? oc.data() : nullptr;
          kernels::reference::lamb_apply(ba, -0.0123f);
          kernels::cpu::lamb_apply(bc, -0.0123f);
          CHECK(count_diff(pa, pc) == 0);
          CHECK(oa == oc);
        }
      }
      omp_set_num_threads(max_threads);
    }
  }
}

TEST_CASE("functional lamb: bad hyper-parameters and buffers are clear errors", "[optim][lamb]") {
  std::vector<float> p(8, 1.0f), g(8, 0.5f), m(8), v(8), r(8);
  auto step = [&](Lamb o, std::int64_t t = 1) { functional::lamb(p, g, m, v, r, t, o); };
  const auto bad = ErrorCode::invalid_argument;
  CHECK(rejects([&] { step(Lamb{.lr = -1}); }, bad, "Lamb: invalid learning rate (lr)"));
  CHECK(rejects([&] { step(Lamb{.betas = {0.9, 1.0}}); }, bad, "beta parameter at index 1"));
  CHECK(rejects([&] { step(Lamb{.eps = -1}); }, bad, "invalid epsilon value (eps)"));
  CHECK(rejects([&] { step(Lamb{.weight_decay = -1}); }, bad, "invalid weight_decay value"));
  CHECK(rejects([&] { step(Lamb{}, 0); }, bad, "step 0 is not a step count"));
  CHECK(rejects([&] { functional::lamb(p, g, m, v, {}, 1, {}); }, bad, "update has 0 elements"));
  CHECK(p == std::vector<float>(8, 1.0f));
  CHECK(Lamb{}.eps == 1e-6);
  CHECK(Lamb{}.weight_decay == 0.01);
}
