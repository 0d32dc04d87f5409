#include "comm/mpi/mpi_types.hpp"

#include <algorithm>
#include <atomic>
#include <cmath>
#include <mutex>
#include <type_traits>

#if defined(__x86_64__)
#include <cpuid.h>
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

// bf16_round for lanes that hold no NaN: round to nearest even alone.
SHARDOPT_AVX2 inline __m256i bf16_round_numbers(__m256 x) {
  const __m256i u = _mm256_castps_si256(x);
  const __m256i odd = _mm256_and_si256(_mm256_srli_epi32(u, 16), _mm256_set1_epi32(1));
  return _mm256_srli_epi32(_mm256_add_epi32(u, _mm256_add_epi32(_mm256_set1_epi32(0x7fff), odd)),
                           16);
}

template <class F>
SHARDOPT_AVX2 int combine_avx2(const bfloat16* a, bfloat16* b, int len, F f) {
  int i = 0;
  for (; i + 16 <= len; i += 16) {
    const __m256i x = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(a + i));
    const __m256i y = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(b + i));
    const __m256 lo = apply8(f, bf16_lo(x), bf16_lo(y));
    const __m256 hi = apply8(f, bf16_hi(x), bf16_hi(y));
    // One test for NaNs in the 16 results (rare), whose quieting the
    // rounding of numbers skips: about a third fewer instructions, and the
    // op is bound by them wherever its data is in cache.
    const __m256 nan =
        _mm256_or_ps(_mm256_cmp_ps(lo, lo, _CMP_UNORD_Q), _mm256_cmp_ps(hi, hi, _CMP_UNORD_Q));
    __m256i packed;
    if (_mm256_movemask_ps(nan) == 0) [[likely]]
      packed = _mm256_packus_epi32(bf16_round_numbers(lo), bf16_round_numbers(hi));
    else
      packed = _mm256_packus_epi32(bf16_round(lo), bf16_round(hi));
    // packus undoes the unpack's interleaving within each 128-bit lane.
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(b + i), packed);
  }
  return i;
}

// The same with AVX-512, 16 f16 or 32 bf16 elements per step: MPI calls the
// op on every chunk it reduces, and an integer sum of the same bytes (what
// MPI would do for a 16-bit type of its own) is the speed to match.
#define SHARDOPT_AVX512 __attribute__((target("avx512f,avx512bw,avx512vl,avx512dq,f16c")))
#define SHARDOPT_AVX512BF16 \
  __attribute__((target("avx512f,avx512bw,avx512vl,avx512dq,f16c,avx512bf16")))

SHARDOPT_AVX512 inline __m512 bf16_lo(__m512i w) {
  return _mm512_castsi512_ps(_mm512_unpacklo_epi16(_mm512_setzero_si512(), w));
}
SHARDOPT_AVX512 inline __m512 bf16_hi(__m512i w) {
  return _mm512_castsi512_ps(_mm512_unpackhi_epi16(_mm512_setzero_si512(), w));
}
// As bf16_round: NaN lanes (an unordered self-comparison) take their quiet
// high half in the masked OR that would otherwise be a blend.
SHARDOPT_AVX512 inline __m512i bf16_round(__m512 x) {
  const __m512i u = _mm512_castps_si512(x);
  const __m512i high = _mm512_srli_epi32(u, 16);
  const __m512i odd = _mm512_and_si512(high, _mm512_set1_epi32(1));
  const __m512i rounded =
      _mm512_srli_epi32(_mm512_add_epi32(u, _mm512_add_epi32(_mm512_set1_epi32(0x7fff), odd)), 16);
  return _mm512_mask_or_epi32(rounded, _mm512_cmp_ps_mask(x, x, _CMP_UNORD_Q), high,
                              _mm512_set1_epi32(0x0040));
}
SHARDOPT_AVX512 inline __m512 apply16(Sum, __m512 x, __m512 y) { return _mm512_add_ps(x, y); }
SHARDOPT_AVX512 inline __m512 apply16(Max, __m512 x, __m512 y) {
  const __mmask16 take_x =
      _mm512_cmp_ps_mask(x, y, _CMP_GT_OQ) | _mm512_cmp_ps_mask(x, x, _CMP_UNORD_Q);
  return _mm512_mask_blend_ps(take_x, y, x);
}
SHARDOPT_AVX512 inline __m512 apply16(Min, __m512 x, __m512 y) {
  const __mmask16 take_x =
      _mm512_cmp_ps_mask(x, y, _CMP_LT_OQ) | _mm512_cmp_ps_mask(x, x, _CMP_UNORD_Q);
  return _mm512_mask_blend_ps(take_x, y, x);
}

template <class F>
SHARDOPT_AVX512 int combine_avx512(const float16* a, float16* b, int len, F f) {
  int i = 0;
  for (; i + 16 <= len; i += 16) {
    const __m512 x = _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(a + i)));
    const __m512 y = _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(b + i)));
    _mm256_storeu_si256(
        reinterpret_cast<__m256i*>(b + i),
        _mm512_cvtps_ph(apply16(f, x, y), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
  }
  return i;
}

template <class F>
SHARDOPT_AVX512 int combine_avx512(const bfloat16* a, bfloat16* b, int len, F f) {
  int i = 0;
  for (; i + 32 <= len; i += 32) {
    const __m512i x = _mm512_loadu_si512(a + i);
    const __m512i y = _mm512_loadu_si512(b + i);
    const __m512i lo = bf16_round(apply16(f, bf16_lo(x), bf16_lo(y)));
    const __m512i hi = bf16_round(apply16(f, bf16_hi(x), bf16_hi(y)));
    _mm512_storeu_si512(b + i, _mm512_packus_epi32(lo, hi));
  }
  return i;
}

// bf16 with AVX512_BF16's conversion, one instruction for the rounding of
// 32 results: the same round to nearest even and NaN made quiet as
// bf16_from_float, except that it takes a subnormal f32 for zero; a step
// whose results hold one (a sum that cancels almost to nothing) rounds in
// integer arithmetic instead.
template <class F>
SHARDOPT_AVX512BF16 int combine_avx512bf16(const bfloat16* a, bfloat16* b, int len, F f) {
  // The unpacks hold elements 0-3, 8-11, ... in lo and 4-7, 12-15, ... in
  // hi; the conversion writes lo's results then hi's, in 4-element groups
  // this permutation puts back in order.
  const __m512i order = _mm512_setr_epi64(0, 4, 1, 5, 2, 6, 3, 7);
  constexpr int kSubnormal = 0x20;  // vfpclassps: denormal, either sign
  int i = 0;
  for (; i + 32 <= len; i += 32) {
    const __m512i x = _mm512_loadu_si512(a + i);
    const __m512i y = _mm512_loadu_si512(b + i);
    const __m512 lo = apply16(f, bf16_lo(x), bf16_lo(y));
    const __m512 hi = apply16(f, bf16_hi(x), bf16_hi(y));
    __m512i out;
    if (_kortestz_mask16_u8(_mm512_fpclass_ps_mask(lo, kSubnormal),
                            _mm512_fpclass_ps_mask(hi, kSubnormal))) {
      out = _mm512_permutexvar_epi64(order, (__m512i)_mm512_cvtne2ps_pbh(hi, lo));
    } else {
      out = _mm512_packus_epi32(bf16_round(lo), bf16_round(hi));
    }
    _mm512_storeu_si512(b + i, out);
  }
  return i;
}

#endif

// Detected once: AVX2 with F16C (the kernels' test, which also asks for FMA:
// no CPU has AVX2 and F16C without it), AVX-512, and AVX512_BF16 (CPUID leaf
// 7, sub-leaf 1, EAX bit 5). SHARDOPT_CPU_ISA does not apply: it caps the
// optimizer kernels only.
HalfOpPath detect_half_op_path() noexcept {
#if defined(__x86_64__)
  const CpuIsa isa = detect_cpu_isa();
  if (isa >= CpuIsa::avx512) {
    unsigned a = 0, b = 0, c = 0, d = 0;
    const bool bf16 = __get_cpuid_count(7, 1, &a, &b, &c, &d) != 0 && (a & (1u << 5)) != 0;
    return bf16 ? HalfOpPath::avx512bf16 : HalfOpPath::avx512;
  }
  if (isa >= CpuIsa::avx2) return HalfOpPath::avx2;
#endif
  return HalfOpPath::scalar;
}

std::atomic<HalfOpPath> g_half_path{detect_half_op_path()};

template <class Half, Half (*FromFloat)(float), class F>
void half_op(void* in, void* inout, int* len, MPI_Datatype*) {
  const auto* a = static_cast<const Half*>(in);
  auto* b = static_cast<Half*>(inout);
  int done = 0;
#if defined(__x86_64__)
  const HalfOpPath path = g_half_path.load(std::memory_order_relaxed);
  if constexpr (std::is_same_v<Half, bfloat16>) {
    if (path == HalfOpPath::avx512bf16)
      done = combine_avx512bf16(a, b, *len, F{});
    else if (path == HalfOpPath::avx512)
      done = combine_avx512(a, b, *len, F{});
  } else if (path >= HalfOpPath::avx512) {
    done = combine_avx512(a, b, *len, F{});
  }
  if (path >= HalfOpPath::avx2) done += combine_avx2(a + done, b + done, *len - done, F{});
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

HalfOpPath half_op_widest() noexcept {
  static const HalfOpPath widest = detect_half_op_path();
  return widest;
}
void limit_half_ops(HalfOpPath widest) noexcept {
  g_half_path.store(std::min(widest, half_op_widest()), std::memory_order_relaxed);
}

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
