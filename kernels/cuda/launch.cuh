// shardopt CUDA kernels (internal): the launch of an element-wise optimizer
// kernel over one contiguous range (grid-stride, 256 threads a block, at
// most 8 blocks per SM) with its non-finite-gradient flag, shared by the
// optimizers' CUDA kernels and the finiteness check; the grid size and the
// error check also serve the cast. Included by .cu files only.
#pragma once

#include <cuda_runtime.h>

#include <algorithm>
#include <cstddef>
#include <stdexcept>
#include <string>

namespace shardopt::kernels::cuda::detail {

inline void check(cudaError_t rc, const char* kernel, const char* what) {
  if (rc != cudaSuccess) {
    cudaGetLastError();
    throw std::runtime_error(std::string("CUDA ") + kernel + " kernel: " + what + ": " +
                             cudaGetErrorString(rc));
  }
}

// The blocks of a grid-stride launch over n > 0 elements with `threads` a
// block: enough for one element a thread, at most 8 blocks per SM.
inline int grid_blocks(std::size_t n, int threads, const char* kernel) {
  int device = 0, sms = 0;
  check(cudaGetDevice(&device), kernel, "cudaGetDevice");
  check(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device), kernel,
        "querying the SM count");
  const std::size_t needed = (n + threads - 1) / threads;
  return static_cast<int>(std::min<std::size_t>(needed, std::size_t{8} * sms));
}

// Grid-stride loop over [0, n) calling Elem::apply(b, s, i), which updates
// element i and returns whether its gradient was finite.
template <class Elem, class B, class S>
__global__ void elementwise_kernel(B b, S s, std::size_t n, unsigned* any_nonfinite) {
  bool bad = false;
  const std::size_t stride = static_cast<std::size_t>(blockDim.x) * gridDim.x;
  for (std::size_t i = blockIdx.x * static_cast<std::size_t>(blockDim.x) + threadIdx.x; i < n;
       i += stride)
    bad |= !Elem::apply(b, s, i);
  if (__syncthreads_or(bad) && threadIdx.x == 0) atomicOr(any_nonfinite, 1u);
}

// Runs Elem over [0, n) on `stream` and waits for it; returns true if every
// gradient was finite. Throws std::runtime_error naming `kernel` on a CUDA error.
template <class Elem, class B, class S>
bool run(const char* kernel, const B& b, const S& s, std::size_t n, cudaStream_t stream) {
  unsigned* flag = nullptr;
  check(cudaMallocAsync(reinterpret_cast<void**>(&flag), sizeof(unsigned), stream), kernel,
        "allocating the non-finite flag");
  check(cudaMemsetAsync(flag, 0, sizeof(unsigned), stream), kernel, "clearing the non-finite flag");
  if (n > 0) {
    const int threads = 256;
    const int blocks = grid_blocks(n, threads, kernel);
    elementwise_kernel<Elem><<<blocks, threads, 0, stream>>>(b, s, n, flag);
    check(cudaGetLastError(), kernel, "launching");
  }
  unsigned host_flag = 0;
  check(cudaMemcpyAsync(&host_flag, flag, sizeof host_flag, cudaMemcpyDeviceToHost, stream), kernel,
        "reading the non-finite flag");
  check(cudaFreeAsync(flag, stream), kernel, "freeing the non-finite flag");
  check(cudaStreamSynchronize(stream), kernel, "waiting for the step");
  return host_flag == 0;
}

}  // namespace shardopt::kernels::cuda::detail
