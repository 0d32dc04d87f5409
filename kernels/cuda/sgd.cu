// The CUDA SGD kernel: one grid-stride launch over the range calling the same
// sgd_element as the CPU kernels (--fmad=false, IEEE division and square
// root), so the results equal the reference kernel's bitwise.
#include "kernels/cuda/launch.cuh"
#include "kernels/sgd.hpp"
#include "kernels/sgd_loop.hpp"

namespace shardopt::kernels::cuda {

bool sgd(const SgdBuffers& b, const SgdScalars& s, void* stream) {
  return kernels::detail::dispatch_sgd(b, s, [&]<class Loop>() {
    return detail::run<Loop>("SGD", b, s, b.n, static_cast<cudaStream_t>(stream));
  });
}

}  // namespace shardopt::kernels::cuda
