// The CUDA Lion kernel: one grid-stride launch over the range calling the same
// lion_element as the CPU kernels (--fmad=false, IEEE division and square
// root), so the results equal the reference kernel's bitwise.
#include "kernels/cuda/launch.cuh"
#include "kernels/lion.hpp"
#include "kernels/lion_loop.hpp"

namespace shardopt::kernels::cuda {

bool lion(const LionBuffers& b, const LionScalars& s, void* stream) {
  return kernels::detail::dispatch_lion(b, s, [&]<class Loop>() {
    return detail::run<Loop>("Lion", b, s, b.n, static_cast<cudaStream_t>(stream));
  });
}

}  // namespace shardopt::kernels::cuda
