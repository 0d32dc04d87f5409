// The CUDA kernels of every element-wise optimizer (kernels/optimizer.hpp):
// one grid-stride launch over a range calling the same element function as
// the CPU kernels (--fmad=false, IEEE division and square root), with
// 16-byte vector loads where the buffers align (kernels/cuda/launch.cuh), so
// the results equal the reference kernel's bitwise; and the same step on a
// list of tensors in one launch per group (kernels/cuda/multi_tensor.cuh).
// Included by the kernel sources that kernels/meson.build makes, one per
// optimizer.
#pragma once

#include "kernels/cuda/launch.cuh"
#include "kernels/cuda/multi_tensor.cuh"
#include "kernels/optimizer.hpp"

namespace shardopt::kernels::cuda {

template <class O>
bool step(const typename Kernel<O>::Buffers& b, const typename Kernel<O>::Scalars& s,
          void* stream) {
  return Kernel<O>::dispatch(b, s, [&]<class Loop>() {
    return detail::run<Loop>(O::name, b, s, b.n, static_cast<cudaStream_t>(stream));
  });
}

template <class O>
bool step(std::span<const typename Kernel<O>::Buffers> tensors,
          const typename Kernel<O>::Scalars& s, void* stream) {
  return detail::run_multi(
      O::name, tensors, s, static_cast<cudaStream_t>(stream),
      [&](const typename Kernel<O>::Buffers& b, auto&& f) { return Kernel<O>::dispatch(b, s, f); });
}

template <class O>
void step_async(std::span<const typename Kernel<O>::Buffers> tensors,
                const typename Kernel<O>::Scalars& s, const unsigned* skip, void* stream) {
  detail::launch_multi(
      O::name, tensors, s, nullptr, static_cast<cudaStream_t>(stream),
      [&](const typename Kernel<O>::Buffers& b, auto&& f) { return Kernel<O>::dispatch(b, s, f); },
      detail::NothingAfter{}, skip);
}

}  // namespace shardopt::kernels::cuda
