// shardopt: the kernel behind CudaRuntime::wait_flag (cuda_runtime.cpp):
// the stream waits on a host flag without a host thread blocking for it.
#include <cuda_runtime_api.h>

#include <cstdint>

#include "common/cuda_check.hpp"

namespace shardopt::detail {

namespace {
__global__ void wait_flag_kernel(const volatile std::uint32_t* flag, std::uint32_t value) {
  while (*flag < value) __nanosleep(2000);
}
}  // namespace

void launch_wait_flag(const std::uint32_t* flag, std::uint32_t value, cudaStream_t s) {
  wait_flag_kernel<<<1, 1, 0, s>>>(flag, value);
  SHARDOPT_CHECK_CUDA(cudaGetLastError(), "launching the wait for a host flag");
}

}  // namespace shardopt::detail
