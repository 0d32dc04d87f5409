// The CPU Lion kernel: OpenMP slices of whole cache lines, each run by the
// loop compiled for the widest vector unit present (kernels/cpu/runner.hpp).
// The arithmetic is lion_element's, so the result equals the reference's bitwise.
#include "kernels/lion.hpp"

#include "kernels/cpu/runner.hpp"
#include "kernels/lion_loop.hpp"

namespace shardopt::kernels::cpu {

bool lion(const LionBuffers& b, const LionScalars& s) {
  return kernels::detail::dispatch_lion(b, s,
                                        [&]<class Loop>() { return detail::run<Loop>(b, s, b.n); });
}

}  // namespace shardopt::kernels::cpu
