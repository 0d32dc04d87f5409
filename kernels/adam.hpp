// shardopt kernels: Adam and AdamW, one fused pass over a contiguous range.
//
// The per-element math is adam_element(), the single definition the
// reference, CPU and CUDA kernels all call. It follows torch.optim.Adam /
// AdamW (PyTorch 1.13) operation by operation, with fused multiply-adds
// exactly where PyTorch's CPU kernels use them (add_ with alpha, addcmul_)
// and nowhere else: contraction is explicit (fmaf), the compilers may not
// add their own (-ffp-contract=off, nvcc --fmad=false). So the reference, CPU
// and CUDA kernels agree bitwise, and with PyTorch's CPU trajectory too
// (tests/data/golden).
#pragma once

#include <cmath>
#include <cstddef>
#include <cstdint>

#include "kernels/element_loop.hpp"
#include "kernels/moments.hpp"
#include "kernels/optimizer.hpp"
#include "shardopt/optimizers.hpp"
#include "shardopt/types.hpp"

namespace shardopt::kernels {

// The scalars of one step: the moments' (kernels/moments.hpp) and
struct AdamScalars : MomentScalars {
  float bias_correction2_sqrt;  // sqrt(1 - beta2^step)
  float neg_step_size;          // -lr / (1 - beta1^step)
  bool amsgrad;
};

// step is the count after this step (1 for the first).
inline AdamScalars make_adam_scalars(double lr, double beta1, double beta2, double eps,
                                     double weight_decay, bool decoupled, bool amsgrad,
                                     bool maximize, std::int64_t step, double grad_mul) {
  AdamScalars s{};
  static_cast<MomentScalars&>(s) =
      make_moment_scalars(lr, {beta1, beta2}, eps, weight_decay, decoupled, maximize, grad_mul);
  const double bc1 = 1.0 - std::pow(beta1, static_cast<double>(step));
  const double bc2 = 1.0 - std::pow(beta2, static_cast<double>(step));
  s.bias_correction2_sqrt = static_cast<float>(std::sqrt(bc2));
  s.neg_step_size = static_cast<float>(-(lr / bc1));
  s.amsgrad = amsgrad;
  return s;
}

// One element (F float, or a vector of lanes: kernels/element.hpp). p, m, v
// (and vmax when amsgrad) are updated in place; g is the gradient as stored,
// already converted to float. W and Ams are the
// step's wd_mode and amsgrad, as template arguments so that the loops
// carry no branches. Returns whether the gradient (after grad_mul) is finite.
template <WeightDecay W, bool Ams, class F>
SHARDOPT_HOST_DEVICE SHARDOPT_FORCE_INLINE auto adam_element(F& p, F g, F& m, F& v, F* vmax,
                                                             const AdamScalars& s) {
  const auto finite = update_moments<W>(p, g, m, v, s);
  F second = v;
  if constexpr (Ams) {
    // torch.maximum; a NaN in v propagates through p anyway
    *vmax = select_op(*vmax < v, v, *vmax);
    second = *vmax;
  }
  const F denom = sqrt_op(second) / s.bias_correction2_sqrt + s.eps;
  p = p + (s.neg_step_size * m) / denom;  // addcdiv_(m, denom, -step)
  return finite;
}

// The buffers of one Adam step over n elements: StepBuffers'
// (kernels/element.hpp) and
//   exp_avg:        first moment, read and written
//   exp_avg_sq:     second moment, read and written
//   max_exp_avg_sq: running maximum of exp_avg_sq, read and written; only with amsgrad
struct AdamBuffers : StateBuffers<AdamBuffers> {
  float* exp_avg = nullptr;
  float* exp_avg_sq = nullptr;
  float* max_exp_avg_sq = nullptr;

  template <class F>
  SHARDOPT_HOST_DEVICE SHARDOPT_FORCE_INLINE constexpr void each_state(F&& f) {
    f(exp_avg);
    f(exp_avg_sq);
    f(max_exp_avg_sq);
  }
};

// One element of an Adam step of the given modes (kernels/element_loop.hpp).
template <WeightDecay W, bool Ams>
struct AdamStep : StepTypes<AdamBuffers, AdamScalars> {
  template <class F>
  SHARDOPT_HOST_DEVICE SHARDOPT_FORCE_INLINE static auto apply(F& p, F g, const Buffers& b,
                                                               std::size_t i, const Scalars& s) {
    return adam_element<W, Ams>(p, g, lane<F>(b.exp_avg, i), lane<F>(b.exp_avg_sq, i),
                                Ams ? lane_ptr<F>(b.max_exp_avg_sq, i) : nullptr, s);
  }
};

template <>
struct Kernel<Adam> : ElementKernel<Adam, AdamBuffers, AdamScalars> {
  static Scalars scalars(const Adam& o, std::int64_t step, double grad_mul) {
    return make_adam_scalars(o.lr, o.betas.first, o.betas.second, o.eps, o.weight_decay, false,
                             o.amsgrad, o.maximize, step, grad_mul);
  }
  template <class F>
  static bool modes(const Scalars& s, F&& f) {
    return with_weight_decay(s.wd_mode, [&]<WeightDecay W>() {
      return s.amsgrad ? f.template operator()<AdamStep<W, true>>()
                       : f.template operator()<AdamStep<W, false>>();
    });
  }
};

// AdamW runs Adam's kernels with decoupled weight decay.
template <>
struct Kernel<AdamW> : Kernel<Adam> {
  static Scalars scalars(const AdamW& o, std::int64_t step, double grad_mul) {
    return make_adam_scalars(o.lr, o.betas.first, o.betas.second, o.eps, o.weight_decay, true,
                             o.amsgrad, o.maximize, step, grad_mul);
  }
};

}  // namespace shardopt::kernels
