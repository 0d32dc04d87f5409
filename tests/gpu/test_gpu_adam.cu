// gpu suite: the CUDA Adam kernel equals the reference kernel bitwise, for
// every gradient type, output copy, weight-decay mode and amsgrad, with the
// buffers aligned (the vector path), all one element in (the vector path
// from element 3) and the gradients alone one element in (the scalar path),
// and through the functional API on device buffers. Skips (exit 77) without
// a device.
#include <cuda_runtime.h>

#include <cmath>
#include <cstdio>
#include <random>
#include <string>
#include <vector>

#include "gpu_test.hpp"
#include "kernels/adam.hpp"
#include "shardopt/shardopt.hpp"

using namespace shardopt;
using gpu_test::check;
using gpu_test::Mirror;

int main() {
  if (gpu_test::no_device()) return gpu_test::kSkip;
  std::mt19937 rng(11);
  std::uniform_real_distribution<float> u(-1.0f, 1.0f);
  for (std::size_t n : {std::size_t{1}, std::size_t{7}, std::size_t{1000}, std::size_t{65537},
                        (std::size_t{1} << 22) + 5}) {
    std::vector<float> p(n), m(n), v(n), vmax(n), g(n);
    for (std::size_t i = 0; i < n; ++i) {
      p[i] = u(rng);
      m[i] = 0.1f * u(rng);
      v[i] = 0.01f * std::fabs(u(rng));
      vmax[i] = 1.5f * v[i];
      g[i] = u(rng);
    }
    for (DType gt : {DType::f32, DType::bf16, DType::f16}) {
      const std::vector<std::uint16_t> g16 = gpu_test::to_16(g, gt);
      const void* host_grad = gt == DType::f32 ? static_cast<const void*>(g.data()) : g16.data();
      for (int mode = 0; mode < 3; ++mode) {
        for (bool ams : {false, true}) {
          for (int cfg = 0; cfg < 9; ++cfg) {
            const int out = cfg % 3;
            // Layout 0: every buffer aligned; 1: every buffer one element in;
            // 2: the gradients alone one element in.
            const int layout = cfg / 3;
            const std::size_t shift = layout == 1 ? 1 : 0, grad_shift = layout == 0 ? 0 : 1;
            const DType ot = out == 2 ? DType::f16 : DType::bf16;
            Mirror<float> dp(p, shift), dm(m, shift), dv(v, shift), dvmax(vmax, shift);
            Mirror<float> dg32(g, grad_shift);
            Mirror<std::uint16_t> dg16(g16, grad_shift);
            Mirror<std::uint16_t> dout(std::vector<std::uint16_t>(n, 0), shift);
            // Reference on the host copies.
            kernels::AdamBuffers hb;
            hb.param = dp.host.data();
            hb.grad = host_grad;
            hb.grad_type = gt;
            hb.exp_avg = dm.host.data();
            hb.exp_avg_sq = dv.host.data();
            hb.max_exp_avg_sq = ams ? dvmax.host.data() : nullptr;
            hb.param_out = out ? dout.host.data() : nullptr;
            hb.param_out_type = ot;
            hb.n = n;
            const auto s = kernels::make_adam_scalars(0.01, 0.9, 0.999, 1e-8, mode ? 0.1 : 0.0,
                                                      mode == 2, ams, out == 1, 4, 0.5);
            kernels::reference::step<Adam>(hb, s);
            // The same step on the device copies.
            kernels::AdamBuffers db = hb;
            db.param = dp.dev;
            db.grad = gt == DType::f32 ? static_cast<const void*>(dg32.dev) : dg16.dev;
            db.exp_avg = dm.dev;
            db.exp_avg_sq = dv.dev;
            db.max_exp_avg_sq = ams ? dvmax.dev : nullptr;
            db.param_out = out ? dout.dev : nullptr;
            kernels::cuda::step<Adam>(db, s, nullptr);
            const std::string where = " (n " + std::to_string(n) + " grad " + dtype_name(gt) +
                                      " mode " + std::to_string(mode) + " amsgrad " +
                                      std::to_string(ams) + " cfg " + std::to_string(cfg) + ")";
            check(dp.same(), "params equal bitwise" + where);
            check(dm.same(), "exp_avg equal bitwise" + where);
            check(dv.same(), "exp_avg_sq equal bitwise" + where);
            check(dvmax.same(), "max_exp_avg_sq equal bitwise (untouched without amsgrad)" + where);
            check(dout.same(), "low-precision copy equal bitwise (untouched without one)" + where);
          }
        }
      }
    }
  }
  // Through the functional API: device buffers run on the device.
  const std::size_t n = 4097;
  Mirror<float> p(std::vector<float>(n, 0.5f)), g(std::vector<float>(n, 0.25f)),
      m(std::vector<float>(n, 0.0f)), v(std::vector<float>(n, 0.0f));
  const auto r = functional::adam({p.dev, n}, functional::GradView(g.dev, n, DType::f32),
                                  {m.dev, n}, {v.dev, n}, {}, 1, Adam{.lr = 0.1});
  functional::adam(p.host, g.host, m.host, v.host, {}, 1, Adam{.lr = 0.1});
  check(r.grads_finite, "functional adam on device reports finite grads");
  check(p.same(), "functional adam on device equals the host step");
  return gpu_test::finish("gpu adam");
}
