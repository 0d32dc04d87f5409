// shardopt internal: the device runtime, the one seam between shardopt's
// device orchestration (the staged backend, the engine's device path) and
// the device that runs it. Two implementations:
//   - CUDA (lib/device/cuda_runtime.cpp, wait_flag.cu), used when the build
//     has CUDA and the process sees a device;
//   - the simulated device (tests/simdevice/), a device with CUDA's
//     semantics on the CPU that only test programs link: memory the host
//     cannot touch, streams run by worker threads, events. A program linked
//     with it runs every device path of shardopt without a GPU.
// Everything above this interface is the same code for both.
//
// Streams and events are opaque handles (cudaStream_t, cudaEvent_t for
// CUDA); a null stream is the device's default stream. Every operation that
// takes a stream is enqueued on it and returns without waiting, like its
// CUDA counterpart; errors of the enqueue throw Error(cuda).
#pragma once

#include <mpi.h>

#include <cstddef>
#include <cstdint>
#include <exception>
#include <functional>
#include <memory>
#include <string>
#include <type_traits>
#include <utility>

#include "build_config.hpp"
#include "common/check.hpp"
#include "device/device.hpp"
#include "shardopt/types.hpp"

namespace shardopt::detail {

using StreamHandle = void*;
using EventHandle = void*;
// On an emulated device: a device address -> the address its kernels use.
using Translate = std::function<void*(const void*)>;

// Collectives the device runs itself, in stream order (NCCL's shape): each
// call is enqueued on the stream like a kernel and returns at once; the
// data moves when the stream reaches it, and later work on the stream sees
// the result. Arguments arrive checked (lib/comm/native/): buffers of this
// rank's device, the stream of that device, every rank calling the same
// operations in the same order.
class DeviceCollectives {
 public:
  virtual ~DeviceCollectives() = default;
  // "nccl", "nccl (simulated)".
  virtual const char* name() const noexcept = 0;
  // recv == send allowed.
  virtual void allreduce(const void* send, void* recv, std::size_t count, DType dtype, ReduceOp op,
                         StreamHandle s) = 0;
  // send: size() blocks of count; recv: count, separate or send + rank*count.
  virtual void reduce_scatter(const void* send, void* recv, std::size_t count, DType dtype,
                              ReduceOp op, StreamHandle s) = 0;
  // recv: size() blocks of count; send separate or recv + rank*count.
  virtual void allgather(const void* send, void* recv, std::size_t count, DType dtype,
                         StreamHandle s) = 0;
  virtual void broadcast(void* buf, std::size_t count, DType dtype, int root, StreamHandle s) = 0;
  // Throws the first failure of an enqueued collective (they fail
  // asynchronously, as NCCL's do), naming `op`, the call that asks.
  virtual void check(const char* op) = 0;
  // Collective: completes what was enqueued and releases the communicator.
  // The destructor releases only what is local.
  virtual void free() noexcept = 0;
};

class DeviceRuntime {
 public:
  virtual ~DeviceRuntime() = default;
  // "CUDA", "simulated device".
  virtual const char* name() const noexcept = 0;
  virtual int device_count() const noexcept = 0;
  // Where p points: device (or managed) memory of this runtime, else host.
  virtual MemoryLocation locate(const void* p) const noexcept = 0;
  // The device the calling thread works on, and its choice (d from 0 to
  // device_count() - 1, checked by the caller).
  virtual int current_device() const = 0;
  virtual void set_current_device(int d) = 0;

  // Device memory of the current device (not initialized), and pinned host
  // memory. Throw Error(out_of_memory) naming `what` when there is none.
  virtual void* allocate(std::size_t bytes, const char* what) = 0;
  virtual void release(void* p) noexcept = 0;
  virtual void* allocate_pinned(std::size_t bytes, const char* what) = 0;
  virtual void release_pinned(void* p) noexcept = 0;

  // A stream that does not synchronize with the default stream.
  virtual StreamHandle create_stream() = 0;
  virtual void destroy_stream(StreamHandle s) noexcept = 0;
  // The device a stream belongs to (the current one for the null stream).
  virtual int stream_device(StreamHandle s) const = 0;
  // Host waits until everything enqueued on s so far has run.
  virtual void synchronize(StreamHandle s) = 0;

  virtual EventHandle create_event() = 0;
  virtual void destroy_event(EventHandle e) noexcept = 0;
  // e completes when the work enqueued on s so far has run.
  virtual void record(EventHandle e, StreamHandle s) = 0;
  // s waits (the host does not) for e's latest record.
  virtual void wait_event(StreamHandle s, EventHandle e) = 0;
  // Whether e's latest record has completed; host waits until it has.
  virtual bool query(EventHandle e) = 0;
  virtual void synchronize_event(EventHandle e) = 0;

  // Copies between any two of device memory, pinned and pageable host
  // memory, in stream order.
  virtual void copy(void* dst, const void* src, std::size_t bytes, StreamHandle s) = 0;
  virtual void zero(void* dst, std::size_t bytes, StreamHandle s) = 0;

  // Host flags the device waits on: a word of pinned memory, mapped for the
  // device, that a host thread raises (set_flag) and a stream waits on
  // (wait_flag) without a host thread blocking on the stream's behalf.
  virtual std::uint32_t* allocate_flags(std::size_t count) = 0;
  virtual void release_flags(std::uint32_t* flags) noexcept = 0;
  // The stream waits until *flag >= value (unsigned, wrapping counters are
  // the caller's concern).
  virtual void wait_flag(StreamHandle s, const std::uint32_t* flag, std::uint32_t value) = 0;
  // From any host thread: *flag = value, visible to waiting streams.
  virtual void set_flag(std::uint32_t* flag, std::uint32_t value) noexcept = 0;

  // The division of avg after a sum: each of count elements of buf (f32,
  // f64, bf16 or f16, device memory) divided by divisor, bitwise as the
  // host transport divides, enqueued on s.
  virtual void divide(void* buf, std::size_t count, DType t, int divisor, StreamHandle s) = 0;

  // The device's own collectives over `comm` (collective over comm; null
  // where the device has none, on every rank alike: ask has_collectives()
  // and agree first). max_chunk: the largest count one call of the
  // transport underneath may take.
  virtual bool has_collectives() const noexcept { return false; }
  // What collectives() makes, as a Communicator names its transport:
  // "nccl", "nccl (simulated)".
  virtual const char* collectives_name() const noexcept { return "nccl"; }
  // For collectives that take one device per rank (NCCL): what names the
  // current device across the job (host and PCI bus id), so that ranks
  // sharing one can be found before they are given it; "" when that does
  // not matter (the simulated device's collectives) or is not known. Never
  // throws.
  virtual std::string device_identity() const { return {}; }
  virtual std::unique_ptr<DeviceCollectives> collectives(MPI_Comm comm, std::size_t max_chunk);

  // The address MPI is given for device memory p when it moves device
  // buffers itself (a CUDA-aware MPI, DeviceComm::mpi): p on CUDA; on an
  // emulated device the host memory behind p, which stands in for a
  // CUDA-aware MPI's own access to the device.
  virtual void* mpi_view(const void* p) const noexcept { return const_cast<void*>(p); }

  // Whether kernels run as host code on the streams (the simulated device)
  // rather than as CUDA kernels.
  virtual bool emulated() const noexcept { return false; }
  // Enqueues host code f on s, in stream order, f getting the translation
  // of device addresses. An emulated device runs its kernels so; CUDA runs
  // f as a host function (cudaLaunchHostFunc) with the identity for a
  // translation: there f may wait or touch host memory, never device
  // memory, and calls no CUDA. f must not throw.
  virtual void emulate(StreamHandle s, std::function<void(const Translate&)> f) = 0;
};

// The process's device runtime: the simulated device when the program links
// it, else CUDA when the build has it and a device is visible, else null
// (no device: every buffer is host memory).
DeviceRuntime* device_runtime() noexcept;

// Makes `runtime` the process's device runtime (the simulated device does
// this from a static initializer). Must be called before any shardopt
// object exists; null restores the default.
void install_device_runtime(DeviceRuntime* runtime) noexcept;

// The CUDA runtime, or null in a build without CUDA (cuda_runtime.cpp).
DeviceRuntime* cuda_device_runtime() noexcept;

// p as a kernel of an emulated device reaches it.
template <class T>
T* translated(T* p, const Translate& tr) {
  return static_cast<T*>(tr(p));
}

// A kernel's buffers struct (one with each_buffer(f), kernels/) as a kernel
// of an emulated device reaches them.
template <class B>
B translated_buffers(B b, const Translate& tr) {
  b.each_buffer([&](auto& p, std::size_t, auto) {
    if (p != nullptr) p = translated(p, tr);
  });
  return b;
}

// A device that is neither emulated nor CUDA: a build without CUDA given
// device buffers. NotCompiled, naming `what`.
[[noreturn]] inline void no_cuda_build(const char* what) {
  throw_error(ErrorCode::not_compiled,
              std::string(what) +
                  ": the buffers are in CUDA memory but this shardopt was built without CUDA",
              "rebuild shardopt with -Dcuda=enabled on a machine with the CUDA toolkit", __FILE__,
              __LINE__);
}

// Enqueues one kernel on device buffers, in stream order, without waiting:
// cuda() on a CUDA device, emulated(translate) as host code on an emulated
// one (which must not throw).
template <class Cuda, class Emulated>
void launch_kernel([[maybe_unused]] const char* what, StreamHandle stream,
                   [[maybe_unused]] Cuda&& cuda, Emulated&& emulated) {
  DeviceRuntime* rt = device_runtime();
  if (rt != nullptr && rt->emulated()) {
    rt->emulate(stream, std::forward<Emulated>(emulated));
    return;
  }
#if SHARDOPT_HAVE_CUDA
  cuda();
#else
  no_cuda_build(what);
#endif
}

// Runs one kernel on device buffers, in stream order, the host waiting for
// its result: cuda() on a CUDA device (the synchronous kernels of
// kernels/cuda/), emulated(translate) as host code on an emulated one. What
// emulated() throws is thrown here.
template <class Cuda, class Emulated>
auto device_kernel(const char* what, StreamHandle stream, Cuda&& cuda, Emulated&& emulated)
    -> decltype(cuda()) {
  using R = decltype(cuda());
  DeviceRuntime* rt = device_runtime();
  if (rt != nullptr && rt->emulated()) {
    std::exception_ptr error;
    std::conditional_t<std::is_void_v<R>, int, R> result{};
    launch_kernel(what, stream, cuda, [&](const Translate& tr) {
      try {
        if constexpr (std::is_void_v<R>)
          emulated(tr);
        else
          result = emulated(tr);
      } catch (...) {
        error = std::current_exception();
      }
    });
    rt->synchronize(stream);
    if (error) std::rethrow_exception(error);
    if constexpr (!std::is_void_v<R>)
      return result;
    else
      return;
  }
#if SHARDOPT_HAVE_CUDA
  return cuda();
#else
  no_cuda_build(what);
#endif
}

}  // namespace shardopt::detail
