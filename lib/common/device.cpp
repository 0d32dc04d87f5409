#include "common/device.hpp"

#include "build_config.hpp"

#if SHARDOPT_HAVE_CUDA
#include <cuda_runtime_api.h>
#endif
#if SHARDOPT_HAVE_NCCL
#include <nccl.h>
#endif

namespace shardopt::detail {

int cuda_device_count() noexcept {
#if SHARDOPT_HAVE_CUDA
  static const int count = [] {
    int n = 0;
    if (cudaGetDeviceCount(&n) != cudaSuccess) {
      cudaGetLastError();  // clear the sticky "no driver / no device" error
      return 0;
    }
    return n;
  }();
  return count;
#else
  return 0;
#endif
}

MemoryLocation locate(const void* p) noexcept {
#if SHARDOPT_HAVE_CUDA
  if (p == nullptr || cuda_device_count() == 0) return {};
  cudaPointerAttributes attr{};
  if (cudaPointerGetAttributes(&attr, p) != cudaSuccess) {
    cudaGetLastError();
    return {};
  }
  switch (attr.type) {
    case cudaMemoryTypeDevice:
      return {MemoryKind::device, attr.device};
    case cudaMemoryTypeManaged:
      return {MemoryKind::managed, attr.device};
    default:
      return {};  // pageable or pinned host memory
  }
#else
  (void)p;
  return {};
#endif
}

const char* memory_kind_name(MemoryKind kind) noexcept {
  switch (kind) {
    case MemoryKind::host:
      return "host memory";
    case MemoryKind::device:
      return "CUDA device memory";
    case MemoryKind::managed:
      return "CUDA managed memory";
  }
  return "unknown memory";
}

std::string location_name(const MemoryLocation& where) {
  return std::string(memory_kind_name(where.kind)) +
         (where.device >= 0 ? " (device " + std::to_string(where.device) + ")" : "");
}

int cuda_runtime_version() noexcept {
#if SHARDOPT_HAVE_CUDA
  int v = 0;
  if (cudaRuntimeGetVersion(&v) != cudaSuccess) return 0;
  return v;
#else
  return 0;
#endif
}

int nccl_version() noexcept {
#if SHARDOPT_HAVE_NCCL
  int v = 0;
  if (ncclGetVersion(&v) != ncclSuccess) return 0;
  return v;
#else
  return 0;
#endif
}

}  // namespace shardopt::detail
