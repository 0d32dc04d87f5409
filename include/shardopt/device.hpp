// shardopt: device memory through shardopt's own device runtime, for
// programs that do not include the CUDA headers (the benchmarks, and C or
// Fortran codes later). Buffers from cudaMalloc work everywhere these do.
#pragma once

#include <cstddef>

#include "shardopt/export.h"

namespace shardopt {

// The devices this process sees: 0 in a build without CUDA or on a machine
// without a GPU.
SHARDOPT_API int device_count() noexcept;
// The device runtime in use: "CUDA", or "none" without a device.
SHARDOPT_API const char* device_runtime_name() noexcept;
// Makes `device` (0 to device_count() - 1) the calling thread's current
// device, as cudaSetDevice does: where the buffers below are allocated and
// where shardopt's communicators and optimizers created afterwards work.
// With several ranks of a node sharing its devices, give each its own:
// set_device(local rank % device_count()). InvalidArgument for another
// number; DeviceError when the process has no device. Local.
SHARDOPT_API void set_device(int device);

// Memory of the calling thread's current device, not initialized. Throws
// Error(out_of_memory), or DeviceError when the process has no device.
// Local; move-only.
class SHARDOPT_API DeviceBuffer {
 public:
  DeviceBuffer() noexcept = default;
  explicit DeviceBuffer(std::size_t bytes);
  DeviceBuffer(DeviceBuffer&& other) noexcept;
  DeviceBuffer& operator=(DeviceBuffer&& other) noexcept;
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;
  ~DeviceBuffer();

  void* data() const noexcept { return data_; }
  std::size_t size() const noexcept { return bytes_; }

 private:
  void* data_ = nullptr;
  std::size_t bytes_ = 0;
};

// Pinned (page-locked) host memory, registered with the device runtime so
// that copies to and from the device run at full speed. Throws
// DeviceError when the process has no device. Local; move-only.
class SHARDOPT_API PinnedBuffer {
 public:
  PinnedBuffer() noexcept = default;
  explicit PinnedBuffer(std::size_t bytes);
  PinnedBuffer(PinnedBuffer&& other) noexcept;
  PinnedBuffer& operator=(PinnedBuffer&& other) noexcept;
  PinnedBuffer(const PinnedBuffer&) = delete;
  PinnedBuffer& operator=(const PinnedBuffer&) = delete;
  ~PinnedBuffer();

  void* data() const noexcept { return data_; }
  std::size_t size() const noexcept { return bytes_; }

 private:
  void* data_ = nullptr;
  std::size_t bytes_ = 0;
};

// Copies `bytes` between any two of host and device memory, on the
// device's default stream; complete on return.
SHARDOPT_API void device_copy(void* dst, const void* src, std::size_t bytes);

}  // namespace shardopt
