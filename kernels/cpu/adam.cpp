// The CPU Adam kernel: the range is split across OpenMP threads in blocks
// aligned to 64 bytes, and each thread runs the loop compiled for the widest
// vector unit the CPU has (AVX-512, AVX2 or the x86-64 baseline, chosen at
// run time: one binary for every node type). The compiler peels unaligned
// heads and tails. The arithmetic is adam_element's, with its explicit
// fused multiply-adds only, so the result equals the reference kernel's bitwise.
#include "kernels/adam.hpp"

#include <omp.h>

#include <algorithm>

#include "kernels/adam_loop.hpp"

namespace shardopt::kernels::cpu {

namespace {

enum class Isa { baseline, avx2, avx512 };

Isa detect_isa() {
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

Isa current_isa() {
  static const Isa isa = detect_isa();
  return isa;
}

#if defined(__x86_64__)
#define SHARDOPT_TARGET_AVX512 \
  __attribute__((target("avx512f,avx512bw,avx512vl,avx512dq,fma,f16c")))
#define SHARDOPT_TARGET_AVX2 __attribute__((target("avx2,fma,f16c")))
#else
#define SHARDOPT_TARGET_AVX512
#define SHARDOPT_TARGET_AVX2
#endif

template <class G, class O, WeightDecay W, bool Ams>
SHARDOPT_TARGET_AVX512 bool range_avx512(const AdamBuffers& b, const AdamScalars& s,
                                         std::size_t begin, std::size_t end) {
  return detail::adam_range<G, O, W, Ams>(b, s, begin, end);
}
template <class G, class O, WeightDecay W, bool Ams>
SHARDOPT_TARGET_AVX2 bool range_avx2(const AdamBuffers& b, const AdamScalars& s, std::size_t begin,
                                     std::size_t end) {
  return detail::adam_range<G, O, W, Ams>(b, s, begin, end);
}
template <class G, class O, WeightDecay W, bool Ams>
bool range_baseline(const AdamBuffers& b, const AdamScalars& s, std::size_t begin,
                    std::size_t end) {
  return detail::adam_range<G, O, W, Ams>(b, s, begin, end);
}

// Threads get blocks of whole cache lines of fp32 elements.
constexpr std::size_t kAlign = 16;

}  // namespace

bool adam(const AdamBuffers& b, const AdamScalars& s) {
  return detail::dispatch_adam(b, s, [&]<class G, class O, WeightDecay W, bool Ams>() {
    auto run = [&](std::size_t begin, std::size_t end) {
      switch (current_isa()) {
        case Isa::avx512:
          return range_avx512<G, O, W, Ams>(b, s, begin, end);
        case Isa::avx2:
          return range_avx2<G, O, W, Ams>(b, s, begin, end);
        default:
          return range_baseline<G, O, W, Ams>(b, s, begin, end);
      }
    };
    // Below a few pages the threads cost more than they save.
    if (b.n < (std::size_t{1} << 15) || omp_get_max_threads() == 1) return run(0, b.n);
    bool all_finite = true;
#pragma omp parallel reduction(&& : all_finite)
    {
      const std::size_t threads = static_cast<std::size_t>(omp_get_num_threads());
      const std::size_t t = static_cast<std::size_t>(omp_get_thread_num());
      const std::size_t share = (b.n + threads - 1) / threads;
      const std::size_t per = (share + kAlign - 1) / kAlign * kAlign;
      const std::size_t begin = std::min(b.n, t * per);
      const std::size_t end = std::min(b.n, begin + per);
      all_finite = run(begin, end);
    }
    return all_finite;
  });
}

}  // namespace shardopt::kernels::cpu
