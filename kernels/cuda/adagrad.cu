// The CUDA Adagrad kernel: one grid-stride launch over the range calling the same
// adagrad_element as the CPU kernels (--fmad=false, IEEE division and square
// root), so the results equal the reference kernel's bitwise.
#include "kernels/adagrad.hpp"
#include "kernels/adagrad_loop.hpp"
#include "kernels/cuda/launch.cuh"

namespace shardopt::kernels::cuda {

bool adagrad(const AdagradBuffers& b, const AdagradScalars& s, void* stream) {
  return kernels::detail::dispatch_adagrad(b, s, [&]<class Loop>() {
    return detail::run<Loop>("Adagrad", b, s, b.n, static_cast<cudaStream_t>(stream));
  });
}

}  // namespace shardopt::kernels::cuda
