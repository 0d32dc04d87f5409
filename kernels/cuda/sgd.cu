// The CUDA SGD kernel: one grid-stride launch over the range calling the
// same sgd_element as the CPU kernels (--fmad=false, IEEE division and
// square root), with 16-byte vector loads where the buffers align
// (kernels/cuda/launch.cuh), so the results equal the reference kernel's
// bitwise; and the same step on a list of tensors in one launch per group
// (kernels/cuda/multi_tensor.cuh).
#include "kernels/cuda/launch.cuh"
#include "kernels/cuda/multi_tensor.cuh"
#include "kernels/sgd.hpp"
#include "kernels/sgd_loop.hpp"

namespace shardopt::kernels::cuda {

bool sgd(const SgdBuffers& b, const SgdScalars& s, void* stream) {
  return kernels::detail::dispatch_sgd(b, s, [&]<class Loop>() {
    return detail::run<Loop>("SGD", b, s, b.n, static_cast<cudaStream_t>(stream));
  });
}

bool sgd(std::span<const SgdBuffers> tensors, const SgdScalars& s, void* stream) {
  return detail::run_multi(
      "SGD", tensors, s, static_cast<cudaStream_t>(stream),
      [&](const SgdBuffers& b, auto&& f) { return kernels::detail::dispatch_sgd(b, s, f); });
}

}  // namespace shardopt::kernels::cuda
