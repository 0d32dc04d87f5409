// shardopt kernels: Adagrad, one fused pass over a contiguous range.
//
// adagrad_element() is the single definition of the per-element math, called
// by the reference, CPU and CUDA kernels. It follows torch.optim.Adagrad
// (PyTorch 1.13, single-tensor path) operation by operation, with fused
// multiply-adds where PyTorch's CPU kernels have them and nowhere else, so it
// matches PyTorch's CPU trajectory bitwise (tests/data/golden/README.md).
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
struct AdagradScalars {
  float neg_clr;  // -lr / (1 + (step - 1) * lr_decay)
  float eps;
  float weight_decay;  // L2: added to the gradient
  float grad_sign;     // -1 when maximizing, else 1
  float grad_mul;      // applied to the gradient first: 1 / loss_scale * clip_coef
};

// step is the count after this step (1 for the first).
inline AdagradScalars make_adagrad_scalars(double lr, double lr_decay, double weight_decay,
                                           double eps, bool maximize, std::int64_t step,
                                           double grad_mul) {
  AdagradScalars s{};
  const double clr = lr / (1.0 + static_cast<double>(step - 1) * lr_decay);
  s.neg_clr = static_cast<float>(-clr);
  s.eps = static_cast<float>(eps);
  s.weight_decay = static_cast<float>(weight_decay);
  s.grad_sign = maximize ? -1.0f : 1.0f;
  s.grad_mul = static_cast<float>(grad_mul);
  return s;
}

// One element: p and sum updated in place; g is the gradient as stored,
// converted to float. Wd is weight_decay != 0. Returns whether the gradient
// (after grad_mul) is finite.
template <bool Wd, class F>
SHARDOPT_HOST_DEVICE SHARDOPT_FORCE_INLINE auto adagrad_element(F& p, F g, F& sum,
                                                                const AdagradScalars& s) {
  g = g * s.grad_mul;
  const auto finite = finite_op(g);
  g = g * s.grad_sign;
  if constexpr (Wd) g = fma_op(s.weight_decay, p, g);  // grad.add(param, alpha=wd)
  sum = fma_op(g, g, sum);                             // state_sum.addcmul_(grad, grad, value=1)
  const F std_ = sqrt_op(sum) + s.eps;                 // state_sum.sqrt().add_(eps)
  p = p + (s.neg_clr * g) / std_;                      // param.addcdiv_(grad, std, value=-clr)
  return finite;
}

// The buffers of one Adagrad step over n elements: StepBuffers'
// (kernels/element.hpp) and
//   sum:       the sum of squared gradients, read and written
struct AdagradBuffers : StateBuffers<AdagradBuffers> {
  float* sum = nullptr;

  template <class F>
  SHARDOPT_HOST_DEVICE SHARDOPT_FORCE_INLINE constexpr void each_state(F&& f) {
    f(sum);
  }
};

// One element of an Adagrad step, with or without weight decay
// (kernels/element_loop.hpp).
template <bool Wd>
struct AdagradStep : StepTypes<AdagradBuffers, AdagradScalars> {
  template <class F>
  SHARDOPT_HOST_DEVICE SHARDOPT_FORCE_INLINE static auto apply(F& p, F g, const Buffers& b,
                                                               std::size_t i, const Scalars& s) {
    return adagrad_element<Wd>(p, g, lane<F>(b.sum, i), s);
  }
};

template <>
struct Kernel<Adagrad> : ElementKernel<Adagrad, AdagradBuffers, AdagradScalars> {
  static Scalars scalars(const Adagrad& o, std::int64_t step, double grad_mul) {
    return make_adagrad_scalars(o.lr, o.lr_decay, o.weight_decay, o.eps, o.maximize, step,
                                grad_mul);
  }
  template <class F>
  static bool modes(const Scalars& s, F&& f) {
    return detail::with_flags([&]<bool Wd>() { return f.template operator()<AdagradStep<Wd>>(); },
                              s.weight_decay != 0.0f);
  }
};

}  // namespace shardopt::kernels
