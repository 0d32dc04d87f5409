// shardopt kernels: Lion (Chen et al. 2023, "Symbolic Discovery of
// Optimization Algorithms"), one fused pass over a contiguous range.
//
// lion_element() is the single definition of the per-element math, called by
// the reference, CPU and CUDA kernels. torch 1.13 has no Lion; the order of
// operations is that of the common PyTorch implementation (decoupled decay,
// then the signed interpolation, then the momentum update), in float32 with
// the scalars rounded from double.
#pragma once

#include <cmath>
#include <cstddef>
#include <cstdint>

#include "kernels/element_loop.hpp"
#include "kernels/optimizer.hpp"
#include "shardopt/optimizers.hpp"
#include "shardopt/types.hpp"

namespace shardopt::kernels {

struct LionScalars {
  float neg_lr;  // -lr
  float beta1, one_minus_beta1;
  float beta2, one_minus_beta2;
  float decay;      // 1 - lr * weight_decay
  float grad_sign;  // -1 when maximizing, else 1
  float grad_mul;   // applied to the gradient first: 1 / loss_scale * clip_coef
};

inline LionScalars make_lion_scalars(double lr, double beta1, double beta2, double weight_decay,
                                     bool maximize, double grad_mul) {
  LionScalars s{};
  s.neg_lr = static_cast<float>(-lr);
  s.beta1 = static_cast<float>(beta1);
  s.one_minus_beta1 = static_cast<float>(1.0 - beta1);
  s.beta2 = static_cast<float>(beta2);
  s.one_minus_beta2 = static_cast<float>(1.0 - beta2);
  s.decay = static_cast<float>(1.0 - lr * weight_decay);
  s.grad_sign = maximize ? -1.0f : 1.0f;
  s.grad_mul = static_cast<float>(grad_mul);
  return s;
}

// One element: p and m updated in place. Returns whether the gradient
// (after grad_mul) is finite.
template <class F>
SHARDOPT_HOST_DEVICE SHARDOPT_FORCE_INLINE auto lion_element(F& p, F g, F& m,
                                                             const LionScalars& s) {
  g = g * s.grad_mul;
  const auto finite = finite_op(g);
  g = g * s.grad_sign;
  p = p * s.decay;                                        // p.mul_(1 - lr * wd)
  const F c = fma_op(s.one_minus_beta1, g, m * s.beta1);  // m * b1 + (1 - b1) * g
  // sign(c): +-1, zero stays zero and NaN stays NaN, as torch.sign.
  const F sign = select_op(c > 0.0f, splat<F>(1.0f), select_op(c < 0.0f, splat<F>(-1.0f), c));
  p = fma_op(s.neg_lr, sign, p);                  // p.add_(sign(c), alpha=-lr): exact product
  m = fma_op(s.one_minus_beta2, g, m * s.beta2);  // m.mul_(b2).add_(g, alpha=1 - b2)
  return finite;
}

// The buffers of one Lion step over n elements: StepBuffers'
// (kernels/element.hpp) and
//   exp_avg:   the momentum, read and written
struct LionBuffers : StateBuffers<LionBuffers> {
  float* exp_avg = nullptr;

  template <class F>
  SHARDOPT_HOST_DEVICE SHARDOPT_FORCE_INLINE constexpr void each_state(F&& f) {
    f(exp_avg);
  }
};

// One element of a Lion step (kernels/element_loop.hpp).
struct LionStep : StepTypes<LionBuffers, LionScalars> {
  template <class F>
  SHARDOPT_HOST_DEVICE SHARDOPT_FORCE_INLINE static auto apply(F& p, F g, const Buffers& b,
                                                               std::size_t i, const Scalars& s) {
    return lion_element(p, g, lane<F>(b.exp_avg, i), s);
  }
};

template <>
struct Kernel<Lion> : ElementKernel<Lion, LionBuffers, LionScalars> {
  static Scalars scalars(const Lion& o, std::int64_t, double grad_mul) {
    return make_lion_scalars(o.lr, o.betas.first, o.betas.second, o.weight_decay, o.maximize,
                             grad_mul);
  }
  template <class F>
  static bool modes(const Scalars&, F&& f) {
    return f.template operator()<LionStep>();
  }
};

}  // namespace shardopt::kernels
