// shardopt kernels: RMSprop (plain or centered, with or without momentum),
// one fused pass over a contiguous range.
//
// rmsprop_element() is the single definition of the per-element math, called
// by the reference, CPU and CUDA kernels. It follows torch.optim.RMSprop
// (PyTorch 1.13, single-tensor path) operation by operation, with fused
// multiply-adds where PyTorch's CPU kernels have them and nowhere else, so it
// matches PyTorch's CPU trajectory bitwise (tests/data/golden/README.md).
// RMSprop has no bias correction, so no step count.
#pragma once

#include <cmath>
#include <cstddef>
#include <cstdint>

#include "kernels/element_loop.hpp"
#include "kernels/optimizer.hpp"
#include "shardopt/optimizers.hpp"
#include "shardopt/types.hpp"

namespace shardopt::kernels {

// The scalars of one step, computed in double and rounded to float as
// PyTorch does.
struct RmspropScalars {
  float neg_lr;  // -lr
  float alpha, one_minus_alpha;
  float eps;           // added outside the square root
  float weight_decay;  // L2: added to the gradient
  float momentum;      // 0: no momentum buffer
  float grad_sign;     // -1 when maximizing, else 1
  float grad_mul;      // applied to the gradient first: 1 / loss_scale * clip_coef
  bool centered;
};

inline RmspropScalars make_rmsprop_scalars(double lr, double alpha, double eps, double weight_decay,
                                           double momentum, bool centered, bool maximize,
                                           double grad_mul) {
  RmspropScalars s{};
  s.neg_lr = static_cast<float>(-lr);
  s.alpha = static_cast<float>(alpha);
  s.one_minus_alpha = static_cast<float>(1.0 - alpha);
  s.eps = static_cast<float>(eps);
  s.weight_decay = static_cast<float>(weight_decay);
  s.momentum = static_cast<float>(momentum);
  s.grad_sign = maximize ? -1.0f : 1.0f;
  s.grad_mul = static_cast<float>(grad_mul);
  s.centered = centered;
  return s;
}

// One element: p, sq and (when centered) *grad_avg and (with momentum) *buf
// updated in place; g is the gradient as stored, converted to float. Wd
// (weight_decay != 0), Centered and Mom (momentum != 0) are template
// arguments. Returns whether the gradient (after grad_mul) is finite.
template <bool Wd, bool Centered, bool Mom, class F>
SHARDOPT_HOST_DEVICE SHARDOPT_FORCE_INLINE auto rmsprop_element(F& p, F g, F& sq, F* grad_avg,
                                                                F* buf, const RmspropScalars& s) {
  g = g * s.grad_mul;
  const auto finite = finite_op(g);
  g = g * s.grad_sign;
  if constexpr (Wd) g = fma_op(s.weight_decay, p, g);   // grad.add(param, alpha=wd)
  sq = fma_op(s.one_minus_alpha * g, g, sq * s.alpha);  // mul_(alpha).addcmul_(g, g, 1-alpha)
  F avg;
  if constexpr (Centered) {
    *grad_avg = fma_op(s.one_minus_alpha, g, *grad_avg * s.alpha);  // mul_(a).add_(g, 1-a)
    avg = sqrt_op(fma_op(-*grad_avg, *grad_avg, sq));  // sq.addcmul(ga, ga, value=-1).sqrt_()
  } else {
    avg = sqrt_op(sq);
  }
  avg = avg + s.eps;  // add_(eps)
  if constexpr (Mom) {
    *buf = *buf * s.momentum + g / avg;  // buf.mul_(momentum).addcdiv_(grad, avg)
    p = fma_op(s.neg_lr, *buf, p);       // param.add_(buf, alpha=-lr)
  } else {
    p = p + (s.neg_lr * g) / avg;  // param.addcdiv_(grad, avg, value=-lr)
  }
  return finite;
}

// The buffers of one RMSprop step over n elements: StepBuffers'
// (kernels/element.hpp) and
//   square_avg:      running average of squared gradients, read and written
//   grad_avg:        running average of gradients, read and written; only when centered
//   momentum_buffer: read and written; only when momentum != 0
struct RmspropBuffers : StateBuffers<RmspropBuffers> {
  float* square_avg = nullptr;
  float* grad_avg = nullptr;
  float* momentum_buffer = nullptr;

  template <class F>
  SHARDOPT_HOST_DEVICE SHARDOPT_FORCE_INLINE constexpr void each_state(F&& f) {
    f(square_avg);
    f(grad_avg);
    f(momentum_buffer);
  }
};

// One element of an RMSprop step of the given modes (kernels/element_loop.hpp).
template <bool Wd, bool Centered, bool Mom>
struct RmspropStep : StepTypes<RmspropBuffers, RmspropScalars> {
  template <class F>
  SHARDOPT_HOST_DEVICE SHARDOPT_FORCE_INLINE static auto apply(F& p, F g, const Buffers& b,
                                                               std::size_t i, const Scalars& s) {
    return rmsprop_element<Wd, Centered, Mom>(p, g, lane<F>(b.square_avg, i),
                                              Centered ? lane_ptr<F>(b.grad_avg, i) : nullptr,
                                              Mom ? lane_ptr<F>(b.momentum_buffer, i) : nullptr, s);
  }
};

template <>
struct Kernel<RMSprop> : ElementKernel<RMSprop, RmspropBuffers, RmspropScalars> {
  static Scalars scalars(const RMSprop& o, std::int64_t, double grad_mul) {
    return make_rmsprop_scalars(o.lr, o.alpha, o.eps, o.weight_decay, o.momentum, o.centered,
                                o.maximize, grad_mul);
  }
  template <class F>
  static bool modes(const Scalars& s, F&& f) {
    return detail::with_flags(
        [&]<bool Wd, bool Centered, bool Mom>() {
          return f.template operator()<RmspropStep<Wd, Centered, Mom>>();
        },
        s.weight_decay != 0.0f, s.centered, s.momentum != 0.0f);
  }
};

}  // namespace shardopt::kernels
