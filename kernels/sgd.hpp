// shardopt kernels: SGD with momentum, dampening, Nesterov, weight decay and
// maximize, one fused pass over a contiguous range.
//
// sgd_element() is the single definition of the per-element math, called by
// the reference, CPU and CUDA kernels. It follows torch.optim.SGD (PyTorch
// 1.13, single-tensor path) operation by operation, with fused
// multiply-adds where PyTorch's CPU kernels have them (add_ with alpha) and
// nowhere else, so it matches PyTorch's CPU trajectory bitwise
// (tests/data/golden/README.md gives the formulas).
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
// PyTorch does when a Python float meets a float32 tensor.
struct SgdScalars {
  float neg_lr;               // -lr
  float momentum;             // 0: no momentum buffer
  float one_minus_dampening;  // 1 - dampening
  float weight_decay;         // L2: added to the gradient
  float grad_sign;            // -1 when maximizing, else 1
  float grad_mul;             // applied to the gradient first: 1 / loss_scale * clip_coef
  bool nesterov;
  // The momentum buffer's first step: it becomes a copy of the (decayed)
  // gradient, without dampening, as torch's momentum_buffer = clone(d_p).
  bool first_step;
};

// step is the count after this step (1 for the first).
inline SgdScalars make_sgd_scalars(double lr, double momentum, double dampening,
                                   double weight_decay, bool nesterov, bool maximize,
                                   std::int64_t step, double grad_mul) {
  SgdScalars s{};
  s.neg_lr = static_cast<float>(-lr);
  s.momentum = static_cast<float>(momentum);
  s.one_minus_dampening = static_cast<float>(1.0 - dampening);
  s.weight_decay = static_cast<float>(weight_decay);
  s.grad_sign = maximize ? -1.0f : 1.0f;
  s.grad_mul = static_cast<float>(grad_mul);
  s.nesterov = nesterov;
  s.first_step = step <= 1;
  return s;
}

// One element: p and, with momentum, *buf updated in place; g is the
// gradient as stored, converted to float. Wd (weight_decay != 0) and Mom
// (momentum != 0) are template arguments so that the loops carry no
// branches. Returns whether the gradient (after grad_mul) is finite.
template <bool Wd, bool Mom, class F>
SHARDOPT_HOST_DEVICE SHARDOPT_FORCE_INLINE auto sgd_element(F& p, F g, F* buf,
                                                            const SgdScalars& s) {
  g = g * s.grad_mul;
  const auto finite = finite_op(g);
  g = g * s.grad_sign;
  if constexpr (Wd) g = fma_op(s.weight_decay, p, g);  // d_p.add(param, alpha=wd)
  if constexpr (Mom) {
    // buf.mul_(momentum).add_(d_p, alpha=1 - dampening), or clone(d_p) on step 1
    *buf = s.first_step ? g : fma_op(s.one_minus_dampening, g, *buf * s.momentum);
    g = s.nesterov ? fma_op(s.momentum, *buf, g) : *buf;  // d_p.add(buf, alpha=momentum)
  }
  p = fma_op(s.neg_lr, g, p);  // param.add_(d_p, alpha=-lr)
  return finite;
}

// The buffers of one SGD step over n elements: StepBuffers'
// (kernels/element.hpp) and
//   momentum_buffer: read and written when momentum != 0; only written on the first step
struct SgdBuffers : StateBuffers<SgdBuffers> {
  float* momentum_buffer = nullptr;

  template <class F>
  SHARDOPT_HOST_DEVICE SHARDOPT_FORCE_INLINE constexpr void each_state(F&& f) {
    f(momentum_buffer);
  }
};

// One element of an SGD step of the given modes (kernels/element_loop.hpp).
template <bool Wd, bool Mom>
struct SgdStep : StepTypes<SgdBuffers, SgdScalars> {
  // GCC vectorizes this loop on its own and forcing it slows the fp32 one;
  // it declines to vectorize it with bf16, whose buffers are staged then
  // (kernels/cpu/runner.hpp).
  static constexpr bool plain_loop = true;
  // sgd_element reads the momentum buffer only after the first step.
  template <class F>
  SHARDOPT_HOST_DEVICE SHARDOPT_FORCE_INLINE static auto apply(F& p, F g, const Buffers& b,
                                                               std::size_t i, const Scalars& s) {
    return sgd_element<Wd, Mom>(p, g, Mom ? lane_ptr<F>(b.momentum_buffer, i) : nullptr, s);
  }
  // The buffers and how this step uses them (the CUDA kernels' vector
  // loads): with momentum, the first step only writes the momentum buffer.
  template <class F>
  SHARDOPT_HOST_DEVICE static void each_buffer(Buffers& b, const Scalars& s, F&& f) {
    b.each_step_buffer(f, [&] {
      f(b.momentum_buffer, 4, Mom && s.first_step ? Access::write : Access::read_write);
    });
  }
};

template <>
struct Kernel<SGD> : ElementKernel<SGD, SgdBuffers, SgdScalars> {
  static Scalars scalars(const SGD& o, std::int64_t step, double grad_mul) {
    return make_sgd_scalars(o.lr, o.momentum, o.dampening, o.weight_decay, o.nesterov, o.maximize,
                            step, grad_mul);
  }
  template <class F>
  static bool modes(const Scalars& s, F&& f) {
    return detail::with_flags(
        [&]<bool Wd, bool Mom>() { return f.template operator()<SgdStep<Wd, Mom>>(); },
        s.weight_decay != 0.0f, s.momentum != 0.0f);
  }
};

}  // namespace shardopt::kernels
