#include "shardopt/error.hpp"

#include <mpi.h>

#include <atomic>
#include <cstring>
#include <sstream>

#include "common/check.hpp"
#include "common/log.hpp"

namespace shardopt {

namespace {

struct CodeInfo {
  shardopt_status_t code;
  const char* name;
  const char* description;
};

constexpr CodeInfo kCodes[] = {
    {SHARDOPT_SUCCESS, "SHARDOPT_SUCCESS", "success"},
    {SHARDOPT_ERR_INVALID_ARGUMENT, "SHARDOPT_ERR_INVALID_ARGUMENT", "invalid argument"},
    {SHARDOPT_ERR_INVALID_CONFIG, "SHARDOPT_ERR_INVALID_CONFIG",
     "invalid SHARDOPT_* environment variable or option"},
    {SHARDOPT_ERR_MPI_NOT_INITIALIZED, "SHARDOPT_ERR_MPI_NOT_INITIALIZED",
     "MPI is not initialized"},
    {SHARDOPT_ERR_MPI_FINALIZED, "SHARDOPT_ERR_MPI_FINALIZED", "MPI is already finalized"},
    {SHARDOPT_ERR_MPI, "SHARDOPT_ERR_MPI", "an MPI call failed"},
    {SHARDOPT_ERR_CUDA, "SHARDOPT_ERR_CUDA", "a CUDA call failed"},
    {SHARDOPT_ERR_NCCL, "SHARDOPT_ERR_NCCL", "an NCCL call failed"},
    {SHARDOPT_ERR_NOT_COMPILED, "SHARDOPT_ERR_NOT_COMPILED", "feature not compiled in"},
    {SHARDOPT_ERR_UNSUPPORTED, "SHARDOPT_ERR_UNSUPPORTED", "unsupported combination"},
    {SHARDOPT_ERR_LAYOUT_MISMATCH, "SHARDOPT_ERR_LAYOUT_MISMATCH",
     "ranks registered different layouts"},
    {SHARDOPT_ERR_WRONG_DEVICE, "SHARDOPT_ERR_WRONG_DEVICE", "buffer on the wrong device"},
    {SHARDOPT_ERR_OUT_OF_MEMORY, "SHARDOPT_ERR_OUT_OF_MEMORY", "out of memory"},
    {SHARDOPT_ERR_IO, "SHARDOPT_ERR_IO", "file input/output failed"},
    {SHARDOPT_ERR_CHECKPOINT, "SHARDOPT_ERR_CHECKPOINT", "bad checkpoint"},
    {SHARDOPT_ERR_NON_FINITE, "SHARDOPT_ERR_NON_FINITE", "non-finite values"},
    {SHARDOPT_ERR_DESYNC, "SHARDOPT_ERR_DESYNC", "ranks issued different collectives"},
    {SHARDOPT_ERR_TIMEOUT, "SHARDOPT_ERR_TIMEOUT", "collective timed out"},
    {SHARDOPT_ERR_INVALID_STATE, "SHARDOPT_ERR_INVALID_STATE", "object in an invalid state"},
    {SHARDOPT_ERR_INTERNAL, "SHARDOPT_ERR_INTERNAL", "internal error"},
};

const CodeInfo* find_code(int code) noexcept {
  for (const auto& c : kCodes)
    if (c.code == code) return &c;
  return nullptr;
}

std::string format_what(ErrorCode code, const std::string& message, const std::string& hint,
                        const char* file, int line, int rank) {
  std::ostringstream os;
  os << "shardopt error";
  if (rank >= 0) os << " on rank " << rank;
  os << " [" << error_code_name(code) << "]: " << message;
  if (!hint.empty()) os << "\n  fix: " << hint;
  if (file != nullptr) os << "\n  at " << file << ":" << line;
  return os.str();
}

// "../../src/shardopt/lib/comm/x.cpp" -> "lib/comm/x.cpp": the path from the
// repository root, whatever the build directory was.
const char* short_path(const char* file) noexcept {
  if (file == nullptr) return file;
  const char* found = nullptr;
  for (const char* p = std::strstr(file, "/lib/"); p != nullptr; p = std::strstr(p + 1, "/lib/"))
    found = p + 1;
  if (found != nullptr) return found;
  while (std::strncmp(file, "../", 3) == 0) file += 3;
  return file;
}

}  // namespace

const char* error_code_name(ErrorCode code) noexcept {
  const CodeInfo* c = find_code(static_cast<int>(code));
  return c ? c->name : "SHARDOPT_ERR_UNKNOWN";
}

Error::Error(ErrorCode code, std::string message, std::string hint, const char* file, int line,
             int rank, int reporter)
    : std::runtime_error(format_what(code, message, hint, short_path(file), line, rank)),
      code_(code),
      message_(std::move(message)),
      hint_(std::move(hint)),
      file_(short_path(file)),
      line_(line),
      rank_(rank),
      reporter_(reporter) {}

bool reports_error(const Error& e) noexcept {
  return e.reporter() < 0 || e.reporter() == detail::world_rank() ||
         detail::log_enabled(LogLevel::info);
}

namespace detail {

namespace {
// The rank last read while MPI ran: still this process's rank after
// MPI_Finalize, when MPI can no longer be asked.
std::atomic<int> g_last_world_rank{-1};
}  // namespace

int world_rank() noexcept {
  int init = 0, fin = 0;
  MPI_Initialized(&init);
  MPI_Finalized(&fin);
  if (!init) return -1;
  if (fin) return g_last_world_rank.load(std::memory_order_relaxed);
  int r = -1;
  if (MPI_Comm_rank(MPI_COMM_WORLD, &r) != MPI_SUCCESS) return -1;
  g_last_world_rank.store(r, std::memory_order_relaxed);
  return r;
}

std::string ranks_list(const std::vector<int>& ranks) {
  std::string s = ranks.size() == 1 ? "rank " : "ranks ";
  for (std::size_t k = 0; k < ranks.size(); ++k) {
    if (k > 0) s += ", ";
    s += std::to_string(ranks[k]);
  }
  return s;
}

void throw_error(ErrorCode code, std::string message, std::string hint, const char* file, int line,
                 int reporter) {
  const int rank = world_rank();
  SHARDOPT_LOG(info, "raising " << error_code_name(code) << ": " << message);
  switch (code) {
    case ErrorCode::invalid_argument:
      throw InvalidArgument(code, std::move(message), std::move(hint), file, line, rank, reporter);
    case ErrorCode::invalid_config:
      throw ConfigError(code, std::move(message), std::move(hint), file, line, rank, reporter);
    case ErrorCode::mpi_not_initialized:
    case ErrorCode::mpi_finalized:
      throw MpiStateError(code, std::move(message), std::move(hint), file, line, rank, reporter);
    case ErrorCode::mpi:
    case ErrorCode::cuda:
    case ErrorCode::nccl:
      throw CommError(code, std::move(message), std::move(hint), file, line, rank, reporter);
    case ErrorCode::not_compiled:
      throw NotCompiledError(code, std::move(message), std::move(hint), file, line, rank, reporter);
    case ErrorCode::unsupported:
      throw UnsupportedError(code, std::move(message), std::move(hint), file, line, rank, reporter);
    case ErrorCode::wrong_device:
      throw DeviceError(code, std::move(message), std::move(hint), file, line, rank, reporter);
    case ErrorCode::invalid_state:
      throw StateError(code, std::move(message), std::move(hint), file, line, rank, reporter);
    case ErrorCode::checkpoint:
      throw CheckpointError(code, std::move(message), std::move(hint), file, line, rank, reporter);
    case ErrorCode::io:
      throw IoError(code, std::move(message), std::move(hint), file, line, rank, reporter);
    case ErrorCode::desync:
      throw DesyncError(code, std::move(message), std::move(hint), file, line, rank, reporter);
    case ErrorCode::non_finite:
      throw NonFiniteError(code, std::move(message), std::move(hint), file, line, rank, reporter);
    default:
      throw Error(code, std::move(message), std::move(hint), file, line, rank, reporter);
  }
}

std::string mpi_error_string(int rc) {
  char text[MPI_MAX_ERROR_STRING + 1] = {};
  int len = 0;
  int cls = 0;
  std::ostringstream os;
  if (MPI_Error_class(rc, &cls) == MPI_SUCCESS) os << "MPI error class " << cls << ", ";
  if (MPI_Error_string(rc, text, &len) == MPI_SUCCESS) {
    os << std::string(text, static_cast<std::size_t>(len));
  } else {
    os << "error code " << rc;
  }
  return os.str();
}

void throw_mpi_error(int rc, const char* call, const std::string& what, const char* file,
                     int line) {
  std::string message = what + ": " + call + " failed: " + mpi_error_string(rc);
  throw_error(ErrorCode::mpi, std::move(message),
              "check that every rank calls the same operations in the same order with the "
              "same counts and types; rerun with SHARDOPT_DEBUG=INFO for the library's log",
              file, line);
}

}  // namespace detail
}  // namespace shardopt

namespace {

// The caller's status as an int, read from its bytes: C code may pass any
// int, which C++ may not read as the enum.
int status_value(const shardopt_status_t& status) {
  int v = 0;
  static_assert(sizeof v == sizeof status);
  std::memcpy(&v, &status, sizeof v);
  return v;
}

}  // namespace

extern "C" {

const char* shardopt_status_name(shardopt_status_t status) {
  const auto* c = shardopt::find_code(status_value(status));
  return c ? c->name : "SHARDOPT_ERR_UNKNOWN";
}

const char* shardopt_status_description(shardopt_status_t status) {
  const auto* c = shardopt::find_code(status_value(status));
  return c ? c->description : "unknown status code";
}

}  // extern "C"
