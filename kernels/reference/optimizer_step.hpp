// The reference kernel of every element-wise optimizer (kernels/optimizer.hpp):
// one plain loop, no threads, no vector paths. It defines the result the
// other kernels must match bitwise. Included by the kernel sources that
// kernels/meson.build makes, one per optimizer.
#pragma once

#include "kernels/optimizer.hpp"

namespace shardopt::kernels::reference {

template <class O>
bool step(const typename Kernel<O>::Buffers& b, const typename Kernel<O>::Scalars& s) {
  return Kernel<O>::dispatch(b, s, [&]<class Loop>() { return Loop::range(b, s, 0, b.n); });
}

}  // namespace shardopt::kernels::reference
