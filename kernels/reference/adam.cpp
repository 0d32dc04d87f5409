// The reference Adam kernel: one plain loop, no threads, no vector paths.
// It defines the result the other kernels must match bitwise.
#include "kernels/adam.hpp"

#include "kernels/adam_loop.hpp"

namespace shardopt::kernels::reference {

bool adam(const AdamBuffers& b, const AdamScalars& s) {
  return detail::dispatch_adam(b, s, [&]<class Loop>() { return Loop::range(b, s, 0, b.n); });
}

}  // namespace shardopt::kernels::reference
