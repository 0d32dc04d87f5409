// The CPU reductions (kernels/reduce.hpp): AVX2 where the CPU has it, the
// x86-64 baseline elsewhere, chosen at run time.
#include "kernels/reduce.hpp"

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdint>
#include <cstring>

#include "kernels/cpu/float_vectors.hpp"
#include "kernels/cpu/isa.hpp"
#include "shardopt/half.hpp"

namespace shardopt::kernels::cpu {

namespace {

// Elements combined per tile of the 16-bit types: the accumulator and one
// widened source stay in L1 while every source streams through once.
constexpr std::size_t kTile = 1024;
// The same types' tile when streamed out, and their pieces when more than
// one pass reads dst back (32 KiB of f32: L1).
constexpr std::size_t kStreamTile = 256;
constexpr std::size_t kPiece = 8192;

struct Sum {
  template <class A>
  A operator()(A x, A y) const {
    return x + y;
  }
};
struct Max {
  template <class A>
  A operator()(A x, A y) const {
    if constexpr (std::is_floating_point_v<A>) return (x > y || x != x) ? x : y;
    return x > y ? x : y;
  }
};
struct Min {
  template <class A>
  A operator()(A x, A y) const {
    if constexpr (std::is_floating_point_v<A>) return (x < y || x != x) ? x : y;
    return x < y ? x : y;
  }
};

// 16-bit floats to f32 and back, a tile at a time: scalar here, AVX2 below.
void widen_scalar(const bfloat16* s, float* d, std::size_t n) {
  for (std::size_t i = 0; i < n; ++i) d[i] = to_float(s[i]);
}
void widen_scalar(const float16* s, float* d, std::size_t n) {
  for (std::size_t i = 0; i < n; ++i) d[i] = to_float(s[i]);
}
void narrow_scalar(const float* s, bfloat16* d, std::size_t n) {
  for (std::size_t i = 0; i < n; ++i) d[i] = bf16_from_float(s[i]);
}
void narrow_scalar(const float* s, float16* d, std::size_t n) {
  for (std::size_t i = 0; i < n; ++i) d[i] = f16_from_float(s[i]);
}

#if defined(__x86_64__)

// 8 at a time through the kernels' conversions (float_vectors.hpp), the
// same bits as the scalar ones.
template <class H>
SHARDOPT_CPU_TARGET_AVX2 void widen_avx2(const H* s, float* d, std::size_t n) {
  std::size_t i = 0;
  for (; i + 8 <= n; i += 8) _mm256_storeu_ps(d + i, detail::Avx2::load(s + i));
  widen_scalar(s + i, d + i, n - i);
}
template <class H>
SHARDOPT_CPU_TARGET_AVX2 void narrow_avx2(const float* s, H* d, std::size_t n) {
  std::size_t i = 0;
  for (; i + 8 <= n; i += 8) detail::Avx2::store(d + i, _mm256_loadu_ps(s + i));
  narrow_scalar(s + i, d + i, n - i);
}
// Non-temporal stores of whole 32-byte lines of dst, memcpy around them.
SHARDOPT_CPU_TARGET_AVX2 void stream_avx2(void* dst, const void* src, std::size_t bytes) {
  auto* d = static_cast<char*>(dst);
  const auto* s = static_cast<const char*>(src);
  const std::size_t head = std::min(bytes, (32 - reinterpret_cast<std::uintptr_t>(d) % 32) % 32);
  std::memcpy(d, s, head);
  std::size_t i = head;
  for (; i + 32 <= bytes; i += 32) {
    _mm256_stream_si256(reinterpret_cast<__m256i*>(d + i),
                        _mm256_loadu_si256(reinterpret_cast<const __m256i*>(s + i)));
  }
  std::memcpy(d + i, s + i, bytes - i);
}
#endif

// A finished tile into dst: memcpy, or past the caches.
template <bool Avx2>
[[gnu::always_inline]] inline void store_tile(void* dst, const void* tile, std::size_t bytes,
                                              bool stream) {
#if defined(__x86_64__)
  if constexpr (Avx2) {
    if (stream) return stream_avx2(dst, tile, bytes);
  }
#endif
  std::memcpy(dst, tile, bytes);
}

template <bool Avx2, class H>
[[gnu::always_inline]] inline void widen(const H* s, float* d, std::size_t n) {
#if defined(__x86_64__)
  if constexpr (Avx2) return widen_avx2(s, d, n);
#endif
  widen_scalar(s, d, n);
}
template <bool Avx2, class H>
[[gnu::always_inline]] inline void narrow(const float* s, H* d, std::size_t n) {
#if defined(__x86_64__)
  if constexpr (Avx2) return narrow_avx2(s, d, n);
#endif
  narrow_scalar(s, d, n);
}

// Sources [0, k) (k from 1 to 4, elements off.. of each) combined into
// d[0, len) in one pass, left to right; with Acc, d's own values first.
// Each pass streams its sources at once: a pass per source, or a copy of
// every small tile, leaves the memory idle between them (docs/benchmarks.md,
// "One-pass reductions and the user's gradient buffers").
template <class T, class Op, bool Acc, int K>
[[gnu::always_inline]] inline void combine_k(T* __restrict d, const void* const* src,
                                             std::size_t off, std::size_t len) {
  const T* __restrict s0 = static_cast<const T*>(src[0]) + off;
  const T* __restrict s1 = static_cast<const T*>(src[K > 1 ? 1 : 0]) + off;
  const T* __restrict s2 = static_cast<const T*>(src[K > 2 ? 2 : 0]) + off;
  const T* __restrict s3 = static_cast<const T*>(src[K > 3 ? 3 : 0]) + off;
  for (std::size_t i = 0; i < len; ++i) {
    T x = Acc ? Op{}(d[i], s0[i]) : s0[i];
    if constexpr (K > 1) x = Op{}(x, s1[i]);
    if constexpr (K > 2) x = Op{}(x, s2[i]);
    if constexpr (K > 3) x = Op{}(x, s3[i]);
    d[i] = x;
  }
}
template <class T, class Op, bool Acc>
[[gnu::always_inline]] inline void combine(T* d, const void* const* src, int k, std::size_t off,
                                           std::size_t len) {
  switch (k) {
    case 1:
      return combine_k<T, Op, Acc, 1>(d, src, off, len);
    case 2:
      return combine_k<T, Op, Acc, 2>(d, src, off, len);
    case 3:
      return combine_k<T, Op, Acc, 3>(d, src, off, len);
    default:
      return combine_k<T, Op, Acc, 4>(d, src, off, len);
  }
}
// Every source into d[0, len), in rank order: four at a time, the later
// passes onto d; avg divides at the end.
template <class T, class Op>
[[gnu::always_inline]] inline void combine_all(T* d, const void* const* src, int n, std::size_t off,
                                               std::size_t len, bool avg) {
  combine<T, Op, false>(d, src, std::min(n, 4), off, len);
  for (int q = 4; q < n; q += 4) combine<T, Op, true>(d, src + q, std::min(n - q, 4), off, len);
  if constexpr (std::is_floating_point_v<T>) {
    if (avg) {
      const T div = static_cast<T>(n);
      for (std::size_t i = 0; i < len; ++i) d[i] /= div;
    }
  }
}

// A type combined in its own arithmetic. Into dst directly (in pieces that
// stay in cache when later passes read them back), or, streamed, through a
// small tile in L1 whose lines are written past the caches.
template <bool Avx2, class T, class Op>
[[gnu::always_inline]] inline void reduce_same(const void* const* src, int n, T* dst,
                                               std::size_t count, bool avg, bool stream) {
  if (!stream) {
    const std::size_t piece = n <= 4 && !avg ? count : kPiece;
    for (std::size_t t = 0; t < count; t += piece)
      combine_all<T, Op>(dst + t, src, n, t, std::min(piece, count - t), avg);
    return;
  }
  alignas(64) T tile[kStreamTile];
  for (std::size_t t = 0; t < count; t += kStreamTile) {
    const std::size_t len = std::min(kStreamTile, count - t);
    combine_all<T, Op>(tile, src, n, t, len, avg);
    store_tile<Avx2>(dst + t, tile, len * sizeof(T), stream);
  }
}

// A 16-bit float: widened a tile at a time, combined in f32, rounded once.
template <bool Avx2, class H, class Op>
[[gnu::always_inline]] inline void reduce_half(const void* const* src, int n, H* dst,
                                               std::size_t count, bool avg, bool stream) {
  alignas(64) float acc[kTile];
  alignas(64) float wide[kTile];
  alignas(64) H narrowed[kTile];
  for (std::size_t t = 0; t < count; t += kTile) {
    const std::size_t len = std::min(kTile, count - t);
    widen<Avx2>(static_cast<const H*>(src[0]) + t, acc, len);
    for (int q = 1; q < n; ++q) {
      widen<Avx2>(static_cast<const H*>(src[q]) + t, wide, len);
      for (std::size_t i = 0; i < len; ++i) acc[i] = Op{}(acc[i], wide[i]);
    }
    if (avg) {
      const float div = static_cast<float>(n);
      for (std::size_t i = 0; i < len; ++i) acc[i] /= div;
    }
    // Into dst directly unless streamed: a small memcpy (rep movsb) stalls
    // the loads around it.
    if (!stream) {
      narrow<Avx2>(acc, dst + t, len);
      continue;
    }
    narrow<Avx2>(acc, narrowed, len);
    store_tile<Avx2>(dst + t, narrowed, len * sizeof(H), stream);
  }
}

template <bool Avx2, class Op>
[[gnu::always_inline]] inline void reduce_op(DType t, const void* const* src, int n, void* dst,
                                             std::size_t count, bool avg, bool stream) {
  switch (t) {
    case DType::f32:
      return reduce_same<Avx2, float, Op>(src, n, static_cast<float*>(dst), count, avg, stream);
    case DType::f64:
      return reduce_same<Avx2, double, Op>(src, n, static_cast<double*>(dst), count, avg, stream);
    case DType::i32:
      return reduce_same<Avx2, std::int32_t, Op>(src, n, static_cast<std::int32_t*>(dst), count,
                                                 avg, stream);
    case DType::i64:
      return reduce_same<Avx2, std::int64_t, Op>(src, n, static_cast<std::int64_t*>(dst), count,
                                                 avg, stream);
    case DType::bf16:
      return reduce_half<Avx2, bfloat16, Op>(src, n, static_cast<bfloat16*>(dst), count, avg,
                                             stream);
    case DType::f16:
      return reduce_half<Avx2, float16, Op>(src, n, static_cast<float16*>(dst), count, avg, stream);
  }
}

template <bool Avx2>
[[gnu::always_inline]] inline void reduce_any(DType t, ReduceOp op, const void* const* src, int n,
                                              void* dst, std::size_t count, bool stream) {
  switch (op) {
    case ReduceOp::sum:
    case ReduceOp::avg:
      return reduce_op<Avx2, Sum>(t, src, n, dst, count, op == ReduceOp::avg, stream);
    case ReduceOp::max:
      return reduce_op<Avx2, Max>(t, src, n, dst, count, false, stream);
    case ReduceOp::min:
      return reduce_op<Avx2, Min>(t, src, n, dst, count, false, stream);
  }
}

#if defined(__x86_64__)
SHARDOPT_CPU_TARGET_AVX2 void reduce_avx2(DType t, ReduceOp op, const void* const* src, int n,
                                          void* dst, std::size_t count, bool stream) {
  reduce_any<true>(t, op, src, n, dst, count, stream);
  if (stream) _mm_sfence();
}
#endif
void reduce_baseline(DType t, ReduceOp op, const void* const* src, int n, void* dst,
                     std::size_t count) {
  reduce_any<false>(t, op, src, n, dst, count, false);
}

bool have_avx2() {
#if defined(__x86_64__)
  // SHARDOPT_CPU_ISA caps the optimizer kernels only, as for MPI's ops.
  static const bool yes = detail::detect_isa() >= detail::Isa::avx2;
  return yes;
#else
  return false;
#endif
}

// ---------------------------------------------------------------------------
// Two buffers at a time (combine_pair): MPI's user-defined ops for bf16 and
// f16.

// inout = f(in, inout), each result rounded once, to nearest even, back to
// the 16-bit type.
template <class Half, Half (*FromFloat)(float), class F>
void combine_scalar(const Half* a, Half* b, int len, F f) {
  for (int i = 0; i < len; ++i) b[i] = FromFloat(f(to_float(a[i]), to_float(b[i])));
}

#if defined(__x86_64__)
// The same combinations, 8 elements at a time with AVX2 (and F16C for f16's
// conversions, which round to nearest even like f16_from_float). Chosen at
// run time, so one binary runs on every x86-64 node; the scalar loop finishes
// the tail and runs everywhere else. Results are bitwise those of
// combine_scalar().

// bf16 -> f32 is a 16-bit shift: interleaving the words with zeros does it,
// 16 elements at a time (lo: elements 0-3 and 8-11, hi: 4-7 and 12-15).
SHARDOPT_CPU_TARGET_AVX2 inline __m256 bf16_lo(__m256i w) {
  return _mm256_castsi256_ps(_mm256_unpacklo_epi16(_mm256_setzero_si256(), w));
}
SHARDOPT_CPU_TARGET_AVX2 inline __m256 bf16_hi(__m256i w) {
  return _mm256_castsi256_ps(_mm256_unpackhi_epi16(_mm256_setzero_si256(), w));
}
// f32 -> bf16 bits in the low half of each 32-bit lane, as bf16_from_float.
SHARDOPT_CPU_TARGET_AVX2 inline __m256i bf16_round(__m256 x) { return detail::Avx2::bf16_bits(x); }
SHARDOPT_CPU_TARGET_AVX2 inline __m256 load8(const float16* p) {
  return _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
}
SHARDOPT_CPU_TARGET_AVX2 inline void store8(float16* p, __m256 x) {
  _mm_storeu_si128(reinterpret_cast<__m128i*>(p),
                   _mm256_cvtps_ph(x, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
}
SHARDOPT_CPU_TARGET_AVX2 inline __m256 apply8(Sum, __m256 x, __m256 y) {
  return _mm256_add_ps(x, y);
}
SHARDOPT_CPU_TARGET_AVX2 inline __m256 apply8(Max, __m256 x, __m256 y) {
  const __m256 take_x =
      _mm256_or_ps(_mm256_cmp_ps(x, y, _CMP_GT_OQ), _mm256_cmp_ps(x, x, _CMP_UNORD_Q));
  return _mm256_blendv_ps(y, x, take_x);
}
SHARDOPT_CPU_TARGET_AVX2 inline __m256 apply8(Min, __m256 x, __m256 y) {
  const __m256 take_x =
      _mm256_or_ps(_mm256_cmp_ps(x, y, _CMP_LT_OQ), _mm256_cmp_ps(x, x, _CMP_UNORD_Q));
  return _mm256_blendv_ps(y, x, take_x);
}

template <class F>
SHARDOPT_CPU_TARGET_AVX2 int combine_avx2(const float16* a, float16* b, int len, F f) {
  int i = 0;
  for (; i + 8 <= len; i += 8) store8(b + i, apply8(f, load8(a + i), load8(b + i)));
  return i;
}

// bf16_round for lanes that hold no NaN: round to nearest even alone.
SHARDOPT_CPU_TARGET_AVX2 inline __m256i bf16_round_numbers(__m256 x) {
  const __m256i u = _mm256_castps_si256(x);
  const __m256i odd = _mm256_and_si256(_mm256_srli_epi32(u, 16), _mm256_set1_epi32(1));
  return _mm256_srli_epi32(_mm256_add_epi32(u, _mm256_add_epi32(_mm256_set1_epi32(0x7fff), odd)),
                           16);
}

template <class F>
SHARDOPT_CPU_TARGET_AVX2 int combine_avx2(const bfloat16* a, bfloat16* b, int len, F f) {
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
#define SHARDOPT_CPU_TARGET_AVX512BF16 \
  __attribute__((target("avx512f,avx512bw,avx512vl,avx512dq,fma,f16c,avx512bf16")))

SHARDOPT_CPU_TARGET_AVX512 inline __m512 bf16_lo(__m512i w) {
  return _mm512_castsi512_ps(_mm512_unpacklo_epi16(_mm512_setzero_si512(), w));
}
SHARDOPT_CPU_TARGET_AVX512 inline __m512 bf16_hi(__m512i w) {
  return _mm512_castsi512_ps(_mm512_unpackhi_epi16(_mm512_setzero_si512(), w));
}
SHARDOPT_CPU_TARGET_AVX512 inline __m512i bf16_round(__m512 x) {
  return detail::Avx512::bf16_bits(x);
}
SHARDOPT_CPU_TARGET_AVX512 inline __m512 apply16(Sum, __m512 x, __m512 y) {
  return _mm512_add_ps(x, y);
}
SHARDOPT_CPU_TARGET_AVX512 inline __m512 apply16(Max, __m512 x, __m512 y) {
  const __mmask16 take_x =
      _mm512_cmp_ps_mask(x, y, _CMP_GT_OQ) | _mm512_cmp_ps_mask(x, x, _CMP_UNORD_Q);
  return _mm512_mask_blend_ps(take_x, y, x);
}
SHARDOPT_CPU_TARGET_AVX512 inline __m512 apply16(Min, __m512 x, __m512 y) {
  const __mmask16 take_x =
      _mm512_cmp_ps_mask(x, y, _CMP_LT_OQ) | _mm512_cmp_ps_mask(x, x, _CMP_UNORD_Q);
  return _mm512_mask_blend_ps(take_x, y, x);
}

template <class F>
SHARDOPT_CPU_TARGET_AVX512 int combine_avx512(const float16* a, float16* b, int len, F f) {
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
SHARDOPT_CPU_TARGET_AVX512 int combine_avx512(const bfloat16* a, bfloat16* b, int len, F f) {
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
SHARDOPT_CPU_TARGET_AVX512BF16 int combine_avx512bf16(const bfloat16* a, bfloat16* b, int len,
                                                      F f) {
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

// Detected once: AVX2 with F16C (with FMA, as the optimizer kernels ask: no
// CPU has AVX2 and F16C without it), AVX-512, and AVX512_BF16 (CPUID leaf
// 7, sub-leaf 1, EAX bit 5). SHARDOPT_CPU_ISA does not apply: it caps the
// optimizer kernels only.
PairPath detect_pair_path() noexcept {
#if defined(__x86_64__)
  const detail::Isa isa = detail::detect_isa();
  if (isa >= detail::Isa::avx512) {
    unsigned a = 0, b = 0, c = 0, d = 0;
    const bool bf16 = __get_cpuid_count(7, 1, &a, &b, &c, &d) != 0 && (a & (1u << 5)) != 0;
    return bf16 ? PairPath::avx512bf16 : PairPath::avx512;
  }
  if (isa >= detail::Isa::avx2) return PairPath::avx2;
#endif
  return PairPath::scalar;
}

std::atomic<PairPath> g_pair_path{detect_pair_path()};

template <class Half, Half (*FromFloat)(float), class F>
void combine_half(const void* in, void* inout, int len) {
  const auto* a = static_cast<const Half*>(in);
  auto* b = static_cast<Half*>(inout);
  int done = 0;
#if defined(__x86_64__)
  const PairPath path = g_pair_path.load(std::memory_order_relaxed);
  if constexpr (std::is_same_v<Half, bfloat16>) {
    if (path == PairPath::avx512bf16)
      done = combine_avx512bf16(a, b, len, F{});
    else if (path == PairPath::avx512)
      done = combine_avx512(a, b, len, F{});
  } else if (path >= PairPath::avx512) {
    done = combine_avx512(a, b, len, F{});
  }
  if (path >= PairPath::avx2) done += combine_avx2(a + done, b + done, len - done, F{});
#endif
  combine_scalar<Half, FromFloat>(a + done, b + done, len - done, F{});
}

template <class Half, Half (*FromFloat)(float)>
void combine_type(ReduceOp op, const void* in, void* inout, int len) {
  switch (op) {
    case ReduceOp::max:
      return combine_half<Half, FromFloat, Max>(in, inout, len);
    case ReduceOp::min:
      return combine_half<Half, FromFloat, Min>(in, inout, len);
    default:
      return combine_half<Half, FromFloat, Sum>(in, inout, len);
  }
}

}  // namespace

void reduce_arrays(DType t, ReduceOp op, const void* const* src, int n, void* dst,
                   std::size_t count, bool stream) noexcept {
  if (count == 0 || n <= 0) return;
#if defined(__x86_64__)
  if (have_avx2()) return reduce_avx2(t, op, src, n, dst, count, stream);
#endif
  reduce_baseline(t, op, src, n, dst, count);
}

void copy_bytes(void* dst, const void* src, std::size_t bytes, bool stream) noexcept {
#if defined(__x86_64__)
  if (stream && have_avx2()) {
    stream_avx2(dst, src, bytes);
    _mm_sfence();
    return;
  }
#endif
  std::memcpy(dst, src, bytes);
}

PairPath pair_path_widest() noexcept {
  static const PairPath widest = detect_pair_path();
  return widest;
}
void limit_pair_path(PairPath widest) noexcept {
  g_pair_path.store(std::min(widest, pair_path_widest()), std::memory_order_relaxed);
}

void combine_pair(DType t, ReduceOp op, const void* in, void* inout, int len) noexcept {
  if (t == DType::f16)
    combine_type<float16, f16_from_float>(op, in, inout, len);
  else
    combine_type<bfloat16, bf16_from_float>(op, in, inout, len);
}

}  // namespace shardopt::kernels::cpu
