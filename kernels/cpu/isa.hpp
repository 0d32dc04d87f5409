// shardopt CPU kernels (internal): the vector units the CPU kernels are
// compiled for (AVX-512, AVX2 with FMA and F16C, the x86-64 baseline) and
// the run-time choice among them: one binary for every node type. The
// detection itself is lib/common/cpu_features.hpp, shared with the
// communicator. Included by .cpp files only.
#pragma once

#include <algorithm>
#include <atomic>

#include "common/cpu_features.hpp"
#include "shardopt/config.hpp"

namespace shardopt::kernels::cpu::detail {

enum class Isa { baseline, avx2, avx512 };
static_assert(static_cast<int>(Isa::avx512) == static_cast<int>(CpuIsa::avx512) &&
              static_cast<int>(Isa::avx2) == static_cast<int>(CpuIsa::avx2));

// The widest vector unit the CPU has (shardopt::detail::detect_cpu_isa).
inline Isa detect_isa() {
  return static_cast<Isa>(static_cast<int>(::shardopt::detail::detect_cpu_isa()));
}

// A further cap on the vector unit, in-process (all by default): tests lower
// it to run every path on one machine, then set it back.
inline std::atomic<Isa>& isa_limit() {
  static std::atomic<Isa> limit{Isa::avx512};
  return limit;
}

// The vector unit the kernels use: the widest the CPU has, capped by
// SHARDOPT_CPU_ISA (read once; shardopt::detail::configured_cpu_isa) and by
// isa_limit().
inline Isa current_isa() {
  static const Isa isa =
      static_cast<Isa>(static_cast<int>(::shardopt::detail::configured_cpu_isa()));
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
