// shardopt CPU kernels (internal): the split of a range across OpenMP threads
// and the run-time choice of the vector unit (AVX-512, AVX2 or the x86-64
// baseline: one binary for every node type), shared by the optimizers'
// CPU kernels. Each runs Loop::range(b, s, begin, end), an always-inline
// loop that is compiled once per vector unit. Included by .cpp files only.
#pragma once

#include <omp.h>

#include <algorithm>
#include <cstddef>

namespace shardopt::kernels::cpu::detail {

enum class Isa { baseline, avx2, avx512 };

inline Isa detect_isa() {
  __builtin_cpu_init();
#if defined(__x86_64__)
  if (__builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
      __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512dq"))
    return Isa::avx512;
  if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") &&
      __builtin_cpu_supports("f16c"))
    return Isa::avx2;
#endif
  return Isa::baseline;
}

inline Isa current_isa() {
  static const Isa isa = detect_isa();
  return isa;
}

#if defined(__x86_64__)
#define SHARDOPT_CPU_TARGET_AVX512 \
  __attribute__((target("avx512f,avx512bw,avx512vl,avx512dq,fma,f16c")))
#define SHARDOPT_CPU_TARGET_AVX2 __attribute__((target("avx2,fma,f16c")))
#else
#define SHARDOPT_CPU_TARGET_AVX512
#define SHARDOPT_CPU_TARGET_AVX2
#endif

template <class Loop, class B, class S>
SHARDOPT_CPU_TARGET_AVX512 bool range_avx512(const B& b, const S& s, std::size_t begin,
                                             std::size_t end) {
  return Loop::range(b, s, begin, end);
}
template <class Loop, class B, class S>
SHARDOPT_CPU_TARGET_AVX2 bool range_avx2(const B& b, const S& s, std::size_t begin,
                                         std::size_t end) {
  return Loop::range(b, s, begin, end);
}
template <class Loop, class B, class S>
bool range_baseline(const B& b, const S& s, std::size_t begin, std::size_t end) {
  return Loop::range(b, s, begin, end);
}

template <class Loop, class B, class S>
bool range_best(const B& b, const S& s, std::size_t begin, std::size_t end) {
  switch (current_isa()) {
    case Isa::avx512:
      return range_avx512<Loop>(b, s, begin, end);
    case Isa::avx2:
      return range_avx2<Loop>(b, s, begin, end);
    default:
      return range_baseline<Loop>(b, s, begin, end);
  }
}

// Runs Loop over [0, n), each thread on one slice whose start is a multiple
// of `align` elements (16: whole cache lines of fp32). Returns the logical
// and of the slices' results.
template <class Loop, class B, class S>
bool run(const B& b, const S& s, std::size_t n, std::size_t align = 16) {
  // Below a few pages the threads cost more than they save.
  if (n < (std::size_t{1} << 15) || omp_get_max_threads() == 1) return range_best<Loop>(b, s, 0, n);
  bool all_finite = true;
#pragma omp parallel reduction(&& : all_finite)
  {
    const std::size_t threads = static_cast<std::size_t>(omp_get_num_threads());
    const std::size_t t = static_cast<std::size_t>(omp_get_thread_num());
    const std::size_t share = (n + threads - 1) / threads;
    const std::size_t per = (share + align - 1) / align * align;
    const std::size_t begin = std::min(n, t * per);
    const std::size_t end = std::min(n, begin + per);
    all_finite = range_best<Loop>(b, s, begin, end);
  }
  return all_finite;
}

}  // namespace shardopt::kernels::cpu::detail
