// shardopt internal: the watchdog (SHARDOPT_TIMEOUT). Every blocking
// operation of the library (a blocking collective, a wait for a
// non-blocking one) is bracketed by a WatchScope; a thread of the process
// wakes a few times a second and, when the current operation has waited
// longer than the timeout, prints what it waits for and where the library
// was (watch_context), and ends the process with exit status
// SHARDOPT_WATCHDOG_EXIT_CODE, which makes mpirun (or srun with
// --kill-on-bad-exit) end the whole job. With the timeout at 0 (the
// default) nothing here costs more than a test of one flag.
#pragma once

#include <cstddef>
#include <string>

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

 private:
  bool armed_ = false;
};

// What the library is doing, for the watchdog's message ("step 12:
// reduce-scatter of bucket 3 of 8"). Cheap to skip: callers build the
// string only when watchdog_armed().
void watch_context(std::string what);

}  // namespace shardopt::detail
