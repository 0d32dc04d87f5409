// shardopt kernels: what Adam, AdamW, NAdam, RAdam and LAMB share, the first
// and second moments of the gradient, written once: the scalars they take
// and the element steps that come before each optimizer's own update. Each
// follows torch.optim (PyTorch 1.13) operation by operation, with fused
// multiply-adds exactly where PyTorch's CPU kernels use them (add_ with
// alpha, addcmul_) and nowhere else (kernels/adam.hpp).
#pragma once

#include <utility>

#include "kernels/element.hpp"
#include "kernels/element_loop.hpp"

namespace shardopt::kernels {

// How weight decay enters: not at all, as L2 on the gradient (Adam), or
// decoupled, multiplying the parameter (AdamW).
enum class WeightDecay { none, l2, decoupled };

// The scalars of the moments, computed in double and rounded to float as
// PyTorch does when a Python float meets a float32 tensor.
struct MomentScalars {
  float beta1, one_minus_beta1;
  float beta2, one_minus_beta2;
  float eps;
  float weight_decay;  // for l2 (LAMB: added to the direction)
  float decay;         // 1 - lr * weight_decay, for decoupled
  float grad_sign;     // -1 when maximizing, else 1
  float grad_mul;      // applied to the gradient first: 1 / loss_scale * clip_coef
  WeightDecay wd_mode;
};

// decoupled: weight decay multiplies the parameter (AdamW) rather than
// adding to the gradient.
inline MomentScalars make_moment_scalars(double lr, std::pair<double, double> betas, double eps,
                                         double weight_decay, bool decoupled, bool maximize,
                                         double grad_mul) {
  MomentScalars s{};
  s.beta1 = static_cast<float>(betas.first);
  s.one_minus_beta1 = static_cast<float>(1.0 - betas.first);
  s.beta2 = static_cast<float>(betas.second);
  s.one_minus_beta2 = static_cast<float>(1.0 - betas.second);
  s.eps = static_cast<float>(eps);
  s.weight_decay = static_cast<float>(weight_decay);
  s.decay = static_cast<float>(1.0 - lr * weight_decay);
  s.grad_sign = maximize ? -1.0f : 1.0f;
  s.grad_mul = static_cast<float>(grad_mul);
  s.wd_mode = weight_decay == 0.0 ? WeightDecay::none
              : decoupled         ? WeightDecay::decoupled
                                  : WeightDecay::l2;
  return s;
}

// The start of one element's step: g (the gradient as stored, converted to
// float) scaled by grad_mul and signed, weight decay W applied to p or g,
// and the moments m and v updated in place. Returns whether the gradient
// (after grad_mul) is finite; g is left as the moments saw it.
template <WeightDecay W, class F>
SHARDOPT_HOST_DEVICE SHARDOPT_FORCE_INLINE auto update_moments(F& p, F& g, F& m, F& v,
                                                               const MomentScalars& s) {
  g = g * s.grad_mul;
  const auto finite = finite_op(g);
  g = g * s.grad_sign;
  if constexpr (W == WeightDecay::decoupled) p = p * s.decay;  // param.mul_(1 - lr*wd)
  if constexpr (W == WeightDecay::l2)
    g = fma_op(s.weight_decay, p, g);                 // grad.add(param, alpha=wd)
  m = fma_op(s.one_minus_beta1, g, m * s.beta1);      // mul_(b1).add_(g, 1-b1)
  v = fma_op(s.one_minus_beta2 * g, g, v * s.beta2);  // mul_(b2).addcmul_(g, g, 1-b2)
  return finite;
}

// The buffers of a step that keeps the two moments only (NAdam, RAdam):
// StepBuffers' (kernels/element.hpp) and
//   exp_avg:     first moment, read and written
//   exp_avg_sq:  second moment, read and written
struct MomentBuffers : StateBuffers<MomentBuffers> {
  float* exp_avg = nullptr;
  float* exp_avg_sq = nullptr;

  template <class F>
  SHARDOPT_HOST_DEVICE SHARDOPT_FORCE_INLINE constexpr void each_state(F&& f) {
    f(exp_avg);
    f(exp_avg_sq);
  }
};

// Calls f.template operator()<W>() with the step's weight decay mode.
template <class F>
bool with_weight_decay(WeightDecay mode, F&& f) {
  switch (mode) {
    case WeightDecay::l2:
      return f.template operator()<WeightDecay::l2>();
    case WeightDecay::decoupled:
      return f.template operator()<WeightDecay::decoupled>();
    default:
      return f.template operator()<WeightDecay::none>();
  }
}

}  // namespace shardopt::kernels
