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
#include <span>

#include "kernels/dispatch.hpp"
#include "kernels/element.hpp"
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
template <bool Wd>
SHARDOPT_HOST_DEVICE inline bool adagrad_element(float& p, float g, float& sum,
                                                 const AdagradScalars& s) {
  g = g * s.grad_mul;
  const bool finite = is_finite_bits(g);
  g = g * s.grad_sign;
  if constexpr (Wd) g = fmaf(s.weight_decay, p, g);  // grad.add(param, alpha=wd)
  sum = fmaf(g, g, sum);                             // state_sum.addcmul_(grad, grad, value=1)
  const float std_ = sqrtf(sum) + s.eps;             // state_sum.sqrt().add_(eps)
  p = p + (s.neg_clr * g) / std_;                    // param.addcdiv_(grad, std, value=-clr)
  return finite;
}

// The buffers of one Adagrad step over n elements: StepBuffers'
// (kernels/element.hpp) and
//   sum:       the sum of squared gradients, read and written
struct AdagradBuffers : StepBuffers {
  float* sum = nullptr;

  // Calls f(pointer, bytes per element, access) on every buffer, null ones
  // included: StepBuffers' and the states.
  template <class F>
  SHARDOPT_HOST_DEVICE constexpr void each_buffer(F&& f) {
    each_step_buffer(f, [&] { f(sum, 4, Access::read_write); });
  }
};

}  // namespace shardopt::kernels

namespace shardopt::kernels::detail {

template <class G, class P, bool Wd>
struct AdagradLoop {
  // The gradient type and parameter storage, and the same loop over others
  // (kernels/cpu/runner.hpp stages 16-bit buffers through fp32 blocks).
  using Grad = G;
  using Storage = P;
  template <class G2, class P2>
  using Rebind = AdagradLoop<G2, P2, Wd>;
  // Updates [begin, end); returns true if every gradient there was finite.
  [[gnu::always_inline]] static inline bool range(const AdagradBuffers& b, const AdagradScalars& s,
                                                  std::size_t begin, std::size_t end) {
    float* __restrict p = b.param;
    typename P::Copy* __restrict copy = static_cast<typename P::Copy*>(b.param_out);
    std::uint16_t* __restrict rem = b.remainder;
    const G* __restrict g = static_cast<const G*>(b.grad);
    float* __restrict sum = b.sum;
    return for_range<force_simd<G, P>>(
        begin, end, [&](std::size_t i) __attribute__((always_inline)) {
          float pi = P::load(p, copy, rem, i);
          const bool finite = adagrad_element<Wd>(pi, load_grad(g, i), sum[i], s);
          P::store(p, copy, rem, i, pi);
          return finite;
        });
  }
  SHARDOPT_HOST_DEVICE static bool apply(const AdagradBuffers& b, const AdagradScalars& s,
                                         std::size_t i) {
    typename P::Copy* copy = static_cast<typename P::Copy*>(b.param_out);
    float p = P::load(b.param, copy, b.remainder, i);
    float sum = b.sum[i];
    const bool finite = adagrad_element<Wd>(p, load_grad(static_cast<const G*>(b.grad), i), sum, s);
    P::store(b.param, copy, b.remainder, i, p);
    b.sum[i] = sum;
    return finite;
  }
};

// Calls f.template operator()<AdagradLoop<...>>() for the step's types and modes.
template <class F>
bool dispatch_adagrad(const AdagradBuffers& b, const AdagradScalars& s, F&& f) {
  return dispatch_types(
      b.grad_type, b.param_out, b.param_out_type, b.remainder, [&]<class G, class P>() {
        return with_flags([&]<bool Wd>() { return f.template operator()<AdagradLoop<G, P, Wd>>(); },
                          s.weight_decay != 0.0f);
      });
}

}  // namespace shardopt::kernels::detail

namespace shardopt::kernels {

template <>
struct Kernel<Adagrad> {
  using Family = Adagrad;
  using Buffers = AdagradBuffers;
  using Scalars = AdagradScalars;
  static Scalars scalars(const Adagrad& o, std::int64_t step, double grad_mul) {
    return make_adagrad_scalars(o.lr, o.lr_decay, o.weight_decay, o.eps, o.maximize, step,
                                grad_mul);
  }
  static void set_states(Buffers& b, float* const* states) { b.sum = states[0]; }
  template <class F>
  static bool dispatch(const Buffers& b, const Scalars& s, F&& f) {
    return detail::dispatch_adagrad(b, s, f);
  }
};

}  // namespace shardopt::kernels
