// The host backends of shared memory: "shm" (every rank on one node) and
// "hier" (shared memory within each node, MPI across nodes among the ranks
// with the same place in their node). Both wrap the MPI host backend, which
// keeps the communicator itself (its duplicate, the watchdog's channel).
//
// Non-blocking operations run in order on a worker thread of the backend,
// so that they progress while the caller computes, with no call of the
// caller's needed; blocking ones run on the caller's thread once the
// worker has finished what was issued before. The worker never calls MPI
// unless MPI provides MPI_THREAD_MULTIPLE: hier's non-blocking operations,
// which need MPI across nodes, otherwise complete before they return.
//
// On one node, with the transport chosen by auto, the blocking operations
// and sizes where MPI's own collective was measured faster than the node's
// slots go to the MPI backend underneath (mpi_is_faster);
// SHARDOPT_HOST_COMM=shm keeps every operation on shared memory.
#include "comm/shm/shm_backend.hpp"

#include <mpi.h>

#include <algorithm>
#include <atomic>
#include <condition_variable>
#include <cstring>
#include <deque>
#include <exception>
#include <functional>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "comm/backend.hpp"
#include "comm/mpi/mpi_types.hpp"
#include "comm/shm/shm_access.hpp"
#include "comm/shm/shm_channel.hpp"
#include "common/check.hpp"
#include "common/log.hpp"
#include "common/watchdog.hpp"
#include "kernels/reduce.hpp"

namespace shardopt::detail {

namespace {

// An operation handed to the worker.
struct Task {
  std::function<void()> run;
  std::atomic<bool> done{false};
  std::exception_ptr error;
  // For a wait with a time limit (wait_for): done is set, then m is taken
  // and released, then cv notified, so that no waiter misses it.
  std::mutex m;
  std::condition_variable cv;
};

class TaskPending final : public PendingOp {
 public:
  explicit TaskPending(std::shared_ptr<Task> t) : t_(std::move(t)) {}
  void wait() override {
    t_->done.wait(false, std::memory_order_acquire);
    finish();
  }
  bool test() override {
    if (!t_->done.load(std::memory_order_acquire)) return false;
    finish();
    return true;
  }
  bool wait_for(std::chrono::microseconds d) override {
    std::unique_lock lock(t_->m);
    if (!t_->cv.wait_for(lock, d, [&] { return t_->done.load(std::memory_order_acquire); }))
      return false;
    lock.unlock();
    finish();
    return true;
  }

 private:
  void finish() {
    if (t_->error) {
      std::exception_ptr e = t_->error;
      t_->error = nullptr;  // thrown once
      std::rethrow_exception(e);
    }
  }
  std::shared_ptr<Task> t_;
};

class ShmBackend final : public Backend {
 public:
  // node: the node's channel; inter: the ranks of the other nodes with this
  // rank's place in its node (MPI_COMM_NULL on one node), ordered by node;
  // rank_at[m * L + l]: the communicator's rank on node m at place l.
  // per_size: whether operations MPI does faster go to it (auto's choice).
  ShmBackend(std::unique_ptr<Backend> mpi, std::shared_ptr<NodeChannel> node, MPI_Comm inter,
             std::vector<int> rank_at, int nodes, bool per_size)
      : mpi_(std::move(mpi)),
        node_(std::move(node)),
        inter_(inter),
        rank_at_(std::move(rank_at)),
        nodes_(nodes),
        local_(node_->ranks()),
        per_size_(per_size && nodes == 1) {
    watch = mpi_->watch;
    if (inter_ != MPI_COMM_NULL)
      SHARDOPT_CHECK_MPI(MPI_Comm_rank(inter_, &node_index_), "querying the node's index");
    int level = MPI_THREAD_SINGLE;
    SHARDOPT_CHECK_MPI(MPI_Query_thread(&level), "querying MPI's thread level");
    background_ = nodes_ == 1 || level == MPI_THREAD_MULTIPLE;
    // The node phase's block order: place l's results are the blocks of
    // the ranks at place l on each node, in node order.
    blocks_.resize(rank_at_.size());
    for (int l = 0; l < local_; ++l)
      for (int m = 0; m < nodes_; ++m) blocks_[l * nodes_ + m] = rank_at_[m * local_ + l];
    SHARDOPT_LOG(
        info, "Communicator: " << name() << " backend, rank " << rank() << " of " << size() << ", "
                               << local_ << " ranks per node through "
                               << node_->segment_bytes() / 1024 << " KiB of shared memory"
                               << (node_->single_copy() ? " (large blocks in a single copy)" : "")
                               << (nodes_ > 1 ? ", MPI across nodes" : "")
                               << (per_size_ ? "; MPI's own where it was measured faster" : ""));
  }
  ~ShmBackend() override { stop_worker(); }

  const char* name() const noexcept override { return nodes_ > 1 ? "hier" : "shm"; }
  // Blocking operations run on the calling thread, their waits for the
  // node's ranks polled by the watchdog (run_here) and those across nodes
  // too (finish_mpi).
  bool watches_blocking_waits() const noexcept override { return true; }
  int rank() const noexcept override { return mpi_->rank(); }
  int size() const noexcept override { return mpi_->size(); }
  MPI_Comm mpi_comm() const noexcept override { return mpi_->mpi_comm(); }
  std::size_t max_chunk() const noexcept override { return mpi_->max_chunk(); }
  bool accepts(const MemoryLocation& where) const noexcept override { return mpi_->accepts(where); }
  void free() override {
    if (mpi_->freed()) return;
    stop_worker();
    if (inter_ != MPI_COMM_NULL) {
      SHARDOPT_CHECK_MPI(MPI_Comm_free(&inter_), "freeing the communicator across nodes");
    }
    mpi_->free();
  }
  bool freed() const noexcept override { return mpi_->freed(); }
  // One node: every rank's memory is this node's (hier's ranks on other
  // nodes are not).
  NodeAccess* node_access() noexcept override {
    if (nodes_ > 1 || mpi_->freed()) return nullptr;
    if (access_ == nullptr) access_ = make_shm_access(mpi_->mpi_comm(), node_);
    return access_.get();
  }

  std::unique_ptr<PendingOp> allreduce(const void* send, void* recv, std::size_t count, DType dtype,
                                       ReduceOp op, bool blocking, StreamHandle stream) override {
    if (blocking &&
        mpi_is_faster(Collective::allreduce, count * dtype_size(dtype), send == recv, dtype, op)) {
      throw_if_broken();
      return mpi_->allreduce(send, recv, count, dtype, op, true, stream);
    }
    return issue(blocking, nodes_ > 1, [=, this] {
      node_->set_operation("allreduce");
      if (nodes_ == 1) return node_->allreduce(send, recv, count, dtype, op);
      hier_allreduce(send, recv, count, dtype, op);
    });
  }

  std::unique_ptr<PendingOp> reduce_scatter(const void* send, void* recv, std::size_t count,
                                            DType dtype, ReduceOp op, ScatterPlace place,
                                            bool blocking, StreamHandle) override {
    const std::size_t es = dtype_size(dtype);
    const void* in = place == ScatterPlace::separate ? send
                     : place == ScatterPlace::at_start
                         ? recv
                         : static_cast<const char*>(recv) - rank() * count * es;
    return issue(blocking, nodes_ > 1, [=, this] {
      node_->set_operation("reduce_scatter");
      hier_reduce_scatter(in, recv, count, dtype, op);
    });
  }

  std::unique_ptr<PendingOp> allgather(const void* send, void* recv, std::size_t count, DType dtype,
                                       bool in_place, bool blocking, StreamHandle stream) override {
    if (blocking && mpi_is_faster(Collective::allgather, count * size() * dtype_size(dtype),
                                  in_place, dtype, ReduceOp::sum)) {
      throw_if_broken();
      return mpi_->allgather(send, recv, count, dtype, in_place, true, stream);
    }
    const void* own =
        in_place ? static_cast<const char*>(recv) + rank() * count * dtype_size(dtype) : send;
    return issue(blocking, nodes_ > 1, [=, this] {
      node_->set_operation("allgather");
      hier_allgather(own, recv, count, dtype);
    });
  }

  std::unique_ptr<PendingOp> broadcast(void* buf, std::size_t count, DType dtype, int root,
                                       bool blocking, StreamHandle stream) override {
    // Across nodes through MPI: its own order on its own communicator.
    if (nodes_ > 1) return mpi_->broadcast(buf, count, dtype, root, blocking, stream);
    if (blocking && mpi_is_faster(Collective::broadcast, count * dtype_size(dtype), true, dtype,
                                  ReduceOp::sum)) {
      throw_if_broken();
      return mpi_->broadcast(buf, count, dtype, root, true, stream);
    }
    return issue(blocking, false, [=, this] {
      node_->set_operation("broadcast");
      node_->broadcast(buf, count * dtype_size(dtype), root);
    });
  }

  std::unique_ptr<PendingOp> barrier(bool blocking, StreamHandle stream) override {
    if (nodes_ > 1) return mpi_->barrier(blocking, stream);
    return issue(blocking, false, [this] {
      node_->set_operation("barrier");
      node_->barrier();
    });
  }

 private:
  enum class Collective { allreduce, allgather, broadcast };

  // Whether MPI's own blocking collective moves `bytes` (the whole result on
  // each rank) faster than the node's slots: the rows of shardopt-bench-comm at
  // 2-4 ranks where shared memory lost by more than 10% in every round
  // (docs/benchmarks.md, "Where the transport's choice loses to MPI"):
  // - broadcast at 2 ranks from 64 KiB (MPI's single copy was as fast from
  //   64 to 256 KiB and faster above), and at 3 or more ranks up to 1 MiB
  //   (every rank waits for every other at each of the slots' steps, where
  //   MPI's tree waits only for the rank it receives from);
  // - in-place allreduce at 2 ranks from 256 KiB to 16 MiB: MPI's exchange
  //   reads the other rank's buffer once, the slots' two steps copy twice.
  //   Only where the two give the same bits: a sum of two values is the
  //   same in either order, but MPI's average of 16-bit floats rounds the
  //   sum before it divides, where shared memory rounds once;
  // - allgather at 4 or more ranks of 64 to 256 KiB in all.
  // Every other row, reduce-scatter's all, stays on shared memory. Measured
  // on a 2-core virtual machine at 2-4 ranks (3 and 4 oversubscribed); where
  // a node measures otherwise, SHARDOPT_HOST_COMM=shm keeps every operation
  // on shared memory.
  bool mpi_is_faster(Collective c, std::size_t bytes, bool in_place, DType t,
                     ReduceOp op) const noexcept {
    if (!per_size_) return false;
    constexpr std::size_t KiB = 1024, MiB = 1024 * KiB;
    const int ranks = size();
    switch (c) {
      case Collective::broadcast:
        return ranks == 2 ? bytes >= 64 * KiB : bytes <= MiB;
      case Collective::allreduce: {
        const bool half = t == DType::bf16 || t == DType::f16;
        return ranks == 2 && in_place && bytes >= 256 * KiB && bytes <= 16 * MiB &&
               !(half && op == ReduceOp::avg);
      }
      case Collective::allgather:
        return ranks >= 4 && bytes >= 64 * KiB && bytes <= 256 * KiB;
    }
    return false;
  }

  // The operations mpi_is_faster() picks run as the MPI backend's blocking
  // call, on the caller's thread (the worker may not call MPI): its
  // non-blocking form, which the watchdog could poll, was slower than shared
  // memory (Open MPI's in-place iallreduce of 4 MiB at 2 ranks took 2.7
  // times its allreduce); the watchdog's backstop reports a stall in it. No
  // wait for the worker's operations: those use the node's channel, the MPI
  // communicator keeps its own order, the same on every rank. They fail as
  // the others do once an operation has failed.
  void throw_if_broken() {
    std::lock_guard lk(m_);
    if (!broken_.empty()) throw_broken();
  }

  // Reduce-scatter over every rank: within the node (each place gets the
  // node's sums of the blocks of the ranks at its place on every node),
  // then across nodes among the ranks at one place: each sends every other
  // node its partial sum of that node's block and adds what it receives,
  // in node order. Every byte crosses the network once, where MPI's
  // reduce-scatter may reduce to one rank and scatter from it (Open MPI's
  // basic one: twice the bytes, over one rank's link).
  void hier_reduce_scatter(const void* in, void* out, std::size_t n, DType t, ReduceOp op) {
    if (nodes_ == 1) {
      node_->reduce_scatter(in, out, n, t, op, 1, blocks_);
      return;
    }
    const std::size_t es = dtype_size(t);
    const ReduceOp node_op = op == ReduceOp::avg ? ReduceOp::sum : op;
    auto* partial = static_cast<std::byte*>(scratch(2 * n * nodes_ * es));
    std::byte* received = partial + n * nodes_ * es;  // block m from node m
    node_->reduce_scatter(in, partial, n, t, node_op, nodes_, blocks_);
    exchange(
        n, t, [&](int m) { return partial + m * n * es; },
        [&](int m) { return received + m * n * es; }, "reduce_scatter across nodes");
    std::vector<const void*> srcs(static_cast<std::size_t>(nodes_));
    for (int m = 0; m < nodes_; ++m)
      srcs[m] = m == node_index_ ? partial + node_index_ * n * es : received + m * n * es;
    kernels::cpu::reduce_arrays(t, node_op, srcs.data(), nodes_, out, n);
    if (op == ReduceOp::avg) divide_elements(out, n, t, size());
  }

  // Allgather: across nodes among the ranks at one place (each sends its
  // block to every other node), then within the node.
  void hier_allgather(const void* own, void* out, std::size_t n, DType t) {
    if (nodes_ == 1) {
      node_->allgather(own, out, n, t, 1, blocks_);
      return;
    }
    const std::size_t es = dtype_size(t);
    auto* gathered = static_cast<std::byte*>(scratch(n * nodes_ * es));
    std::memcpy(gathered + node_index_ * n * es, own, n * es);
    exchange(
        n, t, [&](int) { return static_cast<const std::byte*>(own); },
        [&](int m) { return gathered + m * n * es; }, "allgather across nodes");
    node_->allgather(gathered, out, n, t, nodes_, blocks_);
  }

  // n elements from send_to(m) to every other node m, and into recv_from(m)
  // from each, at once (in pieces of at most max_chunk() elements).
  template <class SendTo, class RecvFrom>
  void exchange(std::size_t n, DType t, SendTo send_to, RecvFrom recv_from, const char* what) {
    const std::size_t es = dtype_size(t);
    const std::size_t chunk = std::max<std::size_t>(1, max_chunk());
    std::vector<MPI_Request> reqs;
    for (int m = 0; m < nodes_; ++m) {
      if (m == node_index_) continue;
      for (std::size_t off = 0; off < n; off += chunk) {
        const int len = static_cast<int>(std::min(chunk, n - off));
        reqs.push_back(MPI_REQUEST_NULL);
        SHARDOPT_CHECK_MPI(
            MPI_Irecv(recv_from(m) + off * es, len, mpi_datatype(t), m, 0, inter_, &reqs.back()),
            what);
        reqs.push_back(MPI_REQUEST_NULL);
        SHARDOPT_CHECK_MPI(
            MPI_Isend(send_to(m) + off * es, len, mpi_datatype(t), m, 0, inter_, &reqs.back()),
            what);
      }
    }
    finish_mpi(reqs, what);
  }

  // Across nodes: a reduce-scatter and an allgather of equal blocks (the
  // sums of a reduce-scatter, so an allreduce of a padded bucket adds as
  // its reduce-scatter does), and the few elements left over allreduced.
  void hier_allreduce(const void* send, void* recv, std::size_t n, DType t, ReduceOp op) {
    const std::size_t es = dtype_size(t);
    const std::size_t ranks = static_cast<std::size_t>(size());
    const std::size_t block = n / ranks;
    char* r = static_cast<char*>(recv);
    if (block > 0) {
      hier_reduce_scatter(send, r + rank() * block * es, block, t, op);
      hier_allgather(r + rank() * block * es, recv, block, t);
    }
    const std::size_t done = block * ranks;
    if (done < n) {
      const ReduceOp node_op = op == ReduceOp::avg ? ReduceOp::sum : op;
      node_->allreduce(static_cast<const char*>(send) + done * es, r + done * es, n - done, t,
                       node_op);
      std::vector<MPI_Request> req(1, MPI_REQUEST_NULL);
      SHARDOPT_CHECK_MPI(MPI_Iallreduce(MPI_IN_PLACE, r + done * es, static_cast<int>(n - done),
                                        mpi_datatype(t), mpi_op(t, node_op), inter_, &req[0]),
                         "allreduce across nodes");
      finish_mpi(req, "allreduce across nodes");
      if (op == ReduceOp::avg) divide_elements(r + done * es, n - done, t, size());
    }
  }

  // Completes an operation across nodes. On the caller's thread with the
  // watchdog armed, polled by it (a stall across nodes is then reported at
  // the timeout, like one of MPI's own operations); otherwise waited for.
  void finish_mpi(std::vector<MPI_Request>& reqs, const char* what) {
    const int count = static_cast<int>(reqs.size());
    if (watchdog_armed() && std::this_thread::get_id() != worker_id_) {
      watch_poll(
          [&] {
            int flag = 0;
            SHARDOPT_CHECK_MPI(MPI_Testall(count, reqs.data(), &flag, MPI_STATUSES_IGNORE), what);
            return flag != 0;
          },
          watch.get());
      return;
    }
    SHARDOPT_CHECK_MPI(MPI_Waitall(count, reqs.data(), MPI_STATUSES_IGNORE), what);
  }

  // Backend-owned memory for the node phase of hier (one operation runs
  // at a time).
  void* scratch(std::size_t bytes) {
    if (scratch_.size() < bytes) scratch_.resize(bytes);
    return scratch_.data();
  }

  // Runs fn now on this thread (blocking, or a non-blocking operation that
  // needs MPI where the worker may not call it), after what the worker
  // has; or queues it for the worker.
  std::unique_ptr<PendingOp> issue(bool blocking, bool uses_mpi, std::function<void()> fn) {
    if (blocking || (uses_mpi && !background_)) {
      run_here(fn);
      return blocking ? nullptr : std::make_unique<TaskPending>(done_task());
    }
    auto t = std::make_shared<Task>();
    t->run = std::move(fn);
    {
      std::lock_guard lk(m_);
      if (!broken_.empty()) throw_broken();
      if (!worker_.joinable()) {
        worker_ = std::thread([this] { work(); });
        worker_id_ = worker_.get_id();
      }
      queue_.push_back(t);
    }
    cv_.notify_all();
    return std::make_unique<TaskPending>(std::move(t));
  }

  static std::shared_ptr<Task> done_task() {
    auto t = std::make_shared<Task>();
    t->done.store(true);
    return t;
  }

  void run_here(const std::function<void()>& fn) {
    std::unique_lock lk(m_);
    cv_.wait(lk, [&] { return queue_.empty() && !busy_; });
    if (!broken_.empty()) throw_broken();
    busy_ = true;
    lk.unlock();
    // On this thread the watchdog polls the waits for the node's ranks, so
    // that this rank answers its questions there too.
    const NodeChannel::Waiter poll = [this](const std::function<bool()>& attempt) {
      watch_poll(attempt, watch.get());
    };
    if (watchdog_armed()) node_->set_waiter(&poll);
    try {
      fn();
    } catch (...) {
      node_->set_waiter(nullptr);
      note_broken();
      release();
      throw;
    }
    node_->set_waiter(nullptr);
    release();
  }
  void release() {
    {
      std::lock_guard lk(m_);
      busy_ = false;
    }
    cv_.notify_all();
  }

  void work() {
    std::unique_lock lk(m_);
    for (;;) {
      cv_.wait(lk, [&] { return stopping_ || (!queue_.empty() && !busy_); });
      if (queue_.empty()) return;  // stopping with nothing left
      std::shared_ptr<Task> t = std::move(queue_.front());
      queue_.pop_front();
      busy_ = true;
      const bool broken = !broken_.empty();
      if (broken) t->error = broken_error();
      lk.unlock();
      if (!broken) {
        try {
          t->run();
        } catch (...) {
          t->error = std::current_exception();
          note_broken();
        }
      }
      t->run = nullptr;
      t->done.store(true, std::memory_order_release);
      t->done.notify_all();
      { const std::lock_guard waiters(t->m); }
      t->cv.notify_all();
      lk.lock();
      busy_ = false;
      cv_.notify_all();
    }
  }

  void stop_worker() {
    {
      std::lock_guard lk(m_);
      stopping_ = true;
      if (!queue_.empty() || busy_) node_->stop();  // a wait that may never end
    }
    cv_.notify_all();
    if (worker_.joinable()) worker_.join();
  }

  // broken_ is guarded by m_. After a failed operation the ranks' steps no longer match: every
  // later operation fails with the first error. Called in a catch block.
  void note_broken() {
    std::string what = "unknown error";
    try {
      throw;
    } catch (const std::exception& e) {
      what = e.what();
    } catch (...) {
    }
    std::lock_guard lk(m_);
    if (broken_.empty()) broken_ = what;
  }
  std::exception_ptr broken_error() const {
    try {
      throw_broken();
    } catch (...) {
      return std::current_exception();
    }
    return nullptr;
  }
  [[noreturn]] void throw_broken() const {
    SHARDOPT_THROW(mpi,
                   std::string("a shared-memory collective of this communicator failed "
                               "earlier: ") +
                       broken_,
                   "a communicator whose operation failed cannot be used again; end the job");
  }

  std::unique_ptr<Backend> mpi_;
  std::shared_ptr<NodeChannel> node_;  // shared with the node access's parts
  std::unique_ptr<NodeAccess> access_;
  MPI_Comm inter_;
  std::vector<int> rank_at_;
  std::vector<int> blocks_;
  int nodes_, local_;
  bool per_size_;       // mpi_is_faster's choice in use
  int node_index_ = 0;  // this rank's node: its rank across nodes
  bool background_ = true;
  std::vector<char> scratch_;
  std::string broken_;

  std::mutex m_;
  std::condition_variable cv_;
  std::deque<std::shared_ptr<Task>> queue_;
  bool busy_ = false;
  bool stopping_ = false;
  std::thread worker_;
  std::thread::id worker_id_;  // set under m_ before the worker takes a task
};

const char* choice_name(HostComm c) {
  switch (c) {
    case HostComm::automatic:
      return "auto";
    case HostComm::mpi:
      return "mpi";
    case HostComm::shm:
      return "shm";
    case HostComm::hier:
      return "hier";
  }
  return "?";
}

}  // namespace

std::unique_ptr<Backend> make_host_backend(std::unique_ptr<Backend> mpi, const NodeLayout& nodes,
                                           HostComm choice, std::size_t slot_bytes,
                                           std::size_t single_copy_bytes) {
  const MPI_Comm comm = mpi->mpi_comm();
  const int size = mpi->size(), rank = mpi->rank();
  // The choice must be the same everywhere (CommOptions is per rank).
  int seen[2] = {static_cast<int>(choice), -static_cast<int>(choice)};
  SHARDOPT_CHECK_MPI(MPI_Allreduce(MPI_IN_PLACE, seen, 2, MPI_INT, MPI_MAX, comm),
                     "agreeing on how host buffers move");
  if (seen[0] != -seen[1]) {
    SHARDOPT_THROW(invalid_config,
                   "Communicator: the ranks ask for different transports of host buffers "
                   "(CommOptions::host_comm or SHARDOPT_HOST_COMM): " +
                       std::string(choice_name(static_cast<HostComm>(-seen[1]))) + " and " +
                       choice_name(static_cast<HostComm>(seen[0])),
                   "pass the same CommOptions::host_comm on every rank");
  }
  const bool several = nodes.nodes > 1;
  if (choice == HostComm::shm && several) {
    SHARDOPT_THROW(invalid_config,
                   "SHARDOPT_HOST_COMM=shm (or CommOptions::host_comm) needs every rank on one "
                   "node, but this communicator has " +
                       nodes.summary(),
                   "use hier (shared memory within each node, MPI across) or auto, or mpi");
  }
  if (choice == HostComm::hier && !nodes.uniform) {
    SHARDOPT_THROW(invalid_config,
                   "SHARDOPT_HOST_COMM=hier (or CommOptions::host_comm) needs the same number "
                   "of ranks on every node, but this communicator has " +
                       nodes.summary(),
                   "launch as many ranks on each node (srun --ntasks-per-node, mpirun "
                   "--map-by ppr:N:node), or use auto or mpi");
  }
  if (choice == HostComm::mpi) return mpi;
  if (choice == HostComm::automatic &&
      (size == 1 || !nodes.uniform || (several && nodes.local_ranks < 2))) {
    return mpi;
  }
  // The node's ranks, and the ranks at this rank's place on every node.
  MPI_Comm node_comm = MPI_COMM_NULL;
  SHARDOPT_CHECK_MPI(MPI_Comm_split(comm, nodes.node, rank, &node_comm),
                     "grouping the ranks of each node");
  std::string error;
  auto channel = NodeChannel::create(node_comm, slot_bytes, single_copy_bytes, error);
  MPI_Comm_free(&node_comm);
  // One rank's failure decides for all: the first failing rank's reason.
  int first = channel ? size : rank;
  SHARDOPT_CHECK_MPI(MPI_Allreduce(MPI_IN_PLACE, &first, 1, MPI_INT, MPI_MIN, comm),
                     "agreeing on the shared memory");
  if (first < size) {
    char text[1024] = {};
    if (rank == first) std::snprintf(text, sizeof text, "%s", error.c_str());
    SHARDOPT_CHECK_MPI(MPI_Bcast(text, sizeof text, MPI_CHAR, first, comm),
                       "sending why the shared memory failed");
    const std::string why = "rank " + std::to_string(first) + ": " + text;
    if (choice == HostComm::automatic) {
      if (rank == 0) {
        SHARDOPT_LOG(warn, "Communicator: shared-memory collectives unavailable ("
                               << why << "); host buffers move through MPI instead");
      }
      return mpi;
    }
    SHARDOPT_THROW(invalid_config,
                   std::string("SHARDOPT_HOST_COMM=") + choice_name(choice) +
                       " cannot make the node's shared memory: " + why,
                   "make /dev/shm larger (a container's --shm-size, or the tmpfs mount), lower "
                   "SHARDOPT_SHM_CHUNK_KB (each communicator maps 2 x it x the node's ranks), "
                   "or set SHARDOPT_HOST_COMM=auto (falls back to MPI) or mpi");
  }
  MPI_Comm inter = MPI_COMM_NULL;
  std::vector<int> rank_at(static_cast<std::size_t>(size));
  if (several) {
    SHARDOPT_CHECK_MPI(MPI_Comm_split(comm, nodes.local_rank, nodes.node, &inter),
                       "grouping the ranks at each place of the nodes");
    SHARDOPT_CHECK_MPI(MPI_Comm_set_errhandler(inter, MPI_ERRORS_RETURN),
                       "setting MPI_ERRORS_RETURN across nodes");
  }
  // Place of each rank in its node: ranks of a node in rank order.
  std::vector<int> seen_on(static_cast<std::size_t>(nodes.nodes), 0);
  for (int r = 0; r < size; ++r) {
    const int m = nodes.node_of_rank[r];
    rank_at[static_cast<std::size_t>(m) * nodes.local_ranks + seen_on[m]++] = r;
  }
  return std::make_unique<ShmBackend>(std::move(mpi), std::move(channel), inter, std::move(rank_at),
                                      nodes.nodes, choice == HostComm::automatic);
}

}  // namespace shardopt::detail
