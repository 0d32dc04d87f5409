// shardopt: the communicator, the first layer of the library.
//
// A Communicator wraps an existing MPI communicator: it duplicates it (so
// shardopt's traffic never mixes with the caller's), sets MPI_ERRORS_RETURN on
// the duplicate (so MPI failures become shardopt::CommError, not aborts), and
// never touches the lifetime of the communicator it was given.
//
// Every operation below is collective over the communicator: all ranks call
// it, in the same order, with the same count, dtype and op (and root). Buffers
// belong to the caller; a blocking call is done with them when it returns, a
// non-blocking one when its Request completes (wait() or test() == true).
//
// In-place forms, chosen by the pointers passed (the conventions of MPI and
// NCCL both work):
//   allreduce:      recv == send.
//   reduce_scatter: recv == send (MPI style: this rank's block is written to
//                   the start of the buffer), or recv == send + rank*count
//                   (NCCL style: the block stays where it is).
//   allgather:      send == recv + rank*count (this rank's block is read from
//                   its place in the output).
//   broadcast:      always in place.
// Device buffers (CUDA device memory; all buffers of one call on one device,
// the one the stream belongs to) are moved by the device's own collectives
// (NCCL), or through pinned host memory by the staged backend with any MPI
// (it needs MPI_THREAD_MULTIPLE): CommOptions::device_comm. They are
// ordered on the communicator's stream (CommOptions::stream): an operation
// starts after the work enqueued there before the call. A blocking call on
// device buffers returns when the result is in them (the host waits); a
// non-blocking one returns at once, and its Request's wait() makes the
// stream wait for the result without the host waiting (test() asks without
// waiting). docs/gpu.md has the details.
// Counts are element counts of type std::size_t; counts past INT_MAX are sent
// in chunks of at most CommOptions::max_chunk_elements elements.
#pragma once

// mpi.h without Open MPI's and MPICH's deprecated C++ bindings, which need a
// library of their own (libmpi_cxx) at link time: shardopt and its users
// need MPI's C API only. (Where the program includes mpi.h first, its own
// flags decide: pkg-config --cflags shardopt gives these two definitions.)
#ifndef OMPI_SKIP_MPICXX
#define OMPI_SKIP_MPICXX 1
#endif
#ifndef MPICH_SKIP_MPICXX
#define MPICH_SKIP_MPICXX 1
#endif
#include <mpi.h>

#include <cstddef>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "shardopt/config.hpp"
#include "shardopt/export.h"
#include "shardopt/types.hpp"

namespace shardopt {

class Communicator;
namespace detail {
class PendingOp;
class Backend;
Backend& backend_of(Communicator& comm);  // shardopt internal (lib/comm/backend.hpp)
}  // namespace detail

// The handle of a non-blocking operation. Move-only. Destroying a Request
// that has not completed waits for it (a warning is logged): MPI requires
// the buffers to stay valid until then, and so does shardopt.
class SHARDOPT_API Request {
 public:
  Request() noexcept;
  explicit Request(std::unique_ptr<detail::PendingOp> op) noexcept;
  Request(Request&&) noexcept;
  Request& operator=(Request&&) noexcept;
  Request(const Request&) = delete;
  Request& operator=(const Request&) = delete;
  ~Request();

  // Blocks until the operation is complete and its result is in the output
  // buffer. Local. Throws CommError if the operation failed. A Request that
  // is already complete (or empty) returns at once.
  void wait();
  // True once the operation is complete (then as wait()). Local, never blocks.
  bool test();
  // True while the operation has not completed through wait() or test().
  bool pending() const noexcept { return op_ != nullptr; }

 private:
  std::unique_ptr<detail::PendingOp> op_;
};

struct CommOptions {
  // Largest number of elements handed to one MPI call; larger operations are
  // split into chunks. 0 takes SHARDOPT_COMM_MAX_CHUNK (default INT_MAX).
  std::size_t max_chunk_elements = 0;
  // Before each operation, exchange every rank's arguments (one small
  // allgather) so that a bad argument on one rank, or ranks passing
  // different counts, types, ops or roots, or calling different operations,
  // is an error on every rank instead of a hang or a silent truncation.
  // Unset takes SHARDOPT_CHECK_ARGS (default off: it costs a collective per
  // call, so turn it on while debugging).
  std::optional<bool> check_arguments = std::nullopt;
  // The CUDA stream (a cudaStream_t) operations on device buffers are
  // ordered on; null: the device's default stream. Unused for host buffers.
  void* stream = nullptr;
  // How device buffers move (DeviceComm, shardopt/config.hpp). Unset takes
  // SHARDOPT_DEVICE_COMM (default automatic). The same on every rank.
  std::optional<DeviceComm> device_comm = std::nullopt;
  // How host buffers move (HostComm, shardopt/config.hpp). Unset takes
  // SHARDOPT_HOST_COMM (default automatic). The same on every rank.
  std::optional<HostComm> host_comm = std::nullopt;
};

// Which ranks of a communicator share a node: a shared-memory domain, as
// MPI_Comm_split_type(MPI_COMM_TYPE_SHARED) finds them (one host, or one
// host's part its launcher made a node of). Nodes are numbered in the order
// of their lowest rank, so node 0 holds rank 0; a node's ranks are numbered
// (local_rank) in rank order. All but node and local_rank are the same on
// every rank.
struct SHARDOPT_API NodeLayout {
  int node = 0;                     // this rank's node
  int nodes = 1;                    // how many nodes the communicator spans
  int local_rank = 0;               // this rank's place among its node's ranks
  int local_ranks = 1;              // how many ranks this rank's node holds
  std::vector<int> ranks_per_node;  // per node, by node index
  std::vector<int> node_of_rank;    // per rank of the communicator, its node
  bool uniform = true;              // every node holds as many ranks as node 0

  // "4 ranks on 2 nodes (2 per node)", "1 rank on 1 node", or, uneven,
  // "5 ranks on 2 nodes (per node: 3, 2)" (the first 16 nodes' counts, then
  // the range). Local.
  std::string summary() const;
};

class SHARDOPT_API Communicator {
 public:
  // Collective over `comm`: duplicates it, and finds which ranks share a
  // node (nodes()). Throws MpiStateError if MPI is not initialized or
  // already finalized, InvalidArgument for MPI_COMM_NULL or an
  // intercommunicator, ConfigError for a bad SHARDOPT_* variable. The
  // SHARDOPT_* variables that change what the ranks do together (docs/env.md)
  // must be the same on every rank: a bad value on some ranks, or values
  // that differ between ranks, is a ConfigError on every rank naming the
  // variable, its value on rank 0 and on the first rank that differs, and
  // that rank's host (before any other collective, so that no rank hangs).
  // The check and the node layout cost one MPI_Comm_split_type and one
  // allgather of 16 bytes per rank over `comm`.
  explicit Communicator(MPI_Comm comm, CommOptions options = {});
  Communicator(Communicator&&) noexcept;
  Communicator& operator=(Communicator&&) noexcept;
  Communicator(const Communicator&) = delete;
  Communicator& operator=(const Communicator&) = delete;
  // Frees the duplicate if free() was not called and MPI is still running.
  // Never throws.
  ~Communicator();

  // Collective: frees the duplicated communicator now. Afterwards every
  // operation throws StateError. Calling it twice is harmless.
  void free();
  bool is_freed() const noexcept;

  int rank() const;
  int size() const;
  // Which ranks share a node, found at construction. Local. Memory is a
  // node's: a node holds the sum over its ranks of what each allocates
  // (ZeroRedundancyOptimizer::memory_report() is one rank's).
  const NodeLayout& nodes() const;
  // The duplicated MPI communicator (owned by this object).
  MPI_Comm mpi_comm() const;
  // The name of the backend in use for host buffers ("shm": shared memory
  // on one node; "hier": shared memory within nodes and MPI across;
  // "mpi-host": MPI's own collectives; CommOptions::host_comm), and for
  // device buffers ("staged", "nccl"; "none" when no rank has a device).
  const char* backend_name() const;
  const char* device_backend_name() const;
  std::size_t max_chunk_elements() const;
  // Whether arguments are agreed across ranks before each operation.
  bool checks_arguments() const noexcept { return check_args_; }
  // The stream operations on device buffers are ordered on (CommOptions).
  void* stream() const noexcept { return stream_; }
  void set_stream(void* stream) noexcept { stream_ = stream; }

  // recv[i] = op over ranks of send[i], i < count, on every rank.
  void allreduce(const void* send, void* recv, std::size_t count, DType dtype, ReduceOp op);
  // send holds size()*count elements, block r at send + r*count; rank r
  // receives op over ranks of block r into recv (count elements).
  void reduce_scatter(const void* send, void* recv, std::size_t count, DType dtype, ReduceOp op);
  // recv holds size()*count elements; block r receives rank r's send.
  void allgather(const void* send, void* recv, std::size_t count, DType dtype);
  // buf (count elements) of rank `root` is copied to every rank's buf.
  void broadcast(void* buf, std::size_t count, DType dtype, int root);
  void barrier();

  // Non-blocking forms: the same semantics, completed through the Request.
  // Several may be outstanding; they may be completed in any order.
  [[nodiscard]] Request iallreduce(const void* send, void* recv, std::size_t count, DType dtype,
                                   ReduceOp op);
  [[nodiscard]] Request ireduce_scatter(const void* send, void* recv, std::size_t count,
                                        DType dtype, ReduceOp op);
  [[nodiscard]] Request iallgather(const void* send, void* recv, std::size_t count, DType dtype);
  [[nodiscard]] Request ibroadcast(void* buf, std::size_t count, DType dtype, int root);
  [[nodiscard]] Request ibarrier();

  // Typed conveniences over std::span (the count is the span's size; for
  // reduce_scatter and allgather, the per-rank block is the smaller span).
  template <class T>
  void allreduce(std::span<T> buf, ReduceOp op) {
    allreduce(buf.data(), buf.data(), buf.size(), dtype_of<std::remove_cv_t<T>>(), op);
  }
  template <class T>
  void allreduce(std::span<const T> send, std::span<T> recv, ReduceOp op) {
    check_span_sizes(send.size(), recv.size(), 1);
    allreduce(send.data(), recv.data(), recv.size(), dtype_of<T>(), op);
  }
  template <class T>
  void reduce_scatter(std::span<const T> send, std::span<T> recv, ReduceOp op) {
    check_span_sizes(send.size(), recv.size(), size());
    reduce_scatter(send.data(), recv.data(), recv.size(), dtype_of<T>(), op);
  }
  template <class T>
  void allgather(std::span<const T> send, std::span<T> recv) {
    check_span_sizes(recv.size(), send.size(), size());
    allgather(send.data(), recv.data(), send.size(), dtype_of<T>());
  }
  template <class T>
  void broadcast(std::span<T> buf, int root) {
    broadcast(buf.data(), buf.size(), dtype_of<T>(), root);
  }

 private:
  // Throws InvalidArgument unless big == factor * small.
  void check_span_sizes(std::size_t big, std::size_t small, int factor) const;
  void require_usable(const char* what) const;
  void release() noexcept;
  void choose_device_backend(MPI_Comm comm, DeviceComm choice);
  friend detail::Backend& detail::backend_of(Communicator& comm);

  std::unique_ptr<detail::Backend> backend_;
  NodeLayout nodes_;
  bool check_args_ = false;
  void* stream_ = nullptr;
};

}  // namespace shardopt
