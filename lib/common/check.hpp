// shardopt internal: throwing and checking.
#pragma once

#include <string>
#include <vector>

#include "shardopt/error.hpp"

namespace shardopt::detail {

// Throws the Error subclass that matches `code`, tagged with this process's
// rank in MPI_COMM_WORLD (when MPI is running) and a short file path;
// reporter: Error::reporter() (an error the ranks agreed on).
[[noreturn]] void throw_error(ErrorCode code, std::string message, std::string hint,
                              const char* file, int line, int reporter = -1);

// Throws CommError for MPI return code `rc` from `call`, while doing `what`.
[[noreturn]] void throw_mpi_error(int rc, const char* call, const std::string& what,
                                  const char* file, int line);

// The text of an MPI error code ("MPI_ERR_TRUNCATE: message truncated").
std::string mpi_error_string(int rc);

// This process's rank in MPI_COMM_WORLD, -1 before MPI_Init (after MPI_Finalize: the one it had).
int world_rank() noexcept;

// "rank 3" or "ranks 0, 2", for messages that name ranks.
std::string ranks_list(const std::vector<int>& ranks);

}  // namespace shardopt::detail

#define SHARDOPT_THROW(code, message, hint)                                                 \
  ::shardopt::detail::throw_error(::shardopt::ErrorCode::code, (message), (hint), __FILE__, \
                                  __LINE__)

#define SHARDOPT_CHECK_MPI(call, what)                                                      \
  do {                                                                                      \
    const int shardopt_rc_ = (call);                                                        \
    if (shardopt_rc_ != MPI_SUCCESS)                                                        \
      ::shardopt::detail::throw_mpi_error(shardopt_rc_, #call, (what), __FILE__, __LINE__); \
  } while (0)
