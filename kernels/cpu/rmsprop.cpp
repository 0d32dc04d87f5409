// The CPU RMSprop kernel: OpenMP slices of whole cache lines, each run by the
// loop compiled for the widest vector unit present (kernels/cpu/runner.hpp).
// The arithmetic is rmsprop_element's, so the result equals the reference's bitwise.
#include "kernels/rmsprop.hpp"

#include "kernels/cpu/runner.hpp"
#include "kernels/rmsprop_loop.hpp"

namespace shardopt::kernels::cpu {

bool rmsprop(const RmspropBuffers& b, const RmspropScalars& s) {
  return kernels::detail::dispatch_rmsprop(
      b, s, [&]<class Loop>() { return detail::run<Loop>(b, s, b.n); });
}

}  // namespace shardopt::kernels::cpu
