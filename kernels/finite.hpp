// shardopt kernels: whether every gradient of a range is finite after the
// gradient multiplier, the check a step makes before it is applied (see
// StepOptions::skip_nonfinite) and the ZeRO engine makes on its gradient
// shard before agreeing on the flag across ranks.
//
// An element counts as finite exactly when the optimizers' element functions
// call it finite: the stored gradient converted to float, times grad_mul in
// float (g = g * s.grad_mul, then is_finite_bits(g); kernels/adam.hpp). So a
// finite gradient that overflows after a large grad_mul is not finite, and
// neither is any gradient when grad_mul itself is inf in float.
#pragma once

#include <cstddef>

#include "kernels/element.hpp"
#include "shardopt/types.hpp"

namespace shardopt::kernels {

// Gradient g (converted to float) times grad_mul is neither inf nor nan.
SHARDOPT_HOST_DEVICE inline bool scaled_finite(float g, float grad_mul) {
  return is_finite_bits(g * grad_mul);
}

// Each returns true if scaled_finite(grad[i], grad_mul) for every i < n
// (true for n == 0). grad_type is f32, bf16 or f16; grad_mul is the step's
// multiplier already rounded to float, as make_adam_scalars and the others
// round it.
namespace reference {
bool all_finite(const void* grad, DType grad_type, std::size_t n, float grad_mul);
}
namespace cpu {
// OpenMP slices; per slice the widest vector unit present (f16 through F16C).
bool all_finite(const void* grad, DType grad_type, std::size_t n, float grad_mul);
}  // namespace cpu
namespace cuda {
// Device buffer; `stream` a cudaStream_t (null: the default stream).
// Synchronous. Throws std::runtime_error on a CUDA error.
bool all_finite(const void* grad, DType grad_type, std::size_t n, float grad_mul, void* stream);
// Enqueued on `stream`, returning at once: sets the device word *flag to 1
// if some gradient is not finite (leaves it as it is otherwise).
void flag_nonfinite(const void* grad, DType grad_type, std::size_t n, float grad_mul,
                    unsigned* flag, void* stream);
}  // namespace cuda

}  // namespace shardopt::kernels
