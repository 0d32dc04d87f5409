// shardopt: the error hierarchy.
//
// Every failure the library reports is a shardopt::Error (or a subclass):
// it carries a stable code (shardopt_status_t), the message, a hint that says
// how to fix the problem, the rank that raised it and the file:line of the
// throw. Destructors in shardopt never throw.
#pragma once

#include <stdexcept>
#include <string>

#include "shardopt/export.h"
#include "shardopt/status.h"

namespace shardopt {

enum class ErrorCode : int {
  invalid_argument = SHARDOPT_ERR_INVALID_ARGUMENT,
  invalid_config = SHARDOPT_ERR_INVALID_CONFIG,
  mpi_not_initialized = SHARDOPT_ERR_MPI_NOT_INITIALIZED,
  mpi_finalized = SHARDOPT_ERR_MPI_FINALIZED,
  mpi = SHARDOPT_ERR_MPI,
  cuda = SHARDOPT_ERR_CUDA,
  nccl = SHARDOPT_ERR_NCCL,
  not_compiled = SHARDOPT_ERR_NOT_COMPILED,
  unsupported = SHARDOPT_ERR_UNSUPPORTED,
  layout_mismatch = SHARDOPT_ERR_LAYOUT_MISMATCH,
  wrong_device = SHARDOPT_ERR_WRONG_DEVICE,
  out_of_memory = SHARDOPT_ERR_OUT_OF_MEMORY,
  io = SHARDOPT_ERR_IO,
  checkpoint = SHARDOPT_ERR_CHECKPOINT,
  non_finite = SHARDOPT_ERR_NON_FINITE,
  desync = SHARDOPT_ERR_DESYNC,
  timeout = SHARDOPT_ERR_TIMEOUT,
  invalid_state = SHARDOPT_ERR_INVALID_STATE,
  internal = SHARDOPT_ERR_INTERNAL,
};

// "SHARDOPT_ERR_MPI" and so on.
SHARDOPT_API const char* error_code_name(ErrorCode code) noexcept;

class SHARDOPT_API Error : public std::runtime_error {
 public:
  // rank is the rank in MPI_COMM_WORLD that raised the error, -1 if unknown.
  // reporter: for an error the ranks agreed on (raised on every rank of a
  // communicator with the same message), the lowest world rank that found
  // it, which prints it (reports_error); -1 for an error of this rank alone.
  Error(ErrorCode code, std::string message, std::string hint, const char* file, int line,
        int rank = -1, int reporter = -1);

  ErrorCode code() const noexcept { return code_; }
  shardopt_status_t status() const noexcept { return static_cast<shardopt_status_t>(code_); }
  const std::string& message() const noexcept { return message_; }
  const std::string& hint() const noexcept { return hint_; }
  const char* file() const noexcept { return file_; }
  int line() const noexcept { return line_; }
  int rank() const noexcept { return rank_; }
  int reporter() const noexcept { return reporter_; }

 private:
  ErrorCode code_;
  std::string message_;
  std::string hint_;
  const char* file_;
  int line_;
  int rank_;
  int reporter_;
};

// Whether this rank is the one that prints e, so that a job prints each
// error once: true for an error of this rank alone (reporter() -1); for an
// error the ranks agreed on, true on its reporter only, and on every rank
// with SHARDOPT_DEBUG=INFO or DEBUG.
SHARDOPT_API bool reports_error(const Error& e) noexcept;

// One subclass per kind of cause a caller may want to catch on its own.
class SHARDOPT_API InvalidArgument : public Error {
  using Error::Error;
};
class SHARDOPT_API ConfigError : public Error {  // bad SHARDOPT_* variable or option
  using Error::Error;
};
class SHARDOPT_API MpiStateError : public Error {  // MPI not initialized / finalized
  using Error::Error;
};
class SHARDOPT_API CommError : public Error {  // an MPI, NCCL or CUDA call failed
  using Error::Error;
};
class SHARDOPT_API NotCompiledError : public Error {
  using Error::Error;
};
class SHARDOPT_API UnsupportedError : public Error {
  using Error::Error;
};
class SHARDOPT_API DeviceError : public Error {  // buffer in memory of the wrong kind
  using Error::Error;
};
class SHARDOPT_API StateError : public Error {  // object used after free or move
  using Error::Error;
};
// A checkpoint file that is malformed, corrupted (a checksum differs), from
// a newer format, or does not match the optimizer (ErrorCode::checkpoint).
class SHARDOPT_API CheckpointError : public Error {
  using Error::Error;
};
// A file system operation failed: open, write, sync, rename, a full disk
// (ErrorCode::io).
class SHARDOPT_API IoError : public Error {
  using Error::Error;
};
// Ranks out of step with each other: parameters that differ between ranks
// (check_sync), or ranks that issued different collectives
// (ErrorCode::desync).
class SHARDOPT_API DesyncError : public Error {
  using Error::Error;
};
// A gradient held an inf or a NaN (NonFinite::error).
class SHARDOPT_API NonFiniteError : public Error {
  using Error::Error;
};

}  // namespace shardopt
