// shardopt CPU kernels (internal): the vector units the CPU kernels are
// compiled for (AVX-512, AVX2 with FMA and F16C, the x86-64 baseline), their
// detection at run time (CPUID: one binary for every node type), and the
// choice among them. Header-only, with no MPI and no library object: the
// CPU kernels, the communicator's reductions (through kernels/reduce.hpp)
// and shardopt-bench-optim's limit kernels all decide here. Included by
// .cpp files only.
#pragma once

#include <algorithm>
#include <atomic>

#if defined(__x86_64__)
#include <cpuid.h>
// The vector intrinsics, for the code that uses these units. GCC 12's
// AVX-512 intrinsics start their unmasked forms from a self-initialized
// "undefined" vector, which -Wmaybe-uninitialized (and, where GCC sees the
// whole path, -Wuninitialized) reports wherever they are inlined: a false
// positive, silenced for this header.
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#pragma GCC diagnostic ignored "-Wuninitialized"
#endif
#include <immintrin.h>
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic pop
#endif
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

// The widest vector unit this CPU has, of those the kernels are compiled
// for: avx512 (AVX-512 F, BW, VL and DQ), avx2 (AVX2 with FMA and F16C), or
// baseline (x86-64 without them, or another architecture).
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

// The cap the library configures for the optimizer kernels
// (SHARDOPT_CPU_ISA): defined by the library (lib/optim/cpu_isa.cpp), which
// reads its settings; the kernels only ask. Throws the library's
// ConfigError for a bad SHARDOPT_* variable.
Isa configured_isa_cap();

// A further cap on the vector unit, in-process (all by default): tests lower
// it to run every path on one machine, then set it back.
inline std::atomic<Isa>& isa_limit() {
  static std::atomic<Isa> limit{Isa::avx512};
  return limit;
}

// The vector unit the kernels use: the widest the CPU has, capped by the
// library's configuration (decided at the first call) and by isa_limit().
inline Isa current_isa() {
  static const Isa isa = std::min(detect_isa(), configured_isa_cap());
  return std::min(isa, isa_limit().load(std::memory_order_relaxed));
}

inline const char* isa_name(Isa i) {
  return i == Isa::avx512 ? "AVX-512" : i == Isa::avx2 ? "AVX2" : "x86-64 baseline";
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
