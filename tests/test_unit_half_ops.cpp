// The bf16/f16 reduction ops (vectorized where the CPU allows) against the
// scalar definition: f32 combination of the two inputs, rounded once.
#include <mpi.h>

#include <catch2/catch.hpp>
#include <cmath>
#include <cstdint>
#include <random>
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

template <class Half>
long long mismatches(DType t, ReduceOp op, int len, std::mt19937& rng) {
  std::uniform_int_distribution<int> bits(0, 0xffff);
  std::uniform_real_distribution<float> real(-3.0f, 3.0f);
  std::vector<std::uint16_t> a(len), b(len), want(len);
  for (int i = 0; i < len; ++i) {
    // Half the elements any bit pattern (inf, NaN, subnormals), half ordinary values.
    a[i] = i % 2 ? static_cast<std::uint16_t>(bits(rng)) : round_to<Half>(real(rng));
    b[i] = i % 3 ? static_cast<std::uint16_t>(bits(rng)) : round_to<Half>(real(rng));
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
  for (ReduceOp op : {ReduceOp::sum, ReduceOp::max, ReduceOp::min}) {
    for (int len : {0, 1, 7, 8, 9, 15, 16, 17, 31, 1000, 65539}) {
      INFO("op " << reduce_op_name(op) << ", length " << len);
      CHECK(mismatches<bfloat16>(DType::bf16, op, len, rng) == 0);
      CHECK(mismatches<float16>(DType::f16, op, len, rng) == 0);
    }
  }
}
