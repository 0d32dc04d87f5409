// The CUDA Adam kernel: one grid-stride launch over the range calling the same
// adam_element as the CPU kernels (--fmad=false, IEEE division and square
// root), so the results equal the reference kernel's bitwise.
#include "kernels/adam.hpp"
#include "kernels/adam_loop.hpp"
#include "kernels/cuda/launch.cuh"

namespace shardopt::kernels::cuda {

bool adam(const AdamBuffers& b, const AdamScalars& s, void* stream) {
  return kernels::detail::dispatch_adam(b, s, [&]<class Loop>() {
    return detail::run<Loop>("Adam", b, s, b.n, static_cast<cudaStream_t>(stream));
  });
}

}  // namespace shardopt::kernels::cuda
