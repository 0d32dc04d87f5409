// shardopt-bench-optim's limit: memory-only kernels that move the streams
// of an optimizer step (every read and in-place write, trivial arithmetic)
// and STREAM triad, split across OpenMP threads and compiled for the vector
// unit as the CPU optimizer kernels are. main.cpp times them beside the
// steps.
#include "limits.hpp"

#include <omp.h>

#include <algorithm>
#include <bit>
#include <cstddef>
#include <cstdint>

#include "shardopt/config.hpp"
#include "shardopt/half.hpp"
#include "shardopt/types.hpp"

namespace limits {

using bench::Streams;
using shardopt::DType;

// Memory-only kernels: the limit and STREAM triad.
//
// Both split the range across OpenMP threads as the CPU optimizer kernels do
// (one static block per thread, rounded up to 16 floats; one thread below
// 32768 elements) and run a loop compiled for the vector unit the optimizer
// kernels use (the widest present, capped by SHARDOPT_CPU_ISA).

using shardopt::kernels::cpu::detail::Isa;

// The widest vector unit present (the kernels' own detection), capped as
// the optimizer kernels cap it (SHARDOPT_CPU_ISA): the limit kernels run on
// the same unit as the steps they bound. Decided at the first use
// (settings() may throw a ConfigError, which main_of reports).
Isa used_isa() {
  static const Isa isa = std::min(shardopt::kernels::cpu::detail::detect_isa(),
                                  static_cast<Isa>(static_cast<int>(shardopt::settings().cpu_isa)));
  return isa;
}

// The kernels' parts: this file's own.
namespace {

// Opaque to the compiler, so the limit kernel's arithmetic is not folded away.
volatile float g_zero = 0.0f;

// A gradient as a float, by the cheapest conversion that reads every bit
// pattern (the value does not matter: it is multiplied by zero).
inline float grad_value(float g) { return g; }
inline float grad_value(shardopt::bfloat16 g) {
  return std::bit_cast<float>(static_cast<std::uint32_t>(g.bits) << 16);
}
inline float grad_value(shardopt::float16 g) { return static_cast<float>(g.bits); }

// The limit kernels move the optimizer kernels' streams the way the
// optimizer kernels move them (kernels/cpu/runner.hpp: range_lanes): 16
// elements at a time, one 64-byte access per fp32 array and one 32-byte
// access per 16-bit array, every load of a group before its stores (the
// arrays are 2 MiB aligned, so a store to p[i] and a later load of s0[i]
// share their low address bits, and the load would wait on the store), then
// the states, p and the copy stored in that order; the last (end - begin) %
// 16 elements one by one. They are written with the vector unit's
// instructions, through a Unit of 16 lanes (one AVX-512 register, or two
// AVX2 ones), not left to the compiler's vectorizer: it picked the access
// width per array mix (under AVX2 8 elements per step for fp32 arrays
// without a copy, 16 with one), so the rows of one optimizer were bounded by
// differently shaped loops. The Unit's functions carry their target
// attribute without being forced inline; the kernels' entry points
// (touch_avx512, ...) are flattened, which inlines them there.
//
// The kernels compute x + g * 0 for p and the states (p + u * 0 in LAMB's
// second pass), `zero` read from a volatile so that nothing is folded away;
// the copy gets the top 16 bits of the new p.
#if defined(__x86_64__)
struct Unit512 {
  struct V {
    __m512 v;
  };
  SHARDOPT_CPU_TARGET_AVX512 static V load(const float* p) { return {_mm512_loadu_ps(p)}; }
  SHARDOPT_CPU_TARGET_AVX512 static void store(float* p, V x) { _mm512_storeu_ps(p, x.v); }
  SHARDOPT_CPU_TARGET_AVX512 static __m512i halves(const void* p) {
    return _mm512_cvtepu16_epi32(_mm256_loadu_si256(static_cast<const __m256i*>(p)));
  }
  // Gradients as grad_value converts them.
  SHARDOPT_CPU_TARGET_AVX512 static V grad(const float* g) { return load(g); }
  SHARDOPT_CPU_TARGET_AVX512 static V grad(const shardopt::bfloat16* g) {
    return {_mm512_castsi512_ps(_mm512_slli_epi32(halves(g), 16))};
  }
  SHARDOPT_CPU_TARGET_AVX512 static V grad(const shardopt::float16* g) {
    return {_mm512_cvtepi32_ps(halves(g))};
  }
  SHARDOPT_CPU_TARGET_AVX512 static V times(V x, float z) {
    return {_mm512_mul_ps(x.v, _mm512_set1_ps(z))};
  }
  SHARDOPT_CPU_TARGET_AVX512 static V plus(V x, V t) { return {_mm512_add_ps(x.v, t.v)}; }
  SHARDOPT_CPU_TARGET_AVX512 static void store_copy(std::uint16_t* c, V x) {
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(c),
                        _mm512_cvtepi32_epi16(_mm512_srli_epi32(_mm512_castps_si512(x.v), 16)));
  }
};

struct Unit256x2 {
  struct V {
    __m256 lo, hi;
  };
  SHARDOPT_CPU_TARGET_AVX2 static V load(const float* p) {
    return {_mm256_loadu_ps(p), _mm256_loadu_ps(p + 8)};
  }
  SHARDOPT_CPU_TARGET_AVX2 static void store(float* p, V x) {
    _mm256_storeu_ps(p, x.lo);
    _mm256_storeu_ps(p + 8, x.hi);
  }
  SHARDOPT_CPU_TARGET_AVX2 static __m256i low8(__m256i h) {
    return _mm256_cvtepu16_epi32(_mm256_castsi256_si128(h));
  }
  SHARDOPT_CPU_TARGET_AVX2 static __m256i high8(__m256i h) {
    return _mm256_cvtepu16_epi32(_mm256_extracti128_si256(h, 1));
  }
  SHARDOPT_CPU_TARGET_AVX2 static V grad(const float* g) { return load(g); }
  SHARDOPT_CPU_TARGET_AVX2 static V grad(const shardopt::bfloat16* g) {
    const __m256i h = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(g));
    return {_mm256_castsi256_ps(_mm256_slli_epi32(low8(h), 16)),
            _mm256_castsi256_ps(_mm256_slli_epi32(high8(h), 16))};
  }
  SHARDOPT_CPU_TARGET_AVX2 static V grad(const shardopt::float16* g) {
    const __m256i h = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(g));
    return {_mm256_cvtepi32_ps(low8(h)), _mm256_cvtepi32_ps(high8(h))};
  }
  SHARDOPT_CPU_TARGET_AVX2 static V times(V x, float z) {
    const __m256 zz = _mm256_set1_ps(z);
    return {_mm256_mul_ps(x.lo, zz), _mm256_mul_ps(x.hi, zz)};
  }
  SHARDOPT_CPU_TARGET_AVX2 static V plus(V x, V t) {
    return {_mm256_add_ps(x.lo, t.lo), _mm256_add_ps(x.hi, t.hi)};
  }
  // One pack for the 16 lanes (within 128-bit halves; the permutation puts
  // the halves in order).
  SHARDOPT_CPU_TARGET_AVX2 static void store_copy(std::uint16_t* c, V x) {
    const __m256i lo = _mm256_srli_epi32(_mm256_castps_si256(x.lo), 16);
    const __m256i hi = _mm256_srli_epi32(_mm256_castps_si256(x.hi), 16);
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(c),
                        _mm256_permute4x64_epi64(_mm256_packus_epi32(lo, hi), 0xd8));
  }
};
#endif

// The limit kernel of a one-pass step over [begin, end): reads g, p and the
// K states; writes the K states, p (each unchanged: x + g * 0) and, with
// Copy, 16 bits per parameter. The elements one by one where U is void (the
// baseline unit: the compiler vectorizes the loop with SSE2).
// The K states' 16 elements from i: each x + t, every load before every
// store.
template <class U, int K>
void touch_states(float* const* st, std::size_t i, typename U::V t) {
  typename U::V a[3]{};
  for (int k = 0; k < K; ++k) a[k] = U::plus(U::load(st[k] + i), t);
  for (int k = 0; k < K; ++k) U::store(st[k] + i, a[k]);
}

template <class U, class G, int K, bool Copy>
void touch_lanes(const Streams& s, float zero, std::size_t begin, std::size_t end) {
  float* p = s.param;
  const G* g = static_cast<const G*>(s.grad);
  float* s0 = s.state[0];
  float* s1 = s.state[1];
  float* s2 = s.state[2];
  auto* c = static_cast<std::uint16_t*>(s.copy);
  std::size_t i = begin;
  if constexpr (!std::is_void_v<U>) {
    using V = typename U::V;
    for (; i + 16 <= end; i += 16) {
      const V t = U::times(U::grad(g + i), zero);
      const V pn = U::plus(U::load(p + i), t);
      touch_states<U, K>(s.state.data(), i, t);
      U::store(p + i, pn);
      if constexpr (Copy) U::store_copy(c + i, pn);
    }
  }
  for (; i < end; ++i) {
    const float t = grad_value(g[i]) * zero;
    const float pn = p[i] + t;
    if constexpr (K > 0) s0[i] = s0[i] + t;
    if constexpr (K > 1) s1[i] = s1[i] + t;
    if constexpr (K > 2) s2[i] = s2[i] + t;
    p[i] = pn;
    if constexpr (Copy) c[i] = static_cast<std::uint16_t>(std::bit_cast<std::uint32_t>(pn) >> 16);
  }
}

// The two passes of a step with a scratch direction (LAMB's): the first
// reads g, p and the K states and writes the states and the direction
// u = p + g * 0; the second reads p and u and writes p = p + u * 0 (and the
// copy).
template <class U, class G, int K>
void direction_lanes(const Streams& s, float zero, std::size_t begin, std::size_t end) {
  const float* p = s.param;
  const G* g = static_cast<const G*>(s.grad);
  float* s0 = s.state[0];
  float* s1 = s.state[1];
  float* s2 = s.state[2];
  float* u = s.scratch;
  std::size_t i = begin;
  if constexpr (!std::is_void_v<U>) {
    using V = typename U::V;
    for (; i + 16 <= end; i += 16) {
      const V t = U::times(U::grad(g + i), zero);
      const V ui = U::plus(U::load(p + i), t);
      touch_states<U, K>(s.state.data(), i, t);
      U::store(u + i, ui);
    }
  }
  for (; i < end; ++i) {
    const float t = grad_value(g[i]) * zero;
    if constexpr (K > 0) s0[i] = s0[i] + t;
    if constexpr (K > 1) s1[i] = s1[i] + t;
    if constexpr (K > 2) s2[i] = s2[i] + t;
    u[i] = p[i] + t;
  }
}

template <class U, bool Copy>
void apply_lanes(const Streams& s, float zero, std::size_t begin, std::size_t end) {
  float* p = s.param;
  const float* u = s.scratch;
  auto* c = static_cast<std::uint16_t*>(s.copy);
  std::size_t i = begin;
  if constexpr (!std::is_void_v<U>) {
    using V = typename U::V;
    for (; i + 16 <= end; i += 16) {
      const V pn = U::plus(U::load(p + i), U::times(U::load(u + i), zero));
      U::store(p + i, pn);
      if constexpr (Copy) U::store_copy(c + i, pn);
    }
  }
  for (; i < end; ++i) {
    const float pn = p[i] + u[i] * zero;
    p[i] = pn;
    if constexpr (Copy) c[i] = static_cast<std::uint16_t>(std::bit_cast<std::uint32_t>(pn) >> 16);
  }
}

#if defined(__x86_64__)
using Avx512Lanes = Unit512;
using Avx2Lanes = Unit256x2;
#define SHARDOPT_BENCH_FLATTEN __attribute__((flatten))
#else
using Avx512Lanes = void;
using Avx2Lanes = void;
#define SHARDOPT_BENCH_FLATTEN
#endif

template <class G, int K>
SHARDOPT_CPU_TARGET_AVX512 SHARDOPT_BENCH_FLATTEN void direction_avx512(const Streams& s, float z,
                                                                        std::size_t b,
                                                                        std::size_t e) {
  direction_lanes<Avx512Lanes, G, K>(s, z, b, e);
}
template <class G, int K>
SHARDOPT_CPU_TARGET_AVX2 SHARDOPT_BENCH_FLATTEN void direction_avx2(const Streams& s, float z,
                                                                    std::size_t b, std::size_t e) {
  direction_lanes<Avx2Lanes, G, K>(s, z, b, e);
}
template <class G, int K>
void direction_baseline(const Streams& s, float z, std::size_t b, std::size_t e) {
  direction_lanes<void, G, K>(s, z, b, e);
}
template <bool Copy>
SHARDOPT_CPU_TARGET_AVX512 SHARDOPT_BENCH_FLATTEN void apply_avx512(const Streams& s, float z,
                                                                    std::size_t b, std::size_t e) {
  apply_lanes<Avx512Lanes, Copy>(s, z, b, e);
}
template <bool Copy>
SHARDOPT_CPU_TARGET_AVX2 SHARDOPT_BENCH_FLATTEN void apply_avx2(const Streams& s, float z,
                                                                std::size_t b, std::size_t e) {
  apply_lanes<Avx2Lanes, Copy>(s, z, b, e);
}
template <bool Copy>
void apply_baseline(const Streams& s, float z, std::size_t b, std::size_t e) {
  apply_lanes<void, Copy>(s, z, b, e);
}
template <class G, int K, bool Copy>
SHARDOPT_CPU_TARGET_AVX512 SHARDOPT_BENCH_FLATTEN void touch_avx512(const Streams& s, float z,
                                                                    std::size_t b, std::size_t e) {
  touch_lanes<Avx512Lanes, G, K, Copy>(s, z, b, e);
}
template <class G, int K, bool Copy>
SHARDOPT_CPU_TARGET_AVX2 SHARDOPT_BENCH_FLATTEN void touch_avx2(const Streams& s, float z,
                                                                std::size_t b, std::size_t e) {
  touch_lanes<Avx2Lanes, G, K, Copy>(s, z, b, e);
}
template <class G, int K, bool Copy>
void touch_baseline(const Streams& s, float z, std::size_t b, std::size_t e) {
  touch_lanes<void, G, K, Copy>(s, z, b, e);
}

// a = b + scalar * c
[[gnu::always_inline]] inline void triad_body(float* __restrict a, const float* __restrict b,
                                              const float* __restrict c, float scalar,
                                              std::size_t begin, std::size_t end) {
  for (std::size_t i = begin; i < end; ++i) a[i] = b[i] + scalar * c[i];
}
SHARDOPT_CPU_TARGET_AVX512 void triad_avx512(float* a, const float* b, const float* c, float x,
                                             std::size_t begin, std::size_t end) {
  triad_body(a, b, c, x, begin, end);
}
SHARDOPT_CPU_TARGET_AVX2 void triad_avx2(float* a, const float* b, const float* c, float x,
                                         std::size_t begin, std::size_t end) {
  triad_body(a, b, c, x, begin, end);
}
void triad_baseline(float* a, const float* b, const float* c, float x, std::size_t begin,
                    std::size_t end) {
  triad_body(a, b, c, x, begin, end);
}

// Runs range(begin, end) over [0, n) split as the CPU optimizer kernels split it.
template <class Range>
void partitioned(std::size_t n, const Range& range) {
  constexpr std::size_t kAlign = 16;
  if (n < (std::size_t{1} << 15) || omp_get_max_threads() == 1) {
    range(std::size_t{0}, n);
    return;
  }
#pragma omp parallel
  {
    const auto threads = static_cast<std::size_t>(omp_get_num_threads());
    const auto t = static_cast<std::size_t>(omp_get_thread_num());
    const std::size_t share = (n + threads - 1) / threads;
    const std::size_t per = (share + kAlign - 1) / kAlign * kAlign;
    const std::size_t begin = std::min(n, t * per);
    const std::size_t end = std::min(n, begin + per);
    range(begin, end);
  }
}

// A kernel over elements [b, e) of the streams.
using RangeKernel = void (*)(const Streams& s, float z, std::size_t b, std::size_t e);

// Runs on each thread's part of the streams the variant of a kernel
// compiled for the vector unit in use (used_isa()).
void run_partitioned(const Streams& s, RangeKernel avx512, RangeKernel avx2, RangeKernel baseline) {
  const float zero = g_zero;
  RangeKernel kernel = baseline;
#if defined(__x86_64__)
  if (used_isa() == Isa::avx512) kernel = avx512;
  if (used_isa() == Isa::avx2) kernel = avx2;
#else
  (void)avx512;
  (void)avx2;
#endif
  partitioned(s.n, [&](std::size_t b, std::size_t e) { kernel(s, zero, b, e); });
}

template <class G, int K, bool Copy>
void touch_all(const Streams& s) {
  run_partitioned(s, touch_avx512<G, K, Copy>, touch_avx2<G, K, Copy>, touch_baseline<G, K, Copy>);
}

template <class G, int K, bool Copy>
void two_passes(const Streams& s) {
  run_partitioned(s, direction_avx512<G, K>, direction_avx2<G, K>, direction_baseline<G, K>);
  run_partitioned(s, apply_avx512<Copy>, apply_avx2<Copy>, apply_baseline<Copy>);
}

template <class G, int K>
void touch_with_copy(const Streams& s) {
  if (s.scratch != nullptr) {
    if (s.copy != nullptr) {
      two_passes<G, K, true>(s);
    } else {
      two_passes<G, K, false>(s);
    }
  } else if (s.copy != nullptr) {
    touch_all<G, K, true>(s);
  } else {
    touch_all<G, K, false>(s);
  }
}

template <class G>
void touch_with_states(const Streams& s, int k) {
  switch (k) {
    case 0:
      return touch_with_copy<G, 0>(s);
    case 1:
      return touch_with_copy<G, 1>(s);
    case 2:
      return touch_with_copy<G, 2>(s);
    default:
      return touch_with_copy<G, 3>(s);
  }
}

}  // namespace

// The memory-only limit kernel of a step with k state arrays (two passes
// when s.scratch is set).
void memory_only(const Streams& s, int k) {
  switch (s.grad_type) {
    case DType::bf16:
      return touch_with_states<shardopt::bfloat16>(s, k);
    case DType::f16:
      return touch_with_states<shardopt::float16>(s, k);
    default:
      return touch_with_states<float>(s, k);
  }
}

void triad(float* a, const float* b, const float* c, std::size_t n) {
  const float scalar = 0.5f + g_zero;
  partitioned(n, [&](std::size_t lo, std::size_t hi) {
    switch (used_isa()) {
#if defined(__x86_64__)
      case Isa::avx512:
        return triad_avx512(a, b, c, scalar, lo, hi);
      case Isa::avx2:
        return triad_avx2(a, b, c, scalar, lo, hi);
#endif
      default:
        return triad_baseline(a, b, c, scalar, lo, hi);
    }
  });
}

// Fills an array as f says, on every OpenMP thread.
void fill(const bench::Fill& f, std::size_t n) {
#pragma omp parallel for schedule(static)
  for (std::size_t i = 0; i < n; ++i) f.store(i);
}

}  // namespace limits
