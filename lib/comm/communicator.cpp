// The Communicator front end: checks every argument once, resolves the
// in-place conventions, then hands the operation to the backend. Its
// construction takes the host transport (make_host_backend) and the
// transport of device buffers (device_choice.cpp); with argument agreement
// on, each operation first compares the ranks' arguments
// (argument_agreement.cpp).
#include "shardopt/communicator.hpp"

#include <algorithm>
#include <atomic>
#include <climits>
#include <cstdint>
#include <cstring>
#include <exception>
#include <string>
#include <utility>
#include <vector>

#include "comm/argument_agreement.hpp"
#include "comm/backend.hpp"
#include "comm/shm/shm_backend.hpp"
#include "comm/survey.hpp"
#include "common/check.hpp"
#include "common/log.hpp"
#include "common/mpi_lifetime.hpp"
#include "common/watchdog.hpp"
#include "device/device_runtime.hpp"
#include "shardopt/config.hpp"
#include "shardopt/environment.hpp"

namespace shardopt {

namespace detail {
namespace {

std::uintptr_t addr(const void* p) { return reinterpret_cast<std::uintptr_t>(p); }

bool overlap(const void* a, std::size_t abytes, const void* b, std::size_t bbytes) {
  if (abytes == 0 || bbytes == 0) return false;
  return addr(a) < addr(b) + bbytes && addr(b) < addr(a) + abytes;
}

[[noreturn, gnu::cold, gnu::noinline]] void throw_overflow(std::size_t a, std::size_t b,
                                                           const char* op, const char* what) {
  throw_error(ErrorCode::invalid_argument,
              std::string(op) + ": " + what + " overflows the address space (" + std::to_string(a) +
                  " x " + std::to_string(b) + ")",
              "pass the element count, not a byte count, and check it is not a negative "
              "number converted to size_t",
              __FILE__, __LINE__);
}

// a * b, or throws when it does not fit in size_t.
inline std::size_t checked_mul(std::size_t a, std::size_t b, const char* op, const char* what) {
  std::size_t r;
  if (__builtin_mul_overflow(a, b, &r)) [[unlikely]]
    throw_overflow(a, b, op, what);
  return r;
}

}  // namespace

Backend& backend_of(Communicator& comm) {
  if (!comm.backend_ || comm.backend_->freed())
    SHARDOPT_THROW(invalid_state, "the communicator was freed",
                   "keep the Communicator alive (not free()d) while objects built on it are used");
  return *comm.backend_;
}

NodeAccess* node_access(Communicator& comm) { return backend_of(comm).node_access(); }

}  // namespace detail

using detail::Backend;
using detail::PendingOp;

// ---------------------------------------------------------------- Request

Request::Request() noexcept = default;
Request::Request(std::unique_ptr<detail::PendingOp> op) noexcept : op_(std::move(op)) {}
Request::Request(Request&&) noexcept = default;

Request& Request::operator=(Request&& other) noexcept {
  if (this != &other) {
    if (op_) {
      try {
        op_->wait();
      } catch (const std::exception& e) {
        SHARDOPT_LOG(warn, "Request overwritten before completion; its wait failed: " << e.what());
      }
    }
    op_ = std::move(other.op_);
  }
  return *this;
}

Request::~Request() {
  if (!op_) return;
  SHARDOPT_LOG(warn,
               "a Request was destroyed before wait() or test() completed it; waiting "
               "for it now (call wait() before the Request goes out of scope)");
  try {
    op_->wait();
  } catch (const std::exception& e) {
    SHARDOPT_LOG(warn, "waiting in ~Request failed: " << e.what());
  }
}

void Request::wait() {
  if (!op_) return;
  if (op_->on_stream) {
    op_->wait();  // the stream waits, not the host
  } else {
    detail::WatchScope watch(op_->what, op_->count, op_->dtype, op_->ranks);
    if (watch.armed())
      detail::watch_wait([&](std::chrono::microseconds d) { return op_->wait_for(d); },
                         op_->channel.get());
    else
      op_->wait();
  }
  op_.reset();
}

bool Request::test() {
  if (!op_) return true;
  if (!op_->test()) return false;
  op_.reset();
  return true;
}

// ------------------------------------------------------------ Communicator

Communicator::Communicator(MPI_Comm comm, CommOptions options) {
  if (!mpi_is_initialized()) {
    SHARDOPT_THROW(mpi_not_initialized,
                   "shardopt::Communicator created before MPI_Init: MPI is not initialized",
                   "call MPI_Init or MPI_Init_thread before creating shardopt objects, or create "
                   "a shardopt::Environment at the top of main()");
  }
  if (mpi_is_finalized()) {
    SHARDOPT_THROW(mpi_finalized,
                   "shardopt::Communicator created after MPI_Finalize: MPI is no longer running",
                   "create and use shardopt objects between MPI_Init and MPI_Finalize, and "
                   "destroy them before MPI_Finalize");
  }
  if (comm == MPI_COMM_NULL) {
    SHARDOPT_THROW(invalid_argument,
                   "Communicator: the MPI communicator is MPI_COMM_NULL (never created, or "
                   "already released with MPI_Comm_free)",
                   "pass a live communicator such as MPI_COMM_WORLD (shardopt duplicates it, "
                   "so the caller may free the original afterwards)");
  }
  int inter = 0;
  SHARDOPT_CHECK_MPI(MPI_Comm_test_inter(comm, &inter), "Communicator: checking the communicator");
  if (inter) {
    SHARDOPT_THROW(invalid_argument, "Communicator: intercommunicators are not supported",
                   "merge the two groups with MPI_Intercomm_merge and pass the result");
  }
  // First of all collectives: the settings checked here decide the others.
  nodes_ = detail::survey_ranks(comm);
  std::size_t chunk = options.max_chunk_elements;
  if (chunk == 0) chunk = settings().comm_max_chunk;
  if (chunk > static_cast<std::size_t>(INT_MAX)) {
    SHARDOPT_THROW(invalid_config,
                   "CommOptions::max_chunk_elements = " + std::to_string(chunk) +
                       " is larger than an MPI count can be (INT_MAX = 2147483647)",
                   "use a value from 1 to 2147483647, or 0 for SHARDOPT_COMM_MAX_CHUNK");
  }
  check_args_ = options.check_arguments.value_or(settings().check_args || settings().desync_check);
  backend_ = detail::make_mpi_host_backend(comm, chunk);
  backend_ = detail::make_host_backend(
      std::move(backend_), nodes_, options.host_comm.value_or(settings().host_comm),
      settings().shm_chunk_kb * 1024,
      settings().shm_single_copy_kb == SIZE_MAX ? SIZE_MAX : settings().shm_single_copy_kb * 1024);
  if (backend_->rank() == 0) SHARDOPT_LOG(info, "Communicator of " << nodes_.summary());
  choose_device_backend(comm, options.device_comm.value_or(settings().device_comm));
  stream_ = options.stream;
  // From here on, the finalize check on every call is one atomic load.
  detail::at_mpi_finalize(nullptr);
}

Communicator::Communicator(Communicator&&) noexcept = default;

Communicator& Communicator::operator=(Communicator&& other) noexcept {
  if (this != &other) {
    release();
    backend_ = std::move(other.backend_);
    nodes_ = std::move(other.nodes_);
    check_args_ = other.check_args_;
    stream_ = other.stream_;
  }
  return *this;
}

Communicator::~Communicator() { release(); }

void Communicator::release() noexcept {
  if (!backend_ || backend_->freed()) return;
  if (detail::mpi_finalize_started()) {
    // Once per process: every Communicator left (an optimizer holds one of
    // its own besides the user's) would say the same.
    static std::atomic<bool> warned{false};
    if (!warned.exchange(true)) {
      SHARDOPT_LOG(warn,
                   "a Communicator outlived MPI_Finalize (MPI released it); destroy "
                   "shardopt objects before MPI_Finalize");
    }
    return;
  }
  try {
    backend_->free();
  } catch (const std::exception& e) {
    SHARDOPT_LOG(warn, "~Communicator: " << e.what());
  }
}

void Communicator::free() {
  if (!backend_) {
    SHARDOPT_THROW(invalid_state, "Communicator::free called on a moved-from Communicator",
                   "call free() on the Communicator the object was moved to");
  }
  if (backend_->freed()) return;
  if (detail::mpi_finalize_started()) {
    SHARDOPT_THROW(mpi_finalized, "Communicator::free called after MPI_Finalize",
                   "free shardopt objects before MPI_Finalize");
  }
  backend_->free();
}

bool Communicator::is_freed() const noexcept { return !backend_ || backend_->freed(); }

void Communicator::require_usable(const char* what) const {
  if (!backend_) [[unlikely]] {
    SHARDOPT_THROW(invalid_state,
                   std::string("Communicator::") + what + " called on a moved-from Communicator",
                   "use the Communicator the object was moved to");
  }
  if (backend_->freed()) [[unlikely]] {
    SHARDOPT_THROW(invalid_state,
                   std::string("Communicator::") + what + " called after Communicator::free()",
                   "create a new shardopt::Communicator, or call free() only when done");
  }
  if (detail::mpi_finalize_started()) [[unlikely]] {
    SHARDOPT_THROW(mpi_finalized,
                   std::string("Communicator::") + what + " called after MPI_Finalize",
                   "finish every shardopt operation before MPI_Finalize");
  }
}

int Communicator::rank() const {
  require_usable("rank");
  return backend_->rank();
}
int Communicator::size() const {
  require_usable("size");
  return backend_->size();
}
const NodeLayout& Communicator::nodes() const {
  require_usable("nodes");
  return nodes_;
}
MPI_Comm Communicator::mpi_comm() const {
  require_usable("mpi_comm");
  return backend_->mpi_comm();
}
const char* Communicator::backend_name() const {
  require_usable("backend_name");
  return backend_->name();
}

const char* Communicator::device_backend_name() const {
  require_usable("device_backend_name");
  return backend_->device_name();
}
std::size_t Communicator::max_chunk_elements() const {
  require_usable("max_chunk_elements");
  return backend_->max_chunk();
}

void Communicator::check_span_sizes(std::size_t big, std::size_t small, int factor) const {
  if (big != small * static_cast<std::size_t>(factor)) {
    SHARDOPT_THROW(invalid_argument,
                   "span sizes do not match: " + std::to_string(big) + " elements where " +
                       std::to_string(factor) + " x " + std::to_string(small) + " are needed",
                   "the full buffer must hold exactly size() blocks of the per-rank count");
  }
}

namespace {

using detail::Backend;

// The checks below run on every call: each is a few compares inline, and
// everything that builds a message lives in a cold function of its own, so
// the hot path stays short and compact.
#define SHARDOPT_COLD [[noreturn, gnu::cold, gnu::noinline]]

SHARDOPT_COLD void throw_bad_dtype(const char* op, DType dtype) {
  detail::throw_error(
      ErrorCode::invalid_argument,
      std::string(op) + ": unknown DType value " + std::to_string(static_cast<int>(dtype)),
      "pass one of DType::f32, f64, bf16, f16, i32, i64", __FILE__, __LINE__);
}

SHARDOPT_COLD void throw_bad_reduction(const char* op, DType dtype, ReduceOp rop) {
  if (!is_valid(rop)) {
    detail::throw_error(
        ErrorCode::invalid_argument,
        std::string(op) + ": unknown ReduceOp value " + std::to_string(static_cast<int>(rop)),
        "pass one of ReduceOp::sum, avg, max, min", __FILE__, __LINE__);
  }
  detail::throw_error(ErrorCode::unsupported,
                      std::string(op) + ": ReduceOp::avg of " + dtype_name(dtype) +
                          " is not supported: an integer average would have to round",
                      "reduce with ReduceOp::sum and divide by size() with the rounding you "
                      "want, or use a floating-point type",
                      __FILE__, __LINE__);
}

SHARDOPT_COLD void throw_null_buffer(const char* op, const char* which, std::size_t count) {
  detail::throw_error(
      ErrorCode::invalid_argument,
      std::string(op) + ": " + which + " buffer is null but count is " + std::to_string(count),
      "pass a buffer of at least the stated number of elements, or a count of 0", __FILE__,
      __LINE__);
}

SHARDOPT_COLD void throw_overlap(const char* message, const char* hint) {
  detail::throw_error(ErrorCode::invalid_argument, message, hint, __FILE__, __LINE__);
}

// Throws unless the backend can use the memory `p` points to.
[[gnu::cold, gnu::noinline]] void check_location(const Backend& b, const char* op,
                                                 const char* which, const void* p) {
  const detail::MemoryLocation where = detail::locate(p);
  if (b.accepts(where)) return;
  detail::throw_error(
      ErrorCode::wrong_device,
      std::string(op) + ": " + which + " buffer is in " + detail::location_name(where) +
          ", which the " + b.name() + " backend cannot use",
      where.kind == detail::MemoryKind::managed
          ? "pass host memory or device memory (cudaMalloc): managed memory is not taken, since "
            "the device may still be writing it when MPI reads it (docs/gpu.md)"
          : "pass host buffers (this process sees no device), or copy the data to host memory "
            "first",
      __FILE__, __LINE__);
}

SHARDOPT_COLD void throw_bad_root(int root, int size) {
  detail::throw_error(ErrorCode::invalid_argument,
                      "broadcast: root " + std::to_string(root) + " is not a rank of this " +
                          std::to_string(size) + "-rank communicator",
                      "pass a root from 0 to size()-1, the same on every rank", __FILE__, __LINE__);
}

[[gnu::cold, gnu::noinline]] void trace_call(const char* op, std::size_t count, DType dtype) {
  SHARDOPT_LOG(trace, op << " count=" << count << " dtype=" << dtype_name(dtype));
}

inline void check_dtype(const char* op, DType dtype) {
  if (!is_valid(dtype)) [[unlikely]]
    throw_bad_dtype(op, dtype);
}

inline void check_reduction(const char* op, DType dtype, ReduceOp rop) {
  check_dtype(op, dtype);
  if (!is_valid(rop) || (rop == ReduceOp::avg && !is_floating(dtype))) [[unlikely]]
    throw_bad_reduction(op, dtype, rop);
}

// A buffer of `count` elements: not null unless empty, and in memory the
// backend can use (only a question when the process sees a CUDA device).
inline void check_buffer(const Backend& b, const char* op, const char* which, const void* p,
                         std::size_t count) {
  if (count == 0) return;
  if (p == nullptr) [[unlikely]]
    throw_null_buffer(op, which, count);
  static const bool any_device = detail::device_runtime() != nullptr;
  if (any_device) check_location(b, op, which, p);
}

inline void trace(const char* op, std::size_t count, DType dtype) {
  if (detail::log_enabled(LogLevel::trace)) [[unlikely]]
    trace_call(op, count, dtype);
}

// With argument agreement on, the local checks run first, then every
// rank's arguments and verdict are compared (argument_agreement.cpp).
template <class Checks>
void check_arguments(Backend& b, bool agree, detail::Signature sig, Checks checks) {
  if (!agree) {
    checks();
    return;
  }
  std::exception_ptr local;
  try {
    checks();
  } catch (const Error& e) {
    local = std::current_exception();
    sig.error = static_cast<std::int32_t>(e.code());
  }
  detail::agree_on_arguments(b, sig, local);
}

using detail::OpKind;
using detail::Signature;
using detail::signature;

Request wrap(const Backend& b, std::unique_ptr<PendingOp> op, const char* what, std::size_t count,
             DType dtype) {
  if (op) {
    op->what = what;
    op->count = count;
    op->dtype = dtype;
    op->ranks = b.size();
    op->channel = b.watch;
  }
  return Request(std::move(op));
}

// A blocking operation, issue(blocking) issuing it. With the watchdog armed
// it is issued non-blocking and polled, so that a stall can ask the other
// ranks where they are, unless the backend's blocking waits are polled by
// the watchdog themselves (shm: the operation then stays on this thread).
template <class Issue>
void run_blocking(Backend& b, const char* what, std::size_t count, DType dtype, Issue issue) {
  detail::WatchScope watch(what, count, dtype, b.size());
  if (!watch.armed() || b.watches_blocking_waits()) {
    issue(true);
    return;
  }
  std::unique_ptr<PendingOp> op = issue(false);
  if (op)
    detail::watch_wait([&](std::chrono::microseconds d) { return op->wait_for(d); }, b.watch.get());
}

}  // namespace

// Each public operation checks, then runs the backend blocking or not.
namespace {

std::unique_ptr<PendingOp> do_allreduce(Backend& b, bool agree, const void* send, void* recv,
                                        std::size_t count, DType dtype, ReduceOp op, bool blocking,
                                        void* stream) {
  const auto sig = signature(OpKind::allreduce, count, dtype, static_cast<int>(op));
  check_arguments(b, agree, sig, [&] {
    check_reduction("allreduce", dtype, op);
    const std::size_t bytes = detail::checked_mul(count, dtype_size(dtype), "allreduce", "count");
    check_buffer(b, "allreduce", "send", send, count);
    check_buffer(b, "allreduce", "recv", recv, count);
    if (send != recv && detail::overlap(send, bytes, recv, bytes)) [[unlikely]] {
      throw_overlap("allreduce: send and recv buffers overlap without being the same",
                    "use one buffer for both (recv == send) for in place, or two separate "
                    "buffers");
    }
  });
  trace("allreduce", count, dtype);
  return b.allreduce(send, recv, count, dtype, op, blocking, stream);
}

// The sizes of a collective between a block of `count` elements per rank
// (the full buffer, `full`) and one block: the full buffer's elements
// (checked against overflow, naming op) and bytes, a block's bytes, and
// where this rank's block of the full buffer starts (null for a null one).
struct Blocks {
  std::size_t total, full_bytes, block_bytes;
  const char* own;
};
Blocks blocks_of(const Backend& b, const char* op, const void* full, std::size_t count,
                 DType dtype) {
  const std::size_t total =
      detail::checked_mul(count, static_cast<std::size_t>(b.size()), op, "count x ranks");
  const std::size_t es = dtype_size(dtype);
  const std::size_t full_bytes = detail::checked_mul(total, es, op, "count");
  // No offset from a null buffer (undefined): check_buffer rejects it next.
  const char* own = full == nullptr ? nullptr
                                    : static_cast<const char*>(full) +
                                          static_cast<std::size_t>(b.rank()) * count * es;
  return {total, full_bytes, count * es, own};
}

std::unique_ptr<PendingOp> do_reduce_scatter(Backend& b, bool agree, const void* send, void* recv,
                                             std::size_t count, DType dtype, ReduceOp op,
                                             bool blocking, void* stream) {
  detail::ScatterPlace place = detail::ScatterPlace::separate;
  const auto sig = signature(OpKind::reduce_scatter, count, dtype, static_cast<int>(op));
  check_arguments(b, agree, sig, [&] {
    check_reduction("reduce_scatter", dtype, op);
    const Blocks k = blocks_of(b, "reduce_scatter", send, count, dtype);
    check_buffer(b, "reduce_scatter", "send", send, k.total);
    check_buffer(b, "reduce_scatter", "recv", recv, count);
    if (count != 0 && recv == send) {
      place = detail::ScatterPlace::at_start;
    } else if (count != 0 && recv == k.own) {
      place = detail::ScatterPlace::at_own_block;
    } else if (detail::overlap(send, k.full_bytes, recv, k.block_bytes)) [[unlikely]] {
      throw_overlap(
          "reduce_scatter: recv overlaps send but is neither send (MPI-style in place) nor "
          "send + rank*count (NCCL-style in place)",
          "use separate buffers, or one of the two in-place forms");
    }
  });
  trace("reduce_scatter", count, dtype);
  return b.reduce_scatter(send, recv, count, dtype, op, place, blocking, stream);
}

std::unique_ptr<PendingOp> do_allgather(Backend& b, bool agree, const void* send, void* recv,
                                        std::size_t count, DType dtype, bool blocking,
                                        void* stream) {
  bool in_place = false;
  check_arguments(b, agree, signature(OpKind::allgather, count, dtype), [&] {
    check_dtype("allgather", dtype);
    const Blocks k = blocks_of(b, "allgather", recv, count, dtype);
    check_buffer(b, "allgather", "send", send, count);
    check_buffer(b, "allgather", "recv", recv, k.total);
    in_place = count != 0 && send == k.own;
    if (!in_place && detail::overlap(send, k.block_bytes, recv, k.full_bytes)) [[unlikely]] {
      throw_overlap(
          "allgather: send overlaps recv but is not recv + rank*count (the in-place form)",
          "use separate buffers, or pass send = recv + rank*count");
    }
  });
  trace("allgather", count, dtype);
  return b.allgather(send, recv, count, dtype, in_place, blocking, stream);
}

std::unique_ptr<PendingOp> do_broadcast(Backend& b, bool agree, void* buf, std::size_t count,
                                        DType dtype, int root, bool blocking, void* stream) {
  check_arguments(b, agree, signature(OpKind::broadcast, count, dtype, -1, root), [&] {
    check_dtype("broadcast", dtype);
    detail::checked_mul(count, dtype_size(dtype), "broadcast", "count");
    if (root < 0 || root >= b.size()) [[unlikely]]
      throw_bad_root(root, b.size());
    check_buffer(b, "broadcast", "buf", buf, count);
  });
  trace("broadcast", count, dtype);
  return b.broadcast(buf, count, dtype, root, blocking, stream);
}

std::unique_ptr<PendingOp> do_barrier(Backend& b, bool agree, bool blocking) {
  Signature sig;
  sig.kind = static_cast<std::int32_t>(OpKind::barrier);
  check_arguments(b, agree, sig, [] {});
  return b.barrier(blocking, nullptr);
}

}  // namespace

void Communicator::allreduce(const void* send, void* recv, std::size_t count, DType dtype,
                             ReduceOp op) {
  require_usable("allreduce");
  run_blocking(*backend_, "allreduce", count, dtype, [&](bool blocking) {
    return do_allreduce(*backend_, check_args_, send, recv, count, dtype, op, blocking, stream_);
  });
}
void Communicator::reduce_scatter(const void* send, void* recv, std::size_t count, DType dtype,
                                  ReduceOp op) {
  require_usable("reduce_scatter");
  run_blocking(*backend_, "reduce_scatter", count, dtype, [&](bool blocking) {
    return do_reduce_scatter(*backend_, check_args_, send, recv, count, dtype, op, blocking,
                             stream_);
  });
}
void Communicator::allgather(const void* send, void* recv, std::size_t count, DType dtype) {
  require_usable("allgather");
  run_blocking(*backend_, "allgather", count, dtype, [&](bool blocking) {
    return do_allgather(*backend_, check_args_, send, recv, count, dtype, blocking, stream_);
  });
}
void Communicator::broadcast(void* buf, std::size_t count, DType dtype, int root) {
  require_usable("broadcast");
  run_blocking(*backend_, "broadcast", count, dtype, [&](bool blocking) {
    return do_broadcast(*backend_, check_args_, buf, count, dtype, root, blocking, stream_);
  });
}
void Communicator::barrier() {
  require_usable("barrier");
  run_blocking(*backend_, "barrier", 0, DType::f32,
               [&](bool blocking) { return do_barrier(*backend_, check_args_, blocking); });
}

Request Communicator::iallreduce(const void* send, void* recv, std::size_t count, DType dtype,
                                 ReduceOp op) {
  require_usable("iallreduce");
  return wrap(*backend_,
              do_allreduce(*backend_, check_args_, send, recv, count, dtype, op, false, stream_),
              "wait for iallreduce", count, dtype);
}
Request Communicator::ireduce_scatter(const void* send, void* recv, std::size_t count, DType dtype,
                                      ReduceOp op) {
  require_usable("ireduce_scatter");
  return wrap(
      *backend_,
      do_reduce_scatter(*backend_, check_args_, send, recv, count, dtype, op, false, stream_),
      "wait for ireduce_scatter", count, dtype);
}
Request Communicator::iallgather(const void* send, void* recv, std::size_t count, DType dtype) {
  require_usable("iallgather");
  return wrap(*backend_,
              do_allgather(*backend_, check_args_, send, recv, count, dtype, false, stream_),
              "wait for iallgather", count, dtype);
}
Request Communicator::ibroadcast(void* buf, std::size_t count, DType dtype, int root) {
  require_usable("ibroadcast");
  return wrap(*backend_,
              do_broadcast(*backend_, check_args_, buf, count, dtype, root, false, stream_),
              "wait for ibroadcast", count, dtype);
}
Request Communicator::ibarrier() {
  require_usable("ibarrier");
  return wrap(*backend_, do_barrier(*backend_, check_args_, false), "wait for ibarrier", 0,
              DType::f32);
}

}  // namespace shardopt
