// shardopt CPU kernels (internal): the vector units the CPU kernels are
// compiled for (AVX-512, AVX2 with FMA and F16C, the x86-64 baseline) and
// the run-time choice among them: one binary for every node type. Included
// by .cpp files only.
#pragma once

#include <algorithm>
#include <atomic>
#if defined(__x86_64__)
#include <cpuid.h>
#endif

#include "shardopt/config.hpp"

namespace shardopt::kernels::cpu::detail {

enum class Isa { baseline, avx2, avx512 };
static_assert(static_cast<int>(Isa::avx512) == static_cast<int>(CpuIsa::avx512) &&
              static_cast<int>(Isa::avx2) == static_cast<int>(CpuIsa::avx2));

#if defined(__x86_64__)
// F16C (half-float conversions), from CPUID leaf 1: not every compiler's
// __builtin_cpu_supports knows its name.
inline bool cpu_has_f16c() {
  unsigned a = 0, b = 0, c = 0, d = 0;
  return __get_cpuid(1, &a, &b, &c, &d) != 0 && (c & bit_F16C) != 0;
}
#endif

inline Isa detect_isa() {
  __builtin_cpu_init();
#if defined(__x86_64__)
  if (__builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
      __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512dq"))
    return Isa::avx512;
  if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") && cpu_has_f16c())
    return Isa::avx2;
#endif
  return Isa::baseline;
}

// A further cap on the vector unit, in-process (all by default): tests lower
// it to run every path on one machine, then set it back.
inline std::atomic<Isa>& isa_limit() {
  static std::atomic<Isa> limit{Isa::avx512};
  return limit;
}

// The vector unit the kernels use: the widest the CPU has, capped by
// SHARDOPT_CPU_ISA (read once) and by isa_limit().
inline Isa current_isa() {
  static const Isa isa = [] {
    const Isa cap = static_cast<Isa>(static_cast<int>(settings().cpu_isa));
    return std::min(detect_isa(), cap);
  }();
  return std::min(isa, isa_limit().load(std::memory_order_relaxed));
}

#if defined(__x86_64__)
#define SHARDOPT_CPU_TARGET_AVX512 \
  __attribute__((target("avx512f,avx512bw,avx512vl,avx512dq,fma,f16c")))
#define SHARDOPT_CPU_TARGET_AVX2 __attribute__((target("avx2,fma,f16c")))
#else
#define SHARDOPT_CPU_TARGET_AVX512
#define SHARDOPT_CPU_TARGET_AVX2
#endif

}  // namespace shardopt::kernels::cpu::detail
