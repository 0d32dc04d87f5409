// shardopt internal: logging controlled by SHARDOPT_DEBUG / SHARDOPT_DEBUG_FILE.
#pragma once

#include <atomic>
#include <sstream>
#include <string>

#include "shardopt/config.hpp"

namespace shardopt::detail {

// The level in force, -1 until first read; cached because log_enabled() sits
// on every collective's path.
extern std::atomic<int> g_log_level;
int read_log_level() noexcept;

inline bool log_enabled(LogLevel level) noexcept {
  int enabled = g_log_level.load(std::memory_order_relaxed);
  if (enabled < 0) enabled = read_log_level();
  return static_cast<int>(level) <= enabled;
}
// This machine's host name, "unknown" if it cannot be read.
std::string host_name();

// Writes one line "host:pid:tid [rank] SHARDOPT LEVEL message". Never throws.
void log_message(LogLevel level, const std::string& message) noexcept;

}  // namespace shardopt::detail

#define SHARDOPT_LOG(level, stream_expr)                                                \
  do {                                                                                  \
    if (::shardopt::detail::log_enabled(::shardopt::LogLevel::level)) {                 \
      std::ostringstream shardopt_os_;                                                  \
      shardopt_os_ << stream_expr;                                                      \
      ::shardopt::detail::log_message(::shardopt::LogLevel::level, shardopt_os_.str()); \
    }                                                                                   \
  } while (0)
