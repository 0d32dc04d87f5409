// The CPU Adam kernel: OpenMP slices of whole cache lines, each run by the
// loop compiled for the widest vector unit present (kernels/cpu/runner.hpp).
// The arithmetic is adam_element's, with its explicit fused multiply-adds
// only, so the result equals the reference kernel's bitwise.
#include "kernels/adam.hpp"

#include "kernels/adam_loop.hpp"
#include "kernels/cpu/runner.hpp"

namespace shardopt::kernels::cpu {

bool adam(const AdamBuffers& b, const AdamScalars& s) {
  return kernels::detail::dispatch_adam(b, s,
                                        [&]<class Loop>() { return detail::run<Loop>(b, s, b.n); });
}

}  // namespace shardopt::kernels::cpu
