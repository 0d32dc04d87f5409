// shardopt: an optional RAII owner of MPI for programs that do not
// initialize MPI themselves.
//
//   int main(int argc, char** argv) {
//     shardopt::Environment env(&argc, &argv);   // MPI_Init_thread if needed
//     shardopt::Communicator comm(MPI_COMM_WORLD);
//     ...
//   }                                              // MPI_Finalize if env did init
//
// Codes that already call MPI_Init keep doing so and need no Environment.
#pragma once

#include "shardopt/export.h"

namespace shardopt {

// The MPI thread support levels, in increasing order.
enum class ThreadLevel : int { single = 0, funneled = 1, serialized = 2, multiple = 3 };

// shardopt calls MPI only from the thread that calls it, while its CPU
// kernels run OpenMP threads that never call MPI: that is MPI_THREAD_FUNNELED.
inline constexpr ThreadLevel required_thread_level = ThreadLevel::funneled;

SHARDOPT_API const char* thread_level_name(ThreadLevel level) noexcept;

class SHARDOPT_API Environment {
 public:
  // If MPI is not initialized: calls MPI_Init_thread asking for `level` and
  // throws MpiStateError if MPI provides less; the destructor then finalizes.
  // If MPI is already initialized: checks the level MPI provides and finalizes
  // nothing. Throws MpiStateError if MPI was already finalized (it cannot be
  // initialized twice). argc/argv may be null.
  explicit Environment(int* argc = nullptr, char*** argv = nullptr,
                       ThreadLevel level = required_thread_level);
  Environment(const Environment&) = delete;
  Environment& operator=(const Environment&) = delete;
  // Calls MPI_Finalize if this object initialized MPI. Never throws.
  ~Environment();

  // True if this object called MPI_Init_thread (and will finalize).
  bool owns_mpi() const noexcept { return owns_; }
  // The thread level MPI provides.
  ThreadLevel provided() const noexcept { return provided_; }

 private:
  bool owns_ = false;
  ThreadLevel provided_ = ThreadLevel::single;
};

// Local checks any rank may call at any time.
SHARDOPT_API bool mpi_is_initialized() noexcept;
SHARDOPT_API bool mpi_is_finalized() noexcept;

}  // namespace shardopt
