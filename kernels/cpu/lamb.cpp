// The CPU LAMB kernels: OpenMP slices (whole norm blocks for the direction
// pass, so that each block's sums are one thread's, in the reference's
// order), each run by the loop compiled for the widest vector unit present.
#include "kernels/lamb.hpp"

#include <vector>

#include "kernels/cpu/runner.hpp"
#include "kernels/lamb_loop.hpp"

namespace shardopt::kernels::cpu {

LambNorms lamb_direction(const LambBuffers& b, const LambScalars& s) {
  std::vector<double> sums(2 * ((b.n + kLambNormBlock - 1) / kLambNormBlock));
  const kernels::detail::LambWork w{b, sums.data()};
  const bool finite = kernels::detail::dispatch_lamb_direction(
      b, [&]<class Loop>() { return detail::run<Loop>(w, s, b.n, kLambNormBlock); });
  return kernels::detail::lamb_sum_blocks(sums.data(), b.n, finite);
}

void lamb_apply(const LambApplyBuffers& b, float neg_step) {
  kernels::detail::dispatch_lamb_apply(
      b, [&]<class Loop>() { return detail::run<Loop>(b, neg_step, b.n); });
}

}  // namespace shardopt::kernels::cpu
