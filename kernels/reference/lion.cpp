// The reference Lion kernel: one plain loop, no threads, no vector paths.
// It defines the result the other kernels must match bitwise.
#include "kernels/lion.hpp"

#include "kernels/lion_loop.hpp"

namespace shardopt::kernels::reference {

bool lion(const LionBuffers& b, const LionScalars& s) {
  return detail::dispatch_lion(b, s, [&]<class Loop>() { return Loop::range(b, s, 0, b.n); });
}

}  // namespace shardopt::kernels::reference
