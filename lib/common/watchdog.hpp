// shardopt internal: the watchdog (SHARDOPT_TIMEOUT). Every blocking
// operation of the library (a blocking collective, a wait for a
// non-blocking one, the argument exchange of SHARDOPT_DESYNC_CHECK) is
// bracketed by a WatchScope. With the watchdog armed, the operation is
// issued non-blocking and watch_poll() tests it from the calling thread;
// when it has waited longer than the timeout, that thread asks every other
// rank of the communicator, over the communicator's WatchChannel, where it
// is. Ranks inside a shardopt operation answer from their own poll loops
// (the same operation, or another one); the silent ones are not in the
// library at all. It prints what it waits for, where the library was
// (watch_context), and each rank's answer, and ends the process with exit
// status SHARDOPT_WATCHDOG_EXIT_CODE, which makes mpirun (or srun with
// --kill-on-bad-exit) end the whole job. A thread of the process is the
// backstop for blocking calls that cannot be polled. With the timeout at 0
// (the default) nothing here costs more than a test of one flag.
#pragma once

#include <mpi.h>

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <string>
#include <thread>
#include <vector>

#include "shardopt/types.hpp"

namespace shardopt::detail {

// Whether SHARDOPT_TIMEOUT is set (read once).
bool watchdog_armed() noexcept;

class WatchScope {
 public:
  // `op` is a string literal ("allreduce", "wait for ireduce_scatter").
  WatchScope(const char* op, std::size_t count, DType dtype, int ranks) noexcept;
  ~WatchScope();
  WatchScope(const WatchScope&) = delete;
  WatchScope& operator=(const WatchScope&) = delete;
  bool armed() const noexcept { return armed_; }

 private:
  bool armed_ = false;
};

// A communicator's side channel for the watchdog's question: a duplicate of
// it, and each rank's world rank, host and pid. Made collectively (one
// MPI_Comm_dup and one allgather) by a backend when the watchdog is armed.
class WatchChannel {
 public:
  explicit WatchChannel(MPI_Comm comm);
  ~WatchChannel();  // unregisters; frees the duplicate while MPI runs
  WatchChannel(const WatchChannel&) = delete;
  WatchChannel& operator=(const WatchChannel&) = delete;
  // Frees the duplicate now (with the communicator it shadows).
  void free();

  struct Peer {
    int world_rank = -1;
    long pid = 0;
    std::string host;
  };
  MPI_Comm comm() const noexcept { return comm_; }
  int rank() const noexcept { return rank_; }
  const std::vector<Peer>& peers() const noexcept { return peers_; }

 private:
  MPI_Comm comm_ = MPI_COMM_NULL;
  int rank_ = 0;
  std::vector<Peer> peers_;
};

// Calls done() from this thread until it returns true, answering other
// ranks' questions in between. Past the timeout of the outermost WatchScope
// it asks the ranks of `channel` (none when null) where they are, prints
// the report and ends the process. Exceptions of done() propagate.
void watch_poll(const std::function<bool()>& done, const WatchChannel* channel);
// The same for an operation that can wait without spinning: wait_for(d)
// waits up to d for it and returns whether it completed.
void watch_wait(const std::function<bool(std::chrono::microseconds)>& wait_for,
                const WatchChannel* channel);

// Calls done() until it returns true (then true) or d has passed (false),
// yielding the core between calls after the first 20 us: a thread it
// waits for (a transport's, the device's) may share the core where ranks
// fill the cores. watch_poll's wait, and PendingOp::wait_for's default.
template <class Done>
bool test_for(std::chrono::microseconds d, Done&& done) {
  const auto start = std::chrono::steady_clock::now();
  for (;;) {
    if (done()) return true;
    const auto waited = std::chrono::steady_clock::now() - start;
    if (waited >= d) return false;
    if (waited > std::chrono::microseconds(20)) std::this_thread::yield();
  }
}

// Device communicators that must be aborted when the watchdog ends the
// process (NCCL's: ncclCommAbort, so that the peers' operations fail rather
// than wait), keyed by their address. The watchdog calls each abort() once,
// after its report and before it exits; abort() must not throw.
void on_watchdog_exit(const void* key, std::function<void()> abort);
void forget_watchdog_exit(const void* key) noexcept;

// What the library is doing, for the watchdog's message ("step 12: the
// reduce-scatter of the gradients, bucket 3 of 8"): `what` a string
// literal, bucket SIZE_MAX for none. A few relaxed stores: the text is
// made only for a report.
void watch_context(std::int64_t step, const char* what, std::size_t bucket,
                   std::size_t buckets) noexcept;

}  // namespace shardopt::detail
