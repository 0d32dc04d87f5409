// The CUDA Lion kernel: one grid-stride launch over the range calling the
// same lion_element as the CPU kernels (--fmad=false, IEEE division and
// square root), with 16-byte vector loads where the buffers align
// (kernels/cuda/launch.cuh), so the results equal the reference kernel's
// bitwise; and the same step on a list of tensors in one launch per group
// (kernels/cuda/multi_tensor.cuh).
#include "kernels/cuda/launch.cuh"
#include "kernels/cuda/multi_tensor.cuh"
#include "kernels/lion.hpp"
#include "kernels/lion_loop.hpp"

namespace shardopt::kernels::cuda {

bool lion(const LionBuffers& b, const LionScalars& s, void* stream) {
  return kernels::detail::dispatch_lion(b, s, [&]<class Loop>() {
    return detail::run<Loop>("Lion", b, s, b.n, static_cast<cudaStream_t>(stream));
  });
}

bool lion(std::span<const LionBuffers> tensors, const LionScalars& s, void* stream) {
  return detail::run_multi(
      "Lion", tensors, s, static_cast<cudaStream_t>(stream),
      [&](const LionBuffers& b, auto&& f) { return kernels::detail::dispatch_lion(b, s, f); });
}

}  // namespace shardopt::kernels::cuda
