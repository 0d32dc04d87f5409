// shardopt internal: the CPU's vector units, detected at run time, so that
// one binary runs on every node type. Header-only, with no MPI and no
// library object (it reads SHARDOPT_CPU_ISA through settings()): the one
// lib/common header the kernels may include. Used by the CPU kernels'
// dispatch (kernels/cpu/isa.hpp) and by the communicator's bf16/f16
// reduction ops (lib/comm/mpi/mpi_types.cpp).
#pragma once

#include <algorithm>
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

namespace shardopt::detail {

#if defined(__x86_64__)
// F16C (half-float conversions), from CPUID leaf 1: not every compiler's
// __builtin_cpu_supports knows its name.
inline bool cpu_has_f16c() {
  unsigned a = 0, b = 0, c = 0, d = 0;
  return __get_cpuid(1, &a, &b, &c, &d) != 0 && (c & bit_F16C) != 0;
}
#endif

// The widest vector unit this CPU has, of those shardopt's CPU code is
// compiled for: avx512 (AVX-512 F, BW, VL and DQ), avx2 (AVX2 with FMA and
// F16C), or baseline (x86-64 without them, or another architecture).
inline CpuIsa detect_cpu_isa() {
  __builtin_cpu_init();
#if defined(__x86_64__)
  if (__builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
      __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512dq"))
    return CpuIsa::avx512;
  if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") && cpu_has_f16c())
    return CpuIsa::avx2;
#endif
  return CpuIsa::baseline;
}

// detect_cpu_isa() capped by SHARDOPT_CPU_ISA (settings().cpu_isa), decided
// at the first call. Throws ConfigError for a bad SHARDOPT_* variable.
inline CpuIsa configured_cpu_isa() {
  static const CpuIsa isa = std::min(detect_cpu_isa(), settings().cpu_isa);
  return isa;
}

}  // namespace shardopt::detail
