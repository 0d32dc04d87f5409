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

#include "kernels/element.hpp"
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

// Each returns true if every gradient was finite (after grad_mul); the
// update is applied either way.
namespace reference {
bool rmsprop(const RmspropBuffers& b, const RmspropScalars& s);
}
namespace cpu {
// OpenMP across threads, AVX-512 / AVX2 / baseline chosen at run time.
bool rmsprop(const RmspropBuffers& b, const RmspropScalars& s);
}  // namespace cpu
namespace cuda {
// Device buffers; `stream` is a cudaStream_t (null: the default stream).
// Synchronous. Throws NotCompiledError in a build without CUDA.
bool rmsprop(const RmspropBuffers& b, const RmspropScalars& s, void* stream);
// The same step on a list of tensors, one RmspropBuffers each (device buffers,
// not overlapping), with the same scalars: one launch per group of tensors
// of the same types and modes, or a few for long lists
// (kernels/cuda/multi_tensor.cuh). Synchronous; true if every gradient was
// finite.
bool rmsprop(std::span<const RmspropBuffers> tensors, const RmspropScalars& s, void* stream);
}  // namespace cuda

}  // namespace shardopt::kernels
