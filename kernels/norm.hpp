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
#include <cstring>
#include <type_traits>

#include "kernels/element.hpp"
#include "shardopt/half.hpp"
#include "shardopt/types.hpp"

namespace shardopt::kernels {

inline constexpr std::size_t kNormBlock = 8192;
inline constexpr int kNormLanes = 16;

// The sum of squares of x[begin, begin + count) in the fixed order above:
// element begin + j goes to lane j % kNormLanes, the lanes are added in a
// tree. X is a pointer or anything indexable that yields floats (LAMB sums
// decoded parameter remainders through it). The lanes are independent
// chains of additions, so a vector unit runs them side by side.
template <class X>
SHARDOPT_HOST_DEVICE inline double lane_sum_squares(const X& x, std::size_t begin,
                                                    std::size_t count) {
  double lane[kNormLanes] = {};
  std::size_t j = 0;
  for (; j + kNormLanes <= count; j += kNormLanes) {
    for (int l = 0; l < kNormLanes; ++l) {
      const double v = static_cast<double>(to_float(x[begin + j + l]));
      lane[l] += v * v;
    }
  }
  // The last count - j < kNormLanes elements, element j + l to lane l:
  // constant lane indices, so that on the device the lanes stay in registers.
  for (int l = 0; l < kNormLanes; ++l) {
    if (j + static_cast<std::size_t>(l) < count) {
      const double v = static_cast<double>(to_float(x[begin + j + static_cast<std::size_t>(l)]));
      lane[l] += v * v;
    }
  }
  for (int width = kNormLanes / 2; width > 0; width /= 2)
    for (int l = 0; l < width; ++l) lane[l] += lane[l + width];
  return lane[0];
}

// lane_sum_squares of x and of y over the same range, in one pass: their
// lanes are independent, so the two sums take the time of one.
template <class X, class Y>
SHARDOPT_HOST_DEVICE inline void lane_sum_squares2(const X& x, const Y& y, std::size_t begin,
                                                   std::size_t count, double& sx, double& sy) {
  double lx[kNormLanes] = {}, ly[kNormLanes] = {};
  std::size_t j = 0;
#if !defined(__CUDA_ARCH__)
  if constexpr (std::is_same_v<X, const float*> || std::is_same_v<X, float*>) {
    // The lanes as vectors held in registers for the whole range (GCC keeps
    // an array of lanes in memory, and every addition then waits on a
    // store): the same additions in the same order.
    using F16 = float __attribute__((vector_size(64)));
    using D8 = double __attribute__((vector_size(64)));
    D8 x0 = {}, x1 = {}, y0 = {}, y1 = {};
    for (; j + kNormLanes <= count; j += kNormLanes) {
      F16 a, b;
      std::memcpy(&a, x + begin + j, sizeof a);
      std::memcpy(&b, y + begin + j, sizeof b);
      const D8 a0 =
          __builtin_convertvector(__builtin_shufflevector(a, a, 0, 1, 2, 3, 4, 5, 6, 7), D8);
      const D8 a1 =
          __builtin_convertvector(__builtin_shufflevector(a, a, 8, 9, 10, 11, 12, 13, 14, 15), D8);
      const D8 b0 =
          __builtin_convertvector(__builtin_shufflevector(b, b, 0, 1, 2, 3, 4, 5, 6, 7), D8);
      const D8 b1 =
          __builtin_convertvector(__builtin_shufflevector(b, b, 8, 9, 10, 11, 12, 13, 14, 15), D8);
      x0 += a0 * a0;
      x1 += a1 * a1;
      y0 += b0 * b0;
      y1 += b1 * b1;
    }
    for (int l = 0; l < 8; ++l) {
      lx[l] = x0[l];
      lx[l + 8] = x1[l];
      ly[l] = y0[l];
      ly[l + 8] = y1[l];
    }
  } else
#endif
  {
    for (; j + kNormLanes <= count; j += kNormLanes) {
      for (int l = 0; l < kNormLanes; ++l) {
        const double u = static_cast<double>(to_float(x[begin + j + l]));
        const double v = static_cast<double>(to_float(y[begin + j + l]));
        lx[l] += u * u;
        ly[l] += v * v;
      }
    }
  }
  for (int l = 0; l < kNormLanes; ++l) {  // the tail, as in lane_sum_squares
    if (j + static_cast<std::size_t>(l) < count) {
      const double u = static_cast<double>(to_float(x[begin + j + static_cast<std::size_t>(l)]));
      const double v = static_cast<double>(to_float(y[begin + j + static_cast<std::size_t>(l)]));
      lx[l] += u * u;
      ly[l] += v * v;
    }
  }
  for (int width = kNormLanes / 2; width > 0; width /= 2) {
    for (int l = 0; l < width; ++l) {
      lx[l] += lx[l + width];
      ly[l] += ly[l + width];
    }
  }
  sx = lx[0];
  sy = ly[0];
}

// The sum of squares of block `b` (elements [b*kNormBlock, min(n, ...))),
// in the fixed order above.
template <class T>
SHARDOPT_HOST_DEVICE inline double block_sum_squares(const T* x, std::size_t n, std::size_t b) {
  const std::size_t begin = b * kNormBlock;
  const std::size_t end = begin + kNormBlock < n ? begin + kNormBlock : n;
  return lane_sum_squares(x, begin, end - begin);
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
