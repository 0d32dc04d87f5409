// The CUDA finiteness check: the optimizers' grid-stride launch
// (kernels/cuda/launch.cuh) with an element that only tests its gradient,
// through the same scaled_finite as the reference.
#include "kernels/cuda/launch.cuh"
#include "kernels/finite.hpp"

namespace shardopt::kernels::cuda {

namespace {

template <class G>
struct FiniteElement {
  __device__ static bool apply(const G* g, float grad_mul, std::size_t i) {
    return scaled_finite(load_grad(g, i), grad_mul);
  }
};

}  // namespace

bool all_finite(const void* grad, DType grad_type, std::size_t n, float grad_mul, void* stream) {
  return kernels::with_float_type(grad, grad_type, [&](const auto* g) {
    using G = std::remove_cvref_t<decltype(*g)>;
    return detail::run<FiniteElement<G>>("finiteness check", g, grad_mul, n,
                                         static_cast<cudaStream_t>(stream));
  });
}

void flag_nonfinite(const void* grad, DType grad_type, std::size_t n, float grad_mul,
                    unsigned* flag, void* stream) {
  kernels::with_float_type(grad, grad_type, [&](const auto* g) {
    using G = std::remove_cvref_t<decltype(*g)>;
    detail::launch<FiniteElement<G>>("finiteness check", g, grad_mul, n, flag,
                                     static_cast<cudaStream_t>(stream));
    return true;
  });
}

}  // namespace shardopt::kernels::cuda
