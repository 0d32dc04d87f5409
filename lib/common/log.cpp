#include "common/log.hpp"

#include <sys/syscall.h>
#include <unistd.h>

#include <atomic>
#include <cstdio>
#include <mutex>

#include "common/check.hpp"

namespace shardopt::detail {

std::string host_name() {
  char buf[256] = {};
  if (gethostname(buf, sizeof buf - 1) != 0) return "unknown";
  return buf;
}

namespace {

std::mutex g_log_mutex;
std::FILE* g_log_file = nullptr;
bool g_log_file_tried = false;

// Expands %h, %p and %r in a SHARDOPT_DEBUG_FILE path.
std::string expand_path(const std::string& pattern) {
  std::string out;
  for (std::size_t i = 0; i < pattern.size(); ++i) {
    if (pattern[i] == '%' && i + 1 < pattern.size()) {
      const char c = pattern[i + 1];
      if (c == 'h') {
        out += host_name();
        ++i;
        continue;
      }
      if (c == 'p') {
        out += std::to_string(getpid());
        ++i;
        continue;
      }
      if (c == 'r') {
        out += std::to_string(world_rank());
        ++i;
        continue;
      }
    }
    out += pattern[i];
  }
  return out;
}

const char* level_name(LogLevel l) {
  switch (l) {
    case LogLevel::none:
      return "NONE";
    case LogLevel::warn:
      return "WARN";
    case LogLevel::info:
      return "INFO";
    case LogLevel::trace:
      return "TRACE";
  }
  return "?";
}

}  // namespace

std::atomic<int> g_log_level{-1};

int read_log_level() noexcept {
  int enabled;
  try {
    enabled = static_cast<int>(settings().debug);
  } catch (...) {
    enabled = static_cast<int>(LogLevel::warn);  // bad settings: keep warnings visible
  }
  g_log_level.store(enabled, std::memory_order_relaxed);
  return enabled;
}

void log_message(LogLevel level, const std::string& message) noexcept {
  try {
    std::lock_guard<std::mutex> lock(g_log_mutex);
    if (!g_log_file_tried) {
      g_log_file_tried = true;
      std::string path;
      try {
        path = settings().debug_file;
      } catch (...) {
      }
      if (!path.empty()) {
        const std::string expanded = expand_path(path);
        g_log_file = std::fopen(expanded.c_str(), "a");
        if (g_log_file == nullptr) {
          std::fprintf(stderr,
                       "shardopt WARN: cannot open SHARDOPT_DEBUG_FILE '%s'; logging to "
                       "stderr\n",
                       expanded.c_str());
        }
      }
    }
    std::FILE* out = g_log_file ? g_log_file : stderr;
    std::fprintf(out, "%s:%d:%ld [%d] SHARDOPT %s %s\n", host_name().c_str(), getpid(),
                 static_cast<long>(syscall(SYS_gettid)), world_rank(), level_name(level),
                 message.c_str());
    std::fflush(out);
  } catch (...) {
  }
}

}  // namespace shardopt::detail
