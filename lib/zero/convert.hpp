// shardopt: element conversions of the ZeRO engine (internal): copies,
// casts and scaled casts between f32, bf16 and f16, and fp32 accumulation.
#pragma once

#include <cstddef>
#include <cstring>

#include "kernels/cast.hpp"
#include "kernels/element.hpp"
#include "shardopt/half.hpp"
#include "shardopt/types.hpp"

namespace shardopt::detail {

inline float from_float_as(float x, float*) { return x; }
inline bfloat16 from_float_as(float x, bfloat16*) { return bf16_from_float(x); }
inline float16 from_float_as(float x, float16*) { return f16_from_float(x); }

// Calls f with src and dst as typed pointers (f32, bf16 or f16).
template <class F>
void with_types(const std::byte* src, DType st, std::byte* dst, DType dt, F&& f) {
  kernels::with_float_type(static_cast<const void*>(src), st, [&](const auto* s) {
    kernels::with_float_type(static_cast<void*>(dst), dt, [&](auto* d) { f(s, d); });
  });
}

// dst[k] = src[k] * mul, converting between f32, bf16 and f16 in host
// memory: a copy, the vectorized cast kernel (its arguments are the
// engine's own buffers, so shardopt::cast's checks are skipped), or one
// typed loop.
inline void convert(const std::byte* src, DType st, std::byte* dst, DType dt, std::size_t n,
                    float mul) {
  if (n == 0) return;
  if (st == dt && mul == 1.0f) {
    std::memcpy(dst, src, n * dtype_size(st));
  } else if (mul == 1.0f) {
    kernels::cpu::cast(src, st, dst, dt, n);
  } else {
    with_types(src, st, dst, dt, [&](const auto* s, auto* d) {
      for (std::size_t k = 0; k < n; ++k) d[k] = from_float_as(to_float(s[k]) * mul, d);
    });
  }
}

// acc[k] += src[k], in fp32, in one typed loop.
template <class S>
void accumulate_typed(const S* src, float* acc, std::size_t n) {
  for (std::size_t k = 0; k < n; ++k) acc[k] += to_float(src[k]);
}

inline void accumulate(const std::byte* src, DType st, float* acc, std::size_t n) {
  switch (st) {
    case DType::bf16:
      return accumulate_typed(reinterpret_cast<const bfloat16*>(src), acc, n);
    case DType::f16:
      return accumulate_typed(reinterpret_cast<const float16*>(src), acc, n);
    default:
      return accumulate_typed(reinterpret_cast<const float*>(src), acc, n);
  }
}

}  // namespace shardopt::detail
