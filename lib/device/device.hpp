// shardopt internal: where a buffer lives (host or which CUDA device).
#pragma once

#include <string>

namespace shardopt::detail {

enum class MemoryKind { host, device, managed };

struct MemoryLocation {
  MemoryKind kind = MemoryKind::host;
  int device = -1;  // CUDA device ordinal for device and managed memory
};

// Number of CUDA devices this process sees; 0 in a build without CUDA or
// without a usable driver. Cached after the first call.
int cuda_device_count() noexcept;

// Where `p` points, as the process's device runtime (device_runtime.hpp)
// sees it. Host for null, for host memory, and always without a device.
MemoryLocation locate(const void* p) noexcept;

// "host memory", "CUDA device memory", "CUDA managed memory".
const char* memory_kind_name(MemoryKind kind) noexcept;

// The kind and device: "host memory", "CUDA device memory (device 1)".
std::string location_name(const MemoryLocation& where);

int cuda_runtime_version() noexcept;

// Whether the MPI library says it takes CUDA device buffers (Open MPI's
// MPIX_Query_cuda_support, MPICH's MPIX_GPU_query_support); false when it
// cannot say, or MPI is not running. Local.
bool mpi_library_cuda_aware() noexcept;
// Whether shardopt may give MPI device buffers: SHARDOPT_CUDA_AWARE_MPI's
// answer, or the library's when it says ask. Local.
bool mpi_takes_device_buffers();
int nccl_version() noexcept;

}  // namespace shardopt::detail
