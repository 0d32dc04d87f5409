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
// block, then moves the block to the start on the same stream. avg is a
// sum, then a division on the stream, as the host transports compute it:
// NCCL's own avg multiplies each input by 1/n first, which is not bitwise
// the same.
//
// The device's collectives (an NCCL communicator) are made on the first
// operation on device buffers, not with the Communicator: most
// communicators (the engine's agreements, a user's host traffic) never
// move device buffers, and each NCCL communicator costs an
// ncclCommInitRank and device memory. A communicator freed without a
// failure leaves its device communicator to the next one over the same
// ranks and device (the ranks agree on both steps), so a program that makes
// and frees communicators over the same ranks, as test suites and
// checkpoint tools do, sets NCCL up once per group.
#include <atomic>
#include <cstdint>
#include <deque>
#include <iterator>
#include <map>
#include <memory>
#include <mutex>
#include <sstream>
#include <string>
#include <vector>

#include "comm/backend.hpp"
#include "common/check.hpp"
#include "common/log.hpp"

namespace shardopt::detail {

namespace {

std::atomic<int> g_collectives_made{0};

// Device communicators left by freed shardopt communicators, each with its
// group's key and a number that every rank of the group gave it alike
// (entries of one key are added in the same order on every rank: only by
// the collective free() after all ranks agreed). Never destroyed: NCCL's
// communicators need not be before the process ends.
class Spares {
 public:
  // At most this many are kept; a free() past it releases its own.
  static constexpr std::size_t kMax = 8;

  // The newest spare of `key` (null if none) and its number.
  std::unique_ptr<DeviceCollectives> take(const std::string& key, std::int64_t& number) {
    std::lock_guard<std::mutex> lock(mu_);
    for (auto it = spares_.rbegin(); it != spares_.rend(); ++it) {
      if (it->key != key) continue;
      std::unique_ptr<DeviceCollectives> c = std::move(it->coll);
      number = it->number;
      spares_.erase(std::next(it).base());
      return c;
    }
    number = -1;
    return nullptr;
  }
  bool room() {
    std::lock_guard<std::mutex> lock(mu_);
    return spares_.size() < kMax;
  }
  void put(const std::string& key, std::unique_ptr<DeviceCollectives> c) {
    std::lock_guard<std::mutex> lock(mu_);
    spares_.push_back({key, next_[key]++, std::move(c)});
  }

 private:
  struct Spare {
    std::string key;
    std::int64_t number;
    std::unique_ptr<DeviceCollectives> coll;
  };
  std::mutex mu_;
  std::deque<Spare> spares_;
  std::map<std::string, std::int64_t> next_;
};

Spares& spares() {
  static Spares* const s = new Spares;  // outlives every static destructor
  return *s;
}

// Which ranks of MPI_COMM_WORLD `comm` holds, in its order, and the device:
// two communicators of the same key can share a device communicator.
std::string group_key(MPI_Comm comm, int device) {
  MPI_Group group = MPI_GROUP_NULL, world = MPI_GROUP_NULL;
  int n = 0;
  SHARDOPT_CHECK_MPI(MPI_Comm_group(comm, &group), "the communicator's group");
  SHARDOPT_CHECK_MPI(MPI_Comm_group(MPI_COMM_WORLD, &world), "the world's group");
  SHARDOPT_CHECK_MPI(MPI_Group_size(group, &n), "the group's size");
  std::vector<int> mine(static_cast<std::size_t>(n)), in_world(static_cast<std::size_t>(n));
  for (int r = 0; r < n; ++r) mine[static_cast<std::size_t>(r)] = r;
  SHARDOPT_CHECK_MPI(MPI_Group_translate_ranks(group, n, mine.data(), world, in_world.data()),
                     "the group's ranks in MPI_COMM_WORLD");
  MPI_Group_free(&group);
  MPI_Group_free(&world);
  std::ostringstream key;
  key << "device " << device << ":";
  for (int w : in_world) key << ' ' << w;
  return key.str();
}

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
  NativeBackend(std::unique_ptr<Backend> host, DeviceRuntime* rt)
      : DeviceBackend(std::move(host)), rt_(rt), device_(rt->current_device()) {
    SHARDOPT_LOG(info, "Communicator: device buffers by the device's own collectives on "
                           << rt_->name() << " (made at the first operation on them)");
  }

  const char* device_name() const noexcept override { return rt_->collectives_name(); }
  bool accepts(const MemoryLocation& where) const noexcept override {
    return where.kind == MemoryKind::host || where.kind == MemoryKind::device;
  }
  // Collective. A device communicator that saw no failure on any rank is
  // kept for the next communicator over the same ranks and device.
  void free() override {
    if (!host_->freed() && coll_) {
      int keep = spares().room() ? 1 : 0;
      try {
        coll_->check("free");
      } catch (const Error&) {
        keep = 0;
      }
      SHARDOPT_CHECK_MPI(MPI_Allreduce(MPI_IN_PLACE, &keep, 1, MPI_INT, MPI_MIN, host_->mpi_comm()),
                         "agreeing to keep the device communicator");
      if (keep)
        spares().put(key_, std::move(coll_));
      else
        coll_->free();
    }
    host_->free();
    claim_.release();
  }

  std::unique_ptr<PendingOp> allreduce(const void* send, void* recv, std::size_t count, DType dtype,
                                       ReduceOp op, bool blocking, StreamHandle s) override {
    if (!on_device("allreduce", {send, recv}, count, s))
      return host_->allreduce(send, recv, count, dtype, op, blocking, s);
    coll_->allreduce(send, recv, count, dtype, summed(op), s);
    if (op == ReduceOp::avg) rt_->divide(recv, count, dtype, size(), s);
    return finish("allreduce", blocking, s);
  }

  std::unique_ptr<PendingOp> reduce_scatter(const void* send, void* recv, std::size_t count,
                                            DType dtype, ReduceOp op, ScatterPlace place,
                                            bool blocking, StreamHandle s) override {
    if (!on_device("reduce_scatter", {send, recv}, count, s))
      return host_->reduce_scatter(send, recv, count, dtype, op, place, blocking, s);
    const std::size_t bytes = count * dtype_size(dtype);
    char* out = static_cast<char*>(recv) +
                (place == ScatterPlace::at_start ? std::size_t(rank()) * bytes : 0);
    coll_->reduce_scatter(send, out, count, dtype, summed(op), s);
    if (op == ReduceOp::avg) rt_->divide(out, count, dtype, size(), s);
    if (out != recv) rt_->copy(recv, out, bytes, s);
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
    if (!coll_) make_collectives();
    coll_->check(op);  // an earlier collective's failure stops this one
    return true;
  }

  // Collective: every rank reaches its first operation on device buffers
  // in the same call. A spare of the same ranks and device that every rank
  // has, with the same number, is taken; else one is made, on device_,
  // whatever the calling thread's current device.
  void make_collectives() {
    key_ = group_key(host_->mpi_comm(), device_);
    std::int64_t number = -1;
    std::unique_ptr<DeviceCollectives> spare = spares().take(key_, number);
    std::int64_t span[2] = {number, -number};  // the minimum and (negated) the maximum
    SHARDOPT_CHECK_MPI(
        MPI_Allreduce(MPI_IN_PLACE, span, 2, MPI_INT64_T, MPI_MIN, host_->mpi_comm()),
        "agreeing on a spare device communicator");
    if (spare && span[0] == number && -span[1] == number) {
      coll_ = std::move(spare);
      SHARDOPT_LOG(info, "Communicator of " << size() << " ranks: " << coll_->name()
                                            << " communicator of these ranks reused");
      return;
    }
    spare.reset();  // not every rank has it: released here (locally), as on every rank
    const int current = rt_->current_device();
    if (current != device_) rt_->set_current_device(device_);
    try {
      coll_ = rt_->collectives(host_->mpi_comm(), host_->max_chunk());
    } catch (...) {
      if (current != device_) rt_->set_current_device(current);
      throw;
    }
    if (current != device_) rt_->set_current_device(current);
    const int made = g_collectives_made.fetch_add(1) + 1;
    SHARDOPT_LOG(info, "Communicator of " << size() << " ranks: " << coll_->name()
                                          << " communicator made on device " << device_
                                          << " (this process's " << made << ")");
  }

  static ReduceOp summed(ReduceOp op) { return op == ReduceOp::avg ? ReduceOp::sum : op; }

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
  std::string key_;  // group_key() of coll_
  int device_;       // the device the collectives were made for
  TransportClaim claim_{DeviceTransport::nccl};
};

}  // namespace

std::unique_ptr<Backend> make_native_backend(std::unique_ptr<Backend> host,
                                             DeviceRuntime* runtime) {
  return std::make_unique<NativeBackend>(std::move(host), runtime);
}

int device_collectives_made() noexcept { return g_collectives_made.load(); }

}  // namespace shardopt::detail
