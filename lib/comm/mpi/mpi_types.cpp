#include "comm/mpi/mpi_types.hpp"

#include <cmath>
#include <mutex>

#if defined(__x86_64__)
#include <immintrin.h>
#endif

#include "common/check.hpp"
#include "common/cpu_features.hpp"
#include "common/mpi_lifetime.hpp"

namespace shardopt::detail {

namespace {

// Element-wise combination of 16-bit floats in f32: inout = f(in, inout).
// Each result is rounded once, to nearest even, back to the 16-bit type.
template <class Half, Half (*FromFloat)(float), class F>
void combine(const Half* a, Half* b, int len, F f) {
  for (int i = 0; i < len; ++i) b[i] = FromFloat(f(to_float(a[i]), to_float(b[i])));
}

struct Sum {
  float operator()(float x, float y) const { return x + y; }
};
// NaN wins, as in torch.maximum / torch.minimum.
struct Max {
  float operator()(float x, float y) const { return (x > y || std::isnan(x)) ? x : y; }
};
struct Min {
  float operator()(float x, float y) const { return (x < y || std::isnan(x)) ? x : y; }
};

#if defined(__x86_64__)
// The same combinations, 8 elements at a time with AVX2 (and F16C for f16's
// conversions, which round to nearest even like f16_from_float). Chosen at
// run time, so one binary runs on every x86-64 node; the scalar loop finishes
// the tail and runs everywhere else. Results are bitwise those of combine().
#define SHARDOPT_AVX2 __attribute__((target("avx2,f16c")))

// bf16 -> f32 is a 16-bit shift: interleaving the words with zeros does it,
// 16 elements at a time (lo: elements 0-3 and 8-11, hi: 4-7 and 12-15).
SHARDOPT_AVX2 inline __m256 bf16_lo(__m256i w) {
  return _mm256_castsi256_ps(_mm256_unpacklo_epi16(_mm256_setzero_si256(), w));
}
SHARDOPT_AVX2 inline __m256 bf16_hi(__m256i w) {
  return _mm256_castsi256_ps(_mm256_unpackhi_epi16(_mm256_setzero_si256(), w));
}
// f32 -> bf16 bits in the low half of each 32-bit lane, as bf16_from_float.
SHARDOPT_AVX2 inline __m256i bf16_round(__m256 x) {
  const __m256i u = _mm256_castps_si256(x);
  const __m256i abs = _mm256_and_si256(u, _mm256_set1_epi32(0x7fffffff));
  const __m256i nan = _mm256_cmpgt_epi32(abs, _mm256_set1_epi32(0x7f800000));
  const __m256i high = _mm256_srli_epi32(u, 16);
  const __m256i quiet = _mm256_or_si256(high, _mm256_set1_epi32(0x0040));
  const __m256i odd = _mm256_and_si256(high, _mm256_set1_epi32(1));
  const __m256i rounded =
      _mm256_srli_epi32(_mm256_add_epi32(u, _mm256_add_epi32(_mm256_set1_epi32(0x7fff), odd)), 16);
  return _mm256_blendv_epi8(rounded, quiet, nan);
}
SHARDOPT_AVX2 inline __m256 load8(const float16* p) {
  return _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
}
SHARDOPT_AVX2 inline void store8(float16* p, __m256 x) {
  _mm_storeu_si128(reinterpret_cast<__m128i*>(p),
                   _mm256_cvtps_ph(x, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
}
SHARDOPT_AVX2 inline __m256 apply8(Sum, __m256 x, __m256 y) { return _mm256_add_ps(x, y); }
SHARDOPT_AVX2 inline __m256 apply8(Max, __m256 x, __m256 y) {
  const __m256 take_x =
      _mm256_or_ps(_mm256_cmp_ps(x, y, _CMP_GT_OQ), _mm256_cmp_ps(x, x, _CMP_UNORD_Q));
  return _mm256_blendv_ps(y, x, take_x);
}
SHARDOPT_AVX2 inline __m256 apply8(Min, __m256 x, __m256 y) {
  const __m256 take_x =
      _mm256_or_ps(_mm256_cmp_ps(x, y, _CMP_LT_OQ), _mm256_cmp_ps(x, x, _CMP_UNORD_Q));
  return _mm256_blendv_ps(y, x, take_x);
}

template <class F>
SHARDOPT_AVX2 int combine_avx2(const float16* a, float16* b, int len, F f) {
  int i = 0;
  for (; i + 8 <= len; i += 8) store8(b + i, apply8(f, load8(a + i), load8(b + i)));
  return i;
}

template <class F>
SHARDOPT_AVX2 int combine_avx2(const bfloat16* a, bfloat16* b, int len, F f) {
  int i = 0;
  for (; i + 16 <= len; i += 16) {
    const __m256i x = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(a + i));
    const __m256i y = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(b + i));
    const __m256i lo = bf16_round(apply8(f, bf16_lo(x), bf16_lo(y)));
    const __m256i hi = bf16_round(apply8(f, bf16_hi(x), bf16_hi(y)));
    // packus undoes the unpack's interleaving within each 128-bit lane.
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(b + i), _mm256_packus_epi32(lo, hi));
  }
  return i;
}

bool have_avx2() {
  // The kernels' detection: AVX2 with FMA and F16C (this code needs no FMA,
  // but no CPU has AVX2 and F16C without it). SHARDOPT_CPU_ISA does not
  // apply: it caps the optimizer kernels only.
  static const bool yes = detect_cpu_isa() >= CpuIsa::avx2;
  return yes;
}
#endif

template <class Half, Half (*FromFloat)(float), class F>
void half_op(void* in, void* inout, int* len, MPI_Datatype*) {
  const auto* a = static_cast<const Half*>(in);
  auto* b = static_cast<Half*>(inout);
  int done = 0;
#if defined(__x86_64__)
  if (have_avx2()) done = combine_avx2(a, b, *len, F{});
#endif
  combine<Half, FromFloat>(a + done, b + done, *len - done, F{});
}

// Index: [is_f16][sum, max, min]
MPI_Op g_ops[2][3] = {{MPI_OP_NULL, MPI_OP_NULL, MPI_OP_NULL},
                      {MPI_OP_NULL, MPI_OP_NULL, MPI_OP_NULL}};
std::once_flag g_ops_once;

void free_ops() {
  for (auto& row : g_ops)
    for (auto& op : row)
      if (op != MPI_OP_NULL) MPI_Op_free(&op);
}

void create_ops() {
  MPI_User_function* fns[2][3] = {
      {&half_op<bfloat16, bf16_from_float, Sum>, &half_op<bfloat16, bf16_from_float, Max>,
       &half_op<bfloat16, bf16_from_float, Min>},
      {&half_op<float16, f16_from_float, Sum>, &half_op<float16, f16_from_float, Max>,
       &half_op<float16, f16_from_float, Min>}};
  for (int t = 0; t < 2; ++t)
    for (int o = 0; o < 3; ++o)
      SHARDOPT_CHECK_MPI(MPI_Op_create(fns[t][o], /*commute=*/1, &g_ops[t][o]),
                         "creating the bf16/f16 reduction ops");
  at_mpi_finalize(free_ops);  // MPI releases nothing by itself
}

}  // namespace

MPI_Op mpi_op(DType t, ReduceOp op) {
  const int o = op == ReduceOp::max ? 1 : op == ReduceOp::min ? 2 : 0;  // avg reduces as sum
  if (t == DType::bf16 || t == DType::f16) {
    std::call_once(g_ops_once, create_ops);
    return g_ops[t == DType::f16 ? 1 : 0][o];
  }
  return o == 1 ? MPI_MAX : o == 2 ? MPI_MIN : MPI_SUM;
}

void divide_elements(void* buf, std::size_t count, DType t, int divisor) noexcept {
  switch (t) {
    case DType::f32: {
      auto* x = static_cast<float*>(buf);
      const float d = static_cast<float>(divisor);
      for (std::size_t i = 0; i < count; ++i) x[i] /= d;
      break;
    }
    case DType::f64: {
      auto* x = static_cast<double*>(buf);
      const double d = divisor;
      for (std::size_t i = 0; i < count; ++i) x[i] /= d;
      break;
    }
    case DType::bf16: {
      auto* x = static_cast<bfloat16*>(buf);
      const float d = static_cast<float>(divisor);
      for (std::size_t i = 0; i < count; ++i) x[i] = bf16_from_float(to_float(x[i]) / d);
      break;
    }
    case DType::f16: {
      auto* x = static_cast<float16*>(buf);
      const float d = static_cast<float>(divisor);
      for (std::size_t i = 0; i < count; ++i) x[i] = f16_from_float(to_float(x[i]) / d);
      break;
    }
    default:
      break;  // integers never reach here: avg of integers is rejected up front
  }
}

}  // namespace shardopt::detail
