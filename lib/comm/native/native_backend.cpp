// The native backend: collectives on device buffers by the device's own
// stream-ordered collectives (NCCL, or the simulated device's), host
// buffers by the host backend it wraps.
//
// Each operation on device buffers is enqueued on the communicator's stream
// and returns at once: later work on that stream sees the result, with no
// host thread involved. A non-blocking operation's request holds an event
// recorded after it (wait() orders the stream after it, test() asks); a
// blocking one waits for that event on the host. The forms NCCL does not
// have are made of those it has: the MPI-style in-place reduce-scatter
// (result at the start of the buffer) reduces in place into this rank's
// block, then moves the block to the start on the same stream.
#include <string>

#include "comm/backend.hpp"
#include "common/check.hpp"
#include "common/log.hpp"

namespace shardopt::detail {

namespace {

class NativePending final : public PendingOp {
 public:
  NativePending(DeviceRuntime* rt, DeviceCollectives* coll, EventHandle done, StreamHandle stream,
                const char* op)
      : rt_(rt), coll_(coll), done_(done), stream_(stream), op_(op) {
    on_stream = true;
  }
  ~NativePending() override { rt_->destroy_event(done_); }
  void wait() override {
    rt_->wait_event(stream_, done_);
    coll_->check(op_);
  }
  bool test() override {
    const bool done = rt_->query(done_);
    if (done) coll_->check(op_);
    return done;
  }

 private:
  DeviceRuntime* rt_;
  DeviceCollectives* coll_;
  EventHandle done_;
  StreamHandle stream_;
  const char* op_;
};

class NativeBackend final : public DeviceBackend {
 public:
  NativeBackend(std::unique_ptr<Backend> host, DeviceRuntime* rt,
                std::unique_ptr<DeviceCollectives> coll)
      : DeviceBackend(std::move(host)),
        rt_(rt),
        coll_(std::move(coll)),
        device_(rt->current_device()) {
    SHARDOPT_LOG(info,
                 "Communicator: device buffers by " << coll_->name() << " on " << rt_->name());
  }

  const char* device_name() const noexcept override { return coll_->name(); }
  bool accepts(const MemoryLocation& where) const noexcept override {
    return where.kind == MemoryKind::host || where.kind == MemoryKind::device;
  }
  void free() override {
    if (!host_->freed()) coll_->free();
    host_->free();
    claim_.release();
  }

  std::unique_ptr<PendingOp> allreduce(const void* send, void* recv, std::size_t count, DType dtype,
                                       ReduceOp op, bool blocking, StreamHandle s) override {
    if (!on_device("allreduce", {send, recv}, count, s))
      return host_->allreduce(send, recv, count, dtype, op, blocking, s);
    coll_->allreduce(send, recv, count, dtype, op, s);
    return finish("allreduce", blocking, s);
  }

  std::unique_ptr<PendingOp> reduce_scatter(const void* send, void* recv, std::size_t count,
                                            DType dtype, ReduceOp op, ScatterPlace place,
                                            bool blocking, StreamHandle s) override {
    if (!on_device("reduce_scatter", {send, recv}, count, s))
      return host_->reduce_scatter(send, recv, count, dtype, op, place, blocking, s);
    if (place != ScatterPlace::at_start) {
      coll_->reduce_scatter(send, recv, count, dtype, op, s);
    } else {
      const std::size_t bytes = count * dtype_size(dtype);
      char* own = static_cast<char*>(recv) + std::size_t(rank()) * bytes;
      coll_->reduce_scatter(send, own, count, dtype, op, s);
      if (own != recv) rt_->copy(recv, own, bytes, s);
    }
    return finish("reduce_scatter", blocking, s);
  }

  std::unique_ptr<PendingOp> allgather(const void* send, void* recv, std::size_t count, DType dtype,
                                       bool in_place, bool blocking, StreamHandle s) override {
    if (!on_device("allgather", {send, recv}, count, s))
      return host_->allgather(send, recv, count, dtype, in_place, blocking, s);
    coll_->allgather(send, recv, count, dtype, s);
    return finish("allgather", blocking, s);
  }

  std::unique_ptr<PendingOp> broadcast(void* buf, std::size_t count, DType dtype, int root,
                                       bool blocking, StreamHandle s) override {
    if (!on_device("broadcast", {buf}, count, s))
      return host_->broadcast(buf, count, dtype, root, blocking, s);
    coll_->broadcast(buf, count, dtype, root, s);
    return finish("broadcast", blocking, s);
  }

 private:
  bool on_device(const char* op, std::initializer_list<const void*> bufs, std::size_t count,
                 StreamHandle s) {
    if (!device_operation(rt_, op, bufs, count, s)) return false;
    // The device's collectives (an NCCL communicator) were made for one
    // device; the buffers are all on one (device_operation checked).
    const int device = locate(*bufs.begin()).device;
    if (device != device_)
      throw_error(ErrorCode::wrong_device,
                  std::string(op) + ": the buffers are on device " + std::to_string(device) +
                      ", but this communicator's collectives work on device " +
                      std::to_string(device_) + " (the current device when it was created)",
                  "make the buffers' device current (cudaSetDevice, shardopt::set_device) before "
                  "creating the Communicator, one Communicator per device; or use the staged "
                  "transport (SHARDOPT_DEVICE_COMM=staged), which takes any device",
                  __FILE__, __LINE__);
    coll_->check(op);  // an earlier collective's failure stops this one
    return true;
  }

  std::unique_ptr<PendingOp> finish(const char* op, bool blocking, StreamHandle s) {
    EventHandle done = rt_->create_event();
    auto pending = std::make_unique<NativePending>(rt_, coll_.get(), done, s, op);
    rt_->record(done, s);
    if (!blocking) return pending;
    rt_->synchronize_event(done);
    coll_->check(op);
    return nullptr;
  }

  DeviceRuntime* rt_;
  std::unique_ptr<DeviceCollectives> coll_;
  int device_;  // the device the collectives were made for
  TransportClaim claim_{DeviceTransport::nccl};
};

}  // namespace

std::unique_ptr<Backend> make_native_backend(std::unique_ptr<Backend> host, DeviceRuntime* runtime,
                                             std::unique_ptr<DeviceCollectives> collectives) {
  return std::make_unique<NativeBackend>(std::move(host), runtime, std::move(collectives));
}

}  // namespace shardopt::detail
