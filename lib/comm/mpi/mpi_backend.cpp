// The MPI backend for host buffers: each operation maps to the MPI collective
// of the same meaning on a duplicated communicator. Operations larger than the
// chunk limit are split so that no single MPI call sees more than
// max_chunk elements (reduce-scatter and allgather then run as one reduce or
// broadcast per rank and chunk, since their per-call size is count * ranks).
#include <mpi.h>

#include <algorithm>
#include <cstring>
#include <functional>
#include <string>
#include <vector>

#include "comm/backend.hpp"
#include "comm/mpi/mpi_types.hpp"
#include "common/check.hpp"
#include "common/log.hpp"
#include "device/device.hpp"

namespace shardopt::detail {

namespace {

// Local work to do once the MPI requests of an operation have completed.
using Finish = std::function<void()>;

class MpiPending final : public PendingOp {
 public:
  MpiPending(const char* what, std::vector<MPI_Request> requests, Finish finish)
      : what_(what), requests_(std::move(requests)), finish_(std::move(finish)) {}

  void wait() override {
    if (done_) return;
    SHARDOPT_CHECK_MPI(
        MPI_Waitall(static_cast<int>(requests_.size()), requests_.data(), MPI_STATUSES_IGNORE),
        std::string("waiting for ") + what_);
    complete();
  }

  bool test() override {
    if (done_) return true;
    int flag = 0;
    SHARDOPT_CHECK_MPI(MPI_Testall(static_cast<int>(requests_.size()), requests_.data(), &flag,
                                   MPI_STATUSES_IGNORE),
                       std::string("testing ") + what_);
    if (flag) complete();
    return flag != 0;
  }

 private:
  void complete() {
    done_ = true;
    if (finish_) finish_();
  }

  const char* what_;
  std::vector<MPI_Request> requests_;
  Finish finish_;
  bool done_ = false;
};

// Issues MPI calls either blocking or non-blocking, so each operation's
// algorithm is written once.
class Issuer {
 public:
  Issuer(const char* what, MPI_Comm comm, bool blocking)
      : what_(what), comm_(comm), blocking_(blocking) {}

  void allreduce(const void* s, void* r, std::size_t n, MPI_Datatype t, MPI_Op op) {
    if (blocking_) {
      SHARDOPT_CHECK_MPI(MPI_Allreduce(s, r, as_int(n), t, op, comm_), what_);
    } else {
      SHARDOPT_CHECK_MPI(MPI_Iallreduce(s, r, as_int(n), t, op, comm_, next()), what_);
    }
  }
  void reduce_scatter_block(const void* s, void* r, std::size_t n, MPI_Datatype t, MPI_Op op) {
    if (blocking_) {
      SHARDOPT_CHECK_MPI(MPI_Reduce_scatter_block(s, r, as_int(n), t, op, comm_), what_);
    } else {
      SHARDOPT_CHECK_MPI(MPI_Ireduce_scatter_block(s, r, as_int(n), t, op, comm_, next()), what_);
    }
  }
  void reduce(const void* s, void* r, std::size_t n, MPI_Datatype t, MPI_Op op, int root) {
    if (blocking_) {
      SHARDOPT_CHECK_MPI(MPI_Reduce(s, r, as_int(n), t, op, root, comm_), what_);
    } else {
      SHARDOPT_CHECK_MPI(MPI_Ireduce(s, r, as_int(n), t, op, root, comm_, next()), what_);
    }
  }
  void allgather(const void* s, void* r, std::size_t n, MPI_Datatype t) {
    if (blocking_) {
      SHARDOPT_CHECK_MPI(MPI_Allgather(s, as_int(n), t, r, as_int(n), t, comm_), what_);
    } else {
      SHARDOPT_CHECK_MPI(MPI_Iallgather(s, as_int(n), t, r, as_int(n), t, comm_, next()), what_);
    }
  }
  void bcast(void* b, std::size_t n, MPI_Datatype t, int root) {
    if (blocking_) {
      SHARDOPT_CHECK_MPI(MPI_Bcast(b, as_int(n), t, root, comm_), what_);
    } else {
      SHARDOPT_CHECK_MPI(MPI_Ibcast(b, as_int(n), t, root, comm_, next()), what_);
    }
  }
  void barrier() {
    if (blocking_) {
      SHARDOPT_CHECK_MPI(MPI_Barrier(comm_), what_);
    } else {
      SHARDOPT_CHECK_MPI(MPI_Ibarrier(comm_, next()), what_);
    }
  }

  // Blocking: runs `finish` now and returns null. Non-blocking: hands the
  // requests and `finish` to the returned op.
  std::unique_ptr<PendingOp> done(Finish finish = {}) {
    if (blocking_) {
      if (finish) finish();
      return nullptr;
    }
    return std::make_unique<MpiPending>(what_, std::move(requests_), std::move(finish));
  }

 private:
  static int as_int(std::size_t n) { return static_cast<int>(n); }  // n <= max_chunk <= INT_MAX
  MPI_Request* next() {
    requests_.push_back(MPI_REQUEST_NULL);
    return &requests_.back();
  }

  const char* what_;
  MPI_Comm comm_;
  bool blocking_;
  std::vector<MPI_Request> requests_;
};

// Calls f(offset, length) for consecutive chunks of at most `chunk` elements
// covering [0, count); once with length 0 when count is 0, so every rank
// still enters the collective.
template <class F>
void for_each_chunk(std::size_t count, std::size_t chunk, F f) {
  if (count == 0) {
    f(std::size_t{0}, std::size_t{0});
    return;
  }
  for (std::size_t off = 0; off < count; off += chunk) f(off, std::min(chunk, count - off));
}

char* at(void* p, std::size_t elements, std::size_t elem_size) {
  return static_cast<char*>(p) + elements * elem_size;
}
const char* at(const void* p, std::size_t elements, std::size_t elem_size) {
  return static_cast<const char*>(p) + elements * elem_size;
}

class MpiHostBackend final : public Backend {
 public:
  MpiHostBackend(MPI_Comm comm, std::size_t max_chunk) : max_chunk_(max_chunk) {
    SHARDOPT_CHECK_MPI(MPI_Comm_dup(comm, &comm_), "duplicating the communicator");
    SHARDOPT_CHECK_MPI(MPI_Comm_set_errhandler(comm_, MPI_ERRORS_RETURN),
                       "setting MPI_ERRORS_RETURN on the duplicated communicator");
    SHARDOPT_CHECK_MPI(MPI_Comm_rank(comm_, &rank_), "querying the rank");
    SHARDOPT_CHECK_MPI(MPI_Comm_size(comm_, &size_), "querying the size");
    if (watchdog_armed()) watch = std::make_shared<WatchChannel>(comm_);
    SHARDOPT_LOG(info, "Communicator: mpi-host backend, rank " << rank_ << " of " << size_
                                                               << ", max chunk " << max_chunk_
                                                               << " elements");
  }

  ~MpiHostBackend() override = default;  // the Communicator decides when to free

  const char* name() const noexcept override { return "mpi-host"; }
  int rank() const noexcept override { return rank_; }
  int size() const noexcept override { return size_; }
  MPI_Comm mpi_comm() const noexcept override { return comm_; }
  std::size_t max_chunk() const noexcept override { return max_chunk_; }
  bool accepts(const MemoryLocation& where) const noexcept override {
    return where.kind == MemoryKind::host;
  }

  void free() override {
    if (comm_ == MPI_COMM_NULL) return;
    if (watch) watch->free();
    SHARDOPT_CHECK_MPI(MPI_Comm_free(&comm_), "freeing the duplicated communicator");
    comm_ = MPI_COMM_NULL;
  }
  bool freed() const noexcept override { return comm_ == MPI_COMM_NULL; }

  // On one rank a collective's result is its input: a copy when out of
  // place, nothing in place, done here for host buffers. Open MPI 4.1 runs a
  // one-rank reduce-scatter through its general path at 1.4 GB/s, a sixth
  // of a copy (docs/benchmarks.md, "shardopt-plan against measured steps").
  bool alone(const void* send, void* recv, std::size_t bytes) const {
    if (size_ != 1 || locate(send).kind != MemoryKind::host ||
        locate(recv).kind != MemoryKind::host)
      return false;
    if (send != recv && bytes != 0) std::memcpy(recv, send, bytes);
    return true;
  }

  std::unique_ptr<PendingOp> allreduce(const void* send, void* recv, std::size_t count, DType dtype,
                                       ReduceOp op, bool blocking, StreamHandle) override {
    if (alone(send, recv, count * dtype_size(dtype))) return nullptr;
    const MPI_Datatype t = mpi_datatype(dtype);
    const MPI_Op mop = mpi_op(dtype, op);
    const bool in_place = send == recv;
    if (blocking && count <= max_chunk_ && (op != ReduceOp::avg || size_ == 1)) {
      // The common case, kept to the bare MPI call.
      SHARDOPT_CHECK_MPI(MPI_Allreduce(in_place ? MPI_IN_PLACE : send, recv,
                                       static_cast<int>(count), t, mop, comm_),
                         "allreduce");
      return nullptr;
    }
    Issuer issue("allreduce", comm_, blocking);
    const std::size_t es = dtype_size(dtype);
    for_each_chunk(count, max_chunk_, [&](std::size_t off, std::size_t n) {
      issue.allreduce(in_place ? MPI_IN_PLACE : at(send, off, es), at(recv, off, es), n, t, mop);
    });
    return issue.done(averager(op, recv, count, dtype));
  }

  std::unique_ptr<PendingOp> reduce_scatter(const void* send, void* recv, std::size_t count,
                                            DType dtype, ReduceOp op, ScatterPlace place,
                                            bool blocking, StreamHandle) override {
    if (alone(send, recv, count * dtype_size(dtype))) return nullptr;
    const MPI_Datatype t = mpi_datatype(dtype);
    const MPI_Op mop = mpi_op(dtype, op);
    if (blocking && place != ScatterPlace::at_own_block &&
        count * static_cast<std::size_t>(size_) <= max_chunk_ &&
        (op != ReduceOp::avg || size_ == 1)) {
      SHARDOPT_CHECK_MPI(
          MPI_Reduce_scatter_block(place == ScatterPlace::at_start ? MPI_IN_PLACE : send, recv,
                                   static_cast<int>(count), t, mop, comm_),
          "reduce_scatter");
      return nullptr;
    }
    Issuer issue("reduce_scatter", comm_, blocking);
    const std::size_t es = dtype_size(dtype);
    const std::size_t block_bytes = count * es;
    // For the in-place forms, the whole input buffer.
    char* whole = place == ScatterPlace::at_own_block ? at(recv, 0, es) - rank_ * block_bytes
                                                      : static_cast<char*>(recv);
    Finish finish;
    if (count * static_cast<std::size_t>(size_) <= max_chunk_) {
      if (place == ScatterPlace::separate) {
        issue.reduce_scatter_block(send, recv, count, t, mop);
      } else {
        // MPI's in-place form leaves the result at the start of the buffer.
        issue.reduce_scatter_block(MPI_IN_PLACE, whole, count, t, mop);
        if (place == ScatterPlace::at_own_block && rank_ != 0 && count != 0) {
          finish = [recv, whole, block_bytes] { std::memmove(recv, whole, block_bytes); };
        }
      }
    } else {
      // One reduce per destination rank and chunk.
      for_each_chunk(
          count, std::max<std::size_t>(1, max_chunk_), [&](std::size_t off, std::size_t n) {
            for (int root = 0; root < size_; ++root) {
              const std::size_t block = static_cast<std::size_t>(root) * count;
              if (root != rank_) {
                const void* src = place == ScatterPlace::separate ? at(send, block + off, es)
                                                                  : at(whole, block + off, es);
                issue.reduce(src, nullptr, n, t, mop, root);
              } else if (place == ScatterPlace::separate) {
                issue.reduce(at(send, block + off, es), at(recv, off, es), n, t, mop, root);
              } else {
                issue.reduce(MPI_IN_PLACE, at(whole, block + off, es), n, t, mop, root);
              }
            }
          });
      if (place == ScatterPlace::at_start && rank_ != 0 && count != 0) {
        char* own = whole + rank_ * block_bytes;
        finish = [whole, own, block_bytes] { std::memmove(whole, own, block_bytes); };
      }
    }
    Finish avg = averager(op, recv, count, dtype);
    if (avg) {
      finish = finish ? Finish([finish, avg] {
        finish();
        avg();
      })
                      : avg;
    }
    return issue.done(std::move(finish));
  }

  std::unique_ptr<PendingOp> allgather(const void* send, void* recv, std::size_t count, DType dtype,
                                       bool in_place, bool blocking, StreamHandle) override {
    if (alone(in_place ? recv : send, recv, count * dtype_size(dtype))) return nullptr;
    const MPI_Datatype t = mpi_datatype(dtype);
    if (blocking && count * static_cast<std::size_t>(size_) <= max_chunk_) {
      SHARDOPT_CHECK_MPI(MPI_Allgather(in_place ? MPI_IN_PLACE : send, static_cast<int>(count), t,
                                       recv, static_cast<int>(count), t, comm_),
                         "allgather");
      return nullptr;
    }
    Issuer issue("allgather", comm_, blocking);
    const std::size_t es = dtype_size(dtype);
    if (count * static_cast<std::size_t>(size_) <= max_chunk_) {
      issue.allgather(in_place ? MPI_IN_PLACE : send, recv, count, t);
      return issue.done();
    }
    // One broadcast per source rank and chunk, this rank's block put in place first.
    if (!in_place && count != 0) {
      std::memcpy(at(recv, static_cast<std::size_t>(rank_) * count, es), send, count * es);
    }
    for_each_chunk(count, max_chunk_, [&](std::size_t off, std::size_t n) {
      for (int root = 0; root < size_; ++root) {
        issue.bcast(at(recv, static_cast<std::size_t>(root) * count + off, es), n, t, root);
      }
    });
    return issue.done();
  }

  std::unique_ptr<PendingOp> broadcast(void* buf, std::size_t count, DType dtype, int root,
                                       bool blocking, StreamHandle) override {
    const MPI_Datatype t = mpi_datatype(dtype);
    if (blocking && count <= max_chunk_) {
      SHARDOPT_CHECK_MPI(MPI_Bcast(buf, static_cast<int>(count), t, root, comm_), "broadcast");
      return nullptr;
    }
    Issuer issue("broadcast", comm_, blocking);
    const std::size_t es = dtype_size(dtype);
    for_each_chunk(count, max_chunk_, [&](std::size_t off, std::size_t n) {
      issue.bcast(at(buf, off, es), n, t, root);
    });
    return issue.done();
  }

  std::unique_ptr<PendingOp> barrier(bool blocking, StreamHandle) override {
    Issuer issue("barrier", comm_, blocking);
    issue.barrier();
    return issue.done();
  }

 private:
  // The division of avg, or nothing.
  Finish averager(ReduceOp op, void* buf, std::size_t count, DType dtype) const {
    if (op != ReduceOp::avg || count == 0 || size_ == 1) return {};
    const int n = size_;
    return [buf, count, dtype, n] { divide_elements(buf, count, dtype, n); };
  }

  MPI_Comm comm_ = MPI_COMM_NULL;
  int rank_ = 0;
  int size_ = 1;
  std::size_t max_chunk_;
};

}  // namespace

std::unique_ptr<Backend> make_mpi_host_backend(MPI_Comm comm, std::size_t max_chunk) {
  return std::make_unique<MpiHostBackend>(comm, max_chunk);
}

}  // namespace shardopt::detail
