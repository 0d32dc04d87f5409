// shardopt-ckpt: inspect, verify, export, compare and benchmark checkpoint
// files (docs/checkpoint.md, "The shardopt-ckpt tool").
//
//   shardopt-ckpt info ckpt.safetensors
//   mpirun -n 4 shardopt-ckpt verify ckpt.safetensors ckpt.safetensors.1
//   mpirun -n 2 shardopt-ckpt export ckpt.safetensors model.safetensors --dtype bf16
//   shardopt-ckpt diff a.safetensors b.safetensors --rtol 1e-6
//   mpirun -n 2 shardopt-ckpt bench -p 25M -D /scratch/me
//
// Runs alone or under mpirun: the reading is cut into windows of at most
// --window bytes, dealt to the ranks in turn, and each round of windows is
// one collective read, so every rank holds about one window (export also
// holds its share of the output, written with one collective write). Rank 0
// prints. Every error is reported once,
// on stderr, and every rank exits with the same status. Uses only the public
// API of shardopt, MPI, nlohmann-json and the standard library.
#include <fcntl.h>
#include <mpi.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/statfs.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <climits>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <limits>
#include <map>
#include <nlohmann/json.hpp>
#include <optional>
#include <random>
#include <set>
#include <span>
#include <stdexcept>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "cli.hpp"
#include "machine.hpp"
#include "report.hpp"
#include "shardopt/shardopt.hpp"

namespace {

namespace ck = shardopt::ckpt;
using cli::bad_value;
using cli::human_count;
using cli::OptionSpec;
using cli::UsageError;
using shardopt::DType;
using u64 = std::uint64_t;
using Json = nlohmann::ordered_json;

constexpr const char* kProgram = "shardopt-ckpt";
constexpr u64 kDefaultWindow = u64{64} << 20;

// Metadata keys (docs/checkpoint-format.md).
constexpr const char* kKeyFormat = "format";
constexpr const char* kKeyFormatVersion = "shardopt.format_version";
constexpr const char* kKeyVersion = "shardopt.version";
constexpr const char* kKeyContent = "shardopt.content";
constexpr const char* kKeyChecksum = "shardopt.checksum";
constexpr const char* kKeyChunkBytes = "shardopt.chunk_bytes";
constexpr const char* kKeyChunksPrefix = "shardopt.xxh3.";
constexpr const char* kKeyStep = "shardopt.step";
constexpr const char* kKeyOptimizer = "shardopt.optimizer";
constexpr const char* kKeyGroups = "shardopt.groups";
constexpr const char* kKeyParams = "shardopt.params";
constexpr const char* kKeyStates = "shardopt.states";
constexpr const char* kKeyStage = "shardopt.stage";
constexpr const char* kKeyRanks = "shardopt.ranks";
constexpr const char* kKeyDtype = "shardopt.dtype";
constexpr const char* kKeyRemainders = "shardopt.param_remainders";
constexpr const char* kKeyFingerprint = "shardopt.layout_fingerprint";

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
// library's.
struct World {
  MPI_Comm comm = MPI_COMM_NULL;
  int rank = 0;
  int size = 1;
};

// Collective: returns if `error` is empty on every rank; otherwise every
// rank throws the same Failure, the message of the lowest rank that failed.
void agree(const World& w, const std::string& error, const std::string& hint = {}) {
  int first = error.empty() ? INT_MAX : w.rank;
  MPI_Allreduce(MPI_IN_PLACE, &first, 1, MPI_INT, MPI_MIN, w.comm);
  if (first == INT_MAX) return;
  std::string text = error + '\n' + hint;
  int n = static_cast<int>(text.size());
  MPI_Bcast(&n, 1, MPI_INT, first, w.comm);
  text.resize(static_cast<std::size_t>(n));
  MPI_Bcast(text.data(), n, MPI_CHAR, first, w.comm);
  const std::size_t nl = text.find('\n');
  std::string message = text.substr(0, nl);
  if (w.size > 1) message = "on rank " + std::to_string(first) + ": " + message;
  throw Failure(message, text.substr(nl + 1));
}

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
                    const std::string& hint) {
  if (w.rank != 0) return;
  std::fprintf(stderr, "%s: %s%s%s\n", kProgram, context.c_str(), context.empty() ? "" : ": ",
               message.c_str());
  if (!hint.empty()) std::fprintf(stderr, "  fix: %s\n", hint.c_str());
  std::fflush(stderr);
}

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
// Command lines: COMMAND [options] [operands]

// Splits the words after the command into options (handed to
// cli::for_each_option, which reports unknown ones) and operands; "--" ends
// the options.
template <class Apply>
std::vector<std::string> parse_words(int argc, char** argv, std::span<const OptionSpec> specs,
                                     Apply&& apply) {
  std::vector<char*> options{argv[0]};
  std::vector<std::string> operands;
  auto takes_value = [&](std::string_view arg) {
    for (const OptionSpec& s : specs) {
      if (!s.takes_value) continue;
      if (arg.starts_with("--") && arg.substr(2) == s.long_name) return true;
      if (arg.size() == 2 && s.short_name != 0 && arg[1] == s.short_name) return true;
    }
    return false;
  };
  bool only_operands = false;
  for (int i = 2; i < argc; ++i) {
    const std::string_view arg = argv[i];
    if (only_operands || arg.size() < 2 || arg[0] != '-') {
      operands.emplace_back(arg);
    } else if (arg == "--") {
      only_operands = true;
    } else {
      options.push_back(argv[i]);
      if (takes_value(arg) && i + 1 < argc) options.push_back(argv[++i]);
    }
  }
  cli::for_each_option(static_cast<int>(options.size()), options.data(), specs, apply);
  return operands;
}

// A byte count: 64M, 1G, 4096.
u64 parse_bytes(const std::string& label, std::string_view v) {
  const auto n = cli::parse_scaled(v, u64{1} << 40);
  if (!n) bad_value(label, v, "a positive byte count with an optional K, M or G suffix, e.g. 64M");
  return *n;
}

double parse_nonnegative(const std::string& label, std::string_view v) {
  const std::string s(v);
  char* end = nullptr;
  const double x = std::strtod(s.c_str(), &end);
  if (s.empty() || *end != '\0' || !std::isfinite(x) || x < 0) {
    bad_value(label, v, "a finite number >= 0, e.g. 1e-6");
  }
  return x;
}

void expect_operands(const std::vector<std::string>& ops, std::size_t lo, std::size_t hi,
                     const char* what) {
  if (ops.size() < lo || ops.size() > hi) {
    throw UsageError{std::string("expected ") + what + ", got " + std::to_string(ops.size()) +
                     " operand" + (ops.size() == 1 ? "" : "s")};
  }
}

const char* kUsage =
    "usage: shardopt-ckpt COMMAND [options] OPERANDS...\n"
    "       mpirun -n N shardopt-ckpt COMMAND ...   (the reading and writing is shared\n"
    "                                                by the ranks; rank 0 prints)\n"
    "\n"
    "Commands:\n"
    "  info FILE           the header of a checkpoint, an export or any safetensors file:\n"
    "                      size, format and shardopt versions, content, step, optimizer,\n"
    "                      stage, ranks, dtype, checksum chunks, the parameter groups and\n"
    "                      a table of the tensors with totals\n"
    "      --json          one JSON object instead\n"
    "  verify FILE...      reads every byte of every tensor and checks every chunk's\n"
    "                      checksum; prints 'FILE: ok (...)' or the error per file\n"
    "      --allow-unchecksummed  a file without checksums is read through and passes\n"
    "                      (default: an error, there is nothing to verify)\n"
    "  export CKPT OUT     the parameters of checkpoint CKPT (its fp32 master tensors,\n"
    "                      the names of shardopt.params) as a plain export file OUT\n"
    "      -d, --dtype T   f32 (default), bf16 or f16 (rounded to nearest even)\n"
    "      --chunk-bytes SIZE  checksum chunk of OUT (default 1M)\n"
    "  diff A B            compares two files tensor by tensor (only in A, only in B,\n"
    "                      dtype or shape, max abs and rel difference, elements that\n"
    "                      differ) and their metadata (step, optimizer, groups, ...)\n"
    "      --atol X, --rtol Y  equal within |a - b| <= atol + rtol * |b| (b from B);\n"
    "                      without them, equal means bitwise equal\n"
    "      --params-only   only the parameters (the tensors of shardopt.params of A or B,\n"
    "                      all tensors of an export) and the step: a checkpoint against\n"
    "                      its export\n"
    "      -q, --quiet     print only what differs and the summary\n"
    "  bench               times ZeroRedundancyOptimizer::save and load (AdamW, stage 1,\n"
    "                      fp32) beside raw pwrite+fsync and pread of as many bytes in\n"
    "                      the same directory, in the same run\n"
    "      -p, --params LIST  parameter counts, K, M or G suffix (default 25M)\n"
    "      -D, --dir DIR   where to write (default .); the files are removed afterwards\n"
    "      -n, --iters N   timed iterations, the median is shown (default 5)\n"
    "      --warmup N      untimed iterations first (default 1)\n"
    "      --cold          drop the files' pages from the page cache (posix_fadvise)\n"
    "                      before each read: reads come from the device, not from memory\n"
    "      --json          one JSON object per row on stdout; the rest on stderr\n"
    "\n"
    "Options of verify, export and diff:\n"
    "  -w, --window SIZE   bytes a rank reads at a time (default 64M); each rank holds\n"
    "                      about that much (export: also its share of OUT)\n"
    "  -h, --help          this text\n"
    "\n"
    "Exit status: 0 success; 1 a file failed (verify), differs (diff) or an error; 2 a bad\n"
    "command line, and for diff any error (as diff(1)).\n";

// ---------------------------------------------------------------------------
// Headers

std::string meta(const ck::Header& h, const char* key, const std::string& fallback = "") {
  const auto it = h.metadata.find(key);
  return it == h.metadata.end() ? fallback : it->second;
}
bool has_meta(const ck::Header& h, const char* key) { return h.metadata.count(key) != 0; }

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

// The parameters a checkpoint lists in shardopt.params.
struct ParamEntry {
  std::string name;
  int group = 0;
  u64 numel = 0;
};

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

// A metadata value that is JSON text (groups, params, states) as JSON, or
// as a JSON string if it does not parse.
Json json_value(const std::string& text) {
  try {
    return Json::parse(text);
  } catch (const Json::exception&) {
    return Json(text);
  }
}

// A decimal metadata value as a JSON number, or the string if it is not one.
Json number_value(const std::string& text) {
  if (const auto v = cli::parse_unsigned(text)) return Json(*v);
  return Json(text);
}

std::size_t text_width(const std::vector<std::string>& v, std::size_t lo, std::size_t hi) {
  std::size_t w = lo;
  for (const std::string& s : v) w = std::max(w, s.size());
  return std::min(w, hi);
}

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

// The window size: the total shared by the ranks, at most `window`.
u64 window_target(u64 total_bytes, int ranks, u64 window) {
  const u64 share = (total_bytes + static_cast<u64>(ranks) - 1) / static_cast<u64>(ranks);
  return std::max<u64>(1, std::min(window, share));
}

std::size_t rounds_of(std::size_t windows, int ranks) {
  return (windows + static_cast<std::size_t>(ranks) - 1) / static_cast<std::size_t>(ranks);
}

// This rank's window of round k, or null.
const Window* my_window(const std::vector<Window>& windows, std::size_t k, const World& w) {
  const std::size_t i = k * static_cast<std::size_t>(w.size) + static_cast<std::size_t>(w.rank);
  return i < windows.size() ? &windows[i] : nullptr;
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

// ---------------------------------------------------------------------------
// info

struct InfoOptions {
  bool json = false;
};

void print_info_text(const ck::Reader& r) {
  const ck::Header& h = r.header();
  auto row = [](const char* key, const std::string& value) {
    std::printf("%-20s %s\n", key, value.c_str());
  };
  row("file:", r.path());
  row("size:", std::to_string(h.file_bytes) + " bytes (" + bytes_text(double(h.file_bytes)) +
                   "), header " + std::to_string(h.header_bytes) + " bytes, data at " +
                   std::to_string(h.data_start));
  if (h.format_version == 0) {
    row("format version:", "0: a plain safetensors file, no shardopt metadata");
  } else {
    row("format version:", std::to_string(h.format_version));
    row("shardopt version:", meta(h, kKeyVersion, "-"));
    row("content:", meta(h, kKeyContent, "-"));
    row("step:", meta(h, kKeyStep, "-"));
    if (meta(h, kKeyContent) == "checkpoint") {
      row("optimizer:", meta(h, kKeyOptimizer, "-"));
      row("stage:", meta(h, kKeyStage, "-"));
      row("ranks saved at:", meta(h, kKeyRanks, "-"));
    }
    row("dtype:", meta(h, kKeyDtype, "-"));
    if (has_meta(h, kKeyRemainders)) row("param remainders:", meta(h, kKeyRemainders));
    if (has_meta(h, kKeyFingerprint)) row("layout fingerprint:", meta(h, kKeyFingerprint));
  }
  row("checksums:", h.chunk_bytes == 0 ? std::string("none")
                                       : meta(h, kKeyChecksum, "?") + " per chunk of " +
                                             std::to_string(h.chunk_bytes) + " bytes (" +
                                             bytes_text(double(h.chunk_bytes)) + ")");
  if (has_meta(h, kKeyGroups)) row("groups:", meta(h, kKeyGroups));
  if (has_meta(h, kKeyParams)) {
    const std::vector<ParamEntry> ps = params_of(h);
    u64 n = 0;
    for (const ParamEntry& p : ps) n += p.numel;
    row("params:", std::to_string(ps.size()) + " tensors, " + std::to_string(n) + " elements");
  }
  if (has_meta(h, kKeyStates)) row("states:", meta(h, kKeyStates));
  // Metadata the lines above do not show (checksums excepted).
  for (const auto& [k, v] : h.metadata) {
    if (k.starts_with(kKeyChunksPrefix)) continue;
    if (k.starts_with("shardopt.") && h.format_version > 0) {
      static const char* shown[] = {kKeyFormatVersion, kKeyVersion,    kKeyContent,    kKeyChecksum,
                                    kKeyChunkBytes,    kKeyStep,       kKeyOptimizer,  kKeyGroups,
                                    kKeyParams,        kKeyStates,     kKeyStage,      kKeyRanks,
                                    kKeyDtype,         kKeyRemainders, kKeyFingerprint};
      if (std::any_of(std::begin(shown), std::end(shown),
                      [&key = k](const char* s) { return key == s; }))
        continue;
    }
    std::string value = v.size() > 200 ? v.substr(0, 200) + "..." : v;
    row("metadata:", k + " = \"" + value + "\"");
  }

  std::vector<std::string> names, dtypes, shapes;
  for (const ck::TensorInfo& t : h.tensors) {
    names.push_back(t.name);
    dtypes.push_back(t.dtype);
    shapes.push_back(shape_text(t.shape));
  }
  const int nw = static_cast<int>(text_width(names, 6, 60));
  const int sw = static_cast<int>(text_width(shapes, 5, 40));
  std::printf("\n%-*s  %-7s  %-*s  %14s  %8s\n", nw, "tensor", "dtype", sw, "shape", "bytes",
              "chunks");
  u64 bytes = 0, chunks = 0;
  for (std::size_t i = 0; i < h.tensors.size(); ++i) {
    const ck::TensorInfo& t = h.tensors[i];
    const u64 c = chunks_of(h, t);
    bytes += t.bytes();
    chunks += c;
    std::printf("%-*s  %-7s  %-*s  %14llu  %8s\n", nw, names[i].c_str(), dtypes[i].c_str(), sw,
                shapes[i].c_str(), static_cast<unsigned long long>(t.bytes()),
                h.chunk_bytes == 0 ? "-" : std::to_string(c).c_str());
  }
  std::printf("total: %zu tensors, %llu bytes (%s), %s\n", h.tensors.size(),
              static_cast<unsigned long long>(bytes), bytes_text(double(bytes)).c_str(),
              h.chunk_bytes == 0 ? "no checksums"
                                 : (std::to_string(chunks) + " checksummed chunks").c_str());
}

Json info_json(const ck::Reader& r) {
  const ck::Header& h = r.header();
  Json j;
  j["file"] = r.path();
  j["file_bytes"] = h.file_bytes;
  j["header_bytes"] = h.header_bytes;
  j["data_start"] = h.data_start;
  j["format_version"] = h.format_version;
  j["shardopt_metadata"] = h.format_version > 0;
  auto opt_str = [&](const char* key) { return has_meta(h, key) ? Json(meta(h, key)) : Json(); };
  auto opt_num = [&](const char* key) {
    return has_meta(h, key) ? number_value(meta(h, key)) : Json();
  };
  j["shardopt_version"] = opt_str(kKeyVersion);
  j["content"] = opt_str(kKeyContent);
  j["step"] = opt_num(kKeyStep);
  j["optimizer"] = opt_str(kKeyOptimizer);
  j["stage"] = opt_num(kKeyStage);
  j["ranks"] = opt_num(kKeyRanks);
  j["dtype"] = opt_str(kKeyDtype);
  j["param_remainders"] =
      has_meta(h, kKeyRemainders) ? Json(meta(h, kKeyRemainders) == "true") : Json();
  j["layout_fingerprint"] = opt_str(kKeyFingerprint);
  j["checksum"] = h.chunk_bytes == 0 ? Json() : Json(meta(h, kKeyChecksum));
  j["chunk_bytes"] = h.chunk_bytes;
  j["groups"] = has_meta(h, kKeyGroups) ? json_value(meta(h, kKeyGroups)) : Json();
  j["params"] = has_meta(h, kKeyParams) ? json_value(meta(h, kKeyParams)) : Json();
  j["states"] = has_meta(h, kKeyStates) ? json_value(meta(h, kKeyStates)) : Json();
  Json other = Json::object();
  for (const auto& [k, v] : h.metadata) {
    if (!k.starts_with("shardopt.")) other[k] = v;
  }
  j["other_metadata"] = other;
  Json tensors = Json::array();
  u64 bytes = 0, chunks = 0;
  for (const ck::TensorInfo& t : h.tensors) {
    Json x;
    x["name"] = t.name;
    x["dtype"] = t.dtype;
    x["shape"] = t.shape;
    x["bytes"] = t.bytes();
    x["chunks"] = chunks_of(h, t);
    x["data_offsets"] = {t.begin, t.end};
    bytes += t.bytes();
    chunks += chunks_of(h, t);
    tensors.push_back(std::move(x));
  }
  j["tensors"] = std::move(tensors);
  j["total_tensors"] = h.tensors.size();
  j["total_bytes"] = bytes;
  j["total_chunks"] = chunks;
  return j;
}

int run_info(shardopt::Communicator& comm, const World& w, const std::string& path,
             const InfoOptions& o) {
  const bool ok = guarded(w, path, [&] {
    ck::Reader r = open_file(comm, w, path);
    // Every rank holds the same header: a shardopt.params that does not
    // parse fails on every rank alike, before anything is printed.
    (void)params_of(r.header());
    if (w.rank == 0) {
      if (o.json) {
        // Names that are not UTF-8 are printed with U+FFFD, not thrown on.
        std::printf("%s\n",
                    info_json(r).dump(-1, ' ', false, Json::error_handler_t::replace).c_str());
      } else {
        print_info_text(r);
      }
      std::fflush(stdout);
    }
  });
  return ok ? 0 : 1;
}

// ---------------------------------------------------------------------------
// verify

struct VerifyOptions {
  bool allow_unchecksummed = false;
  u64 window = kDefaultWindow;
};

// Collective: reads every byte of `path`'s tensors, checksums verified;
// throws what the library throws (the same on every rank).
void verify_file(shardopt::Communicator& comm, const World& w, const std::string& path,
                 const VerifyOptions& o) {
  ck::Reader r = open_file(comm, w, path);
  const ck::Header& h = r.header();
  if (h.chunk_bytes == 0 && !o.allow_unchecksummed) {
    throw Failure(
        "has no checksums (" +
            std::string(h.format_version == 0 ? "a plain safetensors file"
                                              : "written without shardopt.checksum") +
            "): nothing to verify",
        "pass --allow-unchecksummed to read it through anyway (checks that every byte can be "
        "read, not the values)");
  }
  std::vector<u64> numel, cost, align;
  u64 total = 0, chunks = 0;
  for (const ck::TensorInfo& t : h.tensors) {
    numel.push_back(t.bytes());
    cost.push_back(1);
    align.push_back(h.chunk_bytes);
    total += t.bytes();
    chunks += chunks_of(h, t);
  }
  const std::vector<Window> windows =
      cut_windows(numel, cost, align, window_target(total, w.size, o.window));
  Scratch scratch;
  u64 biggest = 0;
  for (std::size_t k = 0; k < rounds_of(windows.size(), w.size); ++k) {
    if (const Window* win = my_window(windows, k, w)) {
      u64 b = 0;
      for (const Unit& u : *win) b += u.count;
      biggest = std::max(biggest, b);
    }
  }
  unsigned char* buf = nullptr;
  local(w, [&] { buf = scratch.get(std::max<u64>(biggest, 1)); });
  for (std::size_t k = 0; k < rounds_of(windows.size(), w.size); ++k) {
    std::vector<ck::ReadRange> ranges;
    if (const Window* win = my_window(windows, k, w)) {
      u64 at = 0;
      for (const Unit& u : *win) {
        ranges.push_back({u.item, u.first, u.count, buf + at});
        at += u.count;
      }
    }
    r.read(ranges, /*verify=*/true);
  }
  if (w.rank == 0) {
    if (h.chunk_bytes == 0) {
      std::printf("%s: ok (%zu tensors, %llu bytes read; no checksums, values not verified)\n",
                  path.c_str(), h.tensors.size(), static_cast<unsigned long long>(total));
    } else {
      std::printf("%s: ok (%zu tensors, %llu bytes, %llu chunks verified)\n", path.c_str(),
                  h.tensors.size(), static_cast<unsigned long long>(total),
                  static_cast<unsigned long long>(chunks));
    }
    std::fflush(stdout);
  }
}

int run_verify(shardopt::Communicator& comm, const World& w, const std::vector<std::string>& files,
               const VerifyOptions& o) {
  int failed = 0;
  for (const std::string& f : files) {
    if (!guarded(w, f, [&] { verify_file(comm, w, f, o); })) ++failed;
  }
  if (files.size() > 1 && w.rank == 0) {
    std::printf("verify: %zu of %zu files ok\n", files.size() - static_cast<std::size_t>(failed),
                files.size());
  }
  return failed == 0 ? 0 : 1;
}

// ---------------------------------------------------------------------------
// export

struct ExportOptions {
  DType dtype = DType::f32;
  u64 window = kDefaultWindow;
  u64 chunk_bytes = ck::kDefaultChunkBytes;
};

// Whether a and b name the same existing file. Local.
bool same_file(const std::string& a, const std::string& b) {
  struct stat sa {
  }, sb{};
  if (::stat(a.c_str(), &sa) != 0 || ::stat(b.c_str(), &sb) != 0) return false;
  return sa.st_dev == sb.st_dev && sa.st_ino == sb.st_ino;
}

void export_file(shardopt::Communicator& comm, const World& w, const std::string& in,
                 const std::string& out, const ExportOptions& o) {
  ck::Reader r = open_file(comm, w, in);
  const ck::Header& h = r.header();
  const std::string content = meta(h, kKeyContent);
  if (h.format_version == 0 || content != "checkpoint") {
    throw Failure(
        in + ": " +
            (h.format_version == 0
                 ? std::string("a plain safetensors file, not a shardopt checkpoint")
                 : "a shardopt " + content + " file, not a checkpoint (no optimizer state)"),
        "export reads a checkpoint written by ZeroRedundancyOptimizer::save (shardopt.content "
        "\"checkpoint\"); 'shardopt-ckpt info " +
            in + "' shows what the file is");
  }
  int same = 0;
  if (w.rank == 0) same = same_file(in, out) ? 1 : 0;
  MPI_Bcast(&same, 1, MPI_INT, 0, w.comm);
  if (same) {
    throw Failure("OUT " + out + " is the checkpoint itself", "write the export to another path");
  }
  std::vector<ParamEntry> params;
  local(w, [&] { params = params_of(h); });
  if (params.empty()) {
    throw Failure(in + ": lists no parameters (shardopt.params is missing or empty)",
                  "the file is damaged or was not written by shardopt");
  }
  // The source tensors, their shapes kept.
  const TensorIndex index(h);
  std::vector<std::size_t> src;
  std::vector<ck::WriteTensor> tensors;
  std::vector<u64> numel, cost, align;
  const char* out_name = ck::dtype_name(o.dtype);
  const u64 out_es = shardopt::dtype_size(o.dtype);
  u64 total = 0;
  for (const ParamEntry& p : params) {
    const ck::TensorInfo* t = index.find(p.name);
    if (t == nullptr || t->dtype != "F32") {
      throw Failure(in + ": parameter '" + p.name + "' " +
                        (t == nullptr ? std::string("has no tensor")
                                      : "is " + t->dtype + ", not F32 (master values)"),
                    "the file is damaged or was not written by shardopt");
    }
    src.push_back(static_cast<std::size_t>(t - h.tensors.data()));
    tensors.push_back({p.name, out_name, t->shape});
    numel.push_back(t->bytes() / 4);
    cost.push_back(4);
    align.push_back(h.chunk_bytes % 4 == 0 ? h.chunk_bytes / 4 : 1);
    total += t->bytes();
  }
  // Each rank holds the output of its windows (its share, about 1/ranks)
  // and reads one window at a time.
  const std::vector<Window> windows =
      cut_windows(numel, cost, align, window_target(total, w.size, o.window));
  const std::size_t rounds = rounds_of(windows.size(), w.size);
  u64 mine = 0, staging = 0;
  for (std::size_t k = 0; k < rounds; ++k) {
    if (const Window* win = my_window(windows, k, w)) {
      u64 n = 0;
      for (const Unit& u : *win) n += u.count;
      mine += n * out_es;
      staging = std::max(staging, n * 4);
    }
  }
  shardopt::HostBuffer held;
  Scratch scratch;
  unsigned char* stage = nullptr;
  local(w, [&] {
    held = shardopt::HostBuffer(static_cast<std::size_t>(std::max<u64>(mine, 1)));
    if (o.dtype != DType::f32) stage = scratch.get(std::max<u64>(staging, 1));
  });
  std::vector<ck::Piece> pieces;
  u64 at = 0;  // where this rank's next unit goes in `held`
  for (std::size_t k = 0; k < rounds; ++k) {
    std::vector<ck::ReadRange> ranges;
    std::vector<std::pair<const Unit*, unsigned char*>> casts;
    for (int owner = 0; owner < w.size; ++owner) {
      const std::size_t i = k * static_cast<std::size_t>(w.size) + static_cast<std::size_t>(owner);
      if (i >= windows.size()) break;
      u64 staged = 0;
      for (const Unit& u : windows[i]) {
        ck::Piece p;
        p.tensor = u.item;
        p.offset = u.first * out_es;
        p.bytes = u.count * out_es;
        p.owner = owner;
        if (owner == w.rank) {
          unsigned char* dst = held.as<unsigned char>() + at;
          p.data = dst;
          at += p.bytes;
          if (o.dtype == DType::f32) {
            ranges.push_back({src[u.item], u.first * 4, u.count * 4, dst});
          } else {
            ranges.push_back({src[u.item], u.first * 4, u.count * 4, stage + staged});
            casts.emplace_back(&u, dst);
            staged += u.count * 4;
          }
        }
        pieces.push_back(p);
      }
    }
    r.read(ranges, /*verify=*/true);
    if (o.dtype != DType::f32) {
      local(w, [&] {
        for (std::size_t c = 0; c < casts.size(); ++c) {
          shardopt::cast(ranges[c].dst, DType::f32, casts[c].second, o.dtype,
                         static_cast<std::size_t>(casts[c].first->count));
        }
      });
    }
  }
  std::map<std::string, std::string> md;
  md[kKeyFormat] = "pt";
  md[kKeyFormatVersion] = std::to_string(ck::kFormatVersion);
  md[kKeyVersion] = shardopt::build_info().version;
  md[kKeyContent] = "export";
  md[kKeyDtype] = meta(h, kKeyDtype, "f32");  // the model's, as export_params() writes it
  md[kKeyStep] = meta(h, kKeyStep, "0");
  ck::WriteOptions wo;
  wo.chunk_bytes = o.chunk_bytes;
  ck::write_file(comm, out, tensors, pieces, md, wo);
  if (w.rank == 0) {
    u64 elements = 0;
    for (u64 n : numel) elements += n;
    std::printf("%s: %zu parameters (%llu elements, %s, %s) of %s at step %s\n", out.c_str(),
                tensors.size(), static_cast<unsigned long long>(elements),
                shardopt::dtype_name(o.dtype), bytes_text(double(elements * out_es)).c_str(),
                in.c_str(), meta(h, kKeyStep, "0").c_str());
    std::fflush(stdout);
  }
}

int run_export(shardopt::Communicator& comm, const World& w, const std::string& in,
               const std::string& out, const ExportOptions& o) {
  return guarded(w, "export", [&] { export_file(comm, w, in, out, o); }) ? 0 : 1;
}

// ---------------------------------------------------------------------------
// diff

struct DiffOptions {
  std::optional<double> atol, rtol;
  bool params_only = false;
  bool quiet = false;
  u64 window = kDefaultWindow;
  bool tolerant() const { return atol || rtol; }
};

// How a dtype's elements read as numbers.
enum class Kind { f64, f32, bf16, f16, i8, i16, i32, i64, u8, u16, u32, u64, boolean, bits };

Kind kind_of(const std::string& d) {
  static const std::pair<const char*, Kind> kinds[] = {
      {"F64", Kind::f64},     {"F32", Kind::f32}, {"BF16", Kind::bf16}, {"F16", Kind::f16},
      {"I8", Kind::i8},       {"I16", Kind::i16}, {"I32", Kind::i32},   {"I64", Kind::i64},
      {"U8", Kind::u8},       {"U16", Kind::u16}, {"U32", Kind::u32},   {"U64", Kind::u64},
      {"BOOL", Kind::boolean}};
  for (const auto& [name, k] : kinds)
    if (d == name) return k;
  return Kind::bits;  // F8_E4M3, F8_E5M2: compared bit for bit only
}

template <class T>
void widen(const unsigned char* p, std::size_t n, double* out) {
  for (std::size_t i = 0; i < n; ++i) {
    T v;
    std::memcpy(&v, p + i * sizeof(T), sizeof(T));
    out[i] = static_cast<double>(v);
  }
}

void to_double(Kind k, const unsigned char* p, std::size_t n, double* out) {
  switch (k) {
    case Kind::f64:
      return widen<double>(p, n, out);
    case Kind::f32:
      return widen<float>(p, n, out);
    case Kind::bf16:
      for (std::size_t i = 0; i < n; ++i) {
        shardopt::bfloat16 b;
        std::memcpy(&b, p + 2 * i, 2);
        out[i] = shardopt::to_float(b);
      }
      return;
    case Kind::f16:
      for (std::size_t i = 0; i < n; ++i) {
        shardopt::float16 h;
        std::memcpy(&h, p + 2 * i, 2);
        out[i] = shardopt::to_float(h);
      }
      return;
    case Kind::i8:
      return widen<std::int8_t>(p, n, out);
    case Kind::i16:
      return widen<std::int16_t>(p, n, out);
    case Kind::i32:
      return widen<std::int32_t>(p, n, out);
    case Kind::i64:
      return widen<std::int64_t>(p, n, out);
    case Kind::u8:
    case Kind::boolean:
      return widen<std::uint8_t>(p, n, out);
    case Kind::u16:
      return widen<std::uint16_t>(p, n, out);
    case Kind::u32:
      return widen<std::uint32_t>(p, n, out);
    case Kind::u64:
      return widen<std::uint64_t>(p, n, out);
    case Kind::bits:
      return;
  }
}

// One pair of tensors compared: in A and in B, the same shape.
struct Pair {
  std::string name;
  std::size_t a = 0, b = 0;  // indices into each header's tensors
  u64 numel = 0;
  std::size_t es_a = 0, es_b = 0;
  Kind kind_a = Kind::bits, kind_b = Kind::bits;
  bool same_dtype = true;
  bool values() const { return kind_a != Kind::bits && kind_b != Kind::bits; }
};

// Per pair, reduced over the ranks: max over elements of |a - b| and
// |a - b| / |b| (inf where a NaN or inf is involved unequally, or b is 0
// and a is not), elements that differ (bits for the same dtype, values
// otherwise), and elements outside the tolerances.
struct PairStats {
  std::vector<double> max_abs, max_rel;
  std::vector<u64> differ, outside;
  explicit PairStats(std::size_t n) : max_abs(n, 0), max_rel(n, 0), differ(n, 0), outside(n, 0) {}
};

bool bits_differ(const unsigned char* a, const unsigned char* b, std::size_t es) {
  return std::memcmp(a, b, es) != 0;
}

void compare_run(const Pair& p, const unsigned char* a, const unsigned char* b, u64 n,
                 const DiffOptions& o, PairStats& s, std::size_t idx, std::vector<double>& da,
                 std::vector<double>& db) {
  if (p.same_dtype && std::memcmp(a, b, static_cast<std::size_t>(n) * p.es_a) == 0) return;
  const double atol = o.atol.value_or(0), rtol = o.rtol.value_or(0);
  constexpr std::size_t kBlock = 4096;
  const double inf = std::numeric_limits<double>::infinity();
  da.resize(kBlock);
  db.resize(kBlock);
  for (u64 first = 0; first < n; first += kBlock) {
    const std::size_t m = static_cast<std::size_t>(std::min<u64>(kBlock, n - first));
    const unsigned char* pa = a + first * p.es_a;
    const unsigned char* pb = b + first * p.es_b;
    if (!p.values()) {
      for (std::size_t i = 0; i < m; ++i) {
        if (bits_differ(pa + i * p.es_a, pb + i * p.es_b, p.es_a)) {
          ++s.differ[idx];
          ++s.outside[idx];
          s.max_abs[idx] = s.max_rel[idx] = inf;
        }
      }
      continue;
    }
    to_double(p.kind_a, pa, m, da.data());
    to_double(p.kind_b, pb, m, db.data());
    for (std::size_t i = 0; i < m; ++i) {
      const double x = da[i], y = db[i];
      const bool both_nan = std::isnan(x) && std::isnan(y);
      double d = 0;
      if (!(x == y || both_nan)) {
        d = std::fabs(x - y);
        if (std::isnan(d)) d = inf;
      }
      const bool differs =
          p.same_dtype ? bits_differ(pa + i * p.es_a, pb + i * p.es_b, p.es_a) : d != 0;
      if (!differs) continue;
      ++s.differ[idx];
      s.max_abs[idx] = std::max(s.max_abs[idx], d);
      const double rel = d == 0 ? 0 : (y == 0 ? inf : d / std::fabs(y));
      s.max_rel[idx] = std::max(s.max_rel[idx], std::isnan(rel) ? inf : rel);
      if (!(d <= atol + rtol * std::fabs(y))) ++s.outside[idx];
    }
  }
}

// Metadata compared by diff: a difference in these makes the files differ.
constexpr const char* kComparedKeys[] = {kKeyContent, kKeyStep,  kKeyOptimizer, kKeyGroups,
                                         kKeyStates,  kKeyDtype, kKeyRemainders};
// Shown when they differ, without making the files differ: how a file was
// written, not what it holds.
constexpr const char* kNotedKeys[] = {kKeyStage,   kKeyRanks,      kKeyFormatVersion,
                                      kKeyVersion, kKeyChunkBytes, kKeyFingerprint};

// Equal as JSON when both parse, else as text.
bool same_value(const std::string& a, const std::string& b) {
  if (a == b) return true;
  try {
    return Json::parse(a) == Json::parse(b);
  } catch (const Json::exception&) {
    return false;
  }
}

std::string number_text(double x) {
  if (std::isinf(x)) return "inf";
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.4g", x);
  return buf;
}

int diff_files(shardopt::Communicator& comm, const World& w, const std::string& path_a,
               const std::string& path_b, const DiffOptions& o) {
  ck::Reader ra = open_file(comm, w, path_a);
  ck::Reader rb = open_file(comm, w, path_b);
  const ck::Header& ha = ra.header();
  const ck::Header& hb = rb.header();
  const TensorIndex ia(ha), ib(hb);
  std::size_t differences = 0;

  // Metadata.
  std::vector<std::string> meta_lines;
  std::size_t meta_differences = 0, meta_notes = 0;
  auto compare_key = [&](const char* key, bool counts) {
    const bool in_a = has_meta(ha, key), in_b = has_meta(hb, key);
    if (!in_a && !in_b) return;
    const std::string va = meta(ha, key, "(none)"), vb = meta(hb, key, "(none)");
    if (in_a && in_b && same_value(va, vb)) return;
    ++(counts ? meta_differences : meta_notes);
    auto cut = [](const std::string& s) { return s.size() > 300 ? s.substr(0, 300) + "..." : s; };
    meta_lines.push_back(std::string(counts ? "  " : "  (note) ") + key + ":\n    A: " + cut(va) +
                         "\n    B: " + cut(vb));
  };
  if (o.params_only) {
    compare_key(kKeyStep, true);
  } else {
    for (const char* k : kComparedKeys) compare_key(k, true);
    for (const char* k : kNotedKeys) compare_key(k, false);
  }

  // Which tensors.
  std::vector<std::string> names_a, names_b;
  if (o.params_only) {
    std::vector<ParamEntry> ps;
    local(w, [&] {
      ps = params_of(ha);
      if (ps.empty()) ps = params_of(hb);
    });
    if (!ps.empty()) {
      for (const ParamEntry& p : ps) {
        if (ia.find(p.name)) names_a.push_back(p.name);
        if (ib.find(p.name)) names_b.push_back(p.name);
      }
      // A parameter neither file holds is listed as missing from both below.
      for (const ParamEntry& p : ps) {
        if (!ia.find(p.name) && !ib.find(p.name)) {
          ++meta_differences;
          meta_lines.push_back("  parameter '" + p.name +
                               "' of shardopt.params is in neither file");
        }
      }
    } else {
      for (const auto& t : ha.tensors) names_a.push_back(t.name);
      for (const auto& t : hb.tensors) names_b.push_back(t.name);
    }
  } else {
    for (const auto& t : ha.tensors) names_a.push_back(t.name);
    for (const auto& t : hb.tensors) names_b.push_back(t.name);
  }
  std::vector<std::string> only_a, only_b, mismatched;
  std::vector<Pair> pairs;
  const std::set<std::string> set_a(names_a.begin(), names_a.end());
  const std::set<std::string> set_b(names_b.begin(), names_b.end());
  for (const std::string& n : names_a) {
    const ck::TensorInfo* ta = ia.find(n);
    const ck::TensorInfo* tb = ib.find(n);
    if (tb == nullptr || set_b.count(n) == 0) {
      only_a.push_back(n);
      continue;
    }
    if (ta->shape != tb->shape) {
      mismatched.push_back(n + ": shape " + shape_text(ta->shape) + " vs " + shape_text(tb->shape));
      continue;
    }
    Pair p;
    p.name = n;
    p.a = static_cast<std::size_t>(ta - ha.tensors.data());
    p.b = static_cast<std::size_t>(tb - hb.tensors.data());
    p.es_a = ck::dtype_bytes(ta->dtype);
    p.es_b = ck::dtype_bytes(tb->dtype);
    p.numel = p.es_a == 0 ? 0 : ta->bytes() / p.es_a;
    p.kind_a = kind_of(ta->dtype);
    p.kind_b = kind_of(tb->dtype);
    p.same_dtype = ta->dtype == tb->dtype;
    if (!p.same_dtype && !p.values()) {
      mismatched.push_back(n + ": dtype " + ta->dtype + " vs " + tb->dtype +
                           " (values not comparable)");
      continue;
    }
    pairs.push_back(std::move(p));
  }
  for (const std::string& n : names_b) {
    if (ia.find(n) == nullptr || set_a.count(n) == 0) only_b.push_back(n);
  }
  differences += meta_differences + only_a.size() + only_b.size() + mismatched.size();

  // Values: windows of elements of the pairs, both files read at once.
  std::vector<u64> numel, cost, align;
  u64 total = 0;
  for (const Pair& p : pairs) {
    numel.push_back(p.numel);
    cost.push_back(p.es_a + p.es_b);
    align.push_back(ha.chunk_bytes > 0 && ha.chunk_bytes % p.es_a == 0 ? ha.chunk_bytes / p.es_a
                                                                       : 1);
    total += p.numel * (p.es_a + p.es_b);
  }
  const std::vector<Window> windows =
      cut_windows(numel, cost, align, window_target(total, w.size, o.window));
  const std::size_t rounds = rounds_of(windows.size(), w.size);
  u64 biggest_a = 1, biggest_b = 1;
  for (std::size_t k = 0; k < rounds; ++k) {
    if (const Window* win = my_window(windows, k, w)) {
      u64 ba = 0, bb = 0;
      for (const Unit& u : *win) {
        ba += u.count * pairs[u.item].es_a;
        bb += u.count * pairs[u.item].es_b;
      }
      biggest_a = std::max(biggest_a, ba);
      biggest_b = std::max(biggest_b, bb);
    }
  }
  Scratch sa, sb;
  unsigned char *buf_a = nullptr, *buf_b = nullptr;
  local(w, [&] {
    buf_a = sa.get(biggest_a);
    buf_b = sb.get(biggest_b);
  });
  PairStats stats(pairs.size());
  std::vector<double> da, db;
  for (std::size_t k = 0; k < rounds; ++k) {
    std::vector<ck::ReadRange> ranges_a, ranges_b;
    const Window* win = my_window(windows, k, w);
    if (win != nullptr) {
      u64 at_a = 0, at_b = 0;
      for (const Unit& u : *win) {
        const Pair& p = pairs[u.item];
        ranges_a.push_back({p.a, u.first * p.es_a, u.count * p.es_a, buf_a + at_a});
        ranges_b.push_back({p.b, u.first * p.es_b, u.count * p.es_b, buf_b + at_b});
        at_a += u.count * p.es_a;
        at_b += u.count * p.es_b;
      }
    }
    ra.read(ranges_a, /*verify=*/true);
    rb.read(ranges_b, /*verify=*/true);
    if (win != nullptr) {
      for (std::size_t i = 0; i < win->size(); ++i) {
        const Unit& u = (*win)[i];
        compare_run(pairs[u.item], static_cast<const unsigned char*>(ranges_a[i].dst),
                    static_cast<const unsigned char*>(ranges_b[i].dst), u.count, o, stats, u.item,
                    da, db);
      }
    }
  }
  if (!pairs.empty()) {
    const int n = static_cast<int>(pairs.size());
    MPI_Allreduce(MPI_IN_PLACE, stats.max_abs.data(), n, MPI_DOUBLE, MPI_MAX, w.comm);
    MPI_Allreduce(MPI_IN_PLACE, stats.max_rel.data(), n, MPI_DOUBLE, MPI_MAX, w.comm);
    MPI_Allreduce(MPI_IN_PLACE, stats.differ.data(), n, MPI_UINT64_T, MPI_SUM, w.comm);
    MPI_Allreduce(MPI_IN_PLACE, stats.outside.data(), n, MPI_UINT64_T, MPI_SUM, w.comm);
  }

  std::size_t identical = 0, within = 0, different = 0;
  std::vector<std::string> result(pairs.size());
  for (std::size_t i = 0; i < pairs.size(); ++i) {
    const Pair& p = pairs[i];
    const std::string dtype_note =
        p.same_dtype ? ""
                     : " (dtype " + ha.tensors[p.a].dtype + " vs " + hb.tensors[p.b].dtype + ")";
    if (stats.differ[i] == 0 && p.same_dtype) {
      result[i] = "identical";
      ++identical;
    } else if (stats.differ[i] == 0 && !o.tolerant()) {
      result[i] = "equal values" + dtype_note;
      ++different;
    } else if (o.tolerant() && stats.outside[i] == 0) {
      result[i] = "within tolerances" + dtype_note;
      ++within;
    } else {
      result[i] = "different" + dtype_note;
      ++different;
    }
  }
  differences += different;

  if (w.rank == 0) {
    auto describe = [](const ck::Header& h) {
      if (h.format_version == 0) return std::string("plain safetensors");
      std::string s = meta(h, kKeyContent, "?");
      if (has_meta(h, kKeyStep)) s += ", step " + meta(h, kKeyStep);
      return s;
    };
    std::printf("A: %s (%s, %zu tensors)\nB: %s (%s, %zu tensors)\n", path_a.c_str(),
                describe(ha).c_str(), ha.tensors.size(), path_b.c_str(), describe(hb).c_str(),
                hb.tensors.size());
    if (o.tolerant()) {
      std::printf("tolerances: |a - b| <= %g + %g * |b|\n", o.atol.value_or(0), o.rtol.value_or(0));
    }
    if (!meta_lines.empty()) {
      std::printf("metadata:\n");
      for (const std::string& l : meta_lines) std::printf("%s\n", l.c_str());
    }
    auto list = [](const char* what, const std::vector<std::string>& v) {
      if (v.empty()) return;
      std::printf("%s (%zu):\n", what, v.size());
      for (const std::string& s : v) std::printf("  %s\n", s.c_str());
    };
    list("only in A", only_a);
    list("only in B", only_b);
    list("dtype or shape differs", mismatched);
    if (!pairs.empty()) {
      std::vector<std::string> names;
      for (const Pair& p : pairs) names.push_back(p.name);
      const int nw = static_cast<int>(text_width(names, 6, 60));
      std::printf("%-*s  %-6s  %12s  %10s  %10s  %14s  %s\n", nw, "tensor", "dtype", "elements",
                  "max_abs", "max_rel", "differ", "result");
      for (std::size_t i = 0; i < pairs.size(); ++i) {
        if (o.quiet && result[i] == "identical") continue;
        const Pair& p = pairs[i];
        std::printf("%-*s  %-6s  %12llu  %10s  %10s  %14llu  %s\n", nw, p.name.c_str(),
                    ha.tensors[p.a].dtype.c_str(), static_cast<unsigned long long>(p.numel),
                    p.values() ? number_text(stats.max_abs[i]).c_str() : "-",
                    p.values() ? number_text(stats.max_rel[i]).c_str() : "-",
                    static_cast<unsigned long long>(stats.differ[i]), result[i].c_str());
      }
    }
    std::printf(
        "summary: %s: %zu tensors compared: %zu identical, %zu within tolerances, %zu "
        "different; %zu only in A, %zu only in B, %zu of another dtype or shape; %zu metadata "
        "difference%s%s\n",
        differences == 0 ? (within > 0 ? "equal within tolerances" : "identical") : "different",
        pairs.size(), identical, within, different, only_a.size(), only_b.size(), mismatched.size(),
        meta_differences, meta_differences == 1 ? "" : "s",
        meta_notes == 0 ? ""
                        : (" (and " + std::to_string(meta_notes) +
                           " noted: how the files were written, not what they hold)")
                              .c_str());
    std::fflush(stdout);
  }
  return differences == 0 ? 0 : 1;
}

int run_diff(shardopt::Communicator& comm, const World& w, const std::string& a,
             const std::string& b, const DiffOptions& o) {
  int rc = 2;
  if (!guarded(w, "diff", [&] { rc = diff_files(comm, w, a, b, o); })) return 2;
  return rc;
}

// ---------------------------------------------------------------------------
// bench

struct BenchOptions {
  std::vector<std::size_t> params;
  std::string dir = ".";
  int iters = 5;
  int warmup = 1;
  bool cold = false;
  bool json = false;
};

constexpr u64 kRawBlock = u64{16} << 20;  // bytes per pwrite/pread call
constexpr double kGoalRatio = 0.8;
constexpr double kBusyFraction = 0.05;

const char* fs_name(long type) {
  switch (static_cast<unsigned long>(type)) {
    case 0xEF53:
      return "ext4";
    case 0x01021994:
      return "tmpfs";
    case 0x58465342:
      return "xfs";
    case 0x9123683E:
      return "btrfs";
    case 0x6969:
      return "nfs";
    case 0x0BD00BD0:
      return "lustre";
    case 0x47504653:
      return "gpfs";
    case 0x794c7630:
      return "overlayfs";
    case 0x65735546:
      return "fuse";
    default:
      return "unknown";
  }
}

// The model: 4 layers, each a weight (rows of 1024 where the count allows)
// and a bias, adding up to psi.
struct BenchTensor {
  std::string name;
  std::size_t numel;
  std::vector<std::size_t> shape;
};

std::vector<BenchTensor> bench_layout(std::size_t psi) {
  constexpr std::size_t kLayers = 4;
  const std::size_t bias = std::min<std::size_t>(1024, psi / (8 * kLayers));
  std::vector<BenchTensor> t;
  std::size_t used = 0;
  for (std::size_t l = 0; l < kLayers; ++l) {
    const std::size_t weight =
        l + 1 < kLayers ? (psi - kLayers * bias) / kLayers : psi - used - bias;
    BenchTensor wt{"layers." + std::to_string(l) + ".weight", weight, {}};
    if (weight % 1024 == 0 && weight > 0) wt.shape = {weight / 1024, 1024};
    t.push_back(std::move(wt));
    t.push_back({"layers." + std::to_string(l) + ".bias", bias, {}});
    used += weight + bias;
  }
  return t;
}

struct BenchRow {
  std::size_t params = 0;
  int ranks = 0;
  u64 bytes = 0;
  int iters = 0;
  double save_s = 0, raw_write_s = 0, load_s = 0, raw_read_s = 0;
  double other_load = -1;
  double gbps(double s) const { return s > 0 ? double(bytes) / s / 1e9 : 0; }
  double save_ratio() const { return raw_write_s > 0 ? raw_write_s / save_s : 0; }
  double load_ratio() const { return raw_read_s > 0 ? raw_read_s / load_s : 0; }
  bool busy() const { return other_load > kBusyFraction; }
};

// Collective: the slowest rank's seconds for fn, started together.
template <class Fn>
double timed(const World& w, Fn&& fn) {
  MPI_Barrier(w.comm);
  const double t0 = MPI_Wtime();
  fn();
  double dt = MPI_Wtime() - t0;
  MPI_Allreduce(MPI_IN_PLACE, &dt, 1, MPI_DOUBLE, MPI_MAX, w.comm);
  return dt;
}

std::string errno_text(const std::string& what, const std::string& path) {
  return what + " '" + path + "': " + std::strerror(errno);
}

// Local: writes `bytes` of buf at `offset` of path in kRawBlock calls, then
// fsyncs; "" or the error.
std::string raw_write(const std::string& path, const unsigned char* buf, u64 offset, u64 bytes) {
  const int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_CLOEXEC, 0644);
  if (fd < 0) return errno_text("cannot open", path);
  std::string err;
  for (u64 done = 0; done < bytes && err.empty();) {
    const ssize_t n =
        ::pwrite(fd, buf + done, static_cast<std::size_t>(std::min(kRawBlock, bytes - done)),
                 static_cast<off_t>(offset + done));
    if (n <= 0) {
      if (n < 0 && errno == EINTR) continue;
      err = errno_text("cannot write", path);
    } else {
      done += static_cast<u64>(n);
    }
  }
  if (err.empty() && ::fsync(fd) != 0) err = errno_text("cannot sync", path);
  ::close(fd);
  return err;
}

std::string raw_read(const std::string& path, unsigned char* buf, u64 offset, u64 bytes) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return errno_text("cannot open", path);
  std::string err;
  for (u64 done = 0; done < bytes && err.empty();) {
    const ssize_t n =
        ::pread(fd, buf + done, static_cast<std::size_t>(std::min(kRawBlock, bytes - done)),
                static_cast<off_t>(offset + done));
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) err = errno_text("cannot read", path);
    if (n == 0) err = "'" + path + "' is shorter than expected";
    if (n > 0) done += static_cast<u64>(n);
  }
  ::close(fd);
  return err;
}

// Local: drops the file's pages from the page cache (they are clean: the
// writes were synced).
void drop_cache(const std::string& path) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return;
  ::posix_fadvise(fd, 0, 0, POSIX_FADV_DONTNEED);
  ::close(fd);
}

// User CPU seconds of the whole machine (/proc/stat: user and nice) and of
// this process. Others' computing shows in the difference; the kernel's
// work for this benchmark's I/O (writeback, the page cache), which is
// system time and partly done by kernel threads, does not, so that it is
// not taken for a busy machine. ok is false when /proc/stat could not be
// read.
struct UserTimes {
  double machine_s = 0, self_s = 0;
  bool ok = false;
};

UserTimes user_times() {
  UserTimes t;
  rusage ru{};
  getrusage(RUSAGE_SELF, &ru);
  t.self_s =
      static_cast<double>(ru.ru_utime.tv_sec) + 1e-6 * static_cast<double>(ru.ru_utime.tv_usec);
  std::FILE* f = std::fopen("/proc/stat", "r");
  if (f == nullptr) return t;
  unsigned long long user = 0, nice = 0;
  t.ok = std::fscanf(f, "cpu %llu %llu", &user, &nice) == 2;
  std::fclose(f);
  t.machine_s = static_cast<double>(user + nice) / static_cast<double>(sysconf(_SC_CLK_TCK));
  return t;
}

class Bench {
 public:
  Bench(shardopt::Communicator& comm, const World& w, const BenchOptions& o, std::string base)
      : comm_(comm), w_(w), o_(o), ckpt_(base + ".safetensors"), raw_(base + ".raw") {}
  ~Bench() { remove_files(); }

  void remove_files() {
    if (w_.rank != 0) return;
    ::unlink(ckpt_.c_str());
    ::unlink(raw_.c_str());
  }

  BenchRow run(std::size_t psi) {
    const std::vector<BenchTensor> layout = bench_layout(psi);
    shardopt::HostBuffer params, grads;
    local(w_, [&] {
      params = shardopt::HostBuffer(psi * 4);
      grads = shardopt::HostBuffer(psi * 4);
      float* p = params.as<float>();
      float* g = grads.as<float>();
      std::mt19937 gen(1234);
      std::uniform_real_distribution<float> u(-1.0f, 1.0f);
      for (std::size_t i = 0; i < psi; ++i) {
        p[i] = u(gen);
        g[i] = 1e-2f * u(gen) * static_cast<float>(w_.rank + 1);
      }
    });
    std::vector<shardopt::Param> ps;
    std::size_t at = 0;
    for (const BenchTensor& t : layout) {
      shardopt::Param p;
      p.name = t.name;
      p.data = params.as<float>() + at;
      p.grad = grads.as<float>() + at;
      p.numel = t.numel;
      p.dtype = DType::f32;
      p.shape = t.shape;
      ps.push_back(std::move(p));
      at += t.numel;
    }
    shardopt::ZeroOptions zo;
    zo.stage = 1;
    shardopt::ZeroRedundancyOptimizer opt(comm_, ps, shardopt::AdamW{}, zo);
    opt.step();  // states that are not zero
    const std::uint64_t hash = report::fnv1a(params.data(), psi * 4);

    // The checkpoint's size, then the raw buffers: each rank its share.
    opt.save(ckpt_);
    u64 bytes = 0;
    if (w_.rank == 0) {
      struct stat st {};
      if (::stat(ckpt_.c_str(), &st) == 0) bytes = static_cast<u64>(st.st_size);
    }
    MPI_Bcast(&bytes, 1, MPI_UINT64_T, 0, w_.comm);
    const u64 n = static_cast<u64>(w_.size);
    const u64 share = (bytes + n - 1) / n;
    const u64 offset = std::min(bytes, share * static_cast<u64>(w_.rank));
    const u64 mine = std::min(share, bytes - offset);
    shardopt::HostBuffer raw;
    local(w_, [&] {
      if (bytes == 0) throw Failure("cannot stat the checkpoint written to " + ckpt_);
      raw = shardopt::HostBuffer(static_cast<std::size_t>(std::max<u64>(mine, 1)));
      std::memset(raw.data(), 0x5a, raw.size());
    });

    std::mt19937 order(777);  // the same draws on every rank
    std::vector<double> save_t, write_t, load_t, read_t;
    const UserTimes before = user_times();
    const double wall0 = MPI_Wtime();
    for (int it = 0; it < o_.warmup + o_.iters; ++it) {
      const bool timed_iter = it >= o_.warmup;
      // Both writes start from no file; the reads from the cache state
      // --cold asks for.
      auto fresh = [&](const std::string& path) {
        if (w_.rank == 0) ::unlink(path.c_str());
        MPI_Barrier(w_.comm);
      };
      auto settle = [&](const std::string& path) {
        if (o_.cold && w_.rank == 0) drop_cache(path);
        MPI_Barrier(w_.comm);
      };
      double s = 0, rw = 0, l = 0, rr = 0;
      std::string err;
      auto do_save = [&] {
        fresh(ckpt_);
        s = timed(w_, [&] { opt.save(ckpt_); });
      };
      auto do_raw_write = [&] {
        fresh(raw_);
        rw = timed(w_, [&] { err = raw_write(raw_, raw.as<unsigned char>(), offset, mine); });
        agree(w_, err);
      };
      if (order() % 2) {
        do_save();
        do_raw_write();
      } else {
        do_raw_write();
        do_save();
      }
      shardopt::LoadReport rep;
      auto do_load = [&] {
        settle(ckpt_);
        l = timed(w_, [&] { rep = opt.load(ckpt_); });
      };
      auto do_raw_read = [&] {
        settle(raw_);
        rr = timed(w_, [&] { err = raw_read(raw_, raw.as<unsigned char>(), offset, mine); });
        agree(w_, err);
      };
      if (order() % 2) {
        do_load();
        do_raw_read();
      } else {
        do_raw_read();
        do_load();
      }
      if (!rep.missing.empty() || !rep.unexpected.empty() || !rep.mismatched.empty()) {
        throw Failure("load() did not restore every tensor: " + rep.summary());
      }
      if (timed_iter) {
        save_t.push_back(s);
        write_t.push_back(rw);
        load_t.push_back(l);
        read_t.push_back(rr);
      }
    }
    const UserTimes after = user_times();
    const double wall = MPI_Wtime() - wall0;
    // Other processes' share of the CPUs while the row ran (this node's
    // ranks' own time taken out).
    double self = after.self_s - before.self_s;
    MPI_Allreduce(MPI_IN_PLACE, &self, 1, MPI_DOUBLE, MPI_SUM, w_.comm);
    const double cores = static_cast<double>(sysconf(_SC_NPROCESSORS_ONLN));
    double other = -1;
    if (before.ok && after.ok && wall > 0) {
      other = std::max(0.0, (after.machine_s - before.machine_s - self) / (wall * cores));
    }
    MPI_Bcast(&other, 1, MPI_DOUBLE, 0, w_.comm);

    // The parameters after the last load are the ones saved.
    const std::uint64_t again = report::fnv1a(params.data(), psi * 4);
    int bad = again != hash ? 1 : 0;
    MPI_Allreduce(MPI_IN_PLACE, &bad, 1, MPI_INT, MPI_MAX, w_.comm);
    if (bad) throw Failure("the parameters after load() differ from those saved");

    BenchRow r;
    r.params = psi;
    r.ranks = w_.size;
    r.bytes = bytes;
    r.iters = o_.iters;
    r.save_s = report::median(save_t);
    r.raw_write_s = report::median(write_t);
    r.load_s = report::median(load_t);
    r.raw_read_s = report::median(read_t);
    r.other_load = other;
    remove_files();
    return r;
  }

 private:
  shardopt::Communicator& comm_;
  const World& w_;
  const BenchOptions& o_;
  std::string ckpt_, raw_;
};

void print_bench_header(const BenchOptions& o, const World& w, const std::string& dir_fs,
                        int local_ranks) {
  FILE* f = o.json ? stderr : stdout;
  std::fprintf(f,
               "# %s bench: ZeroRedundancyOptimizer::save/load beside raw pwrite+fsync/pread of "
               "the same bytes in the same directory\n",
               kProgram);
  std::fprintf(f, "# %s\n", shardopt::build_info_string().c_str());
  std::fprintf(f, "# machine: %s, %ld cores online, %d rank%s here\n", machine::cpu_model().c_str(),
               sysconf(_SC_NPROCESSORS_ONLN), local_ranks, local_ranks == 1 ? "" : "s");
  std::fprintf(f,
               "# dir %s (%s); model: AdamW, stage 1, f32, 8 tensors; ranks %d; iters %d "
               "(median), warmup %d; raw: each rank its 1/%d of the checkpoint's bytes at "
               "disjoint offsets of one file, %llu MiB per call, then fsync; reads %s\n",
               o.dir.c_str(), dir_fs.c_str(), w.size, o.iters, o.warmup, w.size,
               static_cast<unsigned long long>(kRawBlock >> 20),
               o.cold ? "after dropping the file's pages (--cold): from the device"
                      : "right after the write and sync: from the page cache");
  std::fprintf(
      f,
      "# times: slowest rank, after a barrier; GB/s = bytes / time (1e9 B); ratio = "
      "raw time / shardopt time (1: as fast as the raw I/O); other: user CPU time of other "
      "processes, a share of all cores (over 5%%: marked *)\n");
  if (!o.json) {
    std::printf("#\n# %5s %8s %12s %9s %9s %6s %9s %9s %6s %9s %9s  %6s\n", "ranks", "params",
                "bytes", "save", "raw_wr", "ratio", "load", "raw_rd", "ratio", "save", "load",
                "other");
    std::printf("# %5s %8s %12s %9s %9s %6s %9s %9s %6s %9s %9s\n", "", "", "(B)", "(GB/s)",
                "(GB/s)", "", "(GB/s)", "(GB/s)", "", "(ms)", "(ms)");
  }
  std::fflush(f);
}

void print_bench_row(const BenchOptions& o, const BenchRow& r) {
  if (o.json) {
    Json j;
    j["ranks"] = r.ranks;
    j["params"] = r.params;
    j["bytes"] = r.bytes;
    j["save_gbps"] = r.gbps(r.save_s);
    j["raw_write_gbps"] = r.gbps(r.raw_write_s);
    j["save_ratio"] = r.save_ratio();
    j["load_gbps"] = r.gbps(r.load_s);
    j["raw_read_gbps"] = r.gbps(r.raw_read_s);
    j["load_ratio"] = r.load_ratio();
    j["save_s"] = r.save_s;
    j["raw_write_s"] = r.raw_write_s;
    j["load_s"] = r.load_s;
    j["raw_read_s"] = r.raw_read_s;
    j["iters"] = r.iters;
    j["dir"] = o.dir;
    j["cold"] = o.cold;
    j["other_load"] = r.other_load >= 0 ? Json(r.other_load) : Json();
    std::printf("%s\n", j.dump(-1, ' ', false, Json::error_handler_t::replace).c_str());
  } else {
    char other[16] = "?";
    if (r.other_load >= 0) {
      std::snprintf(other, sizeof other, "%3.0f%%%s", 100 * r.other_load, r.busy() ? "*" : "");
    }
    std::printf("  %5d %8s %12llu %9.3f %9.3f %6.3f %9.3f %9.3f %6.3f %9.1f %9.1f  %6s\n", r.ranks,
                human_count(r.params).c_str(), static_cast<unsigned long long>(r.bytes),
                r.gbps(r.save_s), r.gbps(r.raw_write_s), r.save_ratio(), r.gbps(r.load_s),
                r.gbps(r.raw_read_s), r.load_ratio(), 1e3 * r.save_s, 1e3 * r.load_s, other);
  }
  std::fflush(stdout);
}

void print_bench_goals(const BenchOptions& o, const std::vector<BenchRow>& rows) {
  FILE* f = o.json ? stderr : stdout;
  std::fprintf(f,
               "#\n# goal: save >= %.1fx the raw write bandwidth, load >= %.1fx the raw read "
               "bandwidth (ratio >= %.1f)\n",
               kGoalRatio, kGoalRatio, kGoalRatio);
  for (const BenchRow& r : rows) {
    std::fprintf(f, "#   %s params, %d rank%s: save %.3f: %s; load %.3f: %s%s\n",
                 human_count(r.params).c_str(), r.ranks, r.ranks == 1 ? "" : "s", r.save_ratio(),
                 r.save_ratio() >= kGoalRatio ? "met" : "not met", r.load_ratio(),
                 r.load_ratio() >= kGoalRatio ? "met" : "not met",
                 r.busy() ? " (busy machine: other processes used the CPUs, rerun it)" : "");
  }
  std::fflush(f);
}

int run_bench(shardopt::Communicator& comm, const World& w, const BenchOptions& o) {
  // The directory, as every rank sees it.
  std::string dir_fs = "unknown";
  std::string base;
  const bool dir_ok = guarded(w, "bench", [&] {
    local(w, [&] {
      struct stat st {};
      if (::stat(o.dir.c_str(), &st) != 0 || !S_ISDIR(st.st_mode)) {
        throw Failure("-D (--dir) '" + o.dir + "' is not a directory",
                      "pass an existing directory to write the benchmark's files in");
      }
      if (::access(o.dir.c_str(), W_OK) != 0) {
        throw Failure("-D (--dir) '" + o.dir + "' is not writable",
                      "pass a directory you may write in");
      }
      struct statfs fs {};
      if (::statfs(o.dir.c_str(), &fs) == 0) dir_fs = fs_name(static_cast<long>(fs.f_type));
      base = o.dir + "/shardopt-ckpt-bench-" + std::to_string(::getpid());
    });
  });
  if (!dir_ok) return 1;
  auto bcast_string = [&](std::string& s) {
    int n = static_cast<int>(s.size());
    MPI_Bcast(&n, 1, MPI_INT, 0, w.comm);
    s.resize(static_cast<std::size_t>(n));
    MPI_Bcast(s.data(), n, MPI_CHAR, 0, w.comm);
  };
  bcast_string(dir_fs);
  bcast_string(base);

  MPI_Comm node = MPI_COMM_NULL;
  MPI_Comm_split_type(w.comm, MPI_COMM_TYPE_SHARED, w.rank, MPI_INFO_NULL, &node);
  int local_ranks = 1;
  MPI_Comm_size(node, &local_ranks);
  MPI_Comm_free(&node);
  double available = static_cast<double>(machine::mem_available_bytes());
  MPI_Allreduce(MPI_IN_PLACE, &available, 1, MPI_DOUBLE, MPI_MIN, w.comm);

  if (w.rank == 0) print_bench_header(o, w, dir_fs, local_ranks);
  std::vector<BenchRow> rows;
  bool ok = true;
  for (std::size_t psi : o.params) {
    // Parameters and gradients per rank, master weights and two states
    // sharded, the raw buffer (the checkpoint's share), and load()'s reads.
    const double per_rank = 8.0 * double(psi) + 2.0 * 12.0 * double(psi) / w.size;
    if (available > 0 && per_rank * local_ranks > 0.9 * available) {
      if (w.rank == 0) {
        std::fprintf(o.json ? stderr : stdout,
                     "# skipping %s params: %d ranks here need about %.1f GiB, %.1f GiB "
                     "available\n",
                     human_count(psi).c_str(), local_ranks, per_rank * local_ranks / (1 << 30),
                     available / (1 << 30));
      }
      continue;
    }
    ok = guarded(w, "bench " + human_count(psi) + " params", [&] {
      Bench bench(comm, w, o, base);
      const BenchRow r = bench.run(psi);
      if (w.rank == 0) print_bench_row(o, r);
      rows.push_back(r);
    });
    if (!ok) break;
  }
  if (w.rank == 0) print_bench_goals(o, rows);
  return ok ? 0 : 1;
}

// ---------------------------------------------------------------------------
// main

enum class Command { info, verify, export_, diff, bench };

struct Parsed {
  Command command = Command::info;
  std::vector<std::string> operands;
  bool help = false;
  InfoOptions info;
  VerifyOptions verify;
  ExportOptions export_;
  DiffOptions diff;
  BenchOptions bench;
};

Parsed parse_command_line(int argc, char** argv) {
  Parsed p;
  if (argc < 2) throw UsageError{"no command given; commands: info verify export diff bench"};
  const std::string_view cmd = argv[1];
  if (cmd == "-h" || cmd == "--help" || cmd == "help") {
    p.help = true;
    return p;
  }
  static constexpr OptionSpec kHelp = {'h', "help", false};
  static constexpr OptionSpec kWindow = {'w', "window", true};
  auto common = [&](const OptionSpec& spec, const std::string& label, std::string_view v) {
    const std::string_view name = spec.long_name;
    if (name == "help") {
      p.help = true;
      return true;
    }
    if (name == "window") {
      const u64 b = parse_bytes(label, v);
      p.verify.window = p.export_.window = p.diff.window = b;
      return true;
    }
    return false;
  };
  if (cmd == "info") {
    p.command = Command::info;
    static constexpr OptionSpec kSpecs[] = {kHelp, {0, "json", false}};
    p.operands = parse_words(argc, argv, kSpecs,
                             [&](const OptionSpec& s, const std::string& l, std::string_view v) {
                               if (!common(s, l, v)) p.info.json = true;
                             });
    if (!p.help) expect_operands(p.operands, 1, 1, "one FILE: info FILE");
  } else if (cmd == "verify") {
    p.command = Command::verify;
    static constexpr OptionSpec kSpecs[] = {kHelp, kWindow, {0, "allow-unchecksummed", false}};
    p.operands = parse_words(argc, argv, kSpecs,
                             [&](const OptionSpec& s, const std::string& l, std::string_view v) {
                               if (!common(s, l, v)) p.verify.allow_unchecksummed = true;
                             });
    if (!p.help) expect_operands(p.operands, 1, SIZE_MAX, "FILE...: verify FILE...");
  } else if (cmd == "export") {
    p.command = Command::export_;
    static constexpr OptionSpec kSpecs[] = {
        kHelp, kWindow, {'d', "dtype", true}, {0, "chunk-bytes", true}};
    p.operands = parse_words(argc, argv, kSpecs,
                             [&](const OptionSpec& s, const std::string& l, std::string_view v) {
                               if (common(s, l, v)) return;
                               if (std::string_view(s.long_name) == "dtype") {
                                 if (v == "f32") {
                                   p.export_.dtype = DType::f32;
                                 } else if (v == "bf16") {
                                   p.export_.dtype = DType::bf16;
                                 } else if (v == "f16") {
                                   p.export_.dtype = DType::f16;
                                 } else {
                                   bad_value(l, v, "f32 bf16 f16");
                                 }
                               } else {
                                 p.export_.chunk_bytes = parse_bytes(l, v);
                               }
                             });
    if (!p.help) expect_operands(p.operands, 2, 2, "CKPT and OUT: export CKPT OUT");
  } else if (cmd == "diff") {
    p.command = Command::diff;
    static constexpr OptionSpec kSpecs[] = {kHelp,
                                            kWindow,
                                            {0, "atol", true},
                                            {0, "rtol", true},
                                            {0, "params-only", false},
                                            {'q', "quiet", false}};
    p.operands = parse_words(argc, argv, kSpecs,
                             [&](const OptionSpec& s, const std::string& l, std::string_view v) {
                               if (common(s, l, v)) return;
                               const std::string_view name = s.long_name;
                               if (name == "atol") p.diff.atol = parse_nonnegative(l, v);
                               if (name == "rtol") p.diff.rtol = parse_nonnegative(l, v);
                               if (name == "params-only") p.diff.params_only = true;
                               if (name == "quiet") p.diff.quiet = true;
                             });
    if (!p.help) expect_operands(p.operands, 2, 2, "two files: diff A B");
  } else if (cmd == "bench") {
    p.command = Command::bench;
    static constexpr OptionSpec kSpecs[] = {kHelp,
                                            {'p', "params", true},
                                            {'D', "dir", true},
                                            {'n', "iters", true},
                                            {0, "warmup", true},
                                            {0, "cold", false},
                                            {0, "json", false}};
    p.operands = parse_words(
        argc, argv, kSpecs, [&](const OptionSpec& s, const std::string& l, std::string_view v) {
          if (common(s, l, v)) return;
          const std::string_view name = s.long_name;
          if (name == "params") {
            p.bench.params.clear();
            for (std::string_view item : cli::split(v)) {
              const auto n = cli::parse_scaled(item, std::uint64_t{1} << 34);
              if (!n || *n < 64) {
                bad_value(l, item,
                          "counts of at least 64 with an optional K, M or G suffix, e.g. 1M,25M");
              }
              p.bench.params.push_back(static_cast<std::size_t>(*n));
            }
          } else if (name == "dir") {
            if (v.empty()) bad_value(l, v, "a directory");
            p.bench.dir = std::string(v);
          } else if (name == "iters") {
            p.bench.iters = cli::parse_int(l, v, 1, 10000, "an integer >= 1");
          } else if (name == "warmup") {
            p.bench.warmup = cli::parse_int(l, v, 0, 10000, "an integer >= 0");
          } else if (name == "cold") {
            p.bench.cold = true;
          } else if (name == "json") {
            p.bench.json = true;
          }
        });
    if (!p.help) expect_operands(p.operands, 0, 0, "no operands: bench [options]");
    if (p.bench.params.empty()) p.bench.params.push_back(std::size_t{25} << 20);
  } else {
    throw UsageError{"unknown command '" + std::string(cmd) +
                     "'; commands: info verify export diff bench"};
  }
  return p;
}

int ckpt_main(int argc, char** argv) {
  World w;
  MPI_Comm_rank(MPI_COMM_WORLD, &w.rank);
  MPI_Comm_size(MPI_COMM_WORLD, &w.size);

  Parsed p;
  try {
    p = parse_command_line(argc, argv);
  } catch (const UsageError& e) {
    cli::print_usage_error(kProgram, w.rank, e);
    return 2;
  }
  if (p.help) {
    if (w.rank == 0) std::fputs(kUsage, stdout);
    return 0;
  }

  // Library calls throw the same error on every rank, and local work is
  // agreed on (local()), so the errors above are reported and every rank
  // goes on or stops alike. Anything else may have struck one rank only, in
  // the middle of a collective the others wait in: abort the job rather than
  // hang.
  try {
    shardopt::Communicator comm(MPI_COMM_WORLD);
    MPI_Comm_dup(MPI_COMM_WORLD, &w.comm);
    int rc = 0;
    switch (p.command) {
      case Command::info:
        rc = run_info(comm, w, p.operands[0], p.info);
        break;
      case Command::verify:
        rc = run_verify(comm, w, p.operands, p.verify);
        break;
      case Command::export_:
        rc = run_export(comm, w, p.operands[0], p.operands[1], p.export_);
        break;
      case Command::diff:
        rc = run_diff(comm, w, p.operands[0], p.operands[1], p.diff);
        break;
      case Command::bench:
        rc = run_bench(comm, w, p.bench);
        break;
    }
    MPI_Comm_free(&w.comm);
    comm.free();
    return rc;
  } catch (const shardopt::Error& e) {
    cli::print_error(kProgram, w.rank, e.message() + " (fix: " + e.hint() + ")");
    MPI_Abort(MPI_COMM_WORLD, p.command == Command::diff ? 2 : 1);
    return 1;
  } catch (const std::exception& e) {
    cli::print_error(kProgram, w.rank, e.what());
    MPI_Abort(MPI_COMM_WORLD, p.command == Command::diff ? 2 : 1);
    return 1;
  }
}

}  // namespace

int main(int argc, char** argv) { return cli::run_with_mpi(kProgram, argc, argv, ckpt_main); }
