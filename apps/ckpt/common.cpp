// shardopt-ckpt: the definitions of the shared part (common.hpp).
#include "common.hpp"

#include <sys/stat.h>

#include <algorithm>
#include <cstdio>
#include <limits>

#include "shardopt/agree.hpp"

namespace ckpt_tool {

// ---------------------------------------------------------------------------
// Errors

void agree(const World& w, const std::string& error, const std::string& hint) {
  if (w.size == 1) {
    if (!error.empty()) throw Failure(error, hint);
    return;
  }
  // The lowest rank that failed speaks for all: "on rank 2: ...".
  constexpr std::int64_t kNone = std::numeric_limits<std::int64_t>::max();
  const std::int64_t first = shardopt::min_over_ranks(*w.tool, error.empty() ? kNone : w.rank);
  if (first == kNone) return;
  try {
    shardopt::agree_or_throw(*w.tool, w.rank == first ? error : std::string(),
                             shardopt::ErrorCode::io, hint);
  } catch (const shardopt::Error& e) {
    throw Failure(e.message(), e.hint());
  }
}

void report_failure(const World& w, const std::string& context, const std::string& message,
                    const std::string& hint) {
  if (w.rank != 0) return;
  std::fprintf(stderr, "%s: %s%s%s\n", kProgram, context.c_str(), context.empty() ? "" : ": ",
               message.c_str());
  if (!hint.empty()) std::fprintf(stderr, "  fix: %s\n", hint.c_str());
  std::fflush(stderr);
}

// ---------------------------------------------------------------------------
// Headers

std::string meta(const ck::Header& h, const char* key, const std::string& fallback) {
  const auto it = h.metadata.find(key);
  return it == h.metadata.end() ? fallback : it->second;
}
bool has_meta(const ck::Header& h, const char* key) { return h.metadata.count(key) != 0; }

std::string shape_text(const std::vector<u64>& shape) {
  std::string s = "[";
  for (std::size_t i = 0; i < shape.size(); ++i) {
    if (i > 0) s += ", ";
    s += std::to_string(shape[i]);
  }
  return s + "]";
}

u64 chunks_of(const ck::Header& h, const ck::TensorInfo& t) {
  return h.chunk_bytes == 0 ? 0 : (t.bytes() + h.chunk_bytes - 1) / h.chunk_bytes;
}

std::string bytes_text(double b) {
  char buf[64];
  if (b >= double(1 << 30)) {
    std::snprintf(buf, sizeof buf, "%.2f GiB", b / double(1 << 30));
  } else if (b >= double(1 << 20)) {
    std::snprintf(buf, sizeof buf, "%.2f MiB", b / double(1 << 20));
  } else if (b >= 1024) {
    std::snprintf(buf, sizeof buf, "%.2f KiB", b / 1024);
  } else {
    std::snprintf(buf, sizeof buf, "%.0f B", b);
  }
  return buf;
}

std::vector<ParamEntry> params_of(const ck::Header& h) {
  std::vector<ParamEntry> out;
  const auto it = h.metadata.find(kKeyParams);
  if (it == h.metadata.end()) return out;
  try {
    const Json j = Json::parse(it->second);
    for (const Json& p : j) {
      out.push_back(
          {p.at("name").get<std::string>(), p.value("group", 0), p.value("numel", u64{0})});
    }
  } catch (const Json::exception& e) {
    throw Failure(
        std::string(kKeyParams) + " is not a JSON array of {name, group, numel}: " + e.what(),
        "the file is damaged or was not written by shardopt");
  }
  return out;
}

std::size_t text_width(const std::vector<std::string>& v, std::size_t lo, std::size_t hi) {
  std::size_t w = lo;
  for (const std::string& s : v) w = std::max(w, s.size());
  return std::min(w, hi);
}

// ---------------------------------------------------------------------------
// Work plans

std::vector<Window> cut_windows(const std::vector<u64>& numel, const std::vector<u64>& cost,
                                const std::vector<u64>& align, u64 target) {
  std::vector<Window> out;
  Window cur;
  u64 held = 0;
  auto flush = [&] {
    if (!cur.empty()) out.push_back(std::move(cur));
    cur.clear();
    held = 0;
  };
  for (std::size_t i = 0; i < numel.size(); ++i) {
    const u64 a = std::max<u64>(1, align[i]);
    const u64 c = std::max<u64>(1, cost[i]);
    u64 at = 0;
    while (at < numel[i]) {
      const u64 left = numel[i] - at;
      u64 n = std::min(left, target > held ? (target - held) / c : 0);
      if (n < left) n = n / a * a;
      if (n == 0) {
        if (!cur.empty()) {
          flush();
          continue;
        }
        n = std::min(a, left);
      }
      cur.push_back({i, at, n});
      held += n * c;
      at += n;
      if (held >= target) flush();
    }
  }
  flush();
  return out;
}

u64 window_target(u64 total_bytes, int ranks, u64 window) {
  const u64 share = (total_bytes + static_cast<u64>(ranks) - 1) / static_cast<u64>(ranks);
  return std::max<u64>(1, std::min(window, share));
}

std::size_t rounds_of(std::size_t windows, int ranks) {
  return (windows + static_cast<std::size_t>(ranks) - 1) / static_cast<std::size_t>(ranks);
}

const Window* my_window(const std::vector<Window>& windows, std::size_t k, const World& w) {
  const std::size_t i = k * static_cast<std::size_t>(w.size) + static_cast<std::size_t>(w.rank);
  return i < windows.size() ? &windows[i] : nullptr;
}

ck::Reader open_file(shardopt::Communicator& comm, const World& w, const std::string& path) {
  int is_dir = 0;
  if (w.rank == 0) {
    struct stat st {};
    is_dir = ::stat(path.c_str(), &st) == 0 && S_ISDIR(st.st_mode) ? 1 : 0;
  }
  MPI_Bcast(&is_dir, 1, MPI_INT, 0, w.comm);
  if (is_dir) throw Failure("is a directory, not a file", "pass the path of a checkpoint file");
  return ck::Reader(comm, path);
}

}  // namespace ckpt_tool
