// shardopt: conversion of buffers between f32, bf16 and f16.
//
// A narrowing cast (f32 -> bf16 or f16, bf16 <-> f16) rounds to nearest,
// ties to even, exactly as bf16_from_float and f16_from_float
// (shardopt/half.hpp): a NaN stays a quiet NaN, inf stays inf, a finite value
// past the largest finite one of the target becomes inf. A widening cast is
// exact. bf16 <-> f16 rounds once (both are exact in float). A cast to the
// same type copies the bits. The CPU and CUDA kernels give the same bits.
#pragma once

#include <concepts>
#include <cstddef>
#include <iterator>
#include <type_traits>
#include <utility>

#include "shardopt/export.h"
#include "shardopt/half.hpp"
#include "shardopt/types.hpp"

namespace shardopt {

// Converts n elements of src (of src_type) into dst (of dst_type); the types
// are f32, bf16 or f16. Both buffers in host memory, or both on one CUDA
// device (then the cast runs on `stream`, a cudaStream_t, null for the
// default stream, and returns when it is done). src and dst must not overlap,
// except as the very same buffer when the types have the same size (bf16 <->
// f16 in place; a same-type cast onto itself does nothing). Local; not
// collective. The caller owns both buffers.
// Errors: InvalidArgument for a null buffer with n > 0, a type other than
// f32, bf16 or f16 (or a value that is not a DType), or overlapping buffers;
// DeviceError for one buffer on the host and the other on a device (or two
// devices); NotCompiledError for device buffers in a build without CUDA;
// CommError (SHARDOPT_ERR_CUDA) when a CUDA call fails.
SHARDOPT_API void cast(const void* src, DType src_type, void* dst, DType dst_type, std::size_t n,
                       void* stream = nullptr);

namespace detail {
// The typed cast() below: as the untyped one, after checking that src has
// src_size elements and dst as many (InvalidArgument otherwise).
SHARDOPT_API void cast_sized(const void* src, DType src_type, std::size_t src_size, void* dst,
                             DType dst_type, std::size_t dst_size, void* stream);

template <class T>
concept CastElement =
    std::same_as<T, float> || std::same_as<T, bfloat16> || std::same_as<T, float16>;

// The element type of a contiguous range, const kept.
template <class R>
using RangeElement = std::remove_reference_t<decltype(*std::data(std::declval<R&>()))>;

// A contiguous range of float, bfloat16 or float16 to read.
template <class R>
concept CastSource = CastElement<std::remove_const_t<RangeElement<const R>>> &&
    requires(const R& r) {
  std::size(r);
};

// A contiguous range of float, bfloat16 or float16 to write (not const).
template <class R>
concept CastTarget = CastElement<RangeElement<R>> && requires(R& r) {
  std::size(r);
};
}  // namespace detail

// Typed: converts every element of src into dst, two contiguous ranges of
// float, bfloat16 or float16 (std::vector, std::span, ...) of the same
// length, e.g. cast(master_f32, std::span<bfloat16>(model)). The types come
// from the ranges. Errors as above, and InvalidArgument when the lengths
// differ.
template <detail::CastSource Src, detail::CastTarget Dst>
void cast(const Src& src, Dst&& dst, void* stream = nullptr) {
  using S = std::remove_const_t<detail::RangeElement<const Src>>;
  using D = detail::RangeElement<Dst>;
  detail::cast_sized(std::data(src), dtype_of<S>(), std::size(src), std::data(dst), dtype_of<D>(),
                     std::size(dst), stream);
}

}  // namespace shardopt
