// The CUDA RMSprop kernel: one grid-stride launch over the range calling the same
// rmsprop_element as the CPU kernels (--fmad=false, IEEE division and square
// root), so the results equal the reference kernel's bitwise.
#include "kernels/cuda/launch.cuh"
#include "kernels/rmsprop.hpp"
#include "kernels/rmsprop_loop.hpp"

namespace shardopt::kernels::cuda {

bool rmsprop(const RmspropBuffers& b, const RmspropScalars& s, void* stream) {
  return kernels::detail::dispatch_rmsprop(b, s, [&]<class Loop>() {
    return detail::run<Loop>("RMSprop", b, s, b.n, static_cast<cudaStream_t>(stream));
  });
}

}  // namespace shardopt::kernels::cuda
