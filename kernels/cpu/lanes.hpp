// shardopt CPU kernels (internal): vectors of 16 float lanes, one type per
// vector unit (Lanes512: one AVX-512 register; Lanes256x2: two AVX2
// registers), on which the optimizers' element functions run as they are
// written (kernels/element.hpp): every operator and every overload of
// fma_op, sqrt_op, finite_op and select_op does, in each lane, the one IEEE
// operation the scalar code does, so the lanes compute bitwise what the
// reference kernel computes element by element. Loads and stores of 16-bit
// buffers are kernels/cpu/float_vectors.hpp's (the one family of
// conversions, which cast, finite and the reductions use too); written here
// is only the encoding of parameter remainders (kernels/element.hpp), which
// only the optimizers store, in integer arithmetic.
//
// The functions carry their unit's target attribute but are not forced
// inline: the element functions that call them are generic code, into which
// GCC refuses to force a function of another target. The kernels' entry
// points (kernels/cpu/runner.hpp: range_avx512, range_avx2) are flattened,
// which inlines all of it, element functions included, into code compiled
// for the unit. Included by .cpp files only.
#pragma once

#include <cstddef>
#include <cstdint>

#include "kernels/cpu/float_vectors.hpp"
#include "kernels/cpu/isa.hpp"
#include "shardopt/half.hpp"

#if defined(__x86_64__)

namespace shardopt::kernels::cpu::detail {

#define SHARDOPT_LANES512 SHARDOPT_CPU_TARGET_AVX512 inline
#define SHARDOPT_LANES256 SHARDOPT_CPU_TARGET_AVX2 inline

// ---------------------------------------------------------------------------
// AVX-512

// Lanes where a comparison or a finiteness test holds.
struct Mask512 {
  __mmask16 k;
};

struct Lanes512 {
  static constexpr std::size_t width = 16;
  __m512 v;

  Lanes512() = default;
  SHARDOPT_CPU_TARGET_AVX512 Lanes512(float x) : v(_mm512_set1_ps(x)) {}
  SHARDOPT_CPU_TARGET_AVX512 explicit Lanes512(__m512 x) : v(x) {}

  SHARDOPT_LANES512 static Lanes512 load(const float* p) { return Lanes512(_mm512_loadu_ps(p)); }
  SHARDOPT_LANES512 static Lanes512 load(const bfloat16* p) { return Lanes512(Avx512::load(p)); }
  SHARDOPT_LANES512 static Lanes512 load(const float16* p) { return Lanes512(Avx512::load(p)); }
  SHARDOPT_LANES512 static void store(float* p, Lanes512 x) { _mm512_storeu_ps(p, x.v); }
  SHARDOPT_LANES512 static void store(bfloat16* p, Lanes512 x) { Avx512::store(p, x.v); }
  SHARDOPT_LANES512 static void store(float16* p, Lanes512 x) { Avx512::store(p, x.v); }

  // decode_remainder and encode_remainder in every lane.
  SHARDOPT_LANES512 static Lanes512 load_remainder(const bfloat16* hi, const std::uint16_t* rem) {
    const __m512i h =
        _mm512_cvtepu16_epi32(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(hi)));
    const __m512i r =
        _mm512_cvtepi16_epi32(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(rem)));
    return Lanes512(_mm512_castsi512_ps(_mm512_add_epi32(_mm512_slli_epi32(h, 16), r)));
  }
  SHARDOPT_LANES512 static void store_remainder(bfloat16* hi, std::uint16_t* rem, Lanes512 x) {
    const __m512i u = _mm512_castps_si512(x.v);
    const __m512i h = _mm512_srli_epi32(_mm512_add_epi32(u, _mm512_set1_epi32(0x8000)), 16);
    const __m512i r = _mm512_sub_epi32(u, _mm512_slli_epi32(h, 16));
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(hi), _mm512_cvtepi32_epi16(h));
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(rem), _mm512_cvtepi32_epi16(r));
  }

  // The lanes of a mask, bit l for lane l.
  SHARDOPT_LANES512 static unsigned bits(Mask512 m) { return m.k; }

  // Sums of squares in double, one per lane (LAMB's norms, in the order of
  // kernels/norm.hpp: each square, exact in double, added to its lane).
  struct Sums {
    __m512d lo, hi;
  };
  SHARDOPT_LANES512 static Sums zero_sums() { return {_mm512_setzero_pd(), _mm512_setzero_pd()}; }
  SHARDOPT_LANES512 static void add_squares(Sums& s, Lanes512 x) {
    const __m512d lo = _mm512_cvtps_pd(_mm512_castps512_ps256(x.v));
    const __m512d hi =
        _mm512_cvtps_pd(_mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(x.v), 1)));
    s.lo = _mm512_add_pd(s.lo, _mm512_mul_pd(lo, lo));
    s.hi = _mm512_add_pd(s.hi, _mm512_mul_pd(hi, hi));
  }
  SHARDOPT_LANES512 static void store_sums(double* lanes, const Sums& s) {
    _mm512_storeu_pd(lanes, s.lo);
    _mm512_storeu_pd(lanes + 8, s.hi);
  }
};

SHARDOPT_LANES512 Lanes512 operator+(Lanes512 a, Lanes512 b) {
  return Lanes512(_mm512_add_ps(a.v, b.v));
}
SHARDOPT_LANES512 Lanes512 operator-(Lanes512 a, Lanes512 b) {
  return Lanes512(_mm512_sub_ps(a.v, b.v));
}
SHARDOPT_LANES512 Lanes512 operator*(Lanes512 a, Lanes512 b) {
  return Lanes512(_mm512_mul_ps(a.v, b.v));
}
SHARDOPT_LANES512 Lanes512 operator/(Lanes512 a, Lanes512 b) {
  return Lanes512(_mm512_div_ps(a.v, b.v));
}
// -x flips the sign bit, NaN included, as the scalar negation does.
SHARDOPT_LANES512 Lanes512 operator-(Lanes512 a) {
  return Lanes512(_mm512_xor_ps(a.v, _mm512_set1_ps(-0.0f)));
}
// Ordered comparisons: false where either side is NaN, as in C++.
SHARDOPT_LANES512 Mask512 operator<(Lanes512 a, Lanes512 b) {
  return {_mm512_cmp_ps_mask(a.v, b.v, _CMP_LT_OQ)};
}
SHARDOPT_LANES512 Mask512 operator>(Lanes512 a, Lanes512 b) {
  return {_mm512_cmp_ps_mask(a.v, b.v, _CMP_GT_OQ)};
}
SHARDOPT_LANES512 Lanes512 fma_op(Lanes512 a, Lanes512 b, Lanes512 c) {
  return Lanes512(_mm512_fmadd_ps(a.v, b.v, c.v));
}
SHARDOPT_LANES512 Lanes512 sqrt_op(Lanes512 x) { return Lanes512(_mm512_sqrt_ps(x.v)); }
SHARDOPT_LANES512 Mask512 finite_op(Lanes512 x) {
  const __m512i exp = _mm512_set1_epi32(0x7f800000);
  return {_mm512_cmpneq_epi32_mask(_mm512_and_si512(_mm512_castps_si512(x.v), exp), exp)};
}
SHARDOPT_LANES512 Lanes512 select_op(Mask512 c, Lanes512 a, Lanes512 b) {
  return Lanes512(_mm512_mask_blend_ps(c.k, b.v, a.v));
}
// ---------------------------------------------------------------------------
// AVX2: the same 16 lanes in two registers, lanes 0-7 in lo.

struct Mask256x2 {
  __m256 lo, hi;  // all ones in a lane that holds
};
// finite_op's result, kept as its complement (the comparison that finds
// inf and NaN): bits() takes the complement of the 16 bits instead.
struct Finite256x2 {
  __m256 nonfinite_lo, nonfinite_hi;
};

struct Lanes256x2 {
  static constexpr std::size_t width = 16;
  __m256 lo, hi;

  Lanes256x2() = default;
  SHARDOPT_CPU_TARGET_AVX2 Lanes256x2(float x) : lo(_mm256_set1_ps(x)), hi(lo) {}
  SHARDOPT_CPU_TARGET_AVX2 Lanes256x2(__m256 l, __m256 h) : lo(l), hi(h) {}

  SHARDOPT_LANES256 static Lanes256x2 load(const float* p) {
    return {_mm256_loadu_ps(p), _mm256_loadu_ps(p + 8)};
  }
  SHARDOPT_LANES256 static Lanes256x2 load(const bfloat16* p) {
    return {Avx2::load(p), Avx2::load(p + 8)};
  }
  SHARDOPT_LANES256 static Lanes256x2 load(const float16* p) {
    return {Avx2::load(p), Avx2::load(p + 8)};
  }
  SHARDOPT_LANES256 static void store(float* p, Lanes256x2 x) {
    _mm256_storeu_ps(p, x.lo);
    _mm256_storeu_ps(p + 8, x.hi);
  }
  // One pack for the 16 lanes (it packs within 128-bit halves; the
  // permutation puts the halves in order).
  SHARDOPT_LANES256 static void store(bfloat16* p, Lanes256x2 x) {
    const __m256i packed = _mm256_packus_epi32(Avx2::bf16_bits(x.lo), Avx2::bf16_bits(x.hi));
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(p), _mm256_permute4x64_epi64(packed, 0xd8));
  }
  SHARDOPT_LANES256 static void store(float16* p, Lanes256x2 x) {
    Avx2::store(p, x.lo);
    Avx2::store(p + 8, x.hi);
  }

  SHARDOPT_LANES256 static __m256 decode8(__m128i h, __m128i r) {
    return _mm256_castsi256_ps(_mm256_add_epi32(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16),
                                                _mm256_cvtepi16_epi32(r)));
  }
  SHARDOPT_LANES256 static Lanes256x2 load_remainder(const bfloat16* hi, const std::uint16_t* rem) {
    const __m256i h = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(hi));
    const __m256i r = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(rem));
    return {decode8(_mm256_castsi256_si128(h), _mm256_castsi256_si128(r)),
            decode8(_mm256_extracti128_si256(h, 1), _mm256_extracti128_si256(r, 1))};
  }
  SHARDOPT_LANES256 static void store_remainder(bfloat16* hi, std::uint16_t* rem, Lanes256x2 x) {
    const __m256i ulo = _mm256_castps_si256(x.lo), uhi = _mm256_castps_si256(x.hi);
    const __m256i half = _mm256_set1_epi32(0x8000), low16 = _mm256_set1_epi32(0xffff);
    const __m256i hlo = _mm256_srli_epi32(_mm256_add_epi32(ulo, half), 16);
    const __m256i hhi = _mm256_srli_epi32(_mm256_add_epi32(uhi, half), 16);
    const __m256i rlo = _mm256_and_si256(_mm256_sub_epi32(ulo, _mm256_slli_epi32(hlo, 16)), low16);
    const __m256i rhi = _mm256_and_si256(_mm256_sub_epi32(uhi, _mm256_slli_epi32(hhi, 16)), low16);
    // Every value is below 2^16, so the saturating pack keeps it; it packs
    // within 128-bit halves, and the permutation puts the halves in order.
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(hi),
                        _mm256_permute4x64_epi64(_mm256_packus_epi32(hlo, hhi), 0xd8));
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(rem),
                        _mm256_permute4x64_epi64(_mm256_packus_epi32(rlo, rhi), 0xd8));
  }

  SHARDOPT_LANES256 static unsigned bits(Mask256x2 m) {
    return static_cast<unsigned>(_mm256_movemask_ps(m.lo)) |
           static_cast<unsigned>(_mm256_movemask_ps(m.hi)) << 8;
  }
  SHARDOPT_LANES256 static unsigned bits(Finite256x2 m) {
    return ~(static_cast<unsigned>(_mm256_movemask_ps(m.nonfinite_lo)) |
             static_cast<unsigned>(_mm256_movemask_ps(m.nonfinite_hi)) << 8) &
           0xffffu;
  }

  struct Sums {
    __m256d s[4];  // lanes 0-3, 4-7, 8-11, 12-15
  };
  SHARDOPT_LANES256 static Sums zero_sums() {
    return {{_mm256_setzero_pd(), _mm256_setzero_pd(), _mm256_setzero_pd(), _mm256_setzero_pd()}};
  }
  SHARDOPT_LANES256 static void add_squares(Sums& s, Lanes256x2 x) {
    const __m256d d[4] = {_mm256_cvtps_pd(_mm256_castps256_ps128(x.lo)),
                          _mm256_cvtps_pd(_mm256_extractf128_ps(x.lo, 1)),
                          _mm256_cvtps_pd(_mm256_castps256_ps128(x.hi)),
                          _mm256_cvtps_pd(_mm256_extractf128_ps(x.hi, 1))};
    for (int q = 0; q < 4; ++q) s.s[q] = _mm256_add_pd(s.s[q], _mm256_mul_pd(d[q], d[q]));
  }
  SHARDOPT_LANES256 static void store_sums(double* lanes, const Sums& s) {
    for (int q = 0; q < 4; ++q) _mm256_storeu_pd(lanes + 4 * q, s.s[q]);
  }
};

SHARDOPT_LANES256 Lanes256x2 operator+(Lanes256x2 a, Lanes256x2 b) {
  return {_mm256_add_ps(a.lo, b.lo), _mm256_add_ps(a.hi, b.hi)};
}
SHARDOPT_LANES256 Lanes256x2 operator-(Lanes256x2 a, Lanes256x2 b) {
  return {_mm256_sub_ps(a.lo, b.lo), _mm256_sub_ps(a.hi, b.hi)};
}
SHARDOPT_LANES256 Lanes256x2 operator*(Lanes256x2 a, Lanes256x2 b) {
  return {_mm256_mul_ps(a.lo, b.lo), _mm256_mul_ps(a.hi, b.hi)};
}
SHARDOPT_LANES256 Lanes256x2 operator/(Lanes256x2 a, Lanes256x2 b) {
  return {_mm256_div_ps(a.lo, b.lo), _mm256_div_ps(a.hi, b.hi)};
}
SHARDOPT_LANES256 Lanes256x2 operator-(Lanes256x2 a) {
  const __m256 sign = _mm256_set1_ps(-0.0f);
  return {_mm256_xor_ps(a.lo, sign), _mm256_xor_ps(a.hi, sign)};
}
SHARDOPT_LANES256 Mask256x2 operator<(Lanes256x2 a, Lanes256x2 b) {
  return {_mm256_cmp_ps(a.lo, b.lo, _CMP_LT_OQ), _mm256_cmp_ps(a.hi, b.hi, _CMP_LT_OQ)};
}
SHARDOPT_LANES256 Mask256x2 operator>(Lanes256x2 a, Lanes256x2 b) {
  return {_mm256_cmp_ps(a.lo, b.lo, _CMP_GT_OQ), _mm256_cmp_ps(a.hi, b.hi, _CMP_GT_OQ)};
}
SHARDOPT_LANES256 Lanes256x2 fma_op(Lanes256x2 a, Lanes256x2 b, Lanes256x2 c) {
  return {_mm256_fmadd_ps(a.lo, b.lo, c.lo), _mm256_fmadd_ps(a.hi, b.hi, c.hi)};
}
SHARDOPT_LANES256 Lanes256x2 sqrt_op(Lanes256x2 x) {
  return {_mm256_sqrt_ps(x.lo), _mm256_sqrt_ps(x.hi)};
}
// Lanes whose exponent is all ones (inf or NaN).
SHARDOPT_LANES256 __m256 nonfinite8(__m256 x) {
  const __m256i exp = _mm256_set1_epi32(0x7f800000);
  return _mm256_castsi256_ps(
      _mm256_cmpeq_epi32(_mm256_and_si256(_mm256_castps_si256(x), exp), exp));
}
SHARDOPT_LANES256 Finite256x2 finite_op(Lanes256x2 x) {
  return {nonfinite8(x.lo), nonfinite8(x.hi)};
}
SHARDOPT_LANES256 Lanes256x2 select_op(Mask256x2 c, Lanes256x2 a, Lanes256x2 b) {
  return {_mm256_blendv_ps(b.lo, a.lo, c.lo), _mm256_blendv_ps(b.hi, a.hi, c.hi)};
}

#undef SHARDOPT_LANES512
#undef SHARDOPT_LANES256

}  // namespace shardopt::kernels::cpu::detail

#endif
