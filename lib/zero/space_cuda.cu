// shardopt: the ZeRO engine's element operations on a CUDA device
// (lib/zero/space.cpp), enqueued on the engine's stream without waiting.
#include <cuda_runtime_api.h>

#include <cstddef>

#include "device/cuda_check.hpp"
#include "kernels/cast.hpp"
#include "kernels/element.hpp"
#include "shardopt/types.hpp"

namespace shardopt::detail::cuda_space {

namespace {

constexpr int kThreads = 256;

unsigned blocks_for(std::size_t n) {
  const std::size_t b = (n + kThreads - 1) / kThreads;
  return static_cast<unsigned>(b < 4096 ? b : 4096);
}

__global__ void fill_kernel(float* dst, std::size_t n, float value) {
  for (std::size_t i = blockIdx.x * std::size_t(blockDim.x) + threadIdx.x; i < n;
       i += std::size_t(gridDim.x) * blockDim.x)
    dst[i] = value;
}

template <class S, class D>
__global__ void convert_kernel(const S* src, D* dst, std::size_t n, float mul) {
  for (std::size_t i = blockIdx.x * std::size_t(blockDim.x) + threadIdx.x; i < n;
       i += std::size_t(gridDim.x) * blockDim.x)
    dst[i] = kernels::cast_element<D>(to_float(src[i]) * mul);
}

template <class S>
__global__ void accumulate_kernel(const S* src, float* acc, std::size_t n) {
  for (std::size_t i = blockIdx.x * std::size_t(blockDim.x) + threadIdx.x; i < n;
       i += std::size_t(gridDim.x) * blockDim.x)
    acc[i] += to_float(src[i]);
}

cudaStream_t as_stream(void* s) { return static_cast<cudaStream_t>(s); }

}  // namespace

void fill(float* dst, std::size_t n, float value, void* stream) {
  if (n == 0) return;
  fill_kernel<<<blocks_for(n), kThreads, 0, as_stream(stream)>>>(dst, n, value);
  SHARDOPT_CHECK_CUDA(cudaGetLastError(), "a fill on the device");
}

void convert(const void* src, DType st, void* dst, DType dt, std::size_t n, float mul,
             void* stream) {
  if (n == 0) return;
  kernels::with_float_type(src, st, [&](const auto* s) {
    kernels::with_float_type(dst, dt, [&](auto* d) {
      convert_kernel<<<blocks_for(n), kThreads, 0, as_stream(stream)>>>(s, d, n, mul);
    });
  });
  SHARDOPT_CHECK_CUDA(cudaGetLastError(), "a conversion on the device");
}

void accumulate(const void* src, DType st, float* acc, std::size_t n, void* stream) {
  if (n == 0) return;
  kernels::with_float_type(src, st, [&](const auto* s) {
    accumulate_kernel<<<blocks_for(n), kThreads, 0, as_stream(stream)>>>(s, acc, n);
  });
  SHARDOPT_CHECK_CUDA(cudaGetLastError(), "an accumulation on the device");
}

}  // namespace shardopt::detail::cuda_space
