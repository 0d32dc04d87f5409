// The CUDA Adagrad kernel: one grid-stride launch over the range calling the
// same adagrad_element as the CPU kernels (--fmad=false, IEEE division and
// square root), with 16-byte vector loads where the buffers align
// (kernels/cuda/launch.cuh), so the results equal the reference kernel's
// bitwise; and the same step on a list of tensors in one launch per group
// (kernels/cuda/multi_tensor.cuh).
#include "kernels/adagrad.hpp"
#include "kernels/adagrad_loop.hpp"
#include "kernels/cuda/launch.cuh"
#include "kernels/cuda/multi_tensor.cuh"

namespace shardopt::kernels::cuda {

bool adagrad(const AdagradBuffers& b, const AdagradScalars& s, void* stream) {
  return kernels::detail::dispatch_adagrad(b, s, [&]<class Loop>() {
    return detail::run<Loop>("Adagrad", b, s, b.n, static_cast<cudaStream_t>(stream));
  });
}

bool adagrad(std::span<const AdagradBuffers> tensors, const AdagradScalars& s, void* stream) {
  return detail::run_multi("Adagrad", tensors, s, static_cast<cudaStream_t>(stream),
                           [&](const AdagradBuffers& b, auto&& f) {
                             return kernels::detail::dispatch_adagrad(b, s, f);
                           });
}

}  // namespace shardopt::kernels::cuda
