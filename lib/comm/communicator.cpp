// The Communicator front end: checks every argument once, resolves the
// in-place conventions, then hands the operation to the backend.
#include "shardopt/communicator.hpp"

#include <algorithm>
#include <atomic>
#include <climits>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <exception>
#include <string>
#include <utility>
#include <vector>

#include "comm/backend.hpp"
#include "comm/shm/shm_backend.hpp"
#include "comm/survey.hpp"
#include "common/check.hpp"
#include "common/device_runtime.hpp"
#include "common/log.hpp"
#include "common/mpi_lifetime.hpp"
#include "common/watchdog.hpp"
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

// Collective over comm: "ranks a and b use the same device (identity)"
// for two ranks whose device identities (DeviceRuntime::device_identity,
// "" for none) are equal, the same pair on every rank, or "" when no two
// are.
std::string shared_device(MPI_Comm comm, const std::string& identity) {
  constexpr std::size_t kLen = 128;
  int size = 0;
  SHARDOPT_CHECK_MPI(MPI_Comm_size(comm, &size), "Communicator: querying the size");
  char mine[kLen] = {};
  std::snprintf(mine, kLen, "%s", identity.c_str());
  std::vector<char> all(kLen * static_cast<std::size_t>(size));
  SHARDOPT_CHECK_MPI(MPI_Allgather(mine, kLen, MPI_CHAR, all.data(), kLen, MPI_CHAR, comm),
                     "Communicator: comparing the ranks' devices");
  std::vector<std::pair<std::string, int>> named;  // (identity, rank), sorted
  for (int r = 0; r < size; ++r) {
    std::string id(all.data() + std::size_t(r) * kLen);
    if (!id.empty()) named.emplace_back(std::move(id), r);
  }
  std::sort(named.begin(), named.end());
  for (std::size_t k = 1; k < named.size(); ++k)
    if (named[k].first == named[k - 1].first)
      return "ranks " + std::to_string(named[k - 1].second) + " and " +
             std::to_string(named[k].second) + " use the same device (" + named[k].first + ")";
  return "";
}

std::atomic<int> g_live_transports[2];

}  // namespace

int live_device_transports(DeviceTransport t) noexcept {
  return g_live_transports[static_cast<int>(t)].load();
}
TransportClaim::TransportClaim(DeviceTransport t) noexcept : t_(t) {
  g_live_transports[static_cast<int>(t_)].fetch_add(1);
}
void TransportClaim::release() noexcept {
  if (held_) g_live_transports[static_cast<int>(t_)].fetch_sub(1);
  held_ = false;
}

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

// Device buffers: the ranks agree on what each can use, then take the same
// transport, each making the duplicates it needs on every rank alike (a
// rank without a device takes part in them).
void Communicator::choose_device_backend(MPI_Comm comm, DeviceComm choice) {
  using detail::DeviceTransport;
  detail::DeviceRuntime* rt = detail::device_runtime();
  // Each fact true on some rank (the maximum over the ranks).
  enum { kSomeDevice, kNoDevice, kNoNative, kMpiNotAware, kLiveNccl, kLiveMpi, kFacts };
  int facts[kFacts] = {};
  facts[kSomeDevice] = rt != nullptr;
  facts[kNoDevice] = rt == nullptr;
  facts[kNoNative] = rt == nullptr || !rt->has_collectives();
  facts[kMpiNotAware] = !detail::mpi_takes_device_buffers();
  facts[kLiveNccl] = detail::live_device_transports(DeviceTransport::nccl) > 0;
  facts[kLiveMpi] = detail::live_device_transports(DeviceTransport::mpi) > 0;
  const int mine[kFacts] = {facts[0], facts[1], facts[2], facts[3], facts[4], facts[5]};
  SHARDOPT_CHECK_MPI(
      MPI_Allreduce(MPI_IN_PLACE, facts, kFacts, MPI_INT, MPI_MAX, backend_->mpi_comm()),
      "Communicator: agreeing on the transport of device buffers");
  // Collectives of one device per rank (NCCL) refuse ranks that share one:
  // two ranks that do, if any (the same two on every rank).
  std::string shared;
  if (!facts[kNoNative])
    shared = detail::shared_device(backend_->mpi_comm(), rt->device_identity());
  const bool native_ok = !facts[kNoNative] && shared.empty() && !facts[kLiveMpi];
  const bool mpi_ok = !facts[kNoDevice] && !facts[kMpiNotAware] && !facts[kLiveNccl];
  constexpr const char* kDeadlock =
      ", and NCCL and a CUDA-aware MPI must not run collectives on one device side by side "
      "(NCCL documents a deadlock)";
  auto refuse = [&](const char* asked, const std::string& why, const char* fix) {
    backend_->free();
    SHARDOPT_THROW(unsupported,
                   std::string("Communicator: device_comm = ") + asked +
                       " (CommOptions::device_comm or SHARDOPT_DEVICE_COMM) cannot be used: " + why,
                   fix);
  };
  if (choice == DeviceComm::nccl && !native_ok) {
    const std::string why =
        !shared.empty()       ? shared + ", and NCCL takes one device per rank"
        : !facts[kSomeDevice] ? "no rank has a device"
        : rt == nullptr       ? "this rank has no device"
        : !rt->has_collectives()
            ? std::string("this shardopt build has no NCCL collectives for the ") + rt->name()
        : facts[kNoNative] ? "some rank has no device or no NCCL"
        : mine[kLiveMpi]   ? std::string(
                                 "another Communicator of this process moves device "
                                   "buffers over a CUDA-aware MPI") +
                               kDeadlock
                         : std::string(
                               "another Communicator of some rank moves device buffers "
                               "over a CUDA-aware MPI") +
                               kDeadlock;
    refuse("nccl", why,
           "give every rank a device and a shardopt built with NCCL, use one device_comm for "
           "every Communicator of the job, or choose staged (any MPI) or auto");
  }
  if (choice == DeviceComm::mpi && !mpi_ok) {
    const std::string why =
        !facts[kSomeDevice] ? "no rank has a device"
        : mine[kNoDevice]   ? "this rank has no device"
        : facts[kNoDevice]  ? "some rank has no device"
        : mine[kMpiNotAware]
            ? "this rank's MPI is not known to take device buffers (it says it is not "
              "CUDA-aware, cannot say, or SHARDOPT_CUDA_AWARE_MPI=no)"
        : facts[kMpiNotAware] ? "some rank's MPI is not known to take device buffers"
        : mine[kLiveNccl]     ? std::string(
                                    "another Communicator of this process moves device "
                                        "buffers over NCCL") +
                                kDeadlock
                          : std::string(
                                "another Communicator of some rank moves device buffers "
                                "over NCCL") +
                                kDeadlock;
    refuse("mpi", why,
           "run with a CUDA-aware MPI on every rank (SHARDOPT_CUDA_AWARE_MPI=yes for one that "
           "cannot say so), use one device_comm for every Communicator of the job, or choose "
           "staged (any MPI) or auto");
  }
  if (!facts[kSomeDevice]) return;
  const bool nccl = choice == DeviceComm::nccl || (choice == DeviceComm::automatic && native_ok);
  const bool mpi =
      !nccl && (choice == DeviceComm::mpi || (choice == DeviceComm::automatic && mpi_ok));
  if (nccl) {
    backend_ = detail::make_native_backend(std::move(backend_), rt);
  } else {
    backend_ = detail::make_staged_backend(std::move(backend_), comm, rt, mpi);
  }
  if (backend_->rank() == 0) {
    const char* why = choice != DeviceComm::automatic ? "asked for"
                      : nccl            ? "auto: every rank has a device with its own collectives"
                      : mpi             ? "auto: every rank's MPI takes device buffers"
                      : !shared.empty() ? "auto: two ranks share a device, and MPI is not "
                                          "known to take device buffers"
                                        : "auto: no NCCL on every rank, and MPI is not known "
                                          "to take device buffers";
    SHARDOPT_LOG(info, "Communicator of " << backend_->size() << " ranks: device buffers over "
                                          << backend_->device_name() << " (" << why << ")");
  }
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

// ------------------------------------------------ argument agreement
//
// With argument checking on (CommOptions::check_arguments or
// SHARDOPT_CHECK_ARGS=1), every operation first exchanges what each rank
// passed and whether its local checks failed. A bad argument on one rank
// then becomes an error on every rank instead of a hang in the collective,
// and ranks that pass different counts, types, ops or roots (or call
// different operations) are told so before any data moves.

enum class OpKind : std::int32_t { allreduce = 1, reduce_scatter, allgather, broadcast, barrier };

const char* op_kind_name(std::int32_t k) {
  switch (static_cast<OpKind>(k)) {
    case OpKind::allreduce:
      return "allreduce";
    case OpKind::reduce_scatter:
      return "reduce_scatter";
    case OpKind::allgather:
      return "allgather";
    case OpKind::broadcast:
      return "broadcast";
    case OpKind::barrier:
      return "barrier";
  }
  return "unknown operation";
}

// What one rank passed; exchanged as raw bytes, so every field is fixed-size.
struct Signature {
  std::int32_t kind = 0;
  std::int32_t error = 0;  // the ErrorCode of the rank's local checks, 0 if they passed
  std::int64_t count = 0;
  std::int32_t dtype = -1;
  std::int32_t op = -1;
  std::int32_t root = -1;
  std::int32_t pad = 0;
  std::int64_t seq = 0;  // this operation's number on the communicator
};

std::string describe(const Signature& s) {
  std::string d = op_kind_name(s.kind);
  if (static_cast<OpKind>(s.kind) == OpKind::barrier) return d;
  d += "(count=" + std::to_string(s.count) + ", dtype=" + dtype_name(static_cast<DType>(s.dtype));
  if (s.op >= 0) d += std::string(", op=") + reduce_op_name(static_cast<ReduceOp>(s.op));
  if (s.root >= 0) d += ", root=" + std::to_string(s.root);
  return d + ")";
}

// Runs `checks` (the local argument checks). With agreement on, also
// exchanges signatures, and throws on every rank if any rank's checks failed
// or the signatures differ.
template <class Checks>
void check_arguments(Backend& b, bool agree, Signature sig, Checks checks) {
  if (!agree) {
    checks();
    return;
  }
  sig.seq = ++b.agreed_calls;
  std::exception_ptr local;
  try {
    checks();
  } catch (const Error& e) {
    local = std::current_exception();
    sig.error = static_cast<std::int32_t>(e.code());
  }
  std::vector<Signature> all(static_cast<std::size_t>(b.size()));
  const auto exchange_failed = [&] {
    return std::string(op_kind_name(sig.kind)) + ": exchanging arguments";
  };
  detail::WatchScope watch("argument exchange (SHARDOPT_DESYNC_CHECK)", 0, DType::f32, b.size());
  if (watch.armed()) {
    MPI_Request req;
    SHARDOPT_CHECK_MPI(MPI_Iallgather(&sig, sizeof sig, MPI_BYTE, all.data(), sizeof sig, MPI_BYTE,
                                      b.mpi_comm(), &req),
                       exchange_failed());
    detail::watch_poll(
        [&] {
          int done = 0;
          SHARDOPT_CHECK_MPI(MPI_Test(&req, &done, MPI_STATUS_IGNORE), exchange_failed());
          return done != 0;
        },
        b.watch.get());
  } else {
    SHARDOPT_CHECK_MPI(
        MPI_Allgather(&sig, sizeof sig, MPI_BYTE, all.data(), sizeof sig, MPI_BYTE, b.mpi_comm()),
        exchange_failed());
  }
  std::string failed;
  ErrorCode first_code = ErrorCode::invalid_argument;
  for (std::size_t r = 0; r < all.size(); ++r) {
    if (all[r].error == 0) continue;
    if (failed.empty()) first_code = static_cast<ErrorCode>(all[r].error);
    failed += (failed.empty() ? "" : ", ") + std::to_string(r);
  }
  if (local) std::rethrow_exception(local);
  const std::string op = op_kind_name(sig.kind);
  if (!failed.empty()) {
    detail::throw_error(first_code,
                        op + ": rank(s) " + failed + " rejected their arguments (" +
                            error_code_name(first_code) + "); no rank ran the operation",
                        "read the error printed by rank(s) " + failed + ", and fix the call there",
                        __FILE__, __LINE__);
  }
  for (std::size_t r = 1; r < all.size(); ++r) {
    if (std::memcmp(&all[0], &all[r], sizeof(Signature)) == 0) continue;
    // Each distinct call with the ranks that made it, in rank order.
    std::vector<std::pair<Signature, std::vector<int>>> calls;
    for (std::size_t q = 0; q < all.size(); ++q) {
      auto it = std::find_if(calls.begin(), calls.end(), [&](const auto& c) {
        return std::memcmp(&c.first, &all[q], sizeof(Signature)) == 0;
      });
      if (it == calls.end())
        calls.push_back({all[q], {static_cast<int>(q)}});
      else
        it->second.push_back(static_cast<int>(q));
    }
    bool other_op = false;
    std::string list;
    for (const auto& [s, ranks] : calls) {
      other_op = other_op || s.kind != calls[0].first.kind || s.seq != calls[0].first.seq;
      list += list.empty() ? "" : " but ";
      list += "collective #" + std::to_string(s.seq) + " " + describe(s) + " on " +
              detail::ranks_list(ranks);
    }
    detail::throw_error(
        other_op ? ErrorCode::desync : ErrorCode::invalid_argument,
        op + ": ranks disagree: " + list + "; no rank ran the operation",
        other_op ? "every rank must call the same collectives in the same order: look for a "
                   "branch that only some ranks take (a rank-dependent condition, an early "
                   "return, an exception caught on one rank) before this call"
                 : "every rank must pass the same count, dtype, op and root",
        __FILE__, __LINE__);
  }
}

Signature signature(OpKind kind, std::size_t count, DType dtype, int op = -1, int root = -1) {
  Signature s;
  s.kind = static_cast<std::int32_t>(kind);
  s.count = static_cast<std::int64_t>(count);
  s.dtype = static_cast<std::int32_t>(dtype);
  s.op = op;
  s.root = root;
  return s;
}

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
