// The reference SGD kernel: one plain loop, no threads, no vector paths.
// It defines the result the other kernels must match bitwise.
#include "kernels/sgd.hpp"

#include "kernels/sgd_loop.hpp"

namespace shardopt::kernels::reference {

bool sgd(const SgdBuffers& b, const SgdScalars& s) {
  return detail::dispatch_sgd(b, s, [&]<class Loop>() { return Loop::range(b, s, 0, b.n); });
}

}  // namespace shardopt::kernels::reference
