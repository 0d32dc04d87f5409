// shardopt kernels: conversion of a contiguous buffer between f32, bf16 and
// f16, every pair.
//
// The per-element conversion is cast_element(), the one definition the
// reference, CPU and CUDA kernels agree with bitwise: a narrowing cast rounds
// to nearest, ties to even (bf16_from_float, f16_from_float: NaN stays a
// quiet NaN, inf stays inf, a finite value past the largest finite one
// becomes inf); a widening cast is exact (an f16 signaling NaN becomes quiet,
// as the hardware conversion does). bf16 <-> f16 goes through float, which
// holds both exactly, so it is rounded once. A cast to the same type is a
// copy of the bits.
#pragma once

#include <cstddef>
#include <type_traits>

#include "kernels/element.hpp"
#include "shardopt/half.hpp"
#include "shardopt/types.hpp"

namespace shardopt::kernels {

// The types the cast kernels convert between.
inline constexpr bool is_cast_type(DType t) noexcept {
  return t == DType::f32 || t == DType::bf16 || t == DType::f16;
}

// x (float, bfloat16 or float16) as a Dst.
template <class Dst, class Src>
SHARDOPT_HOST_DEVICE inline Dst cast_element(Src x) {
  if constexpr (std::is_same_v<Dst, Src>) {
    return x;
  } else if constexpr (std::is_same_v<Dst, float>) {
    return to_float(x);
  } else if constexpr (std::is_same_v<Dst, bfloat16>) {
    return bf16_from_float(to_float(x));
  } else {
    return f16_from_float(to_float(x));
  }
}

namespace detail {
// Calls f(src, dst) with both pointers typed.
template <class F>
inline void with_cast_types(const void* src, DType src_type, void* dst, DType dst_type, F&& f) {
  with_float_type(src, src_type, [&](const auto* s) {
    with_float_type(dst, dst_type, [&](auto* d) { f(s, d); });
  });
}
}  // namespace detail

// Each converts n elements of src (src_type) into dst (dst_type); both
// types satisfy is_cast_type. src and dst do not overlap, except that they
// may be the same buffer when the types have the same size (bf16 <-> f16 in
// place, or a same-type cast, which then changes nothing).
namespace reference {
void cast(const void* src, DType src_type, void* dst, DType dst_type, std::size_t n);
}
namespace cpu {
// OpenMP slices; per slice the loop of the widest vector unit present, f16
// converted by the F16C instructions where there are some.
void cast(const void* src, DType src_type, void* dst, DType dst_type, std::size_t n);
}  // namespace cpu
namespace cuda {
// Device buffers; `stream` a cudaStream_t (null: the default stream).
// Synchronous. Throws std::runtime_error on a CUDA error.
void cast(const void* src, DType src_type, void* dst, DType dst_type, std::size_t n, void* stream);
}  // namespace cuda

}  // namespace shardopt::kernels
