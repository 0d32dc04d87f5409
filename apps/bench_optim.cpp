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
// the standard library. The optimizer calls, the byte counts and the random
// values are shared with shardopt-bench-optim-gpu (optim_steps.hpp).
#include <omp.h>
#include <unistd.h>

#include <algorithm>
#include <bit>
#include <charconv>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <limits>
#include <optional>
#include <random>
#include <string>
#include <string_view>
#include <tuple>
#include <vector>

#include "cli.hpp"
#include "machine.hpp"
#include "optim_steps.hpp"
#include "report.hpp"
#include "shardopt/build_info.hpp"
#include "shardopt/error.hpp"
#include "shardopt/half.hpp"
#include "shardopt/memory.hpp"
#include "shardopt/optim.hpp"
#include "shardopt/types.hpp"

namespace {

using cli::bad_value;
using cli::human_count;
using cli::OptionSpec;
using cli::parse_int;
using cli::split;
using cli::UsageError;
using report::median;
using report::num;

using bench::bytes_formula;
using bench::bytes_per_param;
using bench::mix64;
using bench::OptimizerEntry;
using bench::optimizers;
using bench::Precision;
using bench::Streams;
using bench::uniform;
using shardopt::DType;

constexpr const char* kProgram = "shardopt-bench-optim";

// The goal: at this many parameters and more, with every core, each
// optimizer and precision runs at this fraction of its memory limit or better.
constexpr std::size_t kGoalNumel = std::size_t{16} << 20;
constexpr double kGoalRatio = 0.95;
// Small sizes run more than the minimum number of repetitions: about this
// long per timed series, up to kMaxReps.
constexpr double kSeriesBudgetS = 0.25;
constexpr int kMaxReps = 2000;
constexpr std::uint64_t kSeed = 0x243f6a8885a308d3ULL;

// ---------------------------------------------------------------------------
// Precisions (bytes per parameter: bench::bytes_per_param)

constexpr Precision kPrecisions[] = {
    {"fp32", DType::f32, false, DType::bf16, false, "f32 grads, no copy"},
    {"bf16", DType::bf16, true, DType::bf16, false,
     "bf16 grads, fp32 master + states, bf16 copy out"},
    {"f16", DType::f16, true, DType::f16, false, "f16 grads, fp32 master + states, f16 copy out"},
    {"fp32-bf16", DType::f32, true, DType::bf16, false,
     "f32 grads, fp32 master + states, bf16 copy out"},
};
constexpr int kDefaultPrecisions = 3;  // fp32 bf16 f16

// ---------------------------------------------------------------------------
// Memory-only kernels: the limit and STREAM triad.
//
// Both split the range across OpenMP threads as the CPU optimizer kernels do
// (one static block per thread, rounded up to 16 floats; one thread below
// 32768 elements) and run a loop compiled for the widest vector unit present.

#if defined(__x86_64__)
enum class Isa { baseline, avx2, avx512 };
Isa detect_isa() {
  __builtin_cpu_init();
  if (__builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
      __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512dq"))
    return Isa::avx512;
  if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma")) return Isa::avx2;
  return Isa::baseline;
}
const char* isa_name(Isa i) {
  return i == Isa::avx512 ? "AVX-512" : i == Isa::avx2 ? "AVX2" : "x86-64 baseline";
}
#define SHARDOPT_BENCH_AVX512 __attribute__((target("avx512f,avx512bw,avx512vl,avx512dq,fma")))
#define SHARDOPT_BENCH_AVX2 __attribute__((target("avx2,fma")))
#else
enum class Isa { baseline };
Isa detect_isa() { return Isa::baseline; }
const char* isa_name(Isa) { return "baseline"; }
#define SHARDOPT_BENCH_AVX512
#define SHARDOPT_BENCH_AVX2
#endif

const Isa kIsa = detect_isa();

// Opaque to the compiler, so the limit kernel's arithmetic is not folded away.
volatile float g_zero = 0.0f;

// A gradient as a float, by the cheapest conversion that reads every bit
// pattern (the value does not matter: it is multiplied by zero).
inline float grad_value(float g) { return g; }
inline float grad_value(shardopt::bfloat16 g) {
  return std::bit_cast<float>(static_cast<std::uint32_t>(g.bits) << 16);
}
inline float grad_value(shardopt::float16 g) { return static_cast<float>(g.bits); }

// The limit kernel over [begin, end): reads g, p and the K states; writes p,
// the K states (each unchanged: x + g * 0) and, with Copy, 16 bits per
// parameter. The same streams, read and written the same way, as the step.
template <class G, int K, bool Copy>
[[gnu::always_inline]] inline void touch_body(const Streams& s, float zero, std::size_t begin,
                                              std::size_t end) {
  float* __restrict p = s.param;
  const G* __restrict g = static_cast<const G*>(s.grad);
  float* __restrict s0 = s.state[0];
  float* __restrict s1 = s.state[1];
  float* __restrict s2 = s.state[2];
  std::uint16_t* __restrict c = static_cast<std::uint16_t*>(s.copy);
  // Every load before every store, as the optimizer loops do: the arrays are
  // 2 MiB aligned, so a store to p[i] and a later load of s0[i] share their
  // low address bits and the load would wait on the store (4K aliasing).
#pragma omp simd
  for (std::size_t i = begin; i < end; ++i) {
    const float t = grad_value(g[i]) * zero;
    const float pn = p[i] + t;
    float a0 = 0, a1 = 0, a2 = 0;
    if constexpr (K > 0) a0 = s0[i] + t;
    if constexpr (K > 1) a1 = s1[i] + t;
    if constexpr (K > 2) a2 = s2[i] + t;
    p[i] = pn;
    if constexpr (K > 0) s0[i] = a0;
    if constexpr (K > 1) s1[i] = a1;
    if constexpr (K > 2) s2[i] = a2;
    if constexpr (Copy) c[i] = static_cast<std::uint16_t>(std::bit_cast<std::uint32_t>(pn) >> 16);
  }
}

// The two passes of a step with a scratch direction: the first reads g, p
// and the K states and writes the states and the direction u = p + g * 0;
// the second reads p and u and writes p = p + u * 0 (and the copy).
template <class G, int K>
[[gnu::always_inline]] inline void direction_body(const Streams& s, float zero, std::size_t begin,
                                                  std::size_t end) {
  const float* __restrict p = s.param;
  const G* __restrict g = static_cast<const G*>(s.grad);
  float* __restrict s0 = s.state[0];
  float* __restrict s1 = s.state[1];
  float* __restrict s2 = s.state[2];
  float* __restrict u = s.scratch;
#pragma omp simd
  for (std::size_t i = begin; i < end; ++i) {  // loads first, as in touch_body
    const float t = grad_value(g[i]) * zero;
    const float ui = p[i] + t;
    float a0 = 0, a1 = 0, a2 = 0;
    if constexpr (K > 0) a0 = s0[i] + t;
    if constexpr (K > 1) a1 = s1[i] + t;
    if constexpr (K > 2) a2 = s2[i] + t;
    if constexpr (K > 0) s0[i] = a0;
    if constexpr (K > 1) s1[i] = a1;
    if constexpr (K > 2) s2[i] = a2;
    u[i] = ui;
  }
}

template <bool Copy>
[[gnu::always_inline]] inline void apply_body(const Streams& s, float zero, std::size_t begin,
                                              std::size_t end) {
  float* __restrict p = s.param;
  const float* __restrict u = s.scratch;
  std::uint16_t* __restrict c = static_cast<std::uint16_t*>(s.copy);
#pragma omp simd
  for (std::size_t i = begin; i < end; ++i) {
    const float pn = p[i] + u[i] * zero;
    p[i] = pn;
    if constexpr (Copy) c[i] = static_cast<std::uint16_t>(std::bit_cast<std::uint32_t>(pn) >> 16);
  }
}

template <class G, int K>
SHARDOPT_BENCH_AVX512 void direction_avx512(const Streams& s, float z, std::size_t b,
                                            std::size_t e) {
  direction_body<G, K>(s, z, b, e);
}
template <class G, int K>
SHARDOPT_BENCH_AVX2 void direction_avx2(const Streams& s, float z, std::size_t b, std::size_t e) {
  direction_body<G, K>(s, z, b, e);
}
template <class G, int K>
void direction_baseline(const Streams& s, float z, std::size_t b, std::size_t e) {
  direction_body<G, K>(s, z, b, e);
}
template <bool Copy>
SHARDOPT_BENCH_AVX512 void apply_avx512(const Streams& s, float z, std::size_t b, std::size_t e) {
  apply_body<Copy>(s, z, b, e);
}
template <bool Copy>
SHARDOPT_BENCH_AVX2 void apply_avx2(const Streams& s, float z, std::size_t b, std::size_t e) {
  apply_body<Copy>(s, z, b, e);
}
template <bool Copy>
void apply_baseline(const Streams& s, float z, std::size_t b, std::size_t e) {
  apply_body<Copy>(s, z, b, e);
}

template <class G, int K, bool Copy>
SHARDOPT_BENCH_AVX512 void touch_avx512(const Streams& s, float z, std::size_t b, std::size_t e) {
  touch_body<G, K, Copy>(s, z, b, e);
}
template <class G, int K, bool Copy>
SHARDOPT_BENCH_AVX2 void touch_avx2(const Streams& s, float z, std::size_t b, std::size_t e) {
  touch_body<G, K, Copy>(s, z, b, e);
}
template <class G, int K, bool Copy>
void touch_baseline(const Streams& s, float z, std::size_t b, std::size_t e) {
  touch_body<G, K, Copy>(s, z, b, e);
}

// a = b + scalar * c
[[gnu::always_inline]] inline void triad_body(float* __restrict a, const float* __restrict b,
                                              const float* __restrict c, float scalar,
                                              std::size_t begin, std::size_t end) {
  for (std::size_t i = begin; i < end; ++i) a[i] = b[i] + scalar * c[i];
}
SHARDOPT_BENCH_AVX512 void triad_avx512(float* a, const float* b, const float* c, float x,
                                        std::size_t begin, std::size_t end) {
  triad_body(a, b, c, x, begin, end);
}
SHARDOPT_BENCH_AVX2 void triad_avx2(float* a, const float* b, const float* c, float x,
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

template <class G, int K, bool Copy>
void touch_all(const Streams& s) {
  const float zero = g_zero;
  partitioned(s.n, [&](std::size_t b, std::size_t e) {
    switch (kIsa) {
#if defined(__x86_64__)
      case Isa::avx512:
        return touch_avx512<G, K, Copy>(s, zero, b, e);
      case Isa::avx2:
        return touch_avx2<G, K, Copy>(s, zero, b, e);
#endif
      default:
        return touch_baseline<G, K, Copy>(s, zero, b, e);
    }
  });
}

template <class G, int K, bool Copy>
void two_passes(const Streams& s) {
  const float zero = g_zero;
  partitioned(s.n, [&](std::size_t b, std::size_t e) {
    switch (kIsa) {
#if defined(__x86_64__)
      case Isa::avx512:
        return direction_avx512<G, K>(s, zero, b, e);
      case Isa::avx2:
        return direction_avx2<G, K>(s, zero, b, e);
#endif
      default:
        return direction_baseline<G, K>(s, zero, b, e);
    }
  });
  partitioned(s.n, [&](std::size_t b, std::size_t e) {
    switch (kIsa) {
#if defined(__x86_64__)
      case Isa::avx512:
        return apply_avx512<Copy>(s, zero, b, e);
      case Isa::avx2:
        return apply_avx2<Copy>(s, zero, b, e);
#endif
      default:
        return apply_baseline<Copy>(s, zero, b, e);
    }
  });
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
    switch (kIsa) {
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

// ---------------------------------------------------------------------------
// Random data

template <class T, class F>
void fill(T* x, std::size_t n, const F& value) {
#pragma omp parallel for schedule(static)
  for (std::size_t i = 0; i < n; ++i) x[i] = value(i);
}

// Gradients, f32 or the bits of bf16 / f16, in [-1, 1) times 1e-2.
void fill_grads(void* g, DType t, std::size_t n, std::uint64_t key) {
  auto v = [key](std::size_t i) { return uniform(key, i, -1e-2f, 1e-2f); };
  switch (t) {
    case DType::bf16:
      fill(static_cast<shardopt::bfloat16*>(g), n,
           [&](std::size_t i) { return shardopt::bf16_from_float(v(i)); });
      break;
    case DType::f16:
      fill(static_cast<shardopt::float16*>(g), n,
           [&](std::size_t i) { return shardopt::f16_from_float(v(i)); });
      break;
    default:
      fill(static_cast<float*>(g), n, v);
      break;
  }
}

// ---------------------------------------------------------------------------
// Options

struct Options {
  std::vector<std::size_t> sizes;
  std::vector<int> threads;
  std::vector<const OptimizerEntry*> optimizers;
  std::vector<const Precision*> precisions;
  int reps = 7;
  int warmup = 2;
  std::size_t max_memory = 0;  // 0: 3/4 of MemAvailable
  bool json = false;
  bool help = false;
};

std::string usage() {
  const std::string names = bench::names_of(optimizers());
  std::string precisions;
  for (const auto& p : kPrecisions) {
    precisions += std::string("                          ") + p.name +
                  std::string(10 - std::strlen(p.name), ' ') + p.description + "\n";
  }
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
             "                          (default 1-nproc)\n"
             "  -o, --optimizers LIST   comma-separated, or all (default all): ") +
         names +
         "\n"
         "  -p, --precisions LIST   comma-separated, or all (default fp32,bf16,f16):\n" +
         precisions +
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
         "           state arrays by name (m, v, buf, sum, sq), c = the 16-bit param copy,\n"
         "           u = LAMB's direction. fp32: Adam/AdamW 28, SGD (momentum 0.9) 20,\n"
         "           Adagrad 20, RMSprop (no momentum, not centered) 20, Lion 20, LAMB 40\n"
         "           (two passes: r p g m v + w m v u; r p u + w p); bf16 or f16 mixed: the\n"
         "           same (2 B less grad, 2 B copy); fp32 grads with a bf16 copy: 2 B more.\n"
         "  time_us  median time of one step\n"
         "  GB/s     numel * B_pp / time_us\n"
         "  limit    GB/s of the memory-only kernel: the same arrays, the same reads and\n"
         "           in-place writes (every input stream read, every output stream\n"
         "           written: p, states += g * 0; c = the top 16 bits of p), trivial\n"
         "           arithmetic, the same OpenMP threads and static partition, the same\n"
         "           passes, counted with the same B_pp. The step cannot beat it by more\n"
         "           than noise.\n"
         "  stream   GB/s of STREAM triad a[i] = b[i] + s * c[i] over three fp32 arrays of\n"
         "           numel elements, counted 12 B per element (read b, c, write a; STREAM's\n"
         "           24 B per double element are the same bytes).\n"
         "           A reference only: it understates the in-place limit, since its counted\n"
         "           bytes leave out the write-allocate read of a, which an in-place update\n"
         "           does not pay.\n"
         "  ratio    GB/s / limit: the fraction of the memory limit the step reaches.\n"
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
         "threads, bytes_per_param, time_us, gbps, limit_gbps, stream_gbps, ratio.\n";
}

// A count of elements or bytes with an optional K, M or G suffix, at most 2^40
// (far past any memory, and no overflow in bytes).
std::optional<std::size_t> parse_count(std::string_view s) {
  return cli::parse_scaled(s, std::uint64_t{1} << 40);
}

Options parse_options(int argc, char** argv) {
  Options o;
  for (std::size_t n : {1, 4, 16, 64, 256}) o.sizes.push_back(n << 20);
  for (int t = 1; t <= omp_get_num_procs(); ++t) o.threads.push_back(t);
  for (const auto& e : optimizers()) o.optimizers.push_back(&e);
  for (int i = 0; i < kDefaultPrecisions; ++i) o.precisions.push_back(&kPrecisions[i]);

  static constexpr OptionSpec kSpecs[] = {
      {'s', "sizes", true},      {'t', "threads", true}, {'o', "optimizers", true},
      {'p', "precisions", true}, {'n', "reps", true},    {'w', "warmup", true},
      {'M', "max-memory", true}, {0, "json", false},     {'h', "help", false},
  };
  cli::for_each_option(
      argc, argv, kSpecs,
      [&](const OptionSpec& spec, const std::string& label, std::string_view v) {
        const std::string_view name = spec.long_name;

        if (name == "sizes") {
          o.sizes.clear();
          for (std::string_view item : split(v)) {
            const auto n = parse_count(item);
            if (!n)
              bad_value(label, v, "positive counts with an optional K, M or G suffix, e.g. 1M,16M");
            o.sizes.push_back(*n);
          }
        } else if (name == "threads") {
          constexpr const char* kAccepted = "thread counts >= 1, comma-separated, or a range A-B";
          o.threads.clear();
          for (std::string_view item : split(v)) {
            const std::size_t dash = item.find('-');
            if (dash == std::string_view::npos) {
              o.threads.push_back(parse_int(label, item, 1, 4096, kAccepted));
            } else {
              const int lo = parse_int(label, item.substr(0, dash), 1, 4096, kAccepted);
              const int hi = parse_int(label, item.substr(dash + 1), 1, 4096, kAccepted);
              if (hi < lo) bad_value(label, v, kAccepted);
              for (int t = lo; t <= hi; ++t) o.threads.push_back(t);
            }
          }
        } else if (name == "optimizers") {
          o.optimizers = bench::choose(label, v, optimizers());
        } else if (name == "precisions") {
          o.precisions = bench::choose(label, v, kPrecisions);
        } else if (name == "reps") {
          o.reps = parse_int(label, v, 1, kMaxReps, "an integer, 1 to 2000");
        } else if (name == "warmup") {
          o.warmup = parse_int(label, v, 0, 1000, "an integer, 0 to 1000");
        } else if (name == "max-memory") {
          const auto n = parse_count(v);
          if (!n)
            bad_value(label, v, "a positive number of bytes with an optional K, M or G suffix");
          o.max_memory = *n;
        } else if (name == "json") {
          o.json = true;
        } else if (name == "help") {
          o.help = true;
        }
      });
  std::sort(o.sizes.begin(), o.sizes.end());
  o.sizes.erase(std::unique(o.sizes.begin(), o.sizes.end()), o.sizes.end());
  std::sort(o.threads.begin(), o.threads.end());
  o.threads.erase(std::unique(o.threads.begin(), o.threads.end()), o.threads.end());
  return o;
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

// A row is marked busy when other processes used more than this fraction of
// the machine while it ran.
constexpr double kBusyFraction = 0.05;

double gib(std::size_t bytes) { return static_cast<double>(bytes) / (1 << 30); }

// ---------------------------------------------------------------------------
// Timing

template <class F>
double seconds(const F& f) {
  const auto t0 = std::chrono::steady_clock::now();
  f();
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

// Median seconds of a and of b, timed alternately in a random order per pair.
struct PairTimes {
  double a = 0, b = 0;
  int reps = 0;
};

template <class A, class B>
PairTimes time_pair(const A& a, const B& b, int warmup, int min_reps, std::mt19937_64& rng) {
  double last = 0;
  for (int i = 0; i < warmup; ++i) last = seconds(a) + seconds(b);
  if (warmup == 0) last = seconds(a) + seconds(b);
  const int budget_reps =
      last > 0 ? static_cast<int>(std::min<double>(kMaxReps, std::ceil(2 * kSeriesBudgetS / last)))
               : kMaxReps;
  const int reps = std::max(min_reps, budget_reps);
  std::vector<double> ta, tb;
  ta.reserve(static_cast<std::size_t>(reps));
  tb.reserve(static_cast<std::size_t>(reps));
  for (int r = 0; r < reps; ++r) {
    if (rng() & 1) {
      ta.push_back(seconds(a));
      tb.push_back(seconds(b));
    } else {
      tb.push_back(seconds(b));
      ta.push_back(seconds(a));
    }
  }
  return {median(ta), median(tb), reps};
}

template <class A>
double time_one(const A& a, int warmup, int min_reps) {
  double last = 0;
  for (int i = 0; i < warmup; ++i) last = seconds(a);
  if (warmup == 0) last = seconds(a);
  const int budget_reps =
      last > 0 ? static_cast<int>(std::min<double>(kMaxReps, std::ceil(kSeriesBudgetS / last)))
               : kMaxReps;
  const int reps = std::max(min_reps, budget_reps);
  std::vector<double> t;
  for (int r = 0; r < reps; ++r) t.push_back(seconds(a));
  return median(t);
}

// ---------------------------------------------------------------------------
// The run

struct Row {
  const OptimizerEntry* opt;
  const Precision* prec;
  std::size_t numel;
  int threads;
  std::size_t bpp;
  double time_us, gbps, limit_gbps, stream_gbps, ratio;
  double other_load;  // other processes' share of the CPUs during the row; -1 unknown
};

void print_row(const Options& o, const Row& r) {
  if (o.json) {
    std::printf(
        "{\"optimizer\": \"%s\", \"precision\": \"%s\", \"numel\": %zu, \"threads\": %d, "
        "\"bytes_per_param\": %zu, \"time_us\": %s, \"gbps\": %s, \"limit_gbps\": %s, "
        "\"stream_gbps\": %s, \"ratio\": %s}\n",
        r.opt->name, r.prec->name, r.numel, r.threads, r.bpp, num(r.time_us, 2).c_str(),
        num(r.gbps, 3).c_str(), num(r.limit_gbps, 3).c_str(), num(r.stream_gbps, 3).c_str(),
        num(r.ratio, 4).c_str());
  } else {
    char other[16] = "?";
    if (r.other_load >= 0) {
      std::snprintf(other, sizeof other, "%3.0f%%%s", 100 * r.other_load,
                    r.other_load > kBusyFraction ? "*" : " ");
    }
    std::printf("%-10s %-10s %6s %7d %4zu %11.1f %8.2f %8.2f %8.2f %6.3f %6s  %s\n", r.opt->name,
                r.prec->name, human_count(r.numel).c_str(), r.threads, r.bpp, r.time_us, r.gbps,
                r.limit_gbps, r.stream_gbps, r.ratio, other,
                bytes_formula(*r.opt, *r.prec).c_str());
  }
  std::fflush(stdout);
}

int run(const Options& o) {
  // Header and summary go to stderr with --json, so stdout holds rows only.
  FILE* info = o.json ? stderr : stdout;
  const int nproc = omp_get_num_procs();
  std::fprintf(info, "# %s: %s\n", kProgram, shardopt::build_info_string().c_str());
  std::fprintf(info, "# machine: %s, %d cores for OpenMP, vector unit %s, MemAvailable %.1f GiB\n",
               machine::cpu_model().c_str(), nproc, isa_name(kIsa),
               gib(machine::mem_available_bytes()));
  if (std::getenv("OMPI_COMM_WORLD_SIZE") != nullptr && nproc == 1) {
    std::fprintf(info,
                 "# note: mpirun binds a rank to one core; mpirun -n 1 --bind-to none "
                 "gives this process every core\n");
  }

  std::size_t max_states = 0;
  bool need_scratch = false;
  for (const auto* e : o.optimizers) {
    max_states = std::max(max_states, e->states.size());
    need_scratch |= e->scratch != nullptr;
  }
  bool need_bf16 = false, need_f16 = false, need_copy = false;
  for (const auto* p : o.precisions) {
    need_bf16 |= p->grad == DType::bf16;
    need_f16 |= p->grad == DType::f16;
    need_copy |= p->copy;
  }
  // params, states and f32 grads (also the triad's output), plus what the precisions need.
  const std::size_t bytes_per_elem = 4 * (2 + max_states) + (need_scratch ? 4 : 0) +
                                     (need_bf16 ? 2 : 0) + (need_f16 ? 2 : 0) + (need_copy ? 2 : 0);
  const std::size_t max_memory =
      o.max_memory != 0 ? o.max_memory : machine::mem_available_bytes() / 4 * 3;

  if (!o.json) {
    std::printf("#\n# %-8s %-10s %6s %7s %4s %11s %8s %8s %8s %6s %6s  %s\n", "optimizer",
                "precision", "numel", "threads", "B_pp", "time_us", "GB/s", "limit", "stream",
                "ratio", "other", "bytes per param (r read, w written)");
  }

  std::vector<Row> rows;
  std::mt19937_64 rng(kSeed);
  for (const std::size_t n : o.sizes) {
    const std::size_t need = n * bytes_per_elem;
    if (max_memory != 0 && need > max_memory) {
      std::fprintf(info,
                   "# skipping %s params: the arrays need %.2f GiB, over the limit %.2f GiB"
                   " (-M)\n",
                   human_count(n).c_str(), gib(need), gib(max_memory));
      continue;
    }
    omp_set_num_threads(nproc);
    shardopt::HostBuffer param(n * 4), grad32(n * 4);
    std::vector<shardopt::HostBuffer> states;
    for (std::size_t i = 0; i < max_states; ++i) states.emplace_back(n * 4);
    shardopt::HostBuffer grad_bf16(need_bf16 ? n * 2 : 0), grad_f16(need_f16 ? n * 2 : 0);
    shardopt::HostBuffer copy(need_copy ? n * 2 : 0);
    shardopt::HostBuffer scratch(need_scratch ? n * 4 : 0);

    const std::uint64_t key = mix64(kSeed + n);
    fill(param.as<float>(), n, [&](std::size_t i) { return uniform(key + 1, i, -1.0f, 1.0f); });
    // States in [0, 1e-2): some are sums of squares (v, Adagrad's sum, RMSprop's sq).
    for (std::size_t s = 0; s < max_states; ++s) {
      fill(states[s].as<float>(), n,
           [&](std::size_t i) { return uniform(key + 2 + s, i, 0.0f, 1e-2f); });
    }
    if (need_bf16) fill_grads(grad_bf16.data(), DType::bf16, n, key + 10);
    if (need_f16) fill_grads(grad_f16.data(), DType::f16, n, key + 11);

    // STREAM triad for each thread count, into the f32 gradient array, which
    // is then refilled.
    std::vector<double> stream_gbps;
    for (const int t : o.threads) {
      omp_set_num_threads(t);
      const double s = time_one(
          [&] {
            triad(grad32.as<float>(), param.as<float>(),
                  states.empty() ? param.as<float>() : states[0].as<float>(), n);
          },
          o.warmup, o.reps);
      stream_gbps.push_back(static_cast<double>(n) * 12 / s / 1e9);
    }
    omp_set_num_threads(nproc);
    fill_grads(grad32.data(), DType::f32, n, key + 12);

    for (std::size_t ti = 0; ti < o.threads.size(); ++ti) {
      const int t = o.threads[ti];
      omp_set_num_threads(t);
      for (const auto* opt : o.optimizers) {
        for (const auto* prec : o.precisions) {
          Streams s;
          s.n = n;
          s.param = param.as<float>();
          for (std::size_t i = 0; i < opt->states.size(); ++i) s.state[i] = states[i].as<float>();
          s.grad_type = prec->grad;
          s.grad = prec->grad == DType::bf16  ? grad_bf16.data()
                   : prec->grad == DType::f16 ? grad_f16.data()
                                              : grad32.data();
          s.copy = prec->copy ? copy.data() : nullptr;
          s.copy_type = prec->copy_type;
          s.scratch = opt->scratch != nullptr ? scratch.as<float>() : nullptr;
          const int k = static_cast<int>(opt->states.size());
          std::int64_t step = 0;
          OtherLoad load;
          const PairTimes pt = time_pair([&] { opt->step(s, ++step); }, [&] { memory_only(s, k); },
                                         o.warmup, o.reps, rng);
          Row r{opt, prec,           n, t, bytes_per_param(*opt, *prec), 0, 0, 0, stream_gbps[ti],
                0,   load.fraction()};
          const double bytes = static_cast<double>(n) * static_cast<double>(r.bpp);
          r.time_us = pt.a * 1e6;
          r.gbps = bytes / pt.a / 1e9;
          r.limit_gbps = bytes / pt.b / 1e9;
          r.ratio = r.gbps / r.limit_gbps;
          print_row(o, r);
          rows.push_back(r);
        }
      }
    }
  }

  // The goal.
  const int goal_threads = o.threads.empty() ? 0 : o.threads.back();
  std::fprintf(info, "#\n# goal: ratio >= %.2f at >= %s params with %d thread%s (%s)\n", kGoalRatio,
               human_count(kGoalNumel).c_str(), goal_threads, goal_threads == 1 ? "" : "s",
               goal_threads >= nproc ? "all cores" : "fewer than all cores");
  const Row* worst = nullptr;
  bool evaluated = false;
  for (const auto* opt : o.optimizers) {
    for (const auto* prec : o.precisions) {
      const Row* w = nullptr;
      for (const Row& r : rows) {
        if (r.opt != opt || r.prec != prec || r.numel < kGoalNumel || r.threads != goal_threads)
          continue;
        if (w == nullptr || r.ratio < w->ratio) w = &r;
      }
      if (w == nullptr) {
        std::fprintf(info, "#   %-10s %-10s not evaluated: no row at >= %s params\n", opt->name,
                     prec->name, human_count(kGoalNumel).c_str());
        continue;
      }
      evaluated = true;
      std::fprintf(info, "#   %-10s %-10s worst ratio %.3f (%s params): %s\n", opt->name,
                   prec->name, w->ratio, human_count(w->numel).c_str(),
                   w->ratio >= kGoalRatio ? "met" : "not met");
      if (worst == nullptr || w->ratio < worst->ratio) worst = w;
    }
  }
  const auto busy = std::count_if(rows.begin(), rows.end(),
                                  [](const Row& r) { return r.other_load > kBusyFraction; });
  if (busy > 0) {
    std::fprintf(info,
                 "# %zu of %zu rows ran while other processes used more than %.0f%% of the CPUs"
                 " (marked * in the table): their times are not this kernel's; rerun them on a"
                 " quiet machine\n",
                 static_cast<std::size_t>(busy), rows.size(), 100 * kBusyFraction);
  }
  if (!evaluated) {
    std::fprintf(info, "# goal: not evaluated (run sizes >= %s)\n",
                 human_count(kGoalNumel).c_str());
  } else {
    std::fprintf(info, "# goal: %s; worst row: %s %s %s params, %d threads, ratio %.3f\n",
                 worst->ratio >= kGoalRatio ? "met" : "not met", worst->opt->name,
                 worst->prec->name, human_count(worst->numel).c_str(), worst->threads,
                 worst->ratio);
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  Options o;
  try {
    o = parse_options(argc, argv);
    if (const int n = launched_processes(); n > 1) {
      throw UsageError{"started as " + std::to_string(n) +
                       " processes; it runs as one (mpirun -n 1, or no launcher): copies would "
                       "compete for the same cores and memory bandwidth"};
    }
  } catch (const UsageError& e) {
    std::fprintf(stderr, "%s: %s\n(%s -h lists the options)\n", kProgram, e.message.c_str(),
                 kProgram);
    return 2;
  }
  if (o.help) {
    std::fputs(usage().c_str(), stdout);
    return 0;
  }
  try {
    return run(o);
  } catch (const shardopt::Error& e) {
    std::fprintf(stderr, "%s: %s\n  hint: %s\n", kProgram, e.what(), e.hint().c_str());
  } catch (const std::exception& e) {
    std::fprintf(stderr, "%s: %s\n", kProgram, e.what());
  }
  return 1;
}
