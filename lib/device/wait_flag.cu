// shardopt: the kernels of CudaRuntime (cuda_runtime.cpp): wait_flag, the
// stream waiting on a host flag without a host thread blocking for it; and
// divide, the division of avg after a sum on device buffers.
#include <cuda_runtime_api.h>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <type_traits>

#include "device/cuda_check.hpp"
#include "shardopt/half.hpp"
#include "shardopt/types.hpp"

namespace shardopt::detail {

namespace {
__global__ void wait_flag_kernel(const volatile std::uint32_t* flag, std::uint32_t value) {
  while (*flag < value) __nanosleep(2000);
}

// Each element divided in Math (double for f64, float for the others) and
// rounded back to T as the host's division (lib/comm/mpi/mpi_types.cpp)
// rounds: bitwise its result.
template <class T, class Math>
__global__ void divide_kernel(T* buf, std::size_t n, Math divisor) {
  const std::size_t stride = static_cast<std::size_t>(blockDim.x) * gridDim.x;
  for (std::size_t i = blockIdx.x * static_cast<std::size_t>(blockDim.x) + threadIdx.x; i < n;
       i += stride) {
    if constexpr (std::is_same_v<T, Math>) {
      buf[i] = buf[i] / divisor;
    } else if constexpr (std::is_same_v<T, bfloat16>) {
      buf[i] = bf16_from_float(to_float(buf[i]) / divisor);
    } else {
      buf[i] = f16_from_float(to_float(buf[i]) / divisor);
    }
  }
}

template <class T, class Math>
void launch_divide(void* buf, std::size_t n, int divisor, cudaStream_t s) {
  constexpr int kThreads = 256;
  const std::size_t blocks = std::min<std::size_t>((n + kThreads - 1) / kThreads, 4096);
  divide_kernel<<<static_cast<unsigned>(blocks), kThreads, 0, s>>>(static_cast<T*>(buf), n,
                                                                   static_cast<Math>(divisor));
  SHARDOPT_CHECK_CUDA(cudaGetLastError(), "launching the division of avg");
}
}  // namespace

void launch_divide(void* buf, std::size_t n, DType t, int divisor, cudaStream_t s) {
  if (n == 0) return;
  switch (t) {
    case DType::f64:
      launch_divide<double, double>(buf, n, divisor, s);
      break;
    case DType::f32:
      launch_divide<float, float>(buf, n, divisor, s);
      break;
    case DType::bf16:
      launch_divide<bfloat16, float>(buf, n, divisor, s);
      break;
    case DType::f16:
      launch_divide<float16, float>(buf, n, divisor, s);
      break;
    default:
      break;  // integers never reach here: avg of integers is rejected up front
  }
}

void launch_wait_flag(const std::uint32_t* flag, std::uint32_t value, cudaStream_t s) {
  wait_flag_kernel<<<1, 1, 0, s>>>(flag, value);
  SHARDOPT_CHECK_CUDA(cudaGetLastError(), "launching the wait for a host flag");
}

}  // namespace shardopt::detail
