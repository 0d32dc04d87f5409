// shardopt: the CUDA device runtime (lib/device/device_runtime.hpp), a thin
// layer over the CUDA runtime API. In a build without CUDA there is none.
#include "build_config.hpp"
#include "device/device_runtime.hpp"

#if SHARDOPT_HAVE_CUDA
#include <cuda.h>  // the driver API's types only: its functions are asked of the runtime
#include <cuda_runtime_api.h>

#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <string>

#include "common/check.hpp"
#include "common/log.hpp"
#include "device/cuda_check.hpp"

namespace shardopt::detail {

// lib/device/wait_flag.cu: a one-thread kernel on s that spins until
// *flag >= value (flag: the device's view of mapped pinned memory).
void launch_wait_flag(const std::uint32_t* flag, std::uint32_t value, cudaStream_t s);
// lib/device/wait_flag.cu: the division of avg, n elements of t by divisor,
// enqueued on s.
void launch_divide(void* buf, std::size_t n, DType t, int divisor, cudaStream_t s);

#if SHARDOPT_HAVE_NCCL
// lib/device/nccl_collectives.cpp: NCCL over `comm`, on the current device.
std::unique_ptr<DeviceCollectives> make_nccl_collectives(MPI_Comm comm);
#endif

namespace {

cudaStream_t as_stream(StreamHandle s) { return static_cast<cudaStream_t>(s); }
cudaEvent_t as_event(EventHandle e) { return static_cast<cudaEvent_t>(e); }

// The driver's stream memory operation that makes a stream wait on a word
// of memory, asked of the runtime (cudaGetDriverEntryPointByVersion), so
// that shardopt links no libcuda: null where the driver has none.
using WaitValue32 = CUresult (*)(CUstream, CUdeviceptr, cuuint32_t, unsigned int);
WaitValue32 driver_wait_value32() {
  void* fn = nullptr;
  cudaDriverEntryPointQueryResult found = cudaDriverEntryPointSymbolNotFound;
  if (cudaGetDriverEntryPointByVersion("cuStreamWaitValue32", &fn, 12000, cudaEnableDefault,
                                       &found) != cudaSuccess ||
      found != cudaDriverEntryPointSuccess) {
    cudaGetLastError();
    return nullptr;
  }
  return reinterpret_cast<WaitValue32>(fn);
}

// How a stream waits on a host flag: the driver's stream memory operation
// (the stream itself waits; no kernel occupies the device), else a
// one-thread kernel that spins. A spinning kernel holds a stream slot, and
// under CUDA's lazy module loading the first launch of another kernel can
// wait for a context synchronization behind it.
enum class FlagWait { unknown, memory_op, kernel };

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
    if (flag_wait() == FlagWait::memory_op) {
      // CU_STREAM_WAIT_VALUE_GEQ compares (int32_t)(*flag - value) >= 0:
      // counters that wrap keep working.
      const CUresult rc =
          wait_value32_(static_cast<CUstream>(s), reinterpret_cast<CUdeviceptr>(dev), value,
                        CU_STREAM_WAIT_VALUE_GEQ);
      if (rc == CUDA_SUCCESS) return;
      if (rc != CUDA_ERROR_NOT_SUPPORTED)
        throw_error(ErrorCode::cuda,
                    "a stream waiting on a host flag (cuStreamWaitValue32): CUDA driver error " +
                        std::to_string(static_cast<int>(rc)),
                    "check the driver (nvidia-smi); SHARDOPT_DEBUG=INFO logs how streams wait",
                    __FILE__, __LINE__);
      flag_wait_ = FlagWait::kernel;
      SHARDOPT_LOG(warn,
                   "CUDA: the driver refuses stream memory operations; streams wait on "
                   "host flags with a spinning kernel instead");
    }
    launch_wait_flag(static_cast<const std::uint32_t*>(dev), value, as_stream(s));
  }

  // On CUDA the function runs on the host in stream order
  // (cudaLaunchHostFunc), its translation the identity: it may wait and
  // touch host memory, never device memory, and must not call CUDA.
  void emulate(StreamHandle s, std::function<void(const Translate&)> f) override {
    auto fn = std::make_unique<std::function<void(const Translate&)>>(std::move(f));
    SHARDOPT_CHECK_CUDA(cudaLaunchHostFunc(
                            as_stream(s),
                            [](void* p) {
                              std::unique_ptr<std::function<void(const Translate&)>> run(
                                  static_cast<std::function<void(const Translate&)>*>(p));
                              (*run)([](const void* q) { return const_cast<void*>(q); });
                            },
                            fn.get()),
                        "a host function on a stream");
    fn.release();  // the host function owns it now
  }
  void divide(void* buf, std::size_t count, DType t, int divisor, StreamHandle s) override {
    launch_divide(buf, count, t, divisor, as_stream(s));
  }
  void set_flag(std::uint32_t* flag, std::uint32_t value) noexcept override {
    __atomic_store_n(flag, value, __ATOMIC_RELEASE);
  }

  // Decided once per process, at the first wait.
  FlagWait flag_wait() {
    std::call_once(flag_wait_chosen_, [this] {
      wait_value32_ = driver_wait_value32();
      const FlagWait w = wait_value32_ != nullptr ? FlagWait::memory_op : FlagWait::kernel;
      flag_wait_ = w;
      SHARDOPT_LOG(info,
                   "CUDA: streams wait on host flags with "
                       << (w == FlagWait::memory_op ? "the driver's stream memory operations "
                                                      "(cuStreamWaitValue32)"
                                                    : "a spinning kernel (the driver offers no "
                                                      "cuStreamWaitValue32)"));
    });
    return flag_wait_.load();
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

 private:
  std::once_flag flag_wait_chosen_;
  std::atomic<FlagWait> flag_wait_{FlagWait::unknown};
  WaitValue32 wait_value32_ = nullptr;
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
