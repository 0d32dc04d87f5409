// shardopt: element types and reduction operations.
#pragma once

#include <cstddef>
#include <cstdint>
#include <type_traits>

#include "shardopt/half.hpp"

namespace shardopt {

// The element type of a buffer passed to shardopt.
enum class DType : int {
  f32 = 0,   // float
  f64 = 1,   // double
  bf16 = 2,  // shardopt::bfloat16 (also any 16-bit bfloat16 storage)
  f16 = 3,   // shardopt::float16 (IEEE binary16)
  i32 = 4,   // std::int32_t
  i64 = 5,   // std::int64_t
};

// Reductions of allreduce and reduce-scatter.
//   sum: element-wise sum.
//   avg: sum divided by the number of ranks (floating types only).
//   max, min: element-wise maximum / minimum.
// bf16 and f16 are combined in f32 and rounded once per combination; avg
// divides the sum, so an f16 sum past 65504 gives inf even where the average
// would fit (reduce such data in f32).
enum class ReduceOp : int { sum = 0, avg = 1, max = 2, min = 3 };

inline constexpr bool is_valid(DType t) noexcept {
  return static_cast<int>(t) >= 0 && static_cast<int>(t) <= 5;
}
inline constexpr bool is_valid(ReduceOp op) noexcept {
  return static_cast<int>(op) >= 0 && static_cast<int>(op) <= 3;
}
inline constexpr bool is_floating(DType t) noexcept {
  return t == DType::f32 || t == DType::f64 || t == DType::bf16 || t == DType::f16;
}

// Bytes per element; 0 for a value that is not a DType.
inline constexpr std::size_t dtype_size(DType t) noexcept {
  switch (t) {
    case DType::f32:
      return 4;
    case DType::f64:
      return 8;
    case DType::bf16:
      return 2;
    case DType::f16:
      return 2;
    case DType::i32:
      return 4;
    case DType::i64:
      return 8;
  }
  return 0;
}

// "f32", "bf16", ...; "invalid" for a value that is not a DType.
inline constexpr const char* dtype_name(DType t) noexcept {
  switch (t) {
    case DType::f32:
      return "f32";
    case DType::f64:
      return "f64";
    case DType::bf16:
      return "bf16";
    case DType::f16:
      return "f16";
    case DType::i32:
      return "i32";
    case DType::i64:
      return "i64";
  }
  return "invalid";
}

// "sum", "avg", "max", "min"; "invalid" for a value that is not a ReduceOp.
inline constexpr const char* reduce_op_name(ReduceOp op) noexcept {
  switch (op) {
    case ReduceOp::sum:
      return "sum";
    case ReduceOp::avg:
      return "avg";
    case ReduceOp::max:
      return "max";
    case ReduceOp::min:
      return "min";
  }
  return "invalid";
}

// The DType of a C++ element type: dtype_of<float>() == DType::f32; a
// type without one does not compile.
template <class T>
inline constexpr DType dtype_of() noexcept {
  if constexpr (std::is_same_v<T, float>)
    return DType::f32;
  else if constexpr (std::is_same_v<T, double>)
    return DType::f64;
  else if constexpr (std::is_same_v<T, bfloat16>)
    return DType::bf16;
  else if constexpr (std::is_same_v<T, float16>)
    return DType::f16;
  else if constexpr (std::is_same_v<T, std::int32_t>)
    return DType::i32;
  else if constexpr (std::is_same_v<T, std::int64_t>)
    return DType::i64;
  else
    static_assert(sizeof(T) == 0, "dtype_of: no DType for this element type");
}
template <class T>
struct DTypeOf {
  static constexpr DType value = dtype_of<T>();
};

}  // namespace shardopt
