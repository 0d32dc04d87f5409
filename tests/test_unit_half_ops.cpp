// The bf16/f16 reduction ops (vectorized where the CPU allows) against the
// scalar definition: f32 combination of the two inputs, rounded once.
#include <mpi.h>

#include <catch2/catch.hpp>
#include <cmath>
#include <cstdint>
#include <random>
#include <type_traits>
#include <vector>

#include "comm/mpi/mpi_types.hpp"

using namespace shardopt;

namespace {

template <class Half>
float value(std::uint16_t bits) {
  return to_float(Half{bits});
}

template <class Half>
std::uint16_t round_to(float x) {
  if constexpr (std::is_same_v<Half, bfloat16>) {
    return bf16_from_float(x).bits;
  } else {
    return f16_from_float(x).bits;
  }
}

template <class Half>
std::uint16_t expected(std::uint16_t in, std::uint16_t inout, ReduceOp op) {
  const float x = value<Half>(in), y = value<Half>(inout);
  float r = x + y;
  if (op == ReduceOp::max) r = (x > y || std::isnan(x)) ? x : y;
  if (op == ReduceOp::min) r = (x < y || std::isnan(x)) ? x : y;
  return round_to<Half>(r);
}

// With tiny, every pair is one of the smallest normal values and a
// subnormal of the other sign (and some tiny ones of the same sign), so that
// many results are subnormal: the AVX512_BF16 path, whose conversion flushes
// subnormals, must round those as bf16_from_float does.
template <class Half>
long long mismatches(DType t, ReduceOp op, int len, std::mt19937& rng, bool tiny = false) {
  std::uniform_int_distribution<int> bits(0, 0xffff);
  std::uniform_real_distribution<float> real(-3.0f, 3.0f);
  std::vector<std::uint16_t> a(len), b(len), want(len);
  // bf16 and f16: exponent field 0 is subnormal; 1 is the smallest normal.
  constexpr int kMantissa = std::is_same_v<Half, bfloat16> ? 7 : 10;
  std::uniform_int_distribution<int> mantissa(0, (1 << kMantissa) - 1), sign(0, 1);
  for (int i = 0; i < len; ++i) {
    if (tiny) {
      const int s = sign(rng);
      a[i] = static_cast<std::uint16_t>((s << 15) | (1 << kMantissa) | mantissa(rng));
      b[i] = static_cast<std::uint16_t>(((i % 4 ? 1 - s : s) << 15) | mantissa(rng));
    } else {
      // Half the elements any bit pattern (inf, NaN, subnormals), half ordinary values.
      a[i] = i % 2 ? static_cast<std::uint16_t>(bits(rng)) : round_to<Half>(real(rng));
      b[i] = i % 3 ? static_cast<std::uint16_t>(bits(rng)) : round_to<Half>(real(rng));
    }
    want[i] = expected<Half>(a[i], b[i], op);
  }
  MPI_Reduce_local(a.data(), b.data(), len, MPI_UINT16_T, detail::mpi_op(t, op));
  long long wrong = 0;
  for (int i = 0; i < len; ++i) {
    const bool both_nan = std::isnan(value<Half>(b[i])) && std::isnan(value<Half>(want[i]));
    if (b[i] != want[i] && !both_nan) ++wrong;
  }
  return wrong;
}

}  // namespace

TEST_CASE("bf16/f16 reduction ops equal the scalar f32 definition bitwise", "[half][ops]") {
  std::mt19937 rng(2024);
  // Every vector path this CPU runs (each narrower one too), with lengths
  // around the vector steps (8 and 16 with AVX2, 16 and 32 with AVX-512),
  // so that every path and its tails run.
  const detail::HalfOpPath widest = detail::half_op_widest();
  for (int p = 0; p <= static_cast<int>(widest); ++p) {
    const auto path = static_cast<detail::HalfOpPath>(p);
    detail::limit_half_ops(path);
    const char* names[] = {"scalar", "avx2", "avx512", "avx512bf16"};
    for (ReduceOp op : {ReduceOp::sum, ReduceOp::max, ReduceOp::min}) {
      for (int len : {0, 1, 7, 8, 9, 15, 16, 17, 31, 32, 33, 47, 63, 64, 65, 1000, 65539}) {
        INFO("path " << names[p] << ", op " << reduce_op_name(op) << ", length " << len);
        CHECK(mismatches<bfloat16>(DType::bf16, op, len, rng) == 0);
        CHECK(mismatches<float16>(DType::f16, op, len, rng) == 0);
        CHECK(mismatches<bfloat16>(DType::bf16, op, len, rng, true) == 0);
        CHECK(mismatches<float16>(DType::f16, op, len, rng, true) == 0);
      }
    }
  }
  detail::limit_half_ops(widest);
}
