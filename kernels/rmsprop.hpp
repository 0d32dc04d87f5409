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
#include <span>

#include "kernels/dispatch.hpp"
#include "kernels/element.hpp"
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
template <bool Wd, bool Centered, bool Mom>
SHARDOPT_HOST_DEVICE inline bool rmsprop_element(float& p, float g, float& sq, float* grad_avg,
                                                 float* buf, const RmspropScalars& s) {
  g = g * s.grad_mul;
  const bool finite = is_finite_bits(g);
  g = g * s.grad_sign;
  if constexpr (Wd) g = fmaf(s.weight_decay, p, g);   // grad.add(param, alpha=wd)
  sq = fmaf(s.one_minus_alpha * g, g, sq * s.alpha);  // mul_(alpha).addcmul_(g, g, 1-alpha)
  float avg;
  if constexpr (Centered) {
    *grad_avg = fmaf(s.one_minus_alpha, g, *grad_avg * s.alpha);  // mul_(a).add_(g, 1-a)
    avg = sqrtf(fmaf(-*grad_avg, *grad_avg, sq));  // sq.addcmul(ga, ga, value=-1).sqrt_()
  } else {
    avg = sqrtf(sq);
  }
  avg = avg + s.eps;  // add_(eps)
  if constexpr (Mom) {
    *buf = *buf * s.momentum + g / avg;  // buf.mul_(momentum).addcdiv_(grad, avg)
    p = fmaf(s.neg_lr, *buf, p);         // param.add_(buf, alpha=-lr)
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
struct RmspropBuffers : StepBuffers {
  float* square_avg = nullptr;
  float* grad_avg = nullptr;
  float* momentum_buffer = nullptr;

  // Calls f(pointer, bytes per element, access) on every buffer, null ones
  // included: StepBuffers' and the states.
  template <class F>
  SHARDOPT_HOST_DEVICE constexpr void each_buffer(F&& f) {
    each_step_buffer(f, [&] {
      f(square_avg, 4, Access::read_write);
      f(grad_avg, 4, Access::read_write);
      f(momentum_buffer, 4, Access::read_write);
    });
  }
};

}  // namespace shardopt::kernels

namespace shardopt::kernels::detail {

template <class G, class P, bool Wd, bool Centered, bool Mom>
struct RmspropLoop {
  // The gradient type and parameter storage, and the same loop over others
  // (kernels/cpu/runner.hpp stages 16-bit buffers through fp32 blocks).
  using Grad = G;
  using Storage = P;
  template <class G2, class P2>
  using Rebind = RmspropLoop<G2, P2, Wd, Centered, Mom>;
  // Updates [begin, end); returns true if every gradient there was finite.
  [[gnu::always_inline]] static inline bool range(const RmspropBuffers& b, const RmspropScalars& s,
                                                  std::size_t begin, std::size_t end) {
    float* __restrict p = b.param;
    typename P::Copy* __restrict copy = static_cast<typename P::Copy*>(b.param_out);
    std::uint16_t* __restrict rem = b.remainder;
    const G* __restrict g = static_cast<const G*>(b.grad);
    float* __restrict sq = b.square_avg;
    float* __restrict ga = b.grad_avg;
    float* __restrict buf = b.momentum_buffer;
    return for_range<force_simd<G, P>>(
        begin, end, [&](std::size_t i) __attribute__((always_inline)) {
          float pi = P::load(p, copy, rem, i);
          const bool finite = rmsprop_element<Wd, Centered, Mom>(
              pi, load_grad(g, i), sq[i], Centered ? ga + i : nullptr, Mom ? buf + i : nullptr, s);
          P::store(p, copy, rem, i, pi);
          return finite;
        });
  }
  SHARDOPT_HOST_DEVICE static bool apply(const RmspropBuffers& b, const RmspropScalars& s,
                                         std::size_t i) {
    typename P::Copy* copy = static_cast<typename P::Copy*>(b.param_out);
    float p = P::load(b.param, copy, b.remainder, i);
    float sq = b.square_avg[i];
    float ga = Centered ? b.grad_avg[i] : 0.0f;
    float buf = Mom ? b.momentum_buffer[i] : 0.0f;
    const bool finite = rmsprop_element<Wd, Centered, Mom>(
        p, load_grad(static_cast<const G*>(b.grad), i), sq, &ga, &buf, s);
    P::store(b.param, copy, b.remainder, i, p);
    b.square_avg[i] = sq;
    if constexpr (Centered) b.grad_avg[i] = ga;
    if constexpr (Mom) b.momentum_buffer[i] = buf;
    return finite;
  }
};

// Calls f.template operator()<RmspropLoop<...>>() for the step's types and modes.
template <class F>
bool dispatch_rmsprop(const RmspropBuffers& b, const RmspropScalars& s, F&& f) {
  return dispatch_types(
      b.grad_type, b.param_out, b.param_out_type, b.remainder, [&]<class G, class P>() {
        return with_flags(
            [&]<bool Wd, bool Centered, bool Mom>() {
              return f.template operator()<RmspropLoop<G, P, Wd, Centered, Mom>>();
            },
            s.weight_decay != 0.0f, s.centered, s.momentum != 0.0f);
      });
}

}  // namespace shardopt::kernels::detail

namespace shardopt::kernels {

template <>
struct Kernel<RMSprop> {
  using Family = RMSprop;
  using Buffers = RmspropBuffers;
  using Scalars = RmspropScalars;
  static Scalars scalars(const RMSprop& o, std::int64_t, double grad_mul) {
    return make_rmsprop_scalars(o.lr, o.alpha, o.eps, o.weight_decay, o.momentum, o.centered,
                                o.maximize, grad_mul);
  }
  static void set_states(Buffers& b, float* const* states) {
    b.square_avg = states[0];
    b.grad_avg = states[1];
    b.momentum_buffer = states[2];
  }
  template <class F>
  static bool dispatch(const Buffers& b, const Scalars& s, F&& f) {
    return detail::dispatch_rmsprop(b, s, f);
  }
};

}  // namespace shardopt::kernels
