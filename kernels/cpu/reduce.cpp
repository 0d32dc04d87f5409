// The CPU reductions (kernels/reduce.hpp): AVX2 where the CPU has it, the
// x86-64 baseline elsewhere, chosen at run time.
#include "kernels/reduce.hpp"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>

#if defined(__x86_64__)
#include <immintrin.h>
#endif

#include "common/cpu_features.hpp"
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
#define SHARDOPT_SHM_AVX2 __attribute__((target("avx2,fma,f16c")))

SHARDOPT_SHM_AVX2 void widen_avx2(const bfloat16* s, float* d, std::size_t n) {
  std::size_t i = 0;
  for (; i + 8 <= n; i += 8) {
    const __m128i h = _mm_loadu_si128(reinterpret_cast<const __m128i*>(s + i));
    _mm256_storeu_ps(d + i, _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16)));
  }
  widen_scalar(s + i, d + i, n - i);
}
SHARDOPT_SHM_AVX2 void widen_avx2(const float16* s, float* d, std::size_t n) {
  std::size_t i = 0;
  for (; i + 8 <= n; i += 8)
    _mm256_storeu_ps(d + i,
                     _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(s + i))));
  widen_scalar(s + i, d + i, n - i);
}
// bf16_from_float on 8 lanes: round to nearest even; a NaN keeps its high
// half and is made quiet.
SHARDOPT_SHM_AVX2 void narrow_avx2(const float* s, bfloat16* d, std::size_t n) {
  std::size_t i = 0;
  for (; i + 8 <= n; i += 8) {
    const __m256i u = _mm256_castps_si256(_mm256_loadu_ps(s + i));
    const __m256i high = _mm256_srli_epi32(u, 16);
    const __m256i bias =
        _mm256_add_epi32(_mm256_set1_epi32(0x7fff), _mm256_and_si256(high, _mm256_set1_epi32(1)));
    const __m256i rounded = _mm256_srli_epi32(_mm256_add_epi32(u, bias), 16);
    const __m256i quiet = _mm256_or_si256(high, _mm256_set1_epi32(0x40));
    const __m256i nan = _mm256_cmpgt_epi32(_mm256_and_si256(u, _mm256_set1_epi32(0x7fffffff)),
                                           _mm256_set1_epi32(0x7f800000));
    const __m256i r = _mm256_blendv_epi8(rounded, quiet, nan);
    // The low 16 bits of each lane, in order.
    const __m128i packed =
        _mm_packus_epi32(_mm256_castsi256_si128(r), _mm256_extracti128_si256(r, 1));
    _mm_storeu_si128(reinterpret_cast<__m128i*>(d + i), packed);
  }
  narrow_scalar(s + i, d + i, n - i);
}
SHARDOPT_SHM_AVX2 void narrow_avx2(const float* s, float16* d, std::size_t n) {
  std::size_t i = 0;
  for (; i + 8 <= n; i += 8) {
    _mm_storeu_si128(reinterpret_cast<__m128i*>(d + i),
                     _mm256_cvtps_ph(_mm256_loadu_ps(s + i), _MM_FROUND_TO_NEAREST_INT));
  }
  narrow_scalar(s + i, d + i, n - i);
}
// Non-temporal stores of whole 32-byte lines of dst, memcpy around them.
SHARDOPT_SHM_AVX2 void stream_avx2(void* dst, const void* src, std::size_t bytes) {
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
SHARDOPT_SHM_AVX2 void reduce_avx2(DType t, ReduceOp op, const void* const* src, int n, void* dst,
                                   std::size_t count, bool stream) {
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
  static const bool yes = ::shardopt::detail::detect_cpu_isa() >= CpuIsa::avx2;
  return yes;
#else
  return false;
#endif
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

}  // namespace shardopt::kernels::cpu
