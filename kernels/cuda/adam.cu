// The CUDA Adam kernel: one grid-stride launch over the range calling the
// same adam_element as the CPU kernels (--fmad=false, IEEE division and
// square root), with 16-byte vector loads where the buffers align
// (kernels/cuda/launch.cuh), so the results equal the reference kernel's
// bitwise; and the same step on a list of tensors in one launch per group
// (kernels/cuda/multi_tensor.cuh).
#include "kernels/adam.hpp"
#include "kernels/adam_loop.hpp"
#include "kernels/cuda/launch.cuh"
#include "kernels/cuda/multi_tensor.cuh"

namespace shardopt::kernels::cuda {

bool adam(const AdamBuffers& b, const AdamScalars& s, void* stream) {
  return kernels::detail::dispatch_adam(b, s, [&]<class Loop>() {
    return detail::run<Loop>("Adam", b, s, b.n, static_cast<cudaStream_t>(stream));
  });
}

bool adam(std::span<const AdamBuffers> tensors, const AdamScalars& s, void* stream) {
  return detail::run_multi(
      "Adam", tensors, s, static_cast<cudaStream_t>(stream),
      [&](const AdamBuffers& b, auto&& f) { return kernels::detail::dispatch_adam(b, s, f); });
}

}  // namespace shardopt::kernels::cuda
