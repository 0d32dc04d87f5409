// The reference finiteness check: one plain loop over every element.
#include "kernels/finite.hpp"

namespace shardopt::kernels::reference {

bool all_finite(const void* grad, DType grad_type, std::size_t n, float grad_mul) {
  return with_float_type(grad, grad_type, [&](const auto* g) {
    bool all = true;
    for (std::size_t i = 0; i < n; ++i) all = scaled_finite(load_grad(g, i), grad_mul) && all;
    return all;
  });
}

}  // namespace shardopt::kernels::reference
