#include "common/watchdog.hpp"

#include <mpi.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <mutex>
#include <thread>

#include "common/log.hpp"
#include "shardopt/config.hpp"
#include "shardopt/status.h"

namespace shardopt::detail {

namespace {

using Clock = std::chrono::steady_clock;

struct State {
  std::mutex m;
  int depth = 0;        // nested scopes: only the outermost is timed
  const char* op = "";  // the operation waited for
  std::size_t count = 0;
  DType dtype = DType::f32;
  int ranks = 0;
  Clock::time_point since;
  std::uint64_t seq = 0;  // blocking operations entered so far
  std::string context = "(no step yet)";
  int world_rank = -1;
  std::once_flag started;
};

// Never destroyed: the monitor thread may look at it while the process
// exits.
State& state() {
  static State* s = new State;
  return *s;
}

double timeout_seconds() noexcept {
  try {
    return settings().timeout;
  } catch (...) {
    return 0.0;  // a bad value is reported by the library's other calls
  }
}

[[noreturn]] void fire(State& s, double timeout, double waited) {
  const std::string h = host_name();
  std::fprintf(stderr,
               "shardopt watchdog on rank %d (host %s, pid %ld) [SHARDOPT_ERR_TIMEOUT]: %s of "
               "%zu %s over %d rank(s) has not completed after %.1f s (SHARDOPT_TIMEOUT=%g); "
               "the library was at: %s; blocking operation #%llu of this rank. A rank of this "
               "communicator has not reached the same operation: it is stuck elsewhere "
               "(computing, in I/O, in a deadlock of the application), has died, or issued "
               "another collective. Which rank cannot be seen from inside a blocking MPI call: "
               "the ranks that print this message are waiting, the others are the ones to look "
               "at.\n  fix: look at what the silent ranks were doing (py-spy/gdb -p, their "
               "logs); run with SHARDOPT_CHECK_ARGS=1 to catch ranks that issue different "
               "collectives; raise SHARDOPT_TIMEOUT if a step can legitimately take longer\n"
               "  ending the job: exit status %d\n",
               s.world_rank, h.c_str(), static_cast<long>(getpid()), s.op, s.count,
               dtype_name(s.dtype), s.ranks, waited, timeout, s.context.c_str(),
               static_cast<unsigned long long>(s.seq), SHARDOPT_WATCHDOG_EXIT_CODE);
  std::fflush(stderr);
  std::_Exit(SHARDOPT_WATCHDOG_EXIT_CODE);
}

void monitor(double timeout) {
  State& s = state();
  const auto tick = std::chrono::duration<double>(std::min(0.1, timeout / 10.0));
  for (;;) {
    std::this_thread::sleep_for(tick);
    std::lock_guard<std::mutex> lock(s.m);
    if (s.depth == 0) continue;
    const double waited = std::chrono::duration<double>(Clock::now() - s.since).count();
    if (waited > timeout) fire(s, timeout, waited);
  }
}

}  // namespace

bool watchdog_armed() noexcept {
  static const bool armed = timeout_seconds() > 0.0;
  return armed;
}

WatchScope::WatchScope(const char* op, std::size_t count, DType dtype, int ranks) noexcept {
  if (!watchdog_armed()) return;
  armed_ = true;
  State& s = state();
  std::call_once(s.started, [&] {
    int init = 0, fin = 0;
    MPI_Initialized(&init);
    MPI_Finalized(&fin);
    if (init && !fin) MPI_Comm_rank(MPI_COMM_WORLD, &s.world_rank);
    const double t = timeout_seconds();
    try {
      std::thread(monitor, t).detach();
    } catch (...) {
      std::fprintf(stderr, "shardopt: SHARDOPT_TIMEOUT: cannot start the watchdog thread\n");
    }
  });
  std::lock_guard<std::mutex> lock(s.m);
  if (s.depth++ > 0) return;
  s.op = op;
  s.count = count;
  s.dtype = dtype;
  s.ranks = ranks;
  s.since = Clock::now();
  ++s.seq;
}

WatchScope::~WatchScope() {
  if (!armed_) return;
  State& s = state();
  std::lock_guard<std::mutex> lock(s.m);
  --s.depth;
}

void watch_context(std::string what) {
  if (!watchdog_armed()) return;
  State& s = state();
  std::lock_guard<std::mutex> lock(s.m);
  s.context = std::move(what);
}

}  // namespace shardopt::detail
