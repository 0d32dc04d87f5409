// shardopt internal: checks of CUDA runtime and NCCL return codes. Include
// only in code compiled when SHARDOPT_HAVE_CUDA (and SHARDOPT_HAVE_NCCL).
#pragma once

#include <string>

#include "build_config.hpp"
#include "common/check.hpp"

#if SHARDOPT_HAVE_CUDA
#include <cuda_runtime_api.h>

namespace shardopt::detail {
[[noreturn]] inline void throw_cuda_error(cudaError_t rc, const char* call, const std::string& what,
                                          const char* file, int line) {
  throw_error(
      ErrorCode::cuda,
      what + ": " + call + " failed: " + cudaGetErrorName(rc) + " (" + cudaGetErrorString(rc) + ")",
      "check that the buffers were allocated on the device the communicator uses and "
      "that the GPU is healthy (nvidia-smi); rerun with SHARDOPT_DEBUG=INFO",
      file, line);
}
}  // namespace shardopt::detail

#define SHARDOPT_CHECK_CUDA(call, what)                                                           \
  do {                                                                                            \
    const cudaError_t shardopt_cuda_rc_ = (call);                                                 \
    if (shardopt_cuda_rc_ != cudaSuccess) {                                                       \
      cudaGetLastError(); /* clear a non-sticky error so later calls are not blamed */            \
      ::shardopt::detail::throw_cuda_error(shardopt_cuda_rc_, #call, (what), __FILE__, __LINE__); \
    }                                                                                             \
  } while (0)
#endif

#if SHARDOPT_HAVE_NCCL
#include <nccl.h>

namespace shardopt::detail {
[[noreturn]] inline void throw_nccl_error(ncclResult_t rc, const char* call,
                                          const std::string& what, const char* file, int line) {
  throw_error(ErrorCode::nccl,
              what + ": " + call + " failed: " + ncclGetErrorString(rc) + " (ncclResult_t " +
                  std::to_string(static_cast<int>(rc)) + ")",
              "rerun with NCCL_DEBUG=WARN (or INFO) for NCCL's own explanation, and check that "
              "every rank calls the same collectives with the same counts",
              file, line);
}
}  // namespace shardopt::detail

#define SHARDOPT_CHECK_NCCL(call, what)                                                           \
  do {                                                                                            \
    const ncclResult_t shardopt_nccl_rc_ = (call);                                                \
    if (shardopt_nccl_rc_ != ncclSuccess)                                                         \
      ::shardopt::detail::throw_nccl_error(shardopt_nccl_rc_, #call, (what), __FILE__, __LINE__); \
  } while (0)
#endif
