// shardopt-bench-optim: the limit kernels of the host (limits.cpp).
#pragma once

#include <cstddef>

#include "harness.hpp"
#include "kernels/cpu/isa.hpp"

namespace limits {

// The vector unit the limit kernels run on: the optimizer kernels' own
// (the widest present, capped by SHARDOPT_CPU_ISA).
shardopt::kernels::cpu::detail::Isa used_isa();
// The memory-only limit kernel of a step with k state arrays (two passes
// when s.scratch is set).
void memory_only(const bench::Streams& s, int k);
// STREAM triad a[i] = b[i] + 0.5 * c[i] over n elements.
void triad(float* a, const float* b, const float* c, std::size_t n);
// Fills an array as f says, on every OpenMP thread.
void fill(const bench::Fill& f, std::size_t n);

}  // namespace limits
