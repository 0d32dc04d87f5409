// shardopt-ckpt: what the commands share: the metadata keys, errors that
// every rank reports alike, a file's header and its tensors, and the work
// plans that cut the reading into windows dealt to the ranks in turn.
#pragma once

#include <mpi.h>

#include <cstddef>
#include <cstdint>
#include <exception>
#include <map>
#include <new>
#include <nlohmann/json.hpp>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include "shardopt/shardopt.hpp"

namespace ckpt_tool {

namespace ck = shardopt::ckpt;
using u64 = std::uint64_t;
using Json = nlohmann::ordered_json;
using shardopt::DType;

inline constexpr const char* kProgram = "shardopt-ckpt";
inline constexpr u64 kDefaultWindow = u64{64} << 20;

// Metadata keys (docs/checkpoint-format.md).
inline constexpr const char* kKeyFormat = "format";
inline constexpr const char* kKeyFormatVersion = "shardopt.format_version";
inline constexpr const char* kKeyVersion = "shardopt.version";
inline constexpr const char* kKeyContent = "shardopt.content";
inline constexpr const char* kKeyChecksum = "shardopt.checksum";
inline constexpr const char* kKeyChunkBytes = "shardopt.chunk_bytes";
inline constexpr const char* kKeyChunksPrefix = "shardopt.xxh3.";
inline constexpr const char* kKeyStep = "shardopt.step";
inline constexpr const char* kKeyOptimizer = "shardopt.optimizer";
inline constexpr const char* kKeyGroups = "shardopt.groups";
inline constexpr const char* kKeyParams = "shardopt.params";
inline constexpr const char* kKeyStates = "shardopt.states";
inline constexpr const char* kKeyStage = "shardopt.stage";
inline constexpr const char* kKeyRanks = "shardopt.ranks";
inline constexpr const char* kKeyDtype = "shardopt.dtype";
inline constexpr const char* kKeyRemainders = "shardopt.param_remainders";
inline constexpr const char* kKeyFingerprint = "shardopt.layout_fingerprint";

// ---------------------------------------------------------------------------
// Errors

// A failure every rank knows about (a collective call of the library threw
// the same error everywhere, or the ranks agreed on one): reported once, by
// rank 0, and the program goes on to its next file or stops cleanly.
class Failure : public std::runtime_error {
 public:
  Failure(std::string message, std::string hint = {})
      : std::runtime_error(std::move(message)), hint_(std::move(hint)) {}
  const std::string& hint() const noexcept { return hint_; }

 private:
  std::string hint_;
};

// The tool's own communicator (barriers, agreement, reductions), beside the
// library's: `tool` for the agreement (shardopt/agree.hpp), `comm`, its MPI
// communicator, for the raw calls.
struct World {
  shardopt::Communicator* tool = nullptr;
  MPI_Comm comm = MPI_COMM_NULL;
  int rank = 0;
  int size = 1;
};

// Collective: returns if `error` is empty on every rank; otherwise every
// rank throws the same Failure, the message of the lowest rank that failed.
void agree(const World& w, const std::string& error, const std::string& hint = {});

// Collective: runs fn, local work that may fail on some ranks only, and
// agrees on the outcome (see agree()).
template <class Fn>
void local(const World& w, Fn&& fn) {
  std::string error, hint;
  try {
    fn();
  } catch (const Failure& e) {
    error = e.what();
    hint = e.hint();
  } catch (const shardopt::Error& e) {
    error = e.message();
    hint = e.hint();
  } catch (const std::bad_alloc&) {
    error = "out of memory";
    hint = "lower --window, or run more ranks on more nodes";
  } catch (const std::exception& e) {
    error = e.what();
  }
  agree(w, error, hint);
}

// "shardopt-ckpt: CONTEXT: MESSAGE" and the fix, on stderr, from rank 0.
void report_failure(const World& w, const std::string& context, const std::string& message,
                    const std::string& hint);

// Runs fn (collective); a Failure or a shardopt::Error, which every rank
// sees alike, is reported under `context` and makes it return false.
template <class Fn>
bool guarded(const World& w, const std::string& context, Fn&& fn) {
  try {
    fn();
    return true;
  } catch (const Failure& e) {
    report_failure(w, context, e.what(), e.hint());
  } catch (const shardopt::Error& e) {
    report_failure(w, context, e.message(), e.hint());
  }
  return false;
}

// ---------------------------------------------------------------------------
// Headers

std::string meta(const ck::Header& h, const char* key, const std::string& fallback = "");
bool has_meta(const ck::Header& h, const char* key);

// A header's tensors by name.
class TensorIndex {
 public:
  explicit TensorIndex(const ck::Header& h) : h_(h) {
    for (std::size_t i = 0; i < h.tensors.size(); ++i) by_name_.emplace(h.tensors[i].name, i);
  }
  const ck::TensorInfo* find(const std::string& name) const {
    const auto it = by_name_.find(name);
    return it == by_name_.end() ? nullptr : &h_.tensors[it->second];
  }

 private:
  const ck::Header& h_;
  std::map<std::string, std::size_t> by_name_;
};

std::string shape_text(const std::vector<u64>& shape);

u64 chunks_of(const ck::Header& h, const ck::TensorInfo& t);

std::string bytes_text(double b);

// The parameters a checkpoint lists in shardopt.params.
struct ParamEntry {
  std::string name;
  int group = 0;
  u64 numel = 0;
};

std::vector<ParamEntry> params_of(const ck::Header& h);

std::size_t text_width(const std::vector<std::string>& v, std::size_t lo, std::size_t hi);

// ---------------------------------------------------------------------------
// Work plans: windows of elements, dealt to the ranks in turn

// Elements [first, first + count) of item `item`.
struct Unit {
  std::size_t item = 0;
  u64 first = 0, count = 0;
};
using Window = std::vector<Unit>;

// Cuts items of numel[i] elements, costing cost[i] bytes each to hold, into
// windows of at most `target` bytes, in order; a cut inside an item falls on
// a multiple of align[i] elements (a checksum chunk), so a single unit of
// align[i] elements may exceed the target.
std::vector<Window> cut_windows(const std::vector<u64>& numel, const std::vector<u64>& cost,
                                const std::vector<u64>& align, u64 target);

// The window size: the total shared by the ranks, at most `window`.
u64 window_target(u64 total_bytes, int ranks, u64 window);

std::size_t rounds_of(std::size_t windows, int ranks);

// This rank's window of round k, or null.
const Window* my_window(const std::vector<Window>& windows, std::size_t k, const World& w);

// The windows of a plan over everything, `total_bytes`, at most `window`
// bytes each (cut_windows, window_target).
inline std::vector<Window> plan_windows(const std::vector<u64>& numel, const std::vector<u64>& cost,
                                        const std::vector<u64>& align, u64 total_bytes,
                                        const World& w, u64 window) {
  return cut_windows(numel, cost, align, window_target(total_bytes, w.size, window));
}

// Local: calls fn(window) for each window this rank gets, in order.
template <class Fn>
void for_each_my_window(const std::vector<Window>& windows, const World& w, Fn&& fn) {
  for (std::size_t k = 0; k < rounds_of(windows.size(), w.size); ++k) {
    if (const Window* win = my_window(windows, k, w)) fn(*win);
  }
}

// A pre-touched buffer of at least `bytes`, reused.
class Scratch {
 public:
  unsigned char* get(u64 bytes) {
    if (buf_.size() < bytes) buf_ = shardopt::HostBuffer(static_cast<std::size_t>(bytes));
    return buf_.as<unsigned char>();
  }

 private:
  shardopt::HostBuffer buf_;
};

// Collective: opens a file. The library's errors are the same on every
// rank; the caller names the file. A directory is refused here, by name (the
// MPI-IO layer would open it and report a nonsensical size).
ck::Reader open_file(shardopt::Communicator& comm, const World& w, const std::string& path);

}  // namespace ckpt_tool
