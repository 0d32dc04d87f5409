// shardopt kernels: RAdam (Liu et al. 2020, "On the Variance of the Adaptive
// Learning Rate and Beyond"), one fused pass over a contiguous range.
//
// radam_element() is the single definition of the per-element math, called
// by the reference, CPU and CUDA kernels. It follows torch.optim.RAdam's
// single-tensor step operation by operation in float32, as Adam does
// (kernels/adam.hpp): the bias-corrected first moment m / (1 - beta1^t),
// then, while the variance is tractable (rho_t > 5, decided per step), the
// adaptive rate sqrt(1 - beta2^t) / (sqrt(v) + eps) as torch computes a
// scalar over a tensor (a reciprocal, then a product) and the rectification
// term; before that, plain momentum steps.
#pragma once

#include <cmath>
#include <cstddef>
#include <cstdint>

#include "kernels/adam.hpp"
#include "kernels/dispatch.hpp"
#include "kernels/element.hpp"
#include "kernels/optimizer.hpp"
#include "shardopt/optimizers.hpp"

namespace shardopt::kernels {

// The scalars of one step: computed in double, rounded to float as torch
// rounds a Python float meeting a float32 tensor.
struct RAdamScalars {
  float beta1, one_minus_beta1;
  float beta2, one_minus_beta2;
  float bias_correction1;       // 1 - beta1^step
  float bias_correction2_sqrt;  // sqrt(1 - beta2^step)
  float eps;
  float lr;
  float rect;  // the variance rectification term
  float weight_decay;
  float decay;      // 1 - lr * weight_decay, for decoupled weight decay
  float grad_sign;  // -1 when maximizing, else 1
  float grad_mul;   // applied to the gradient first: 1 / loss_scale * clip_coef
  WeightDecay wd_mode;
  bool rectified;  // rho_t > 5: the adaptive step
};

inline RAdamScalars make_radam_scalars(const RAdam& o, std::int64_t step, double grad_mul) {
  RAdamScalars s{};
  const double beta1 = o.betas.first, beta2 = o.betas.second, t = static_cast<double>(step);
  s.beta1 = static_cast<float>(beta1);
  s.one_minus_beta1 = static_cast<float>(1.0 - beta1);
  s.beta2 = static_cast<float>(beta2);
  s.one_minus_beta2 = static_cast<float>(1.0 - beta2);
  const double bc1 = 1.0 - std::pow(beta1, t);
  const double bc2 = 1.0 - std::pow(beta2, t);
  s.bias_correction1 = static_cast<float>(bc1);
  s.bias_correction2_sqrt = static_cast<float>(std::sqrt(bc2));
  s.eps = static_cast<float>(o.eps);
  s.lr = static_cast<float>(o.lr);
  // The maximum length of the approximated simple moving average, and its
  // length at this step.
  const double rho_inf = 2.0 / (1.0 - beta2) - 1.0;
  const double rho_t = rho_inf - 2.0 * t * std::pow(beta2, t) / bc2;
  s.rectified = rho_t > 5.0;
  if (s.rectified)
    s.rect = static_cast<float>(std::sqrt((rho_t - 4.0) * (rho_t - 2.0) * rho_inf /
                                          ((rho_inf - 4.0) * (rho_inf - 2.0) * rho_t)));
  s.weight_decay = static_cast<float>(o.weight_decay);
  s.decay = static_cast<float>(1.0 - o.lr * o.weight_decay);
  s.grad_sign = o.maximize ? -1.0f : 1.0f;
  s.grad_mul = static_cast<float>(grad_mul);
  s.wd_mode = o.weight_decay == 0.0      ? WeightDecay::none
              : o.decoupled_weight_decay ? WeightDecay::decoupled
                                         : WeightDecay::l2;
  return s;
}

// One element: p, m and v updated in place; g is the gradient as stored,
// converted to float. Returns whether the gradient (after grad_mul) is finite.
template <WeightDecay W, bool Rectified>
SHARDOPT_HOST_DEVICE inline bool radam_element(float& p, float g, float& m, float& v,
                                               const RAdamScalars& s) {
  g = g * s.grad_mul;
  const bool finite = is_finite_bits(g);
  g = g * s.grad_sign;
  if constexpr (W == WeightDecay::decoupled) p = p * s.decay;          // param.mul_(1 - lr*wd)
  if constexpr (W == WeightDecay::l2) g = fmaf(s.weight_decay, p, g);  // grad.add(param, alpha=wd)
  m = fmaf(s.one_minus_beta1, g, m * s.beta1);                         // mul_(b1).add_(g, 1-b1)
  v = fmaf(s.one_minus_beta2 * g, g, v * s.beta2);  // mul_(b2).addcmul_(g, g, 1-b2)
  const float corrected = m / s.bias_correction1;   // exp_avg / bias_correction1
  if constexpr (Rectified) {
    // sqrt(bc2) / (sqrt(v) + eps): torch's scalar / tensor is reciprocal() * scalar.
    const float adaptive = (1.0f / (sqrtf(v) + s.eps)) * s.bias_correction2_sqrt;
    p = p -
        ((corrected * s.lr) * adaptive) * s.rect;  // add_(m_hat * lr * adaptive * rect, alpha=-1)
  } else {
    p = p - corrected * s.lr;  // add_(m_hat * lr, alpha=-1)
  }
  return finite;
}

// The buffers of one RAdam step over n elements: StepBuffers'
// (kernels/element.hpp) and
//   exp_avg:     first moment, read and written
//   exp_avg_sq:  second moment, read and written
struct RAdamBuffers : StepBuffers {
  float* exp_avg = nullptr;
  float* exp_avg_sq = nullptr;

  template <class F>
  SHARDOPT_HOST_DEVICE constexpr void each_buffer(F&& f) {
    each_step_buffer(f, [&] {
      f(exp_avg, 4, Access::read_write);
      f(exp_avg_sq, 4, Access::read_write);
    });
  }
};

}  // namespace shardopt::kernels

namespace shardopt::kernels::detail {

template <class G, class P, WeightDecay W, bool Rectified>
struct RAdamLoop {
  using Grad = G;
  using Storage = P;
  template <class G2, class P2>
  using Rebind = RAdamLoop<G2, P2, W, Rectified>;
  // Updates [begin, end); returns true if every gradient there was finite.
  [[gnu::always_inline]] static inline bool range(const RAdamBuffers& b, const RAdamScalars& s,
                                                  std::size_t begin, std::size_t end) {
    float* __restrict p = b.param;
    typename P::Copy* __restrict copy = static_cast<typename P::Copy*>(b.param_out);
    std::uint16_t* __restrict rem = b.remainder;
    const G* __restrict g = static_cast<const G*>(b.grad);
    float* __restrict m = b.exp_avg;
    float* __restrict v = b.exp_avg_sq;
    return for_range<force_simd<G, P>>(
        begin, end, [&](std::size_t i) __attribute__((always_inline)) {
          float pi = P::load(p, copy, rem, i);
          const bool finite = radam_element<W, Rectified>(pi, load_grad(g, i), m[i], v[i], s);
          P::store(p, copy, rem, i, pi);
          return finite;
        });
  }
  SHARDOPT_HOST_DEVICE static bool apply(const RAdamBuffers& b, const RAdamScalars& s,
                                         std::size_t i) {
    typename P::Copy* copy = static_cast<typename P::Copy*>(b.param_out);
    float p = P::load(b.param, copy, b.remainder, i), m = b.exp_avg[i], v = b.exp_avg_sq[i];
    const bool finite =
        radam_element<W, Rectified>(p, load_grad(static_cast<const G*>(b.grad), i), m, v, s);
    P::store(b.param, copy, b.remainder, i, p);
    b.exp_avg[i] = m;
    b.exp_avg_sq[i] = v;
    return finite;
  }
};

}  // namespace shardopt::kernels::detail

namespace shardopt::kernels {

template <>
struct Kernel<RAdam> {
  using Family = RAdam;
  using Buffers = RAdamBuffers;
  using Scalars = RAdamScalars;
  static Scalars scalars(const RAdam& o, std::int64_t step, double grad_mul) {
    return make_radam_scalars(o, step, grad_mul);
  }
  static void set_states(Buffers& b, float* const* states) {
    b.exp_avg = states[0];
    b.exp_avg_sq = states[1];
  }
  template <class F>
  static bool dispatch(const Buffers& b, const Scalars& s, F&& f) {
    return detail::dispatch_types(
        b.grad_type, b.param_out, b.param_out_type, b.remainder, [&]<class G, class P>() {
          auto with_rect = [&]<WeightDecay W>() {
            return s.rectified ? f.template operator()<detail::RAdamLoop<G, P, W, true>>()
                               : f.template operator()<detail::RAdamLoop<G, P, W, false>>();
          };
          switch (s.wd_mode) {
            case WeightDecay::l2:
              return with_rect.template operator()<WeightDecay::l2>();
            case WeightDecay::decoupled:
              return with_rect.template operator()<WeightDecay::decoupled>();
            default:
              return with_rect.template operator()<WeightDecay::none>();
          }
        });
  }
};

}  // namespace shardopt::kernels
