// gpu suite: the CUDA SGD, Adagrad, RMSprop, Lion and LAMB kernels equal the reference
// kernels bitwise, for every gradient type, output copy and mode, with the
// buffers aligned (the vector path), all one element in (the vector path
// from element 3) and the gradients alone one element in (the scalar path),
// and device buffers run on the device through the functional API. Skips
// (exit 77) without a device.
#include <cuda_runtime.h>

#include <cstdio>
#include <random>
#include <span>
#include <string>
#include <vector>

#include "gpu_test.hpp"
#include "kernels/adagrad.hpp"
#include "kernels/lamb.hpp"
#include "kernels/lion.hpp"
#include "kernels/rmsprop.hpp"
#include "kernels/sgd.hpp"
#include "shardopt/shardopt.hpp"

using namespace shardopt;
using gpu_test::check;
using gpu_test::Mirror;
using gpu_test::uniform;

namespace {

// The step of O with scalars s on the host buffers of b (the reference
// kernel), then on the device (the CUDA kernel): b's parameters, gradient
// and 16-bit copy at param, grad and param_out there, its states where
// device_states(b) sets them.
template <class O, class B, class S, class States>
void host_then_device(B b, const S& s, float* param, const void* grad, void* param_out,
                      States&& device_states) {
  kernels::reference::step<O>(b, s);
  b.param = param;
  b.grad = grad;
  b.param_out = param_out;
  device_states(b);
  kernels::cuda::step<O>(b, s, nullptr);
}

}  // namespace

int main() {
  if (gpu_test::no_device()) return gpu_test::kSkip;
  std::mt19937 rng(17);
  for (std::size_t n : {std::size_t{1}, std::size_t{7}, std::size_t{1000}, std::size_t{65537},
                        (std::size_t{1} << 22) + 5}) {
    const std::vector<float> g = uniform(n, rng, -1, 1);
    // Layout 0: every buffer aligned; 1: every buffer one element in; 2: the
    // gradients alone one element in.
    for (int layout = 0; layout < 3; ++layout)
      for (DType gt : {DType::f32, DType::bf16, DType::f16}) {
        const std::size_t shift = layout == 1 ? 1 : 0;
        Mirror<float> g32(g, layout == 0 ? 0 : 1);
        Mirror<std::uint16_t> g16(gpu_test::to_16(g, gt), layout == 0 ? 0 : 1);
        const void* hg = gt == DType::f32 ? static_cast<const void*>(g32.host.data())
                                          : static_cast<const void*>(g16.host.data());
        const void* dg = gt == DType::f32 ? static_cast<const void*>(g32.dev)
                                          : static_cast<const void*>(g16.dev);
        for (int out = 0; out < 3; ++out) {
          const DType ot = out == 2 ? DType::f16 : DType::bf16;
          const double grad_mul = out == 1 ? 0.5 : 1.0;
          for (int mode = 0; mode < 8; ++mode) {
            const std::string where = "n " + std::to_string(n) + " layout " +
                                      std::to_string(layout) + " grad " + dtype_name(gt) + " out " +
                                      std::to_string(out) + " mode " + std::to_string(mode);
            const bool maximize = (mode + out) % 2 == 1;
            {  // SGD, steps 1 and 2
              Mirror<float> p(uniform(n, rng, -1, 1), shift),
                  buf(uniform(n, rng, -0.1f, 0.1f), shift);
              Mirror<std::uint16_t> o(std::vector<std::uint16_t>(n, 0), shift);
              const bool mom = mode & 1;
              for (std::int64_t step : {1, 2}) {
                const auto s =
                    kernels::make_sgd_scalars(0.01, mom ? 0.9 : 0.0, 0.0, (mode & 2) ? 0.1 : 0.0,
                                              mom && (mode & 4), maximize, step, grad_mul);
                host_then_device<SGD>(kernels::SgdBuffers{{p.host.data(), hg, gt,
                                                           out ? o.host.data() : nullptr, ot, n},
                                                          mom ? buf.host.data() : nullptr},
                                      s, p.dev, dg, out ? o.dev : nullptr, [&](auto& b) {
                                        b.momentum_buffer = mom ? buf.dev : nullptr;
                                      });
              }
              check(p.same() && buf.same() && o.same(), "SGD " + where);
            }
            if (mode < 2) {  // Adagrad
              Mirror<float> p(uniform(n, rng, -1, 1), shift), sum(uniform(n, rng, 0, 0.1f), shift);
              Mirror<std::uint16_t> o(std::vector<std::uint16_t>(n, 0), shift);
              const auto s = kernels::make_adagrad_scalars(0.05, 0.01, mode ? 0.1 : 0.0, 1e-10,
                                                           maximize, 3, grad_mul);
              host_then_device<Adagrad>(
                  kernels::AdagradBuffers{
                      {p.host.data(), hg, gt, out ? o.host.data() : nullptr, ot, n},
                      sum.host.data()},
                  s, p.dev, dg, out ? o.dev : nullptr, [&](auto& b) { b.sum = sum.dev; });
              check(p.same() && sum.same() && o.same(), "Adagrad " + where);
            }
            if (mode < 2) {  // Lion
              Mirror<float> p(uniform(n, rng, -1, 1), shift),
                  m(uniform(n, rng, -0.1f, 0.1f), shift);
              Mirror<std::uint16_t> o(std::vector<std::uint16_t>(n, 0), shift);
              const auto s =
                  kernels::make_lion_scalars(1e-3, 0.9, 0.99, mode ? 0.1 : 0.0, maximize, grad_mul);
              host_then_device<Lion>(
                  kernels::LionBuffers{
                      {p.host.data(), hg, gt, out ? o.host.data() : nullptr, ot, n}, m.host.data()},
                  s, p.dev, dg, out ? o.dev : nullptr, [&](auto& b) { b.exp_avg = m.dev; });
              check(p.same() && m.same() && o.same(), "Lion " + where);
            }
            if (mode < 2) {  // LAMB: the direction, the norms, then the apply pass
              Mirror<float> p(uniform(n, rng, -1, 1), shift),
                  m(uniform(n, rng, -0.1f, 0.1f), shift), v(uniform(n, rng, 0, 0.01f), shift),
                  r(std::vector<float>(n, 0.0f), shift);
              Mirror<std::uint16_t> o(std::vector<std::uint16_t>(n, 0), shift);
              const auto s = kernels::make_lamb_scalars(0.9, 0.999, 1e-6, mode ? 0.01 : 0.0,
                                                        maximize, 3, grad_mul);
              kernels::LambBuffers b{p.host.data(), hg, gt, m.host.data(), v.host.data(),
                                     r.host.data(), n};
              const auto hn = kernels::reference::lamb_direction(b, s);
              b.param = p.dev;
              b.grad = dg;
              b.exp_avg = m.dev;
              b.exp_avg_sq = v.dev;
              b.update = r.dev;
              const auto dn = kernels::cuda::lamb_direction(b, s, nullptr);
              check(hn.param_sq == dn.param_sq && hn.update_sq == dn.update_sq &&
                        hn.grads_finite == dn.grads_finite,
                    "LAMB norms " + where);
              kernels::LambApplyBuffers a{p.host.data(), r.host.data(),
                                          out ? o.host.data() : nullptr, ot, n};
              kernels::reference::lamb_apply(a, -0.0123f);
              a.param = p.dev;
              a.update = r.dev;
              a.param_out = out ? o.dev : nullptr;
              kernels::cuda::lamb_apply(a, -0.0123f, nullptr);
              check(p.same() && m.same() && v.same() && r.same() && o.same(), "LAMB " + where);
            }
            {  // RMSprop
              Mirror<float> p(uniform(n, rng, -1, 1), shift), sq(uniform(n, rng, 0.5f, 1), shift),
                  ga(uniform(n, rng, -0.1f, 0.1f), shift), buf(uniform(n, rng, -0.1f, 0.1f), shift);
              Mirror<std::uint16_t> o(std::vector<std::uint16_t>(n, 0), shift);
              const bool centered = mode & 1, mom = mode & 2;
              const auto s =
                  kernels::make_rmsprop_scalars(0.01, 0.99, 1e-8, (mode & 4) ? 0.1 : 0.0,
                                                mom ? 0.9 : 0.0, centered, maximize, grad_mul);
              host_then_device<RMSprop>(
                  kernels::RmspropBuffers{
                      {p.host.data(), hg, gt, out ? o.host.data() : nullptr, ot, n},
                      sq.host.data(),
                      centered ? ga.host.data() : nullptr,
                      mom ? buf.host.data() : nullptr},
                  s, p.dev, dg, out ? o.dev : nullptr, [&](auto& b) {
                    b.square_avg = sq.dev;
                    b.grad_avg = centered ? ga.dev : nullptr;
                    b.momentum_buffer = mom ? buf.dev : nullptr;
                  });
              check(p.same() && sq.same() && ga.same() && buf.same() && o.same(),
                    "RMSprop " + where);
            }
          }
        }
      }
  }
  // Through the functional API: device buffers run on the device, and agree
  // with the host step.
  const std::size_t n = 4097;
  std::mt19937 rng2(5);
  const std::vector<float> g = uniform(n, rng2, -1, 1);
  Mirror<float> dg(g);
  {
    Mirror<float> p(uniform(n, rng2, -1, 1)), buf(std::vector<float>(n, 0.0f));
    const SGD o{.lr = 0.1, .momentum = 0.9, .nesterov = true};
    const auto r = functional::sgd({p.dev, n}, functional::GradView(dg.dev, n, DType::f32),
                                   {buf.dev, n}, 1, o);
    functional::sgd(p.host, g, buf.host, 1, o);
    check(r.grads_finite && p.same() && buf.same(), "functional sgd on device");
  }
  {
    Mirror<float> p(uniform(n, rng2, -1, 1)), sum(std::vector<float>(n, 0.1f));
    const Adagrad o{.lr = 0.1, .initial_accumulator_value = 0.1};
    functional::adagrad({p.dev, n}, functional::GradView(dg.dev, n, DType::f32), {sum.dev, n}, 1,
                        o);
    functional::adagrad(p.host, g, sum.host, 1, o);
    check(p.same() && sum.same(), "functional adagrad on device");
  }
  {
    Mirror<float> p(uniform(n, rng2, -1, 1)), sq(std::vector<float>(n, 0.0f)),
        ga(std::vector<float>(n, 0.0f));
    const RMSprop o{.lr = 0.1, .centered = true};
    functional::rmsprop({p.dev, n}, functional::GradView(dg.dev, n, DType::f32), {sq.dev, n},
                        {ga.dev, n}, {}, o);
    functional::rmsprop(p.host, g, sq.host, ga.host, {}, o);
    check(p.same() && sq.same() && ga.same(), "functional rmsprop on device");
  }
  {
    Mirror<float> p(uniform(n, rng2, -1, 1)), m(std::vector<float>(n, 0.0f)),
        v(std::vector<float>(n, 0.0f)), r(std::vector<float>(n, 0.0f));
    const Lamb o{.lr = 0.01};
    functional::lamb({p.dev, n}, functional::GradView(dg.dev, n, DType::f32), {m.dev, n},
                     {v.dev, n}, {r.dev, n}, 1, o);
    functional::lamb(p.host, g, m.host, v.host, r.host, 1, o);
    check(p.same() && m.same() && v.same() && r.same(), "functional lamb on device");
  }
  // Parameter remainders: bf16 parameters and remainders on the device step
  // exactly as on the host (which equals the fp32-master trajectory, tested
  // in test_optim_remainders), for every optimizer.
  for (std::size_t rn : {std::size_t{1}, std::size_t{1000}, std::size_t{65537}}) {
    for (DType gt : {DType::bf16, DType::f16}) {
      const std::vector<float> master = uniform(rn, rng2, -1, 1);
      std::vector<bfloat16> hi0(rn);
      std::vector<std::uint16_t> rem0(rn);
      functional::encode_param_remainders(master, hi0, rem0);
      Mirror<std::uint16_t> rg(gpu_test::to_16(uniform(rn, rng2, -1, 1), gt));
      const functional::GradView hgv(rg.host.data(), rn, gt), dgv(rg.dev, rn, gt);
      for (int opt = 0; opt < 7; ++opt) {
        Mirror<bfloat16> hi(hi0);
        Mirror<std::uint16_t> rem(rem0);
        Mirror<float> s0(std::vector<float>(rn, 0.1f)), s1(std::vector<float>(rn, 0.0f)),
            s2(std::vector<float>(rn, 0.0f));
        for (int dev = 0; dev < 2; ++dev) {
          const functional::ParamView pv(
              std::span<bfloat16>(dev ? hi.dev : hi.host.data(), rn),
              std::span<std::uint16_t>(dev ? rem.dev : rem.host.data(), rn));
          const functional::GradView gv = dev ? dgv : hgv;
          const std::span<float> a(dev ? s0.dev : s0.host.data(), rn),
              b(dev ? s1.dev : s1.host.data(), rn), c(dev ? s2.dev : s2.host.data(), rn);
          for (std::int64_t t : {1, 2}) {
            switch (opt) {
              case 0:
                functional::adam(pv, gv, a, b, c, t, Adam{.weight_decay = 0.01, .amsgrad = true});
                break;
              case 1:
                functional::adamw(pv, gv, a, b, {}, t, AdamW{});
                break;
              case 2:
                functional::sgd(pv, gv, a, t, SGD{.lr = 0.01, .momentum = 0.9});
                break;
              case 3:
                functional::adagrad(pv, gv, a, t, Adagrad{.initial_accumulator_value = 0.1});
                break;
              case 4:
                functional::rmsprop(pv, gv, a, b, c, RMSprop{.momentum = 0.9, .centered = true});
                break;
              case 5:
                functional::lion(pv, gv, a, Lion{.weight_decay = 0.1});
                break;
              default:
                functional::lamb(pv, gv, a, b, c, t, Lamb{});
                break;
            }
          }
        }
        check(hi.same() && rem.same() && s0.same() && s1.same() && s2.same(),
              "remainders optimizer " + std::to_string(opt) + " n " + std::to_string(rn) +
                  " grad " + dtype_name(gt));
      }
    }
  }
  return gpu_test::finish("gpu optim (SGD, Adagrad, RMSprop, Lion, LAMB)");
}
