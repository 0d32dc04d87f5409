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
#include <span>

#include "kernels/element.hpp"
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
template <bool Wd, bool Mom>
SHARDOPT_HOST_DEVICE inline bool sgd_element(float& p, float g, float* buf, const SgdScalars& s) {
  g = g * s.grad_mul;
  const bool finite = is_finite_bits(g);
  g = g * s.grad_sign;
  if constexpr (Wd) g = fmaf(s.weight_decay, p, g);  // d_p.add(param, alpha=wd)
  if constexpr (Mom) {
    // buf.mul_(momentum).add_(d_p, alpha=1 - dampening), or clone(d_p) on step 1
    *buf = s.first_step ? g : fmaf(s.one_minus_dampening, g, *buf * s.momentum);
    g = s.nesterov ? fmaf(s.momentum, *buf, g) : *buf;  // d_p.add(buf, alpha=momentum)
  }
  p = fmaf(s.neg_lr, g, p);  // param.add_(d_p, alpha=-lr)
  return finite;
}

// The buffers of one SGD step over n elements: StepBuffers'
// (kernels/element.hpp) and
//   momentum_buffer: read and written when momentum != 0; only written on the first step
struct SgdBuffers : StepBuffers {
  float* momentum_buffer = nullptr;

  // Calls f(pointer, bytes per element, access) on every buffer, null ones
  // included: StepBuffers' and the states.
  // The momentum buffer is only written on a step with momentum's first step
  // (SgdLoop::each_buffer passes `momentum` = Access::write then).
  template <class F>
  SHARDOPT_HOST_DEVICE constexpr void each_buffer(F&& f, Access momentum = Access::read_write) {
    each_step_buffer(f, [&] { f(momentum_buffer, 4, momentum); });
  }
};

// Each returns true if every gradient was finite (after grad_mul); the
// update is applied either way.
namespace reference {
bool sgd(const SgdBuffers& b, const SgdScalars& s);
}
namespace cpu {
// OpenMP across threads, AVX-512 / AVX2 / baseline chosen at run time.
bool sgd(const SgdBuffers& b, const SgdScalars& s);
}  // namespace cpu
namespace cuda {
// Device buffers; `stream` is a cudaStream_t (null: the default stream).
// Synchronous. Throws NotCompiledError in a build without CUDA.
bool sgd(const SgdBuffers& b, const SgdScalars& s, void* stream);
// The same step on a list of tensors, one SgdBuffers each (device buffers,
// not overlapping), with the same scalars: one launch per group of tensors
// of the same types and modes, or a few for long lists
// (kernels/cuda/multi_tensor.cuh). Synchronous; true if every gradient was
// finite.
bool sgd(std::span<const SgdBuffers> tensors, const SgdScalars& s, void* stream);
}  // namespace cuda

}  // namespace shardopt::kernels
