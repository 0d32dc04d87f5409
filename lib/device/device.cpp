#include "device/device.hpp"

#include "build_config.hpp"
#include "device/device_runtime.hpp"

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

namespace {
DeviceRuntime* installed_runtime = nullptr;
}  // namespace

void install_device_runtime(DeviceRuntime* runtime) noexcept { installed_runtime = runtime; }

std::unique_ptr<DeviceCollectives> DeviceRuntime::collectives(MPI_Comm, std::size_t) {
  return nullptr;
}

DeviceRuntime* device_runtime() noexcept {
  if (installed_runtime != nullptr) return installed_runtime;
  static DeviceRuntime* const cuda = cuda_device_count() > 0 ? cuda_device_runtime() : nullptr;
  return cuda;
}

MemoryLocation locate(const void* p) noexcept {
  if (p == nullptr) return {};
  const DeviceRuntime* rt = device_runtime();
  return rt == nullptr ? MemoryLocation{} : rt->locate(p);
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
