// shardopt: the CUDA device runtime (lib/common/device_runtime.hpp), a thin
// layer over the CUDA runtime API. In a build without CUDA there is none.
#include "build_config.hpp"
#include "common/device_runtime.hpp"

#if SHARDOPT_HAVE_CUDA
#include <cuda_runtime_api.h>

#include <string>

#include "common/check.hpp"
#include "common/cuda_check.hpp"
#include "common/log.hpp"

namespace shardopt::detail {

// lib/common/wait_flag.cu: a one-thread kernel on s that spins until
// *flag >= value (flag: the device's view of mapped pinned memory).
void launch_wait_flag(const std::uint32_t* flag, std::uint32_t value, cudaStream_t s);
// lib/common/wait_flag.cu: the division of avg, n elements of t by divisor,
// enqueued on s.
void launch_divide(void* buf, std::size_t n, DType t, int divisor, cudaStream_t s);

#if SHARDOPT_HAVE_NCCL
// lib/common/nccl_collectives.cpp: NCCL over `comm`, on the current device.
std::unique_ptr<DeviceCollectives> make_nccl_collectives(MPI_Comm comm);
#endif

namespace {

cudaStream_t as_stream(StreamHandle s) { return static_cast<cudaStream_t>(s); }
cudaEvent_t as_event(EventHandle e) { return static_cast<cudaEvent_t>(e); }

[[noreturn]] void out_of_memory(const char* kind, std::size_t bytes, const char* what) {
  throw_error(ErrorCode::out_of_memory,
              std::string("cannot allocate ") + std::to_string(bytes) + " bytes of " + kind +
                  " for " + what,
              "free device memory (another process may hold it: nvidia-smi), use a higher ZeRO "
              "stage or more ranks, or a smaller bucket_mb",
              __FILE__, __LINE__);
}

class CudaRuntime final : public DeviceRuntime {
 public:
  const char* name() const noexcept override { return "CUDA"; }
  int device_count() const noexcept override { return cuda_device_count(); }

  MemoryLocation locate(const void* p) const noexcept override {
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
  }

  int current_device() const override {
    int d = 0;
    SHARDOPT_CHECK_CUDA(cudaGetDevice(&d), "the current device");
    return d;
  }
  void set_current_device(int d) override {
    SHARDOPT_CHECK_CUDA(cudaSetDevice(d), "choosing the current device");
  }

  void* allocate(std::size_t bytes, const char* what) override {
    void* p = nullptr;
    if (bytes == 0) return nullptr;
    if (cudaMalloc(&p, bytes) != cudaSuccess) {
      cudaGetLastError();
      out_of_memory("device memory", bytes, what);
    }
    return p;
  }
  void release(void* p) noexcept override {
    if (p != nullptr) cudaFree(p);
  }
  void* allocate_pinned(std::size_t bytes, const char* what) override {
    void* p = nullptr;
    if (bytes == 0) return nullptr;
    if (cudaHostAlloc(&p, bytes, cudaHostAllocPortable) != cudaSuccess) {
      cudaGetLastError();
      out_of_memory("pinned host memory", bytes, what);
    }
    return p;
  }
  void release_pinned(void* p) noexcept override {
    if (p != nullptr) cudaFreeHost(p);
  }

  StreamHandle create_stream() override {
    cudaStream_t s = nullptr;
    SHARDOPT_CHECK_CUDA(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking), "a stream");
    return s;
  }
  void destroy_stream(StreamHandle s) noexcept override {
    if (s != nullptr) cudaStreamDestroy(as_stream(s));
  }
  int stream_device(StreamHandle s) const override {
    if (s == nullptr) return current_device();
    int d = 0;
    SHARDOPT_CHECK_CUDA(cudaStreamGetDevice(as_stream(s), &d), "the stream's device");
    return d;
  }
  void synchronize(StreamHandle s) override {
    SHARDOPT_CHECK_CUDA(cudaStreamSynchronize(as_stream(s)), "waiting for a stream");
  }

  EventHandle create_event() override {
    cudaEvent_t e = nullptr;
    SHARDOPT_CHECK_CUDA(cudaEventCreateWithFlags(&e, cudaEventDisableTiming), "an event");
    return e;
  }
  void destroy_event(EventHandle e) noexcept override {
    if (e != nullptr) cudaEventDestroy(as_event(e));
  }
  void record(EventHandle e, StreamHandle s) override {
    SHARDOPT_CHECK_CUDA(cudaEventRecord(as_event(e), as_stream(s)), "recording an event");
  }
  void wait_event(StreamHandle s, EventHandle e) override {
    SHARDOPT_CHECK_CUDA(cudaStreamWaitEvent(as_stream(s), as_event(e), 0),
                        "a stream waiting on an event");
  }
  bool query(EventHandle e) override {
    const cudaError_t rc = cudaEventQuery(as_event(e));
    if (rc == cudaErrorNotReady) return false;
    SHARDOPT_CHECK_CUDA(rc, "querying an event");
    return true;
  }
  void synchronize_event(EventHandle e) override {
    SHARDOPT_CHECK_CUDA(cudaEventSynchronize(as_event(e)), "waiting for an event");
  }

  void copy(void* dst, const void* src, std::size_t bytes, StreamHandle s) override {
    if (bytes == 0) return;
    SHARDOPT_CHECK_CUDA(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDefault, as_stream(s)),
                        "a copy");
  }
  void zero(void* dst, std::size_t bytes, StreamHandle s) override {
    if (bytes == 0) return;
    SHARDOPT_CHECK_CUDA(cudaMemsetAsync(dst, 0, bytes, as_stream(s)), "a fill");
  }

  std::uint32_t* allocate_flags(std::size_t count) override {
    void* p = nullptr;
    if (cudaHostAlloc(&p, count * sizeof(std::uint32_t),
                      cudaHostAllocMapped | cudaHostAllocPortable) != cudaSuccess) {
      cudaGetLastError();
      out_of_memory("mapped pinned host memory", count * sizeof(std::uint32_t), "host flags");
    }
    auto* flags = static_cast<std::uint32_t*>(p);
    for (std::size_t k = 0; k < count; ++k) flags[k] = 0;
    return flags;
  }
  void release_flags(std::uint32_t* flags) noexcept override {
    if (flags != nullptr) cudaFreeHost(flags);
  }
  void wait_flag(StreamHandle s, const std::uint32_t* flag, std::uint32_t value) override {
    void* dev = nullptr;
    SHARDOPT_CHECK_CUDA(cudaHostGetDevicePointer(&dev, const_cast<std::uint32_t*>(flag), 0),
                        "the device's address of a host flag");
    launch_wait_flag(static_cast<const std::uint32_t*>(dev), value, as_stream(s));
  }
  void divide(void* buf, std::size_t count, DType t, int divisor, StreamHandle s) override {
    launch_divide(buf, count, t, divisor, as_stream(s));
  }
  void set_flag(std::uint32_t* flag, std::uint32_t value) noexcept override {
    __atomic_store_n(flag, value, __ATOMIC_RELEASE);
  }

#if SHARDOPT_HAVE_NCCL
  bool has_collectives() const noexcept override { return true; }
  // Never throws (the ranks compare identities in a collective right
  // after): a device that cannot be named is "" (unknown).
  std::string device_identity() const override {
    int device = 0;
    char bus[32] = {};
    if (cudaGetDevice(&device) != cudaSuccess ||
        cudaDeviceGetPCIBusId(bus, sizeof bus, device) != cudaSuccess) {
      cudaGetLastError();
      return {};
    }
    return host_name() + " GPU " + bus;
  }
  std::unique_ptr<DeviceCollectives> collectives(MPI_Comm comm, std::size_t) override {
    return make_nccl_collectives(comm);  // NCCL takes any count
  }
#endif
};

}  // namespace

DeviceRuntime* cuda_device_runtime() noexcept {
  static CudaRuntime runtime;
  return &runtime;
}

}  // namespace shardopt::detail

#else

namespace shardopt::detail {
DeviceRuntime* cuda_device_runtime() noexcept { return nullptr; }
}  // namespace shardopt::detail

#endif
