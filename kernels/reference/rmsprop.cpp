// The reference RMSprop kernel: one plain loop, no threads, no vector paths.
// It defines the result the other kernels must match bitwise.
#include "kernels/rmsprop.hpp"

#include "kernels/rmsprop_loop.hpp"

namespace shardopt::kernels::reference {

bool rmsprop(const RmspropBuffers& b, const RmspropScalars& s) {
  return detail::dispatch_rmsprop(b, s, [&]<class Loop>() { return Loop::range(b, s, 0, b.n); });
}

}  // namespace shardopt::kernels::reference
