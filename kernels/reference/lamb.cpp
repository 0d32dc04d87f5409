// The reference LAMB kernels: plain loops, no threads, no vector paths. They
// define the results the other kernels must match bitwise.
#include "kernels/lamb.hpp"

#include <vector>

#include "kernels/lamb_loop.hpp"

namespace shardopt::kernels::reference {

LambNorms lamb_direction(const LambBuffers& b, const LambScalars& s) {
  std::vector<double> sums(2 * ((b.n + kLambNormBlock - 1) / kLambNormBlock));
  const detail::LambWork w{b, sums.data()};
  const bool finite =
      detail::dispatch_lamb_direction(b, [&]<class Loop>() { return Loop::range(w, s, 0, b.n); });
  return detail::lamb_sum_blocks(sums.data(), b.n, finite);
}

void lamb_apply(const LambApplyBuffers& b, float neg_step) {
  detail::dispatch_lamb_apply(b, [&]<class Loop>() { return Loop::range(b, neg_step, 0, b.n); });
}

}  // namespace shardopt::kernels::reference
