// The CPU SGD kernel: OpenMP slices of whole cache lines, each run by the
// loop compiled for the widest vector unit present (kernels/cpu/runner.hpp).
// The arithmetic is sgd_element's, so the result equals the reference's bitwise.
#include "kernels/sgd.hpp"

#include "kernels/cpu/runner.hpp"
#include "kernels/sgd_loop.hpp"

namespace shardopt::kernels::cpu {

bool sgd(const SgdBuffers& b, const SgdScalars& s) {
  return kernels::detail::dispatch_sgd(b, s,
                                       [&]<class Loop>() { return detail::run<Loop>(b, s, b.n); });
}

}  // namespace shardopt::kernels::cpu
