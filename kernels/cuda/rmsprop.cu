// The CUDA RMSprop kernel: one grid-stride launch over the range calling the
// same rmsprop_element as the CPU kernels (--fmad=false, IEEE division and
// square root), with 16-byte vector loads where the buffers align
// (kernels/cuda/launch.cuh), so the results equal the reference kernel's
// bitwise; and the same step on a list of tensors in one launch per group
// (kernels/cuda/multi_tensor.cuh).
#include "kernels/cuda/launch.cuh"
#include "kernels/cuda/multi_tensor.cuh"
#include "kernels/rmsprop.hpp"
#include "kernels/rmsprop_loop.hpp"

namespace shardopt::kernels::cuda {

bool rmsprop(const RmspropBuffers& b, const RmspropScalars& s, void* stream) {
  return kernels::detail::dispatch_rmsprop(b, s, [&]<class Loop>() {
    return detail::run<Loop>("RMSprop", b, s, b.n, static_cast<cudaStream_t>(stream));
  });
}

bool rmsprop(std::span<const RmspropBuffers> tensors, const RmspropScalars& s, void* stream) {
  return detail::run_multi("RMSprop", tensors, s, static_cast<cudaStream_t>(stream),
                           [&](const RmspropBuffers& b, auto&& f) {
                             return kernels::detail::dispatch_rmsprop(b, s, f);
                           });
}

}  // namespace shardopt::kernels::cuda
