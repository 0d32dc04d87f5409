// shardopt internal: knowing, cheaply, that MPI_Finalize has begun, and
// releasing MPI objects at that moment.
#pragma once

#include <atomic>
#include <functional>

namespace shardopt::detail {

// Registers `fn` to run when MPI_Finalize begins (MPI deletes the attributes
// of MPI_COMM_SELF first thing, and shardopt keeps one there). MPI must be
// running. Callbacks run in the order they were registered.
void at_mpi_finalize(std::function<void()> fn);

// True once MPI_Finalize has begun. After any at_mpi_finalize registration
// this is one atomic load (it sits on every collective's path); before, it
// asks MPI_Finalized. Inline: the state behind it is these two flags.
extern std::atomic<bool> g_finalize_watched;
extern std::atomic<bool> g_finalize_started;
bool ask_mpi_finalized() noexcept;

inline bool mpi_finalize_started() noexcept {
  if (g_finalize_watched.load(std::memory_order_relaxed)) [[likely]]
    return g_finalize_started.load(std::memory_order_relaxed);
  return ask_mpi_finalized();
}

}  // namespace shardopt::detail
