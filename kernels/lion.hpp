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
#include <span>

#include "kernels/dispatch.hpp"
#include "kernels/element.hpp"
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
SHARDOPT_HOST_DEVICE inline bool lion_element(float& p, float g, float& m, const LionScalars& s) {
  g = g * s.grad_mul;
  const bool finite = is_finite_bits(g);
  g = g * s.grad_sign;
  p = p * s.decay;                                          // p.mul_(1 - lr * wd)
  const float c = fmaf(s.one_minus_beta1, g, m * s.beta1);  // m * b1 + (1 - b1) * g
  // sign(c): +-1, zero stays zero and NaN stays NaN, as torch.sign.
  const float sign = c > 0.0f ? 1.0f : c < 0.0f ? -1.0f : c;
  p = fmaf(s.neg_lr, sign, p);                  // p.add_(sign(c), alpha=-lr): exact product
  m = fmaf(s.one_minus_beta2, g, m * s.beta2);  // m.mul_(b2).add_(g, alpha=1 - b2)
  return finite;
}

// The buffers of one Lion step over n elements: StepBuffers'
// (kernels/element.hpp) and
//   exp_avg:   the momentum, read and written
struct LionBuffers : StepBuffers {
  float* exp_avg = nullptr;

  // Calls f(pointer, bytes per element, access) on every buffer, null ones
  // included: StepBuffers' and the states.
  template <class F>
  SHARDOPT_HOST_DEVICE constexpr void each_buffer(F&& f) {
    each_step_buffer(f, [&] { f(exp_avg, 4, Access::read_write); });
  }
};

}  // namespace shardopt::kernels

namespace shardopt::kernels::detail {

template <class G, class P>
struct LionLoop {
  // The gradient type and parameter storage, and the same loop over others
  // (kernels/cpu/runner.hpp stages 16-bit buffers through fp32 blocks).
  using Grad = G;
  using Storage = P;
  template <class G2, class P2>
  using Rebind = LionLoop<G2, P2>;
  // Updates [begin, end); returns true if every gradient there was finite.
  [[gnu::always_inline]] static inline bool range(const LionBuffers& b, const LionScalars& s,
                                                  std::size_t begin, std::size_t end) {
    float* __restrict p = b.param;
    typename P::Copy* __restrict copy = static_cast<typename P::Copy*>(b.param_out);
    std::uint16_t* __restrict rem = b.remainder;
    const G* __restrict g = static_cast<const G*>(b.grad);
    float* __restrict m = b.exp_avg;
    return for_range<force_simd<G, P>>(
        begin, end, [&](std::size_t i) __attribute__((always_inline)) {
          float pi = P::load(p, copy, rem, i);
          const bool finite = lion_element(pi, load_grad(g, i), m[i], s);
          P::store(p, copy, rem, i, pi);
          return finite;
        });
  }
  SHARDOPT_HOST_DEVICE static bool apply(const LionBuffers& b, const LionScalars& s,
                                         std::size_t i) {
    typename P::Copy* copy = static_cast<typename P::Copy*>(b.param_out);
    float p = P::load(b.param, copy, b.remainder, i);
    float m = b.exp_avg[i];
    const bool finite = lion_element(p, load_grad(static_cast<const G*>(b.grad), i), m, s);
    P::store(b.param, copy, b.remainder, i, p);
    b.exp_avg[i] = m;
    return finite;
  }
};

// Calls f.template operator()<LionLoop<...>>() for the step's types.
template <class F>
bool dispatch_lion(const LionBuffers& b, const LionScalars&, F&& f) {
  return dispatch_types(
      b.grad_type, b.param_out, b.param_out_type, b.remainder,
      [&]<class G, class P>() { return f.template operator()<LionLoop<G, P>>(); });
}

}  // namespace shardopt::kernels::detail

namespace shardopt::kernels {

template <>
struct Kernel<Lion> {
  using Family = Lion;
  using Buffers = LionBuffers;
  using Scalars = LionScalars;
  static Scalars scalars(const Lion& o, std::int64_t, double grad_mul) {
    return make_lion_scalars(o.lr, o.betas.first, o.betas.second, o.weight_decay, o.maximize,
                             grad_mul);
  }
  static void set_states(Buffers& b, float* const* states) { b.exp_avg = states[0]; }
  template <class F>
  static bool dispatch(const Buffers& b, const Scalars& s, F&& f) {
    return detail::dispatch_lion(b, s, f);
  }
};

}  // namespace shardopt::kernels
