// shardopt-bench-optim: the functional optimizers on the host beside their
// memory limit.
//
// An optimizer step streams its arrays once: it is memory-bound, and its
// limit is the time the same memory traffic takes without the math. For each
// optimizer, precision, parameter count and thread count this program times
// the step and, alternately on the same arrays, a memory-only kernel that
// reads and writes exactly the streams the step does (same in-place writes,
// same OpenMP threads and partition, trivial arithmetic), and prints both
// rates and their ratio. STREAM triad is printed beside them for reference.
//
//   shardopt-bench-optim                 # 1M..256M params, 1..nproc threads
//   shardopt-bench-optim -s 16M,64M -o adam,adamw -p fp32,bf16 --json
//
// It runs as one process (the functional API needs no MPI_Init); it also
// runs under `mpirun -n 1`. Uses only the public API of shardopt, OpenMP and
// the standard library. The options, the sweep, the timing, the table and
// the goal are shared with shardopt-bench-optim-gpu (bench_optim_harness.hpp,
// over the optimizer table of optim_steps.hpp); this file holds what is the
// host's: the arrays in host memory, the OpenMP memory-only kernels and
// STREAM triad, the thread counts and the load of other processes.
#include <omp.h>

#include <algorithm>
#include <bit>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <tuple>
#include <type_traits>
#include <vector>

#include "bench_optim_harness.hpp"
#include "cli.hpp"
#include "kernels/cpu/isa.hpp"
#include "machine.hpp"
#include "optim_steps.hpp"
#include "shardopt/config.hpp"
#include "shardopt/half.hpp"
#include "shardopt/memory.hpp"
#include "shardopt/types.hpp"

namespace {

using bench::Streams;
using shardopt::DType;

// The goal: at this many parameters and more (bench::kGoalNumel), with every
// core, each optimizer and precision runs at this fraction of its memory
// limit or better.
constexpr double kGoalRatio = 0.95;
// Small sizes run more than the minimum number of repetitions: about this
// long per timed series, up to kMaxReps.
constexpr double kSeriesBudgetS = 0.25;
constexpr int kMaxReps = 2000;

// ---------------------------------------------------------------------------
// Memory-only kernels: the limit and STREAM triad.
//
// Both split the range across OpenMP threads as the CPU optimizer kernels do
// (one static block per thread, rounded up to 16 floats; one thread below
// 32768 elements) and run a loop compiled for the vector unit the optimizer
// kernels use (the widest present, capped by SHARDOPT_CPU_ISA).

using shardopt::kernels::cpu::detail::Isa;
using shardopt::kernels::cpu::detail::isa_name;

// The widest vector unit present (the kernels' own detection), capped as
// the optimizer kernels cap it (SHARDOPT_CPU_ISA): the limit kernels run on
// the same unit as the steps they bound. Decided at the first use
// (settings() may throw a ConfigError, which main_of reports).
Isa used_isa() {
  static const Isa isa = std::min(shardopt::kernels::cpu::detail::detect_isa(),
                                  static_cast<Isa>(static_cast<int>(shardopt::settings().cpu_isa)));
  return isa;
}

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

// ---------------------------------------------------------------------------
// Machine

// mpirun -n 2 would start two copies that compete for the same cores.
int launched_processes() {
  for (const char* var : {"OMPI_COMM_WORLD_SIZE", "PMI_SIZE", "PMIX_SIZE", "MPI_LOCALNRANKS"}) {
    if (const char* v = std::getenv(var)) {
      const auto n = cli::parse_unsigned(v);
      if (n && *n > 1) return static_cast<int>(std::min<std::uint64_t>(*n, 1 << 20));
    }
  }
  return 1;
}

// CPU time used by other processes (and the kernel) since the last call, as a
// fraction of all cores over that wall time: 0 on a quiet machine. Busy rows
// are marked, since a step and its limit slowed down alike read as ratio 1.
class OtherLoad {
 public:
  OtherLoad() { sample(); }
  // The fraction since the last call (or construction); -1 if unknown.
  double fraction() {
    const auto [busy0, self0, wall0] = std::tuple{busy_s_, self_s_, wall_};
    if (!sample()) return -1;
    const double wall = std::chrono::duration<double>(wall_ - wall0).count();
    const double cores = static_cast<double>(omp_get_num_procs());
    if (wall <= 0) return -1;
    return std::max(0.0, ((busy_s_ - busy0) - (self_s_ - self0)) / (wall * cores));
  }

 private:
  bool sample() {
    wall_ = std::chrono::steady_clock::now();
    const machine::CpuTimes t = machine::cpu_times();
    self_s_ = t.self_s;
    if (t.ok) busy_s_ = t.busy_s;
    return t.ok;
  }
  double busy_s_ = 0, self_s_ = 0;
  std::chrono::steady_clock::time_point wall_;
};

// ---------------------------------------------------------------------------
// Host memory

class HostMemory final : public bench::Memory {
 public:
  HostMemory() {
    for (int t = 1; t <= nproc_; ++t) threads_.push_back(t);
  }

  const bench::Program& program() const override {
    static const bench::Program p{
        .name = "shardopt-bench-optim",
        .sizes_option = "sizes",
        .default_sizes = {std::size_t{1} << 20, std::size_t{4} << 20, std::size_t{16} << 20,
                          std::size_t{64} << 20, std::size_t{256} << 20},
        .series = {.warmup = 2, .reps = 7, .budget_s = kSeriesBudgetS, .max_reps = kMaxReps},
        .remainders = false,
        .table = {"threads", 7, 11, 2, "stream", true},
        .goal = {.at_least = kGoalRatio, .of_reference = false, .names_threads = true},
    };
    return p;
  }

  std::span<const cli::OptionSpec> own_options() const override {
    static constexpr cli::OptionSpec kSpecs[] = {{'t', "threads", true}, {'M', "max-memory", true}};
    return kSpecs;
  }

  void set_option(std::string_view name, const std::string& label, std::string_view v) override {
    if (name == "threads") {
      constexpr const char* kAccepted = "thread counts >= 1, comma-separated, or a range A-B";
      threads_.clear();
      for (std::string_view item : cli::split(v)) {
        const std::size_t dash = item.find('-');
        if (dash == std::string_view::npos) {
          threads_.push_back(cli::parse_int(label, item, 1, 4096, kAccepted));
        } else {
          const int lo = cli::parse_int(label, item.substr(0, dash), 1, 4096, kAccepted);
          const int hi = cli::parse_int(label, item.substr(dash + 1), 1, 4096, kAccepted);
          if (hi < lo) cli::bad_value(label, v, kAccepted);
          for (int t = lo; t <= hi; ++t) threads_.push_back(t);
        }
      }
      std::sort(threads_.begin(), threads_.end());
      threads_.erase(std::unique(threads_.begin(), threads_.end()), threads_.end());
    } else if (name == "max-memory") {
      const auto n = cli::parse_scaled(v, std::uint64_t{1} << 40);
      if (!n)
        cli::bad_value(label, v, "a positive number of bytes with an optional K, M or G suffix");
      max_memory_ = *n;
    }
  }

  std::string usage() const override;

  void check_launch() const override {
    if (const int n = launched_processes(); n > 1) {
      throw cli::UsageError{"started as " + std::to_string(n) +
                            " processes; it runs as one (mpirun -n 1, or no launcher): copies "
                            "would compete for the same cores and memory bandwidth"};
    }
  }

  int start(const bench::Options&, bench::Needs& needs, FILE* info) override {
    std::fprintf(info,
                 "# machine: %s, %d cores for OpenMP, vector unit %s%s%s, MemAvailable %.1f "
                 "GiB\n",
                 machine::cpu_model().c_str(), nproc_, isa_name(used_isa()),
                 std::getenv("SHARDOPT_CPU_ISA") != nullptr ? " (SHARDOPT_CPU_ISA=" : "",
                 std::getenv("SHARDOPT_CPU_ISA") != nullptr
                     ? (std::string(std::getenv("SHARDOPT_CPU_ISA")) + ")").c_str()
                     : "",
                 bench::gib(machine::mem_available_bytes()));
    if (std::getenv("OMPI_COMM_WORLD_SIZE") != nullptr && nproc_ == 1) {
      std::fprintf(info,
                   "# note: mpirun binds a rank to one core; mpirun -n 1 --bind-to none "
                   "gives this process every core\n");
    }
    needs.grad32 = true;  // STREAM triad's output
    if (max_memory_ == 0) max_memory_ = machine::mem_available_bytes() / 4 * 3;
    return 0;
  }

  bool prepare(std::size_t n, const bench::Needs& needs, FILE* info) override {
    const std::size_t need = n * needs.bytes();
    if (max_memory_ != 0 && need > max_memory_) {
      std::fprintf(info,
                   "# skipping %s params: the arrays need %.2f GiB, over the limit %.2f GiB"
                   " (-M)\n",
                   cli::human_count(n).c_str(), bench::gib(need), bench::gib(max_memory_));
      return false;
    }
    omp_set_num_threads(nproc_);
    arrays_.reset();  // the last size's first
    arrays_.emplace(needs, n);
    key_ = bench::fill_key(n);
    const bench::ArraySet a = arrays();
    // All but the f32 gradients, which STREAM triad writes first (lanes()).
    for (const bench::Fill& f : bench::fills(a, key_)) {
      if (f.data != a.grad32) fill(f, n);
    }
    return true;
  }

  bench::ArraySet arrays() override { return arrays_->pointers(); }

  // STREAM triad for each thread count, into the f32 gradients, which are
  // then filled.
  std::vector<bench::Lane> lanes(std::size_t n, const bench::Series& series) override {
    const bench::ArraySet a = arrays();
    float* out = static_cast<float*>(a.grad32);
    const float* in = a.state[0] != nullptr ? a.state[0] : a.param;
    std::vector<bench::Lane> lanes;
    for (const int t : threads_) {
      omp_set_num_threads(t);
      const double s = bench::time_median(
          *this, [&] { triad(out, a.param, in, n); }, series);
      lanes.push_back({t, static_cast<double>(n) * 12 / s / 1e9});
    }
    omp_set_num_threads(nproc_);
    fill(bench::grad_fill(a, DType::f32, key_), n);
    return lanes;
  }

  void enter(const bench::Lane& lane) override { omp_set_num_threads(lane.threads); }

  double seconds(const std::function<void()>& f) override { return bench::wall_seconds(f); }

  void memory_only(const Streams& s, const bench::OptimizerEntry& opt) override {
    ::memory_only(s, static_cast<int>(opt.states.size()));
  }

  void row_started() override { load_ = OtherLoad{}; }
  double other_load() override { return load_.fraction(); }

  int goal_threads() const override { return threads_.empty() ? 0 : threads_.back(); }
  std::string goal_scope() const override {
    const int t = goal_threads();
    return " with " + std::to_string(t) + " thread" + (t == 1 ? "" : "s") + " (" +
           (t >= nproc_ ? "all cores" : "fewer than all cores") + ")";
  }

 private:
  const int nproc_ = omp_get_num_procs();
  std::vector<int> threads_;
  std::size_t max_memory_ = 0;  // 0: 3/4 of MemAvailable
  std::optional<bench::Arrays<shardopt::HostBuffer>> arrays_;
  std::uint64_t key_ = 0;
  OtherLoad load_;
};

namespace {
// "sgd 20, adam 28, ...": every optimizer's fp32 bytes per parameter.
std::string fp32_bytes() {
  std::string list;
  for (const auto& e : bench::optimizers()) {
    if (!list.empty()) list.append(", ");
    list.append(e.name).append(" ").append(
        std::to_string(bench::bytes_per_param(e, bench::kPrecisions[0])));
  }
  return cli::wrap(list, 11);
}
}  // namespace

std::string HostMemory::usage() const {
  return std::string(
             "usage: shardopt-bench-optim [options]\n"
             "\n"
             "Times shardopt's functional optimizers on host memory beside their memory limit,\n"
             "measured in the same run on the same arrays. Runs as one process (also under\n"
             "mpirun -n 1 --bind-to none: by default mpirun binds the rank to one core); OpenMP\n"
             "threads are set per row with omp_set_num_threads.\n"
             "\n"
             "  -s, --sizes LIST        parameter counts, comma-separated, with an optional K, M "
             "or\n"
             "                          G suffix (powers of 1024) (default 1M,4M,16M,64M,256M)\n"
             "  -t, --threads LIST      OpenMP thread counts, comma-separated, or a range A-B\n"
             "                          (default 1-nproc)\n") +
         bench::optimizer_and_precision_usage(program()) +
         "  -n, --reps N            timed repetitions of each series, at least (default 7);\n"
         "                          small sizes run more, about 0.25 s worth, up to 2000\n"
         "  -w, --warmup N          untimed repetitions first (default 2)\n"
         "  -M, --max-memory SIZE   skip sizes whose arrays need more bytes than this\n"
         "                          (K, M, G suffix; default 3/4 of MemAvailable at start)\n"
         "      --json              one JSON object per row on stdout; the rest on stderr\n"
         "  -h, --help              this text\n"
         "\n"
         "Arrays are allocated once per size as shardopt::HostBuffer (2 MiB aligned, huge\n"
         "pages, touched at allocation) and filled with random data (params in [-1,1),\n"
         "states in [0,1e-2), grads in [-1e-2,1e-2)). For each row the step and the limit kernel\n"
         "run alternately, in an order drawn at random per pair, after warm-up; the table\n"
         "shows medians.\n"
         "\n"
         "Columns:\n"
         "  B_pp     bytes per parameter, every read and write counted once; the formula\n"
         "           is printed per row: r = read, w = written, p = fp32 params, g = grads,\n"
         "           the optimizer's state arrays by name (exp_avg, ...), c = the 16-bit\n"
         "           param copy, update = LAMB's direction (two passes). fp32, per\n"
         "           optimizer (sgd with momentum 0.9):\n"
         "           " +
         fp32_bytes() +
         ";\n"
         "           bf16 or f16 mixed: the same (2 B less grad, 2 B copy); fp32 grads with\n"
         "           a bf16 copy: 2 B more.\n"
         "  time_us  median time of one step\n"
         "  GB/s     numel * B_pp / time_us\n"
         "  min-max  GB/s of the slowest and of the fastest step of the row: the spread\n"
         "           over its repetitions (this machine's memory bandwidth moves)\n"
         "  limit    GB/s of the memory-only kernel: the same arrays, the same reads and\n"
         "           in-place writes (every input stream read, every output stream\n"
         "           written: p, states += g * 0; c = the top 16 bits of p), trivial\n"
         "           arithmetic, the same OpenMP threads and static partition, the same\n"
         "           passes, the same accesses (16 elements at a time, every load before\n"
         "           the stores, on the same vector unit: SHARDOPT_CPU_ISA applies),\n"
         "           counted with the same B_pp (its median time; the next min-max is\n"
         "           its spread). The step cannot beat it by more than noise.\n"
         "  stream   GB/s of STREAM triad a[i] = b[i] + s * c[i] over three fp32 arrays of\n"
         "           numel elements, counted 12 B per element (read b, c, write a; STREAM's\n"
         "           24 B per double element are the same bytes).\n"
         "           A reference only: it understates the in-place limit, since its counted\n"
         "           bytes leave out the write-allocate read of a, which an in-place update\n"
         "           does not pay.\n"
         "  ratio    GB/s / limit of the medians: the fraction of the memory limit the\n"
         "           step reaches. Step and limit are timed in pairs, alternately, so\n"
         "           both medians come from the same stretch of the machine's time.\n"
         "  other    CPU time other processes used while the row ran, as a share of all\n"
         "           cores (from /proc/stat); over 5% the row is marked * and its times\n"
         "           are those of a busy machine, not of the kernel.\n"
         "\n"
         "After the table, one line per optimizer and precision gives its smallest ratio at\n"
         ">= 16M params with the most threads measured, beside the goal (>= 0.95), and a\n"
         "last line the verdict with the worst row. Timings are not pass/fail.\n"
         "\n"
         "Exit status: 0 all steps ran, 1 a step or an allocation failed, 2 a bad option.\n"
         "With --json, each row is an object with the keys optimizer, precision, numel,\n"
         "threads, bytes_per_param, time_us, gbps, limit_gbps, stream_gbps, ratio, reps\n"
         "(pairs timed), time_us_min, time_us_max, limit_time_us, limit_time_us_min,\n"
         "limit_time_us_max, gbps_min, gbps_max, limit_gbps_min, limit_gbps_max,\n"
         "other_load (the other column as a fraction, null if unknown).\n";
}

}  // namespace

int main(int argc, char** argv) {
  HostMemory memory;
  return bench::main_of(memory, argc, argv);
}
