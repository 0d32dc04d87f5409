// The reference Adagrad kernel: one plain loop, no threads, no vector paths.
// It defines the result the other kernels must match bitwise.
#include "kernels/adagrad.hpp"

#include "kernels/adagrad_loop.hpp"

namespace shardopt::kernels::reference {

bool adagrad(const AdagradBuffers& b, const AdagradScalars& s) {
  return detail::dispatch_adagrad(b, s, [&]<class Loop>() { return Loop::range(b, s, 0, b.n); });
}

}  // namespace shardopt::kernels::reference
