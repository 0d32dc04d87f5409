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

#include "kernels/element.hpp"
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

// Each returns true if every gradient was finite (after grad_mul); the
// update is applied either way.
namespace reference {
bool adagrad(const AdagradBuffers& b, const AdagradScalars& s);
}
namespace cpu {
// OpenMP across threads, AVX-512 / AVX2 / baseline chosen at run time.
bool adagrad(const AdagradBuffers& b, const AdagradScalars& s);
}  // namespace cpu
namespace cuda {
// Device buffers; `stream` is a cudaStream_t (null: the default stream).
// Synchronous. Throws NotCompiledError in a build without CUDA.
bool adagrad(const AdagradBuffers& b, const AdagradScalars& s, void* stream);
// The same step on a list of tensors, one AdagradBuffers each (device buffers,
// not overlapping), with the same scalars: one launch per group of tensors
// of the same types and modes, or a few for long lists
// (kernels/cuda/multi_tensor.cuh). Synchronous; true if every gradient was
// finite.
bool adagrad(std::span<const AdagradBuffers> tensors, const AdagradScalars& s, void* stream);
}  // namespace cuda

}  // namespace shardopt::kernels
