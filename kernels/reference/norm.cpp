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
  switch (type) {
    case DType::bf16:
      return run(static_cast<const bfloat16*>(x), n);
    case DType::f16:
      return run(static_cast<const float16*>(x), n);
    default:
      return run(static_cast<const float*>(x), n);
  }
}

}  // namespace shardopt::kernels::reference
