// shardopt internal: the seam between the Communicator (argument checks,
// in-place conventions) and the transports that move the data. The MPI host
// backend implements it now; NCCL and CUDA-aware MPI backends plug in here.
//
// A backend receives arguments already checked by the Communicator: valid
// dtype and op, a supported combination, non-null buffers where count > 0,
// buffers in memory the backend accepts, and the in-place form resolved.
#pragma once

#include <mpi.h>

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <initializer_list>
#include <memory>
#include <thread>
#include <vector>

#include "comm/node_access.hpp"
#include "common/watchdog.hpp"
#include "device/device.hpp"
#include "device/device_runtime.hpp"
#include "shardopt/communicator.hpp"
#include "shardopt/types.hpp"

namespace shardopt::detail {

// A started non-blocking operation. wait()/test() complete it, including any
// local post-processing (the division of avg, the move of an in-place block).
class PendingOp {
 public:
  virtual ~PendingOp() = default;
  virtual void wait() = 0;
  virtual bool test() = 0;
  // Waits up to d for completion (true: complete, as test()): the
  // watchdog's wait (Request::wait with it armed). The default tests
  // until d has passed (an MPI request, which MPI progresses only inside
  // its calls, or a helper thread's work) as test_for does, yielding the
  // core after the first microseconds; an operation that completes on a
  // thread of ours sleeps instead.
  virtual bool wait_for(std::chrono::microseconds d) {
    return test_for(d, [this] { return test(); });
  }
  // What it is, for the watchdog's message (set by the front end), and
  // where the watchdog asks the other ranks (null when it is not armed).
  const char* what = "wait";
  std::size_t count = 0;
  DType dtype = DType::f32;
  int ranks = 0;
  std::shared_ptr<const WatchChannel> channel;
  // A device operation: wait() makes the caller's stream wait, not the
  // host, so the watchdog does not turn it into a host wait; the host's
  // later waits for the device carry the watchdog (Space::wait_scope).
  bool on_stream = false;
};

// Completes op (null: nothing to do) from a helper thread, testing it and
// yielding the core between tests rather than spinning inside MPI: such a
// thread shares the cores with the application's, and a spinning waiter
// slows the very ranks it waits for.
inline void complete_yielding(std::unique_ptr<PendingOp> op) {
  if (op == nullptr) return;
  while (!op->test()) std::this_thread::yield();
}

// How reduce_scatter's output relates to its input.
enum class ScatterPlace {
  separate,     // recv does not overlap send
  at_start,     // recv == send: result in the first `count` elements (MPI style)
  at_own_block  // recv == send + rank*count: result stays in place (NCCL style)
};

class Backend {
 public:
  virtual ~Backend() = default;
  // The transport of host buffers ("mpi-host"), and of device buffers
  // ("staged", "nccl"; "none" for a backend of host buffers only).
  virtual const char* name() const noexcept = 0;
  virtual const char* device_name() const noexcept { return "none"; }
  virtual int rank() const noexcept = 0;
  virtual int size() const noexcept = 0;
  virtual MPI_Comm mpi_comm() const noexcept = 0;
  virtual std::size_t max_chunk() const noexcept = 0;
  // Whether buffers in memory `where` can be passed to this backend.
  virtual bool accepts(const MemoryLocation& where) const noexcept = 0;
  // Whether its blocking operations wait through the watchdog themselves
  // when it is armed (watch_poll on the calling thread): the front end then
  // issues them blocking rather than as polled non-blocking ones.
  virtual bool watches_blocking_waits() const noexcept { return false; }
  // Its node access (comm/node_access.hpp), or null: a transport with
  // every rank on one node sharing memory has one.
  virtual NodeAccess* node_access() noexcept { return nullptr; }
  // Collective: releases the backend's communicator. Idempotent.
  virtual void free() = 0;
  virtual bool freed() const noexcept = 0;

  // With blocking == true the operation is complete on return and nullptr is
  // returned; otherwise the returned op completes it. `stream` orders the
  // operations on device buffers (backends of host buffers ignore it): the
  // operation starts after the work enqueued on it so far, and a returned
  // op's wait() makes the stream wait for it.
  virtual std::unique_ptr<PendingOp> allreduce(const void* send, void* recv, std::size_t count,
                                               DType dtype, ReduceOp op, bool blocking,
                                               StreamHandle stream) = 0;
  virtual std::unique_ptr<PendingOp> reduce_scatter(const void* send, void* recv, std::size_t count,
                                                    DType dtype, ReduceOp op, ScatterPlace place,
                                                    bool blocking, StreamHandle stream) = 0;
  // in_place: send == recv + rank*count.
  virtual std::unique_ptr<PendingOp> allgather(const void* send, void* recv, std::size_t count,
                                               DType dtype, bool in_place, bool blocking,
                                               StreamHandle stream) = 0;
  virtual std::unique_ptr<PendingOp> broadcast(void* buf, std::size_t count, DType dtype, int root,
                                               bool blocking, StreamHandle stream) = 0;
  virtual std::unique_ptr<PendingOp> barrier(bool blocking, StreamHandle stream) = 0;

  // Operations issued with argument agreement on, numbered from 1: the
  // sequence number each one carries (SHARDOPT_DESYNC_CHECK).
  std::int64_t agreed_calls = 0;
  // The watchdog's side channel over the same ranks, made by the backend
  // when SHARDOPT_TIMEOUT is set (else null) and freed with it.
  std::shared_ptr<WatchChannel> watch;
};

// A backend of device buffers that passes host buffers to the host backend
// it wraps (staged, native): what concerns the communicator itself is the
// host backend's.
class DeviceBackend : public Backend {
 public:
  explicit DeviceBackend(std::unique_ptr<Backend> host) : host_(std::move(host)) {
    watch = host_->watch;
  }
  const char* name() const noexcept override { return host_->name(); }
  int rank() const noexcept override { return host_->rank(); }
  int size() const noexcept override { return host_->size(); }
  MPI_Comm mpi_comm() const noexcept override { return host_->mpi_comm(); }
  std::size_t max_chunk() const noexcept override { return host_->max_chunk(); }
  bool freed() const noexcept override { return host_->freed(); }
  // For host buffers, which the host backend moves.
  NodeAccess* node_access() noexcept override { return host_->node_access(); }
  std::unique_ptr<PendingOp> barrier(bool blocking, StreamHandle stream) override {
    return host_->barrier(blocking, stream);
  }

 protected:
  std::unique_ptr<Backend> host_;
};

// The device transports of this process's live communicators, counted so
// that NCCL and a CUDA-aware MPI never move device buffers side by side
// (NCCL documents a deadlock when both run collectives on one device
// concurrently). A backend holds a claim from construction to free().
enum class DeviceTransport { nccl, mpi };
int live_device_transports(DeviceTransport t) noexcept;
class TransportClaim {
 public:
  explicit TransportClaim(DeviceTransport t) noexcept;
  ~TransportClaim() { release(); }
  TransportClaim(const TransportClaim&) = delete;
  TransportClaim& operator=(const TransportClaim&) = delete;
  void release() noexcept;

 private:
  DeviceTransport t_;
  bool held_ = true;
};

// Duplicates `comm` (collective) and uses it with MPI on host buffers.
std::unique_ptr<Backend> make_mpi_host_backend(MPI_Comm comm, std::size_t max_chunk);

// Host buffers through `host`; device buffers of `runtime`'s devices staged
// through pinned host memory and moved by MPI on a duplicate of `comm`
// (collective), driven by a progress thread (lib/comm/staged/). A rank
// without a device (runtime null) takes part in the duplicate and passes
// every buffer to `host`. direct: MPI takes device buffers (a CUDA-aware
// MPI), and moves them itself without staging, on the same thread, except
// the reductions of 16-bit floats (MPI reduces those with operations of
// shardopt's, which run on the host), which stay staged.
std::unique_ptr<Backend> make_staged_backend(std::unique_ptr<Backend> host, MPI_Comm comm,
                                             DeviceRuntime* runtime, bool direct = false);

// Host buffers through `host`; device buffers by the device's own
// stream-ordered collectives (lib/comm/native/), made over `host`'s MPI
// communicator on the first operation on device buffers (collective then,
// as that operation is), on the device current now. A communicator that
// never moves device buffers (the engine's agreements, control traffic)
// never makes one: each is an ncclCommInitRank on a GPU.
std::unique_ptr<Backend> make_native_backend(std::unique_ptr<Backend> host, DeviceRuntime* runtime);
// How many of the device's own communicators (NCCL's) this process has
// made so far.
int device_collectives_made() noexcept;

// Whether an operation on `bufs` (count elements each) is one on device
// buffers of `rt` (false: host buffers, or nothing to move). Buffers in two
// memories, or a stream of another device than theirs: WrongDevice.
bool device_operation(DeviceRuntime* rt, const char* op, std::initializer_list<const void*> bufs,
                      std::size_t count, StreamHandle s);

}  // namespace shardopt::detail
