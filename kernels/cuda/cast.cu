// The CUDA cast: one grid-stride launch of cast_element, the reference's
// conversion, on the caller's stream; a same-type cast is a device copy.
// Synchronous.
#include <type_traits>

#include "kernels/cast.hpp"
#include "kernels/cuda/launch.cuh"

namespace shardopt::kernels::cuda {

namespace {

// Each thread reads its element before it writes it, so src == dst
// (same-size types) converts in place.
template <class Dst, class Src>
__global__ void cast_kernel(const Src* src, Dst* dst, std::size_t n) {
  const std::size_t stride = static_cast<std::size_t>(blockDim.x) * gridDim.x;
  for (std::size_t i = blockIdx.x * static_cast<std::size_t>(blockDim.x) + threadIdx.x; i < n;
       i += stride)
    dst[i] = cast_element<Dst>(src[i]);
}

}  // namespace

void cast(const void* src, DType src_type, void* dst, DType dst_type, std::size_t n, void* stream) {
  const auto s = static_cast<cudaStream_t>(stream);
  const char* kernel = "cast";
  kernels::detail::with_cast_types(src, src_type, dst, dst_type, [&](const auto* from, auto* to) {
    using Src = std::remove_cvref_t<decltype(*from)>;
    using Dst = std::remove_cvref_t<decltype(*to)>;
    if (n == 0) return;
    if constexpr (std::is_same_v<Src, Dst>) {
      if (static_cast<const void*>(from) != static_cast<const void*>(to))
        detail::check(cudaMemcpyAsync(to, from, n * sizeof(Dst), cudaMemcpyDeviceToDevice, s),
                      kernel, "copying");
    } else {
      cast_kernel<<<detail::grid_for(n, kernel), detail::kThreads, 0, s>>>(from, to, n);
      detail::check(cudaGetLastError(), kernel, "launching");
    }
  });
  detail::check(cudaStreamSynchronize(s), kernel, "waiting for the cast");
}

}  // namespace shardopt::kernels::cuda
