// The CPU kernel of every element-wise optimizer (kernels/optimizer.hpp):
// OpenMP slices of whole cache lines, each run by the loop compiled for the
// widest vector unit present (kernels/cpu/runner.hpp). The arithmetic is the
// element function's, with its explicit fused multiply-adds only, so the
// result equals the reference kernel's bitwise. Included by the kernel
// sources that kernels/meson.build makes, one per optimizer.
#pragma once

#include "kernels/cpu/runner.hpp"
#include "kernels/optimizer.hpp"

namespace shardopt::kernels::cpu {

template <class O>
bool step(const typename Kernel<O>::Buffers& b, const typename Kernel<O>::Scalars& s) {
  return Kernel<O>::dispatch(b, s, [&]<class Loop>() { return detail::run<Loop>(b, s, b.n); });
}

}  // namespace shardopt::kernels::cpu
