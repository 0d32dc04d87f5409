// shardopt: the ZeRO engine's memory space (internal): where the parameters,
// the gradients and the engine's own buffers live (host memory, or one
// device per rank) and the operations on them, so that the engine's
// orchestration is written once for both. On the host every operation runs
// at the call; on a device it is enqueued on the engine's stream, in order,
// and the host waits only where an operation returns a host value (the
// norm, the finiteness check) or moves data to or from host memory
// (download, upload: checkpoints, check_sync, gather_state).
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <utility>

#include "common/watchdog.hpp"
#include "device/device.hpp"
#include "device/device_runtime.hpp"
#include "kernels/lamb.hpp"
#include "shardopt/memory.hpp"
#include "shardopt/types.hpp"

namespace shardopt::detail {

class Space;

// A buffer the engine owns, in its space: a HostBuffer (pre-touched, huge
// pages) on the host, device memory on a device. Move-only.
class SpaceBuffer {
 public:
  SpaceBuffer() noexcept = default;
  // A host buffer becomes a host space's buffer.
  explicit SpaceBuffer(HostBuffer&& h) noexcept
      : host_(std::move(h)), data_(host_.data()), bytes_(host_.size()) {}
  // Host memory owned elsewhere (node shared memory), never freed here.
  static SpaceBuffer borrow(void* data, std::size_t bytes) noexcept {
    SpaceBuffer b;
    b.data_ = data;
    b.bytes_ = bytes;
    return b;
  }
  SpaceBuffer(SpaceBuffer&& o) noexcept { *this = std::move(o); }
  SpaceBuffer& operator=(SpaceBuffer&& o) noexcept;
  SpaceBuffer(const SpaceBuffer&) = delete;
  SpaceBuffer& operator=(const SpaceBuffer&) = delete;
  ~SpaceBuffer() { release(); }

  void* data() const noexcept { return data_; }
  template <class T>
  T* as() const noexcept {
    return static_cast<T*>(data_);
  }
  std::size_t size() const noexcept { return bytes_; }

 private:
  friend class Space;
  void release() noexcept;
  HostBuffer host_;
  DeviceRuntime* rt_ = nullptr;  // device memory when set
  void* data_ = nullptr;
  std::size_t bytes_ = 0;
};

// An event of the space's device (none on the host), destroyed with it.
// Move-only.
class SpaceEvent {
 public:
  SpaceEvent() noexcept = default;
  SpaceEvent(SpaceEvent&& o) noexcept { *this = std::move(o); }
  SpaceEvent& operator=(SpaceEvent&& o) noexcept {
    std::swap(rt_, o.rt_);
    std::swap(e_, o.e_);
    return *this;
  }
  ~SpaceEvent();
  explicit operator bool() const noexcept { return e_ != nullptr; }

 private:
  friend class Space;
  friend class HostWord;
  DeviceRuntime* rt_ = nullptr;
  EventHandle e_ = nullptr;
};

// A word of pinned host memory that mirrors a word of the device: fetch()
// enqueues the copy on the space's stream, wait() lets the host wait for it
// and returns the value. Device spaces only: on the host the word is read
// where it is.
class HostWord {
 public:
  HostWord() noexcept = default;
  HostWord(HostWord&& o) noexcept { *this = std::move(o); }
  HostWord& operator=(HostWord&& o) noexcept {
    std::swap(space_, o.space_);
    std::swap(word_, o.word_);
    std::swap(copied_, o.copied_);
    return *this;
  }
  ~HostWord();
  void fetch(const std::uint32_t* word);
  std::uint32_t wait();

 private:
  friend class Space;
  const Space* space_ = nullptr;
  std::uint32_t* word_ = nullptr;
  SpaceEvent copied_;
};

class Space {
 public:
  // The host.
  Space() noexcept = default;
  // Device `device` of this process's device runtime, work ordered on
  // `stream`, for an optimizer over `ranks` ranks.
  static Space device(int device, StreamHandle stream, int ranks);
  // The device a stream of this process's device runtime belongs to
  // (before a space is chosen: to check the stream a user passed).
  static int device_of(StreamHandle stream);

  bool on_device() const noexcept { return rt_ != nullptr; }
  StreamHandle stream() const noexcept { return stream_; }
  MemoryLocation location() const noexcept {
    return on_device() ? MemoryLocation{MemoryKind::device, device_} : MemoryLocation{};
  }
  std::string name() const { return location_name(location()); }

  // Zero-filled. `what` names the buffer in an out-of-memory error.
  SpaceBuffer allocate(std::size_t bytes, const char* what) const;

  // Enqueued on a device, done at the call on the host.
  void copy(void* dst, const void* src, std::size_t bytes) const;
  void zero(void* dst, std::size_t bytes) const;
  void fill(float* dst, std::size_t n, float value) const;
  // dst[k] = src[k] * mul, between f32, bf16 and f16.
  void convert(const void* src, DType st, void* dst, DType dt, std::size_t n, float mul) const;
  // acc[k] += src[k] in fp32.
  void accumulate(const void* src, DType st, float* acc, std::size_t n) const;

  // *flag (a word in the space) = 1 if some x[k] * mul is not finite;
  // enqueued on a device, like the fused update that reads it.
  void flag_nonfinite(const void* x, DType type, std::size_t n, float mul,
                      std::uint32_t* flag) const;

  // LAMB's two passes (kernels/lamb.hpp): the direction, with its norms
  // (a host value: the host waits for the device), then the update.
  kernels::LambNorms lamb_direction(const kernels::LambBuffers& b,
                                    const kernels::LambScalars& s) const;
  void lamb_apply(const kernels::LambApplyBuffers& a, float neg_step) const;

  // Host values: the host waits for the device.
  double sum_squares(const void* x, DType type, std::size_t n) const;
  bool all_finite(const void* x, DType type, std::size_t n, float mul) const;
  // Between the space and host memory; complete on return.
  void download(void* host, const void* src, std::size_t bytes) const {
    transfer(host, src, bytes);
  }
  void upload(void* dst, const void* host, std::size_t bytes) const { transfer(dst, host, bytes); }
  // The host waits for everything enqueued so far.
  void synchronize() const;
  // Work enqueued from now on waits (on the device, not the host) for what
  // `producer`, another stream of this device, has enqueued so far; `e` is
  // the event that carries it (recorded anew each time). Nothing on the host
  // or for the space's own stream.
  void order_after(StreamHandle producer, SpaceEvent& e) const;
  // An event for order_after.
  SpaceEvent event() const;
  // A host word that mirrors a device word (HostWord), on a device space;
  // `what` names it in an out-of-memory error.
  HostWord host_word(const char* what) const;
  // The device `stream` belongs to (-1 on the host).
  int stream_device(StreamHandle stream) const;
  // Brackets a wait of the host for the device (every one above, and the
  // engine's own) for the watchdog: with SHARDOPT_TIMEOUT set, a device
  // that does not get there in time (a collective that some rank's device
  // never joins) ends the job with the watchdog's report, naming the wait
  // and where the engine was, instead of a hang.
  WatchScope wait_scope() const noexcept {
    return WatchScope("a wait for the device (its kernels and collectives)", 0, DType::f32, ranks_);
  }

 private:
  friend class HostWord;
  Space(DeviceRuntime& rt, StreamHandle stream, int device, int ranks) noexcept
      : rt_(&rt), stream_(stream), device_(device), ranks_(ranks) {}
  // A copy in any direction, the host waiting for it.
  void transfer(void* dst, const void* src, std::size_t bytes) const;

  DeviceRuntime* rt_ = nullptr;
  StreamHandle stream_ = nullptr;
  int device_ = -1;
  int ranks_ = 1;
};

}  // namespace shardopt::detail
