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
#include "kernels/element_loop.hpp"
#include "kernels/optimizer.hpp"
#include "shardopt/optimizers.hpp"

namespace shardopt::kernels {

// The scalars of one step: the moments' (kernels/moments.hpp) and
struct RAdamScalars : MomentScalars {
  float bias_correction1;       // 1 - beta1^step
  float bias_correction2_sqrt;  // sqrt(1 - beta2^step)
  float lr;
  float rect;      // the variance rectification term
  bool rectified;  // rho_t > 5: the adaptive step
};

inline RAdamScalars make_radam_scalars(const RAdam& o, std::int64_t step, double grad_mul) {
  RAdamScalars s{};
  static_cast<MomentScalars&>(s) = make_moment_scalars(
      o.lr, o.betas, o.eps, o.weight_decay, o.decoupled_weight_decay, o.maximize, grad_mul);
  const double beta1 = o.betas.first, beta2 = o.betas.second, t = static_cast<double>(step);
  const double bc1 = 1.0 - std::pow(beta1, t);
  const double bc2 = 1.0 - std::pow(beta2, t);
  s.bias_correction1 = static_cast<float>(bc1);
  s.bias_correction2_sqrt = static_cast<float>(std::sqrt(bc2));
  s.lr = static_cast<float>(o.lr);
  // The maximum length of the approximated simple moving average, and its
  // length at this step.
  const double rho_inf = 2.0 / (1.0 - beta2) - 1.0;
  const double rho_t = rho_inf - 2.0 * t * std::pow(beta2, t) / bc2;
  s.rectified = rho_t > 5.0;
  if (s.rectified)
    s.rect = static_cast<float>(std::sqrt((rho_t - 4.0) * (rho_t - 2.0) * rho_inf /
                                          ((rho_inf - 4.0) * (rho_inf - 2.0) * rho_t)));
  return s;
}

// One element: p, m and v updated in place; g is the gradient as stored,
// converted to float. Returns whether the gradient (after grad_mul) is finite.
template <WeightDecay W, bool Rectified, class F>
SHARDOPT_HOST_DEVICE SHARDOPT_FORCE_INLINE auto radam_element(F& p, F g, F& m, F& v,
                                                              const RAdamScalars& s) {
  const auto finite = update_moments<W>(p, g, m, v, s);
  const F corrected = m / s.bias_correction1;  // exp_avg / bias_correction1
  if constexpr (Rectified) {
    // sqrt(bc2) / (sqrt(v) + eps): torch's scalar / tensor is reciprocal() * scalar.
    const F adaptive = (1.0f / (sqrt_op(v) + s.eps)) * s.bias_correction2_sqrt;
    p = p -
        ((corrected * s.lr) * adaptive) * s.rect;  // add_(m_hat * lr * adaptive * rect, alpha=-1)
  } else {
    p = p - corrected * s.lr;  // add_(m_hat * lr, alpha=-1)
  }
  return finite;
}

// The buffers of one RAdam step over n elements: the moments' (kernels/moments.hpp).
using RAdamBuffers = MomentBuffers;

// One element of a RAdam step of the given modes (kernels/element_loop.hpp).
template <WeightDecay W, bool Rectified>
struct RAdamStep : StepTypes<RAdamBuffers, RAdamScalars> {
  template <class F>
  SHARDOPT_HOST_DEVICE SHARDOPT_FORCE_INLINE static auto apply(F& p, F g, const Buffers& b,
                                                               std::size_t i, const Scalars& s) {
    return radam_element<W, Rectified>(p, g, lane<F>(b.exp_avg, i), lane<F>(b.exp_avg_sq, i), s);
  }
};

template <>
struct Kernel<RAdam> : ElementKernel<RAdam, RAdamBuffers, RAdamScalars> {
  static Scalars scalars(const RAdam& o, std::int64_t step, double grad_mul) {
    return make_radam_scalars(o, step, grad_mul);
  }
  template <class F>
  static bool modes(const Scalars& s, F&& f) {
    return with_weight_decay(s.wd_mode, [&]<WeightDecay W>() {
      return s.rectified ? f.template operator()<RAdamStep<W, true>>()
                         : f.template operator()<RAdamStep<W, false>>();
    });
  }
};

}  // namespace shardopt::kernels
