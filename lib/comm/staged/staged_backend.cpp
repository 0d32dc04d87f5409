// The staged backend: collectives on device buffers over any MPI, CUDA-aware
// or not. Host buffers go to the host backend it wraps, unchanged.
//
// A collective on device buffers runs in chunks through a ring of pinned
// host slots, on two internal streams and a progress thread:
//
//   caller's stream  --event-->  down: copy chunk k's device pieces into
//                                      slot k % R, record ready[k]
//   progress thread:  wait ready[k] (host), run the MPI collective on the
//                     slot (the host backend's blocking form, on a
//                     communicator of its own), raise the flag to k
//   up:               wait (on the device) for the flag >= k, copy the slot
//                     into the device pieces, record slot_free[k % R]
//
// down copies chunk k+1 while MPI works on chunk k, and up copies chunk k-1
// back meanwhile; down waits for slot_free before refilling a slot. None of
// it blocks the calling thread: a non-blocking operation's request holds the
// event recorded on up after the last chunk, and its wait() makes the
// caller's stream wait on it. A blocking operation waits for that event on
// the host.
//
// The progress thread calls MPI while the application's threads may too, so
// MPI must provide MPI_THREAD_MULTIPLE (checked at the first device
// operation). Its collectives run on their own duplicate of the
// communicator, in the order the operations were issued, the same on every
// rank.
//
// Direct (DeviceComm::mpi, a CUDA-aware MPI): the same thread runs each
// collective on the device buffers themselves, whole, with no slot and no
// copy. The caller's stream's work so far is its `ready`; up waits for the
// flag, then does what MPI's form leaves to do on the device (the move of
// an in-place reduce-scatter's block, avg's division: the host backend's
// forms are chosen so that it never touches the buffers itself), and
// records the operation's event. The thread makes blocking MPI calls:
// CUDA-aware MPIs reduce device buffers in blocking collectives, not always
// in non-blocking ones. Reductions of bf16 and f16 stay staged: MPI reduces
// them with operations of shardopt's, which run on the host.
#include <mpi.h>

#include <algorithm>
#include <condition_variable>
#include <cstring>
#include <deque>
#include <exception>
#include <functional>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "comm/backend.hpp"
#include "common/check.hpp"
#include "common/log.hpp"
#include "shardopt/config.hpp"
#include "shardopt/error.hpp"

namespace shardopt::detail {

namespace {

constexpr int kSlots = 3;

// A copy between a device (or host) buffer and a place in a slot.
struct Piece {
  const char* from = nullptr;  // down: the source; up: unused
  char* to = nullptr;          // up: the destination; down: unused
  std::size_t slot_off = 0, bytes = 0;
};

// One chunk: what goes down, the MPI work on the slot, what comes back up.
struct Chunk {
  std::vector<Piece> down, up;
  std::function<void(char* slot)> mpi;
};

// A copy between two places of device memory.
struct DeviceCopy {
  void* to = nullptr;
  const void* from = nullptr;
  std::size_t bytes = 0;
};

// A direct operation: MPI on the device buffers, and what the device does
// before (on down) and after (on up).
struct Direct {
  DeviceCopy before, after;
  std::function<void()> mpi;
  // avg's division of the result, after: the buffer (null: none).
  void* average = nullptr;
  std::size_t count = 0;
  DType dtype = DType::f32;
};

// Whether a reduction of `t` runs with an MPI operation of shardopt's
// (mpi_types.cpp), which reduces host memory only.
bool host_reduction(DType t) { return t == DType::bf16 || t == DType::f16; }

// The MPI side: a thread that runs each chunk's collective once its copy
// down has completed, in order.
class Progress {
 public:
  explicit Progress(DeviceRuntime* rt) : rt_(rt) {}
  ~Progress() { stop(); }

  struct Job {
    EventHandle ready;
    std::function<void()> mpi;
    std::uint32_t seq;
  };

  // device: the one the backend's streams and events are on, which the
  // thread makes its own before its first call of the runtime (a thread
  // starts on device 0: on a node with several GPUs it would otherwise make
  // a context there and wait on the wrong device's events).
  void start(std::uint32_t* flag, int device) {
    flag_ = flag;
    device_ = device;
    thread_ = std::thread([this] { run(); });
  }
  void stop() noexcept {
    if (!thread_.joinable()) return;
    {
      std::lock_guard<std::mutex> lock(mu_);
      stopping_ = true;
    }
    cv_.notify_all();
    thread_.join();
  }
  void push(Job job) {
    {
      std::lock_guard<std::mutex> lock(mu_);
      jobs_.push_back(std::move(job));
    }
    cv_.notify_all();
  }
  // The first error of a collective the thread ran, if any.
  std::exception_ptr error() {
    std::lock_guard<std::mutex> lock(mu_);
    return error_;
  }
  // An event for a job's `ready`: reused once the thread is done with it.
  EventHandle event() {
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (!spare_.empty()) {
        EventHandle e = spare_.back();
        spare_.pop_back();
        return e;
      }
    }
    EventHandle e = rt_->create_event();
    std::lock_guard<std::mutex> lock(mu_);
    all_.push_back(e);
    return e;
  }
  void destroy_events() noexcept {
    for (EventHandle e : all_) rt_->destroy_event(e);
    all_.clear();
    spare_.clear();
  }

 private:
  void run() {
    try {
      rt_->set_current_device(device_);
    } catch (...) {
      std::lock_guard<std::mutex> lock(mu_);
      error_ = std::current_exception();
    }
    for (;;) {
      Job job;
      {
        std::unique_lock<std::mutex> lock(mu_);
        cv_.wait(lock, [&] { return stopping_ || !jobs_.empty(); });
        if (jobs_.empty()) return;  // stopping, and nothing left to do
        job = std::move(jobs_.front());
        jobs_.pop_front();
      }
      try {
        rt_->synchronize_event(job.ready);
        if (!error()) job.mpi();
      } catch (...) {
        std::lock_guard<std::mutex> lock(mu_);
        if (!error_) error_ = std::current_exception();
      }
      {
        std::lock_guard<std::mutex> lock(mu_);
        spare_.push_back(job.ready);
      }
      // Raised after an error too: the device must not wait forever; the
      // error reaches the host at the operation's completion.
      rt_->set_flag(flag_, job.seq);
    }
  }

  DeviceRuntime* rt_;
  std::uint32_t* flag_ = nullptr;
  int device_ = 0;
  std::thread thread_;
  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<Job> jobs_;
  std::vector<EventHandle> spare_, all_;
  std::exception_ptr error_;
  bool stopping_ = false;
};

// A device operation's completion: an event on the up stream.
class StagedPending final : public PendingOp {
 public:
  StagedPending(DeviceRuntime* rt, EventHandle done, StreamHandle caller,
                std::function<void()> check)
      : rt_(rt), done_(done), caller_(caller), check_(std::move(check)) {
    on_stream = true;
  }
  ~StagedPending() override { rt_->destroy_event(done_); }
  void wait() override {
    rt_->wait_event(caller_, done_);
    check_();
  }
  bool test() override {
    const bool done = rt_->query(done_);
    if (done) check_();
    return done;
  }

 private:
  DeviceRuntime* rt_;
  EventHandle done_;
  StreamHandle caller_;
  std::function<void()> check_;
};

char* at(const void* p, std::size_t elems, std::size_t es) {
  return const_cast<char*>(static_cast<const char*>(p)) + elems * es;
}

class StagedBackend final : public DeviceBackend {
 public:
  StagedBackend(std::unique_ptr<Backend> host, MPI_Comm comm, DeviceRuntime* rt, bool direct)
      : DeviceBackend(std::move(host)), rt_(rt), progress_(rt), direct_(direct && rt != nullptr) {
    // The progress thread's own communicator: its collectives never meet
    // the application's or the host backend's.
    wire_ = make_mpi_host_backend(comm, host_->max_chunk());
    chunk_bytes_ = settings().staged_chunk_kb * 1024;
    if (direct_) claim_.emplace(DeviceTransport::mpi);
  }
  ~StagedBackend() override { shutdown(); }

  const char* device_name() const noexcept override { return direct_ ? "mpi" : "staged"; }
  bool accepts(const MemoryLocation& where) const noexcept override {
    return where.kind == MemoryKind::host || (rt_ != nullptr && where.kind == MemoryKind::device);
  }
  void free() override {
    shutdown();
    wire_->free();
    host_->free();
    if (claim_) claim_->release();
  }

  std::unique_ptr<PendingOp> allreduce(const void* send, void* recv, std::size_t count, DType dtype,
                                       ReduceOp op, bool blocking, StreamHandle s) override {
    if (!on_device("allreduce", {send, recv}, count, s))
      return host_->allreduce(send, recv, count, dtype, op, blocking, s);
    Backend& w = *wire_;
    if (direct_ && !host_reduction(dtype)) {
      Direct d = averaged(op, recv, count, dtype);
      d.mpi = [&w, vs = view(send), vr = view(recv), count, dtype, op = summed(op)] {
        w.allreduce(vs, vr, count, dtype, op, true, nullptr);
      };
      return run_direct("allreduce", blocking, s, std::move(d));
    }
    const std::size_t es = dtype_size(dtype), step = piece_elems(es, 1);
    return run("allreduce", count, step, blocking, s,
               [&](std::size_t off, std::size_t n, Chunk& c) {
                 c.down.push_back({at(send, off, es), nullptr, 0, n * es});
                 c.up.push_back({nullptr, at(recv, off, es), 0, n * es});
                 c.mpi = [&w, n, dtype, op](char* slot) {
                   complete_yielding(w.allreduce(slot, slot, n, dtype, op, false, nullptr));
                 };
               });
  }

  std::unique_ptr<PendingOp> reduce_scatter(const void* send, void* recv, std::size_t count,
                                            DType dtype, ReduceOp op, ScatterPlace place,
                                            bool blocking, StreamHandle s) override {
    // The in-place forms need nothing special here: chunk k's result goes
    // up only after every block's chunk k went down, and later chunks read
    // other elements.
    if (!on_device("reduce_scatter", {send, recv}, count, s))
      return host_->reduce_scatter(send, recv, count, dtype, op, place, blocking, s);
    const std::size_t es = dtype_size(dtype), ranks = std::size_t(size());
    Backend& w = *wire_;
    if (direct_ && !host_reduction(dtype)) {
      Direct d = averaged(op, recv, count, dtype);
      // The host backend moves an in-place result between the start of the
      // buffer and this rank's block itself (with memmove) in two cases:
      // those take the other in-place form, and the device moves it.
      const std::size_t me = std::size_t(rank()), bytes = count * es;
      const bool one_call = count * ranks <= w.max_chunk();  // else one reduce per rank
      char* whole = place == ScatterPlace::at_own_block ? at(recv, 0, es) - me * bytes
                                                        : static_cast<char*>(recv);
      const void* wsend = send;
      void* wrecv = recv;
      ScatterPlace wplace = place;
      if (me != 0 && bytes != 0) {
        if (place == ScatterPlace::at_own_block && one_call) {
          wsend = wrecv = whole;
          wplace = ScatterPlace::at_start;
          d.after = {recv, whole, bytes};
        } else if (place == ScatterPlace::at_start && !one_call) {
          wsend = whole;
          wrecv = whole + me * bytes;
          wplace = ScatterPlace::at_own_block;
          d.after = {whole, whole + me * bytes, bytes};
        }
      }
      d.mpi = [&w, vs = view(wsend), vr = view(wrecv), count, dtype, op = summed(op), wplace] {
        w.reduce_scatter(vs, vr, count, dtype, op, wplace, true, nullptr);
      };
      return run_direct("reduce_scatter", blocking, s, std::move(d));
    }
    const std::size_t step = piece_elems(es, ranks);
    return run(
        "reduce_scatter", count, step, blocking, s, [&](std::size_t off, std::size_t n, Chunk& c) {
          for (std::size_t r = 0; r < ranks; ++r)
            c.down.push_back({at(send, r * count + off, es), nullptr, r * n * es, n * es});
          c.up.push_back({nullptr, at(recv, off, es), 0, n * es});
          c.mpi = [&w, n, dtype, op](char* slot) {
            complete_yielding(
                w.reduce_scatter(slot, slot, n, dtype, op, ScatterPlace::at_start, false, nullptr));
          };
        });
  }

  std::unique_ptr<PendingOp> allgather(const void* send, void* recv, std::size_t count, DType dtype,
                                       bool in_place, bool blocking, StreamHandle s) override {
    if (!on_device("allgather", {send, recv}, count, s))
      return host_->allgather(send, recv, count, dtype, in_place, blocking, s);
    const std::size_t es = dtype_size(dtype), ranks = std::size_t(size());
    const std::size_t me = std::size_t(rank());
    Backend& w = *wire_;
    if (direct_) {
      // Past one call the host backend first copies this rank's block into
      // place itself (with memcpy): the device copies it, and MPI gathers
      // in place.
      Direct d;
      const void* wsend = send;
      bool wplace = in_place;
      if (!in_place && count * ranks > w.max_chunk() && count != 0) {
        wsend = at(recv, me * count, es);
        wplace = true;
        d.before = {at(recv, me * count, es), send, count * es};
      }
      d.mpi = [&w, vs = view(wsend), vr = view(recv), count, dtype, wplace] {
        w.allgather(vs, vr, count, dtype, wplace, true, nullptr);
      };
      return run_direct("allgather", blocking, s, std::move(d));
    }
    const std::size_t step = piece_elems(es, ranks);
    return run("allgather", count, step, blocking, s,
               [&](std::size_t off, std::size_t n, Chunk& c) {
                 c.down.push_back({at(send, off, es), nullptr, me * n * es, n * es});
                 for (std::size_t r = 0; r < ranks; ++r)
                   c.up.push_back({nullptr, at(recv, r * count + off, es), r * n * es, n * es});
                 c.mpi = [&w, n, dtype, me, es](char* slot) {
                   complete_yielding(
                       w.allgather(slot + me * n * es, slot, n, dtype, true, false, nullptr));
                 };
               });
  }

  std::unique_ptr<PendingOp> broadcast(void* buf, std::size_t count, DType dtype, int root,
                                       bool blocking, StreamHandle s) override {
    if (!on_device("broadcast", {buf}, count, s))
      return host_->broadcast(buf, count, dtype, root, blocking, s);
    if (direct_) {
      Direct d;
      d.mpi = [&w = *wire_, vb = view(buf), count, dtype, root] {
        w.broadcast(vb, count, dtype, root, true, nullptr);
      };
      return run_direct("broadcast", blocking, s, std::move(d));
    }
    const std::size_t es = dtype_size(dtype), step = piece_elems(es, 1);
    const bool mine = rank() == root;
    Backend& w = *wire_;
    return run("broadcast", count, step, blocking, s,
               [&](std::size_t off, std::size_t n, Chunk& c) {
                 if (mine) c.down.push_back({at(buf, off, es), nullptr, 0, n * es});
                 if (!mine) c.up.push_back({nullptr, at(buf, off, es), 0, n * es});
                 c.mpi = [&w, n, dtype, root](char* slot) {
                   complete_yielding(w.broadcast(slot, n, dtype, root, false, nullptr));
                 };
               });
  }

 private:
  // Whether the operation is one on device buffers (else the host
  // backend's); its first device operation starts the pipeline.
  bool on_device(const char* op, std::initializer_list<const void*> bufs, std::size_t count,
                 StreamHandle s) {
    if (!device_operation(rt_, op, bufs, count, s)) return false;
    start(op);
    return true;
  }

  // Elements per rank's block in one chunk.
  std::size_t piece_elems(std::size_t es, std::size_t blocks) const {
    return std::max<std::size_t>(1, chunk_bytes_ / es / (blocks > 0 ? blocks : 1));
  }

  // Where MPI reaches device memory p.
  void* view(const void* p) const { return p != nullptr ? rt_->mpi_view(p) : nullptr; }
  // avg reduces as a sum; the device divides afterwards.
  static ReduceOp summed(ReduceOp op) { return op == ReduceOp::avg ? ReduceOp::sum : op; }
  Direct averaged(ReduceOp op, void* recv, std::size_t count, DType dtype) const {
    Direct d;
    if (op == ReduceOp::avg && size() > 1 && count != 0) {
      d.average = recv;
      d.count = count;
      d.dtype = dtype;
    }
    return d;
  }

  // The first device operation: the thread level, the streams, the slots
  // and the progress thread. Later ones: a failure of an earlier one.
  void start(const char* op) {
    rethrow(op);
    if (started_) return;
    int level = MPI_THREAD_SINGLE;
    SHARDOPT_CHECK_MPI(MPI_Query_thread(&level), "querying MPI's thread level");
    if (level < MPI_THREAD_MULTIPLE)
      throw_error(ErrorCode::unsupported,
                  std::string(op) +
                      " on device buffers: the staged backend runs MPI on a progress thread, "
                      "which needs MPI_THREAD_MULTIPLE, but MPI was initialized with a lower "
                      "thread level",
                  "initialize MPI with MPI_Init_thread(..., MPI_THREAD_MULTIPLE, ...) (or "
                  "shardopt::Environment with ThreadLevel::multiple)",
                  __FILE__, __LINE__);
    down_ = rt_->create_stream();
    up_ = rt_->create_stream();
    start_ = rt_->create_event();
    const std::size_t slot = chunk_bytes_ * std::size_t(std::max(1, size()));
    for (int k = 0; k < kSlots; ++k) {
      slots_[k] = static_cast<char*>(rt_->allocate_pinned(slot, "the staged backend's slots"));
      slot_free_[k] = rt_->create_event();
    }
    flag_ = rt_->allocate_flags(1);
    progress_.start(flag_, rt_->current_device());
    started_ = true;
    SHARDOPT_LOG(info, "Communicator: device buffers "
                           << (direct_ ? "moved by MPI itself, 16-bit reductions " : "")
                           << "staged through " << kSlots << " pinned slots of " << slot
                           << " bytes over " << rt_->name());
  }

  void rethrow(const char* op) {
    if (std::exception_ptr e = progress_.error()) {
      try {
        std::rethrow_exception(e);
      } catch (const Error& err) {
        throw_error(
            err.code(),
            std::string(op) + ": an earlier collective on device buffers failed: " + err.message(),
            "the communicator cannot be used for device buffers after such a failure: " +
                err.hint(),
            __FILE__, __LINE__);
      }
    }
  }

  // Runs `count` elements per block in chunks of `step`, plan(off, n, chunk)
  // describing each.
  template <class Plan>
  std::unique_ptr<PendingOp> run(const char* op, std::size_t count, std::size_t step, bool blocking,
                                 StreamHandle s, Plan plan) {
    rt_->record(start_, s);
    rt_->wait_event(down_, start_);
    rt_->wait_event(up_, start_);
    for (std::size_t off = 0; off < count; off += step) {
      const std::size_t n = std::min(step, count - off);
      Chunk c;
      plan(off, n, c);
      const int k = static_cast<int>(chunks_ % kSlots);
      char* slot = slots_[k];
      if (chunks_ >= kSlots) rt_->wait_event(down_, slot_free_[k]);
      for (const Piece& p : c.down) rt_->copy(slot + p.slot_off, p.from, p.bytes, down_);
      EventHandle ready = progress_.event();
      rt_->record(ready, down_);
      const std::uint32_t seq = static_cast<std::uint32_t>(++chunks_);
      progress_.push({ready, [mpi = std::move(c.mpi), slot] { mpi(slot); }, seq});
      rt_->wait_flag(up_, flag_, seq);
      for (const Piece& p : c.up) rt_->copy(p.to, slot + p.slot_off, p.bytes, up_);
      rt_->record(slot_free_[k], up_);
    }
    return complete(op, blocking, s);
  }

  // One direct operation (the header's "Direct").
  std::unique_ptr<PendingOp> run_direct(const char* op, bool blocking, StreamHandle s, Direct d) {
    rt_->record(start_, s);
    rt_->wait_event(down_, start_);
    rt_->wait_event(up_, start_);
    if (d.before.bytes != 0) rt_->copy(d.before.to, d.before.from, d.before.bytes, down_);
    EventHandle ready = progress_.event();
    rt_->record(ready, down_);
    const std::uint32_t seq = static_cast<std::uint32_t>(++chunks_);
    progress_.push({ready, std::move(d.mpi), seq});
    rt_->wait_flag(up_, flag_, seq);
    if (d.after.bytes != 0) rt_->copy(d.after.to, d.after.from, d.after.bytes, up_);
    if (d.average != nullptr) rt_->divide(d.average, d.count, d.dtype, size(), up_);
    return complete(op, blocking, s);
  }

  // The operation's event, recorded on up after its last work: the caller
  // waits for it, on the host (blocking) or on its stream (the request).
  std::unique_ptr<PendingOp> complete(const char* op, bool blocking, StreamHandle s) {
    EventHandle done = rt_->create_event();
    rt_->record(done, up_);
    auto pending = std::make_unique<StagedPending>(rt_, done, s, [this, op] { rethrow(op); });
    if (blocking) {
      rt_->synchronize_event(done);
      rethrow(op);
      return nullptr;
    }
    return pending;
  }

  void shutdown() noexcept {
    if (!started_) return;
    started_ = false;
    try {
      rt_->synchronize(up_);
    } catch (...) {  // a destructor never throws
    }
    progress_.stop();
    progress_.destroy_events();
    for (int k = 0; k < kSlots; ++k) {
      rt_->release_pinned(slots_[k]);
      rt_->destroy_event(slot_free_[k]);
    }
    rt_->release_flags(flag_);
    rt_->destroy_event(start_);
    rt_->destroy_stream(down_);
    rt_->destroy_stream(up_);
  }

  std::unique_ptr<Backend> wire_;
  DeviceRuntime* rt_;  // null on a rank without a device
  Progress progress_;
  std::size_t chunk_bytes_ = 0;
  bool started_ = false;
  StreamHandle down_ = nullptr, up_ = nullptr;
  EventHandle start_ = nullptr;
  char* slots_[kSlots] = {};
  EventHandle slot_free_[kSlots] = {};
  std::uint32_t* flag_ = nullptr;
  std::uint64_t chunks_ = 0;  // chunks issued; the flag counts those done
  bool direct_;
  std::optional<TransportClaim> claim_;  // direct: the CUDA-aware MPI's
};

}  // namespace

std::unique_ptr<Backend> make_staged_backend(std::unique_ptr<Backend> host, MPI_Comm comm,
                                             DeviceRuntime* runtime, bool direct) {
  return std::make_unique<StagedBackend>(std::move(host), comm, runtime, direct);
}

}  // namespace shardopt::detail
