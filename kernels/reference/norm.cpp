// The reference sum of squares: the blocks one after the other.
#include "kernels/norm.hpp"

namespace shardopt::kernels::reference {

namespace {
template <class T>
double run(const T* x, std::size_t n) {
  double total = 0.0;
  for (std::size_t b = 0; b * kNormBlock < n; ++b) total += block_sum_squares(x, n, b);
  return total;
}
}  // namespace

double sum_squares(const void* x, DType type, std::size_t n) {
  return with_float_type(x, type, [&](const auto* p) { return run(p, n); });
}

}  // namespace shardopt::kernels::reference
