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
#include <span>

#include "kernels/dispatch.hpp"
#include "kernels/element.hpp"
#include "kernels/optimizer.hpp"
#include "shardopt/optimizers.hpp"
#include "shardopt/types.hpp"

namespace shardopt::kernels {

// How weight decay enters: not at all, as L2 on the gradient (Adam), or
// decoupled, multiplying the parameter (AdamW).
enum class WeightDecay { none, l2, decoupled };

// The scalars of one step, computed in double and rounded to float as
// PyTorch does when a Python float meets a float32 tensor.
struct AdamScalars {
  float beta1, one_minus_beta1;
  float beta2, one_minus_beta2;
  float bias_correction2_sqrt;  // sqrt(1 - beta2^step)
  float eps;
  float neg_step_size;  // -lr / (1 - beta1^step)
  float weight_decay;   // for l2
  float decay;          // 1 - lr * weight_decay, for decoupled
  float grad_sign;      // -1 when maximizing, else 1
  float grad_mul;       // applied to the gradient first: 1 / loss_scale * clip_coef
  WeightDecay wd_mode;
  bool amsgrad;
};

// step is the count after this step (1 for the first).
inline AdamScalars make_adam_scalars(double lr, double beta1, double beta2, double eps,
                                     double weight_decay, bool decoupled, bool amsgrad,
                                     bool maximize, std::int64_t step, double grad_mul) {
  AdamScalars s{};
  s.beta1 = static_cast<float>(beta1);
  s.one_minus_beta1 = static_cast<float>(1.0 - beta1);
  s.beta2 = static_cast<float>(beta2);
  s.one_minus_beta2 = static_cast<float>(1.0 - beta2);
  const double bc1 = 1.0 - std::pow(beta1, static_cast<double>(step));
  const double bc2 = 1.0 - std::pow(beta2, static_cast<double>(step));
  s.bias_correction2_sqrt = static_cast<float>(std::sqrt(bc2));
  s.eps = static_cast<float>(eps);
  s.neg_step_size = static_cast<float>(-(lr / bc1));
  s.weight_decay = static_cast<float>(weight_decay);
  s.decay = static_cast<float>(1.0 - lr * weight_decay);
  s.grad_sign = maximize ? -1.0f : 1.0f;
  s.grad_mul = static_cast<float>(grad_mul);
  s.wd_mode = weight_decay == 0.0 ? WeightDecay::none
              : decoupled         ? WeightDecay::decoupled
                                  : WeightDecay::l2;
  s.amsgrad = amsgrad;
  return s;
}

// One element. p, m, v (and vmax when amsgrad) are updated in place; g is
// the gradient as stored, already converted to float. W and Ams are the
// step's wd_mode and amsgrad, as template arguments so that the loops
// carry no branches. Returns whether the gradient (after grad_mul) is finite.
template <WeightDecay W, bool Ams>
SHARDOPT_HOST_DEVICE inline bool adam_element(float& p, float g, float& m, float& v, float* vmax,
                                              const AdamScalars& s) {
  g = g * s.grad_mul;
  const bool finite = is_finite_bits(g);
  g = g * s.grad_sign;
  if constexpr (W == WeightDecay::decoupled) p = p * s.decay;          // param.mul_(1 - lr*wd)
  if constexpr (W == WeightDecay::l2) g = fmaf(s.weight_decay, p, g);  // grad.add(param, alpha=wd)
  m = fmaf(s.one_minus_beta1, g, m * s.beta1);                         // mul_(b1).add_(g, 1-b1)
  v = fmaf(s.one_minus_beta2 * g, g, v * s.beta2);  // mul_(b2).addcmul_(g, g, 1-b2)
  float second = v;
  if constexpr (Ams) {
    *vmax = *vmax < v ? v : *vmax;  // torch.maximum; a NaN in v propagates through p anyway
    second = *vmax;
  }
  const float denom = sqrtf(second) / s.bias_correction2_sqrt + s.eps;
  p = p + (s.neg_step_size * m) / denom;  // addcdiv_(m, denom, -step)
  return finite;
}

// The buffers of one Adam step over n elements: StepBuffers'
// (kernels/element.hpp) and
//   exp_avg:        first moment, read and written
//   exp_avg_sq:     second moment, read and written
//   max_exp_avg_sq: running maximum of exp_avg_sq, read and written; only with amsgrad
struct AdamBuffers : StepBuffers {
  float* exp_avg = nullptr;
  float* exp_avg_sq = nullptr;
  float* max_exp_avg_sq = nullptr;

  // Calls f(pointer, bytes per element, access) on every buffer, null ones
  // included: StepBuffers' and the states.
  template <class F>
  SHARDOPT_HOST_DEVICE constexpr void each_buffer(F&& f) {
    each_step_buffer(f, [&] {
      f(exp_avg, 4, Access::read_write);
      f(exp_avg_sq, 4, Access::read_write);
      f(max_exp_avg_sq, 4, Access::read_write);
    });
  }
};

}  // namespace shardopt::kernels

namespace shardopt::kernels::detail {

template <class G, class P, WeightDecay W, bool Ams>
struct AdamLoop {
  // The gradient type and parameter storage, and the same loop over others
  // (kernels/cpu/runner.hpp stages 16-bit buffers through fp32 blocks).
  using Grad = G;
  using Storage = P;
  template <class G2, class P2>
  using Rebind = AdamLoop<G2, P2, W, Ams>;
  // Updates [begin, end); returns true if every gradient there was finite.
  [[gnu::always_inline]] static inline bool range(const AdamBuffers& b, const AdamScalars& s,
                                                  std::size_t begin, std::size_t end) {
    float* __restrict p = b.param;
    typename P::Copy* __restrict copy = static_cast<typename P::Copy*>(b.param_out);
    std::uint16_t* __restrict rem = b.remainder;
    const G* __restrict g = static_cast<const G*>(b.grad);
    float* __restrict m = b.exp_avg;
    float* __restrict v = b.exp_avg_sq;
    float* __restrict vmax = b.max_exp_avg_sq;
    return for_range<force_simd<G, P>>(
        begin, end, [&](std::size_t i) __attribute__((always_inline)) {
          float pi = P::load(p, copy, rem, i);
          const bool finite =
              adam_element<W, Ams>(pi, load_grad(g, i), m[i], v[i], Ams ? vmax + i : nullptr, s);
          P::store(p, copy, rem, i, pi);
          return finite;
        });
  }
  SHARDOPT_HOST_DEVICE static bool apply(const AdamBuffers& b, const AdamScalars& s,
                                         std::size_t i) {
    typename P::Copy* copy = static_cast<typename P::Copy*>(b.param_out);
    float p = P::load(b.param, copy, b.remainder, i), m = b.exp_avg[i], v = b.exp_avg_sq[i];
    const bool finite = adam_element<W, Ams>(p, load_grad(static_cast<const G*>(b.grad), i), m, v,
                                             Ams ? b.max_exp_avg_sq + i : nullptr, s);
    P::store(b.param, copy, b.remainder, i, p);
    b.exp_avg[i] = m;
    b.exp_avg_sq[i] = v;
    return finite;
  }
};

// Calls f.template operator()<AdamLoop<...>>() for the step's types and modes.
template <class F>
bool dispatch_adam(const AdamBuffers& b, const AdamScalars& s, F&& f) {
  return dispatch_types(b.grad_type, b.param_out, b.param_out_type, b.remainder,
                        [&]<class G, class P>() {
                          auto with_ams = [&]<WeightDecay W>() {
                            return s.amsgrad ? f.template operator()<AdamLoop<G, P, W, true>>()
                                             : f.template operator()<AdamLoop<G, P, W, false>>();
                          };
                          switch (s.wd_mode) {
                            case WeightDecay::l2:
                              return with_ams.template operator()<WeightDecay::l2>();
                            case WeightDecay::decoupled:
                              return with_ams.template operator()<WeightDecay::decoupled>();
                            default:
                              return with_ams.template operator()<WeightDecay::none>();
                          }
                        });
}

}  // namespace shardopt::kernels::detail

namespace shardopt::kernels {

template <>
struct Kernel<Adam> {
  using Family = Adam;
  using Buffers = AdamBuffers;
  using Scalars = AdamScalars;
  static Scalars scalars(const Adam& o, std::int64_t step, double grad_mul) {
    return make_adam_scalars(o.lr, o.betas.first, o.betas.second, o.eps, o.weight_decay, false,
                             o.amsgrad, o.maximize, step, grad_mul);
  }
  static void set_states(Buffers& b, float* const* states) {
    b.exp_avg = states[0];
    b.exp_avg_sq = states[1];
    b.max_exp_avg_sq = states[2];
  }
  template <class F>
  static bool dispatch(const Buffers& b, const Scalars& s, F&& f) {
    return detail::dispatch_adam(b, s, f);
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
