// shardopt CPU kernels (internal): vectors of floats loaded from and stored
// to f32, bf16 and f16 memory, one struct per vector unit, with the
// conversions of shardopt/half.hpp bitwise: f16 by the F16C instructions
// (vcvtph2ps, vcvtps2ph with round to nearest even; to_float and
// f16_from_float give the same bits, NaNs included), bf16 by integer
// arithmetic (a shift up; bf16_from_float's rounding down). Every member
// carries its unit's target attribute, so GCC inlines the intrinsics into
// it, and it inlines only into functions compiled for that unit (a caller
// without the attribute is a compile error, not a slow call). Included by
// .cpp files only.
#pragma once

#include <cstddef>
#include <type_traits>

#include "kernels/cast.hpp"
#include "kernels/cpu/isa.hpp"
#include "shardopt/half.hpp"

#if defined(__x86_64__)
// The intrinsics: through kernels/cpu/isa.hpp.

namespace shardopt::kernels::cpu::detail {

// AVX-512: 16 floats.
struct Avx512 {
  static constexpr std::size_t width = 16;
  using Vec = __m512;

  [[gnu::always_inline]] SHARDOPT_CPU_TARGET_AVX512 static inline Vec load(const float* p) {
    return _mm512_loadu_ps(p);
  }
  [[gnu::always_inline]] SHARDOPT_CPU_TARGET_AVX512 static inline Vec load(const bfloat16* p) {
    const __m256i h = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p));
    return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
  }
  [[gnu::always_inline]] SHARDOPT_CPU_TARGET_AVX512 static inline Vec load(const float16* p) {
    return _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)));
  }

  [[gnu::always_inline]] SHARDOPT_CPU_TARGET_AVX512 static inline void store(float* p, Vec x) {
    _mm512_storeu_ps(p, x);
  }
  // bf16_from_float in every lane: a NaN keeps its high half, made quiet;
  // anything else rounds to nearest even (inf stays inf, overflow gives inf).
  [[gnu::always_inline]] SHARDOPT_CPU_TARGET_AVX512 static inline void store(bfloat16* p, Vec x) {
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(p), _mm512_cvtepi32_epi16(bf16_bits(x)));
  }
  // bf16_from_float's bits in the low half of every 32-bit lane: the NaN
  // lanes (an unordered self-comparison) take their quiet high half in the
  // same masked OR that would otherwise be a blend.
  [[gnu::always_inline]] SHARDOPT_CPU_TARGET_AVX512 static inline __m512i bf16_bits(Vec x) {
    const __m512i u = _mm512_castps_si512(x);
    const __m512i high = _mm512_srli_epi32(u, 16);
    const __m512i bias =
        _mm512_add_epi32(_mm512_set1_epi32(0x7fff), _mm512_and_si512(high, _mm512_set1_epi32(1)));
    const __m512i rounded = _mm512_srli_epi32(_mm512_add_epi32(u, bias), 16);
    const __mmask16 nan = _mm512_cmp_ps_mask(x, x, _CMP_UNORD_Q);
    return _mm512_mask_or_epi32(rounded, nan, high, _mm512_set1_epi32(0x40));
  }
  [[gnu::always_inline]] SHARDOPT_CPU_TARGET_AVX512 static inline void store(float16* p, Vec x) {
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(p),
                        _mm512_cvtps_ph(x, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
  }

  // A mask of the lanes of x * mul that are inf or nan.
  [[gnu::always_inline]] SHARDOPT_CPU_TARGET_AVX512 static inline unsigned nonfinite(Vec x,
                                                                                     Vec mul) {
    const __m512i exp = _mm512_set1_epi32(0x7f800000);
    const __m512i u = _mm512_castps_si512(_mm512_mul_ps(x, mul));
    return _mm512_cmpeq_epi32_mask(_mm512_and_si512(u, exp), exp);
  }
  [[gnu::always_inline]] SHARDOPT_CPU_TARGET_AVX512 static inline Vec broadcast(float x) {
    return _mm512_set1_ps(x);
  }
};

// AVX2 with F16C: 8 floats.
struct Avx2 {
  static constexpr std::size_t width = 8;
  using Vec = __m256;

  [[gnu::always_inline]] SHARDOPT_CPU_TARGET_AVX2 static inline Vec load(const float* p) {
    return _mm256_loadu_ps(p);
  }
  [[gnu::always_inline]] SHARDOPT_CPU_TARGET_AVX2 static inline Vec load(const bfloat16* p) {
    const __m128i h = _mm_loadu_si128(reinterpret_cast<const __m128i*>(p));
    return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16));
  }
  [[gnu::always_inline]] SHARDOPT_CPU_TARGET_AVX2 static inline Vec load(const float16* p) {
    return _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
  }

  [[gnu::always_inline]] SHARDOPT_CPU_TARGET_AVX2 static inline void store(float* p, Vec x) {
    _mm256_storeu_ps(p, x);
  }
  // As Avx512::store(bfloat16*, ...).
  [[gnu::always_inline]] SHARDOPT_CPU_TARGET_AVX2 static inline void store(bfloat16* p, Vec x) {
    const __m256i bits = bf16_bits(x);
    // Every lane is below 2^16: the unsigned saturating pack keeps it.
    const __m128i packed =
        _mm_packus_epi32(_mm256_castsi256_si128(bits), _mm256_extracti128_si256(bits, 1));
    _mm_storeu_si128(reinterpret_cast<__m128i*>(p), packed);
  }
  // As Avx512::bf16_bits.
  [[gnu::always_inline]] SHARDOPT_CPU_TARGET_AVX2 static inline __m256i bf16_bits(Vec x) {
    const __m256i u = _mm256_castps_si256(x);
    const __m256i high = _mm256_srli_epi32(u, 16);
    const __m256i bias =
        _mm256_add_epi32(_mm256_set1_epi32(0x7fff), _mm256_and_si256(high, _mm256_set1_epi32(1)));
    const __m256i rounded = _mm256_srli_epi32(_mm256_add_epi32(u, bias), 16);
    const __m256i quiet = _mm256_or_si256(high, _mm256_set1_epi32(0x40));
    const __m256 nan = _mm256_cmp_ps(x, x, _CMP_UNORD_Q);
    return _mm256_castps_si256(
        _mm256_blendv_ps(_mm256_castsi256_ps(rounded), _mm256_castsi256_ps(quiet), nan));
  }
  [[gnu::always_inline]] SHARDOPT_CPU_TARGET_AVX2 static inline void store(float16* p, Vec x) {
    _mm_storeu_si128(reinterpret_cast<__m128i*>(p),
                     _mm256_cvtps_ph(x, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
  }

  [[gnu::always_inline]] SHARDOPT_CPU_TARGET_AVX2 static inline unsigned nonfinite(Vec x, Vec mul) {
    const __m256i exp = _mm256_set1_epi32(0x7f800000);
    const __m256i u = _mm256_castps_si256(_mm256_mul_ps(x, mul));
    const __m256i bad = _mm256_cmpeq_epi32(_mm256_and_si256(u, exp), exp);
    return static_cast<unsigned>(_mm256_movemask_ps(_mm256_castsi256_ps(bad)));
  }
  [[gnu::always_inline]] SHARDOPT_CPU_TARGET_AVX2 static inline Vec broadcast(float x) {
    return _mm256_set1_ps(x);
  }
};

// Converts s[begin, end) into d[begin, end) (cast_element's bits) with AVX-512
// or AVX2 vectors and a scalar tail. A whole vector is loaded before it is
// stored, so src == dst (types of one size) converts in place.
template <class Dst, class Src>
SHARDOPT_CPU_TARGET_AVX512 void convert_avx512(const Src* s, Dst* d, std::size_t begin,
                                               std::size_t end) {
  std::size_t i = begin;
  for (; i + Avx512::width <= end; i += Avx512::width) Avx512::store(d + i, Avx512::load(s + i));
  for (; i < end; ++i) d[i] = cast_element<Dst>(s[i]);
}
template <class Dst, class Src>
SHARDOPT_CPU_TARGET_AVX2 void convert_avx2(const Src* s, Dst* d, std::size_t begin,
                                           std::size_t end) {
  std::size_t i = begin;
  for (; i + Avx2::width <= end; i += Avx2::width) Avx2::store(d + i, Avx2::load(s + i));
  for (; i < end; ++i) d[i] = cast_element<Dst>(s[i]);
}

}  // namespace shardopt::kernels::cpu::detail
#endif

namespace shardopt::kernels::cpu::detail {

// The same element by element, for the baseline unit (inlined into its
// caller, whose vector unit then vectorizes what it can).
template <class Dst, class Src>
[[gnu::always_inline]] inline void convert_scalar(const Src* s, Dst* d, std::size_t begin,
                                                  std::size_t end) {
  for (std::size_t i = begin; i < end; ++i) d[i] = cast_element<Dst>(s[i]);
}

#if !defined(__x86_64__)
template <class Dst, class Src>
void convert_avx512(const Src* s, Dst* d, std::size_t begin, std::size_t end) {
  convert_scalar(s, d, begin, end);
}
template <class Dst, class Src>
void convert_avx2(const Src* s, Dst* d, std::size_t begin, std::size_t end) {
  convert_scalar(s, d, begin, end);
}
#endif

}  // namespace shardopt::kernels::cpu::detail
