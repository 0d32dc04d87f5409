// The CPU sum of squares: threads take blocks, each block summed in the
// fixed lane order (vectorized across lanes, which keeps every lane's order),
// then the blocks' sums are added in order: the result does not depend on the
// number of threads or the vector unit.
#include "kernels/norm.hpp"

#include <omp.h>

#include <vector>

namespace shardopt::kernels::cpu {

namespace {

template <class T>
double run(const T* x, std::size_t n) {
  const std::size_t blocks = (n + kNormBlock - 1) / kNormBlock;
  if (blocks <= 1 || omp_get_max_threads() == 1) {
    double total = 0.0;
    for (std::size_t b = 0; b < blocks; ++b) total += block_sum_squares(x, n, b);
    return total;
  }
  std::vector<double> partial(blocks);
#pragma omp parallel for schedule(static)
  for (std::size_t b = 0; b < blocks; ++b) partial[b] = block_sum_squares(x, n, b);
  double total = 0.0;
  for (double s : partial) total += s;
  return total;
}

}  // namespace

double sum_squares(const void* x, DType type, std::size_t n) {
  return with_float_type(x, type, [&](const auto* p) { return run(p, n); });
}

}  // namespace shardopt::kernels::cpu
