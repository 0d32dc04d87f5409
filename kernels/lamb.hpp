// shardopt kernels: LAMB (You et al. 2020, "Large Batch Optimization for Deep
// Learning", Algorithm 2 with Adam's bias correction), in two passes so that
// a sharded caller can sum the norms across shards in between:
//
//   lamb_direction: the moments, the update direction r into a caller
//                   buffer, and the squared norms ||p||^2 and ||r||^2 of the
//                   range;
//   lamb_apply:     p = p - lr * trust * r, trust = ||p|| / ||r|| (1 when
//                   either is 0), computed by the caller from the norms of
//                   the whole tensor.
//
// The squared norms are summed in double over fixed blocks of kLambNormBlock
// elements (each block in the lanes of kernels/norm.hpp: lane_sum_squares,
// then the blocks in order),
// so they are bitwise the same for any thread count and on the GPU.
#pragma once

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <span>

#include "kernels/element.hpp"
#include "kernels/moments.hpp"
#include "kernels/norm.hpp"
#include "shardopt/types.hpp"

namespace shardopt::kernels {

inline constexpr std::size_t kLambNormBlock = 2048;

// The scalars of one step: the moments' (kernels/moments.hpp; weight decay
// enters the direction, r += weight_decay * p, so wd_mode is none) and
struct LambScalars : MomentScalars {
  float bias_correction1;       // 1 - beta1^step
  float bias_correction2_sqrt;  // sqrt(1 - beta2^step)
};

// step is the count after this step (1 for the first).
inline LambScalars make_lamb_scalars(double beta1, double beta2, double eps, double weight_decay,
                                     bool maximize, std::int64_t step, double grad_mul) {
  LambScalars s{};
  static_cast<MomentScalars&>(s) =
      make_moment_scalars(0.0, {beta1, beta2}, eps, weight_decay, false, maximize, grad_mul);
  s.wd_mode = WeightDecay::none;
  s.bias_correction1 = static_cast<float>(1.0 - std::pow(beta1, static_cast<double>(step)));
  s.bias_correction2_sqrt =
      static_cast<float>(std::sqrt(1.0 - std::pow(beta2, static_cast<double>(step))));
  return s;
}

// One element of the direction: m and v updated in place, r written; p is
// only read. Returns whether the gradient (after grad_mul) is finite.
// (F float, or a vector of lanes: kernels/element.hpp.)
template <class F>
SHARDOPT_HOST_DEVICE SHARDOPT_FORCE_INLINE auto lamb_direction_element(F p, F g, F& m, F& v, F& r,
                                                                       const LambScalars& s) {
  const auto finite = update_moments<WeightDecay::none>(p, g, m, v, s);
  const F denom = sqrt_op(v) / s.bias_correction2_sqrt + s.eps;
  r = fma_op(s.weight_decay, p, (m / s.bias_correction1) / denom);  // m_hat / denom + wd * p
  return finite;
}

// The buffers of one LAMB direction pass over n elements.
//   param:      fp32 parameters, read; null with remainder
//   param_bf16: with remainder, the bf16 parameters, read; else null
//   remainder:  optional 16-bit remainders of the bf16 parameters
//               (parameter remainders, kernels/element.hpp), read
//   grad:       gradients of grad_type (f32, bf16 or f16), read
//   exp_avg:    first moment, read and written
//   exp_avg_sq: second moment, read and written
//   update:     the direction r, written
struct LambBuffers {
  const float* param = nullptr;
  const void* grad = nullptr;
  DType grad_type = DType::f32;
  float* exp_avg = nullptr;
  float* exp_avg_sq = nullptr;
  float* update = nullptr;
  std::size_t n = 0;
  const bfloat16* param_bf16 = nullptr;
  const std::uint16_t* remainder = nullptr;

  // Calls f(pointer, bytes per element, access) on every buffer, null ones
  // included (kernels/element.hpp: subrange; the CUDA kernels' vector loads).
  template <class F>
  SHARDOPT_HOST_DEVICE constexpr void each_buffer(F&& f) {
    f(param, 4, Access::read);
    f(grad, grad_bytes(grad_type), Access::read);
    f(exp_avg, 4, Access::read_write);
    f(exp_avg_sq, 4, Access::read_write);
    f(update, 4, Access::write);
    f(param_bf16, 2, Access::read);
    f(remainder, 2, Access::read);
  }
};

// What the direction pass returns: the squared norms of the range.
struct LambNorms {
  double param_sq = 0.0;
  double update_sq = 0.0;
  bool grads_finite = true;  // every gradient finite after grad_mul
};

// The buffers of the apply pass: p = p + neg_step * r with neg_step =
// f(-(lr * trust)); param read and written, update read, param_out (bf16 or
// f16, optional) written. With remainder set, param is null and param_out
// holds the bf16 parameters themselves, read and written with their
// remainders (parameter remainders, kernels/element.hpp).
struct LambApplyBuffers {
  float* param = nullptr;
  const float* update = nullptr;
  void* param_out = nullptr;
  DType param_out_type = DType::bf16;
  std::size_t n = 0;
  std::uint16_t* remainder = nullptr;

  // Calls f(pointer, bytes per element, access) on every buffer, null ones
  // included (kernels/element.hpp: subrange; the CUDA kernels' vector loads).
  template <class F>
  SHARDOPT_HOST_DEVICE constexpr void each_buffer(F&& f) {
    f(param, 4, Access::read_write);
    f(update, 4, Access::read);
    f(param_out, 2, remainder != nullptr ? Access::read_write : Access::write);
    f(remainder, 2, Access::read_write);
  }
};

template <class F>
SHARDOPT_HOST_DEVICE SHARDOPT_FORCE_INLINE void lamb_apply_element(F& p, F r, float neg_step) {
  p = fma_op(neg_step, r, p);
}

// The apply pass's neg_step from the norms of a whole tensor: -(lr * trust)
// rounded to float, trust = ||p|| / ||r|| (1 when either is 0), in double.
inline float lamb_neg_step(const LambNorms& norms, double lr) {
  const double trust = norms.param_sq > 0.0 && norms.update_sq > 0.0
                           ? std::sqrt(norms.param_sq) / std::sqrt(norms.update_sq)
                           : 1.0;
  return static_cast<float>(-(lr * trust));
}

namespace reference {
LambNorms lamb_direction(const LambBuffers& b, const LambScalars& s);
void lamb_apply(const LambApplyBuffers& b, float neg_step);
}  // namespace reference
namespace cpu {
// OpenMP across threads (whole norm blocks each), AVX-512 / AVX2 / baseline.
LambNorms lamb_direction(const LambBuffers& b, const LambScalars& s);
void lamb_apply(const LambApplyBuffers& b, float neg_step);
}  // namespace cpu
namespace cuda {
// Device buffers; `stream` is a cudaStream_t (null: the default stream).
// Synchronous. Throws NotCompiledError in a build without CUDA.
LambNorms lamb_direction(const LambBuffers& b, const LambScalars& s, void* stream);
void lamb_apply(const LambApplyBuffers& b, float neg_step, void* stream);
// The two passes on a list of tensors (device buffers, not overlapping), each
// in one launch per group of tensors of the same types, or a few for long
// lists (kernels/cuda/multi_tensor.cuh). lamb_direction writes each tensor's
// norms to norms[i] (as many as tensors; grads_finite is the whole list's)
// and returns whether every gradient was finite; lamb_apply takes each
// tensor's neg_step.
bool lamb_direction(std::span<const LambBuffers> tensors, const LambScalars& s,
                    std::span<LambNorms> norms, void* stream);
void lamb_apply(std::span<const LambApplyBuffers> tensors, std::span<const float> neg_steps,
                void* stream);
}  // namespace cuda

}  // namespace shardopt::kernels
