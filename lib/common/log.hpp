// shardopt internal: logging controlled by SHARDOPT_DEBUG / SHARDOPT_DEBUG_FILE.
#pragma once

#include <sstream>
#include <string>

#include "shardopt/config.hpp"

namespace shardopt::detail {

bool log_enabled(LogLevel level) noexcept;
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
