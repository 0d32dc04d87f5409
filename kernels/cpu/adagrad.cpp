// The CPU Adagrad kernel: OpenMP slices of whole cache lines, each run by the
// loop compiled for the widest vector unit present (kernels/cpu/runner.hpp).
// The arithmetic is adagrad_element's, so the result equals the reference's bitwise.
#include "kernels/adagrad.hpp"

#include "kernels/adagrad_loop.hpp"
#include "kernels/cpu/runner.hpp"

namespace shardopt::kernels::cpu {

bool adagrad(const AdagradBuffers& b, const AdagradScalars& s) {
  return kernels::detail::dispatch_adagrad(
      b, s, [&]<class Loop>() { return detail::run<Loop>(b, s, b.n); });
}

}  // namespace shardopt::kernels::cpu
