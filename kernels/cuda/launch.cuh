// shardopt CUDA kernels (internal): the launch of an element-wise optimizer
// kernel over one contiguous range, shared by the optimizers' CUDA kernels
// and the finiteness check; the grid size and the error check also serve the
// cast. Included by .cu files only.
//
// One launch per range, grid-stride, 256 threads a block and at most 8
// blocks per SM, with a non-finite-gradient flag. When every buffer of the
// range can be read 4 elements at a time with one aligned vector access (16
// bytes for fp32, 8 for 16-bit; kernels/vector_step.hpp) each thread handles 4
// consecutive elements per iteration: it loads each buffer's 4 elements with
// one vector load into registers, runs Loop::apply on a view of its buffers
// that points at those registers, and stores each written buffer with one
// vector store. Elements before the first aligned group and after the last
// (at most 3 each) take the scalar step, and a range that cannot be aligned
// runs the scalar kernel. The arithmetic per element is Loop::apply's either
// way, so every path gives the reference kernel's bits. Lists of tensors:
// kernels/cuda/multi_tensor.cuh.
#pragma once

#include <cuda_runtime.h>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <stdexcept>
#include <string>
#include <type_traits>

#include "kernels/element.hpp"
#include "kernels/vector_step.hpp"

namespace shardopt::kernels::cuda::detail {

inline constexpr int kThreads = 256;

inline void check(cudaError_t rc, const char* kernel, const char* what) {
  if (rc != cudaSuccess) {
    cudaGetLastError();
    throw std::runtime_error(std::string("CUDA ") + kernel + " kernel: " + what + ": " +
                             cudaGetErrorString(rc));
  }
}

// Grid-stride loop over [0, n) calling Loop::apply(b, s, i), which updates
// element i and returns whether its gradient was finite.
template <class Loop, class B, class S>
__global__ void __launch_bounds__(kThreads)
    elementwise_kernel(B b, S s, std::size_t n, unsigned* any_nonfinite) {
  const std::size_t threads = static_cast<std::size_t>(blockDim.x) * gridDim.x;
  const std::size_t t = blockIdx.x * static_cast<std::size_t>(blockDim.x) + threadIdx.x;
  const bool bad = !kernels::detail::scalar_share<Loop>(b, s, 0, n, t, threads);
  if (__syncthreads_or(bad) && threadIdx.x == 0) atomicOr(any_nonfinite, 1u);
}

// The vector path over [0, n), grid-stride: groups of 4 elements from
// `head` on (kernels/vector_step.hpp: vector_share). The bounds promise one
// block per SM at least, not more: ptxas then keeps every value in registers
// (up to about 85 a thread, 3 blocks per SM) rather than spill a few bytes
// to reach a higher occupancy, which these loads do not need.
template <class Loop, class B, class S>
__global__ void __launch_bounds__(kThreads, 1)
    vector_kernel(B b, S s, std::size_t n, int head, unsigned* any_nonfinite) {
  const std::size_t threads = static_cast<std::size_t>(blockDim.x) * gridDim.x;
  const std::size_t t = blockIdx.x * static_cast<std::size_t>(blockDim.x) + threadIdx.x;
  const bool bad = !kernels::detail::vector_share<Loop>(b, s, 0, n, head, t, threads);
  if (__syncthreads_or(bad) && threadIdx.x == 0) atomicOr(any_nonfinite, 1u);
}

// The number of blocks for `work` items of one thread each: enough for all,
// at most 8 per SM (the grid strides over the rest).
inline int grid_for(std::size_t work, const char* kernel) {
  int device = 0, sms = 0;
  check(cudaGetDevice(&device), kernel, "cudaGetDevice");
  check(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device), kernel,
        "querying the SM count");
  const std::size_t needed = (work + kThreads - 1) / kThreads;
  return static_cast<int>(std::max<std::size_t>(
      1, std::min<std::size_t>(needed, static_cast<std::size_t>(8) * static_cast<unsigned>(sms))));
}

// A zeroed non-finite flag in device memory, ordered on `stream`, and its
// read-back; freed by read().
class NonFiniteFlag {
 public:
  NonFiniteFlag(const char* kernel, cudaStream_t stream) : kernel_(kernel), stream_(stream) {
    check(cudaMallocAsync(reinterpret_cast<void**>(&flag_), sizeof(unsigned), stream_), kernel_,
          "allocating the non-finite flag");
    check(cudaMemsetAsync(flag_, 0, sizeof(unsigned), stream_), kernel_,
          "clearing the non-finite flag");
  }
  NonFiniteFlag(const NonFiniteFlag&) = delete;
  NonFiniteFlag& operator=(const NonFiniteFlag&) = delete;
  ~NonFiniteFlag() {
    if (flag_ != nullptr) cudaFreeAsync(flag_, stream_);
  }
  unsigned* get() const { return flag_; }
  // Waits for the stream; true if no kernel raised the flag.
  bool read() {
    unsigned host_flag = 0;
    check(cudaMemcpyAsync(&host_flag, flag_, sizeof host_flag, cudaMemcpyDeviceToHost, stream_),
          kernel_, "reading the non-finite flag");
    check(cudaFreeAsync(flag_, stream_), kernel_, "freeing the non-finite flag");
    flag_ = nullptr;
    check(cudaStreamSynchronize(stream_), kernel_, "waiting for the step");
    return host_flag == 0;
  }

 private:
  const char* kernel_;
  cudaStream_t stream_;
  unsigned* flag_ = nullptr;
};

// count elements of T in device memory, ordered on `stream` (null for 0),
// freed on the stream when it goes.
template <class T>
class DeviceScratch {
 public:
  DeviceScratch(std::size_t count, const char* kernel, const char* what, cudaStream_t stream)
      : stream_(stream) {
    if (count > 0)
      check(cudaMallocAsync(reinterpret_cast<void**>(&ptr_), count * sizeof(T), stream_), kernel,
            what);
  }
  DeviceScratch(const DeviceScratch&) = delete;
  DeviceScratch& operator=(const DeviceScratch&) = delete;
  ~DeviceScratch() {
    if (ptr_ != nullptr) cudaFreeAsync(ptr_, stream_);
  }
  T* get() const { return ptr_; }

 private:
  cudaStream_t stream_;
  T* ptr_ = nullptr;
};

// Launches Loop over [0, n) on `stream` without waiting: the vector kernel
// when the buffers align (vector_head) and the range holds a group of 4,
// else the scalar kernel.
template <class Loop, class B, class S>
void launch(const char* kernel, const B& b, const S& s, std::size_t n, unsigned* flag,
            cudaStream_t stream) {
  if (n == 0) return;
  // Elements over plain pointers (the finiteness check) have no buffer list:
  // the scalar kernel.
  if constexpr (requires(B & x) { x.each_buffer([](auto&&...) {}); }) {
    const int head = kernels::detail::vector_head<Loop>(b, s);
    if (head >= 0 && n >= static_cast<std::size_t>(head) + 4) {
      const std::size_t groups = (n - static_cast<std::size_t>(head)) / 4;
      vector_kernel<Loop><<<grid_for(groups, kernel), kThreads, 0, stream>>>(b, s, n, head, flag);
      check(cudaGetLastError(), kernel, "launching");
      return;
    }
  }
  elementwise_kernel<Loop><<<grid_for(n, kernel), kThreads, 0, stream>>>(b, s, n, flag);
  check(cudaGetLastError(), kernel, "launching");
}

// Runs Loop over [0, n) on `stream` and waits for it; returns true if every
// gradient was finite. Throws std::runtime_error naming `kernel` on a CUDA error.
template <class Loop, class B, class S>
bool run(const char* kernel, const B& b, const S& s, std::size_t n, cudaStream_t stream) {
  NonFiniteFlag flag(kernel, stream);
  launch<Loop>(kernel, b, s, n, flag.get(), stream);
  return flag.read();
}

}  // namespace shardopt::kernels::cuda::detail
