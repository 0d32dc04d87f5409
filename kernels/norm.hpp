// shardopt kernels: the sum of squares of a range, for gradient norms.
//
// The result is bitwise the same for any number of threads, any vector unit
// and on the GPU: the range is cut into fixed blocks of kNormBlock elements;
// in a block, element i goes to lane i % kNormLanes, each lane summing its
// elements' squares in order in double (a float's square is exact in double);
// the lanes are added in a fixed tree, and the blocks in order. Only the
// arithmetic of that fixed order is ever done, whatever runs it. Non-finite
// values propagate (an inf or nan gradient gives an inf or nan sum).
#pragma once

#include <cstddef>

#include "shardopt/half.hpp"
#include "shardopt/types.hpp"

namespace shardopt::kernels {

inline constexpr std::size_t kNormBlock = 8192;
inline constexpr int kNormLanes = 16;

// The sum of squares of block `b` (elements [b*kNormBlock, min(n, ...))),
// in the fixed order above.
template <class T>
SHARDOPT_HOST_DEVICE inline double block_sum_squares(const T* x, std::size_t n, std::size_t b) {
  const std::size_t begin = b * kNormBlock;
  const std::size_t end = begin + kNormBlock < n ? begin + kNormBlock : n;
  double lane[kNormLanes] = {};
  std::size_t i = begin;
  for (; i + kNormLanes <= end; i += kNormLanes) {
    for (int l = 0; l < kNormLanes; ++l) {
      const double v = static_cast<double>(to_float(x[i + l]));
      lane[l] += v * v;
    }
  }
  for (int l = 0; i < end; ++i, ++l) {
    const double v = static_cast<double>(to_float(x[i]));
    lane[l] += v * v;
  }
  for (int width = kNormLanes / 2; width > 0; width /= 2)
    for (int l = 0; l < width; ++l) lane[l] += lane[l + width];
  return lane[0];
}

// Calls f(typed pointer) for x of type t (f32, bf16 or f16).
template <class F>
SHARDOPT_HOST_DEVICE inline double with_norm_type(const void* x, DType t, F&& f) {
  switch (t) {
    case DType::bf16:
      return f(static_cast<const bfloat16*>(x));
    case DType::f16:
      return f(static_cast<const float16*>(x));
    default:
      return f(static_cast<const float*>(x));
  }
}

namespace reference {
double sum_squares(const void* x, DType type, std::size_t n);
}
namespace cpu {
// OpenMP over blocks; the blocks' sums are added in order.
double sum_squares(const void* x, DType type, std::size_t n);
}  // namespace cpu
namespace cuda {
// x in device memory; `stream` a cudaStream_t. Synchronous.
double sum_squares(const void* x, DType type, std::size_t n, void* stream);
}  // namespace cuda

}  // namespace shardopt::kernels
