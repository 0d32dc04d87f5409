#include "common/settings.hpp"

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <climits>
#include <cstdio>
#include <cstdlib>
#include <initializer_list>
#include <mutex>
#include <optional>
#include <string>
#include <type_traits>
#include <utility>

#include "common/check.hpp"

namespace shardopt {

namespace {

// One declaration per variable: name, default, accepted values, meaning, and
// how a (non-empty) value is applied. docs/env.md lists the same table.
struct VarSpec {
  const char* name;
  const char* default_value;
  const char* accepted;
  const char* description;
  // Applies `value`; returns false if the value is not accepted.
  bool (*apply)(Settings& s, const std::string& value);
  // For a variable that must be the same on every rank (it changes what
  // the ranks do together, so ranks that differ would hang or mismatch
  // collectives): its parsed value as text, which the ranks compare at
  // every Communicator's construction (lib/comm/survey.cpp). Null for one
  // that may differ between ranks; each entry says why.
  std::string (*agreed)(const Settings& s) = nullptr;
};

std::string upper(std::string v) {
  std::transform(v.begin(), v.end(), v.begin(),
                 [](unsigned char c) { return static_cast<char>(std::toupper(c)); });
  return v;
}

std::optional<bool> parse_bool(const std::string& v) {
  const std::string u = upper(v);
  if (u == "1" || u == "TRUE" || u == "YES" || u == "ON") return true;
  if (u == "0" || u == "FALSE" || u == "NO" || u == "OFF") return false;
  return std::nullopt;
}

// A positive decimal integer no larger than `max`, without sign or junk.
std::optional<unsigned long long> parse_count(const std::string& v, unsigned long long max) {
  if (v.empty() || v.size() > 20) return std::nullopt;
  for (char c : v)
    if (c < '0' || c > '9') return std::nullopt;
  errno = 0;
  const unsigned long long n = std::strtoull(v.c_str(), nullptr, 10);
  if (errno != 0 || n == 0 || n > max) return std::nullopt;
  return n;
}

// parse_count, or "0" (which turns a periodic action off), as an int.
std::optional<int> parse_period(const std::string& v) {
  if (v == "0") return 0;
  const auto n = parse_count(v, INT_MAX);
  if (!n) return std::nullopt;
  return static_cast<int>(*n);
}

// A decimal number in [lo, hi] (lo itself only when lo_open is false), with
// nothing after it.
std::optional<double> parse_number(const std::string& v, double lo, bool lo_open, double hi) {
  char* end = nullptr;
  errno = 0;
  const double x = std::strtod(v.c_str(), &end);
  if (errno != 0 || end == v.c_str() || *end != '\0') return std::nullopt;
  if (!(lo_open ? x > lo : x >= lo) || x > hi) return std::nullopt;  // NaN fails here too
  return x;
}

// VarSpec::apply for a flag and for a period, storing into one Settings field.
template <auto Field>
bool apply_bool(Settings& s, const std::string& v) {
  const auto b = parse_bool(v);
  if (b) s.*Field = *b;
  return b.has_value();
}

// VarSpec::agreed: the parsed value of one Settings field as text.
template <auto Field>
std::string value_text(const Settings& s) {
  const auto& v = s.*Field;
  using T = std::remove_cvref_t<decltype(v)>;
  if constexpr (std::is_same_v<T, double>) {
    char text[32];
    std::snprintf(text, sizeof text, "%.17g", v);
    return text;
  } else if constexpr (std::is_enum_v<T>) {
    return std::to_string(static_cast<int>(v));
  } else {
    return std::to_string(v);
  }
}

template <auto Field>
bool apply_period(Settings& s, const std::string& v) {
  const auto n = parse_period(v);
  if (n) s.*Field = *n;
  return n.has_value();
}

// For a named choice (any case): stores the value of the name v is, if any.
template <class E>
bool apply_choice(E& field, const std::string& v,
                  std::initializer_list<std::pair<const char*, E>> choices) {
  const std::string u = upper(v);
  for (const auto& [name, value] : choices) {
    if (u != name) continue;
    field = value;
    return true;
  }
  return false;
}

const VarSpec kVars[] = {
    {"SHARDOPT_DEBUG", "WARN", "NONE, WARN, INFO, TRACE (any case)",
     "How much the library logs: NONE nothing, WARN problems, INFO also setup and per-phase "
     "summaries, TRACE every collective. Like NCCL_DEBUG.",
     [](Settings& s, const std::string& v) {
       return apply_choice(s.debug, v,
                           {{"NONE", LogLevel::none},
                            {"WARN", LogLevel::warn},
                            {"INFO", LogLevel::info},
                            {"TRACE", LogLevel::trace}});
     },
     // Per rank: what one process logs changes nothing the ranks do together.
     nullptr},
    {"SHARDOPT_DEBUG_FILE", "(stderr)",
     "a file path; %h is replaced by the host name, %p by the "
     "process id, %r by the rank in MPI_COMM_WORLD",
     "Where log lines go instead of stderr, one file per process when the path uses %p or %r. "
     "Like NCCL_DEBUG_FILE.",
     [](Settings& s, const std::string& v) {
       s.debug_file = v;
       return true;
     },
     // Per rank: a path of this process's own (it may name the host and rank).
     nullptr},
    {"SHARDOPT_HUGE_PAGES", "1", "1, 0 (also true/false, yes/no, on/off)",
     "Ask the kernel for transparent huge pages (madvise) for the library's large host buffers. "
     "Turn off only where huge pages are known to hurt.",
     apply_bool<&Settings::huge_pages>,
     // Per rank: advice on this process's own memory; no result changes.
     nullptr},
    {"SHARDOPT_COMM_MAX_CHUNK", "2147483647", "an integer from 1 to 2147483647",
     "Largest number of elements passed to one MPI call; larger collectives are split into "
     "chunks. Lower it for MPI libraries that fail on messages of 2 GiB or more.",
     [](Settings& s, const std::string& v) {
       const auto n = parse_count(v, INT_MAX);
       if (!n) return false;
       s.comm_max_chunk = static_cast<std::size_t>(*n);
       return true;
     },
     // Agreed: ranks that cut a large collective into chunks of different
     // sizes issue different numbers of MPI calls of different counts.
     value_text<&Settings::comm_max_chunk>},
    {"SHARDOPT_CHECK_ARGS", "0", "1, 0 (also true/false, yes/no, on/off)",
     "Agree on every collective's arguments across ranks before running it, so that a bad "
     "argument on one rank, or ranks that disagree on count, type, op or root, fail on every "
     "rank with a clear error instead of hanging. Costs one small collective per call.",
     apply_bool<&Settings::check_args>,
     // Agreed: a rank that checks arguments adds an allgather before every
     // collective, which the ranks that do not would never join.
     value_text<&Settings::check_args>},
    {"SHARDOPT_CPU_ISA", "auto", "auto, avx512, avx2, baseline (any case)",
     "The widest vector unit the CPU optimizer kernels may use: auto (or avx512) the widest "
     "the CPU has, avx2 at most AVX2 with FMA and F16C, baseline the x86-64 baseline (SSE2). A "
     "cap: a CPU without the named unit uses the widest it has. For comparing nodes of "
     "different types, or ruling the vector code out while debugging.",
     [](Settings& s, const std::string& v) {
       return apply_choice(s.cpu_isa, v,
                           {{"AUTO", CpuIsa::avx512},
                            {"AVX512", CpuIsa::avx512},
                            {"AVX2", CpuIsa::avx2},
                            {"BASELINE", CpuIsa::baseline}});
     },
     // Per rank: every vector unit gives bitwise the same results (the golden
     // tests run bitwise at every cap), and nodes of different CPU types
     // need their own.
     nullptr},
    {"SHARDOPT_BUCKET_MB", "25", "a number of MiB > 0 and <= 65536, e.g. 25 or 0.5",
     "The size of the ZeRO engine's gradient buckets (of reduced gradients) when "
     "ZeroOptions::bucket_mb is 0: larger buckets mean fewer, larger messages; smaller ones "
     "start the reduction sooner in the backward pass and need less scratch memory.",
     [](Settings& s, const std::string& v) {
       const auto mb = parse_number(v, 0.0, true, 65536.0);
       if (!mb) return false;
       s.bucket_mb = *mb;
       return true;
     },
     // Agreed: the buckets decide the reduce-scatters each step issues (the
     // engine also agrees on the size in force, but could not say why).
     value_text<&Settings::bucket_mb>},
    {"SHARDOPT_TIMEOUT", "600", "a number of seconds >= 0 and <= 604800, e.g. 600 or 0.5",
     "The watchdog, armed by default: when one blocking operation of the library (a "
     "collective, or the wait for one) has not completed after this many seconds, print which "
     "operation, the step and bucket, and end the process with exit status 86, which ends the "
     "job under mpirun (and srun --kill-on-bad-exit) instead of letting it hang until the time "
     "limit. The default, 10 minutes, is NCCL's and PyTorch's: longer than any legitimate wait "
     "of a step or a checkpoint's collective. 0: off.",
     [](Settings& s, const std::string& v) {
       const auto t = parse_number(v, 0.0, false, 604800.0);
       if (!t) return false;
       s.timeout = *t;
       return true;
     },
     // Agreed: an armed watchdog makes collectives of its own (a duplicate
     // and an allgather at each communicator's construction, questions to
     // the other ranks on a stall) and turns blocking calls into polled
     // non-blocking ones; and one job should end at one limit.
     value_text<&Settings::timeout>},
    {"SHARDOPT_DESYNC_CHECK", "0", "1, 0 (also true/false, yes/no, on/off)",
     "Desync detection: every collective the library issues carries a sequence number and a "
     "fingerprint (operation, count, dtype, op, root) that the ranks compare before any data "
     "moves; ranks that issued different collectives, or a different number of them, get an "
     "error naming the ranks and both operations instead of a hang or a truncation. Turns "
     "SHARDOPT_CHECK_ARGS on; costs one small allgather per collective.",
     apply_bool<&Settings::desync_check>,
     // Agreed: as SHARDOPT_CHECK_ARGS, which it turns on.
     value_text<&Settings::desync_check>},
    {"SHARDOPT_STATS_EVERY", "100", "an integer from 0 to 2147483647",
     "At SHARDOPT_DEBUG=INFO, every N optimizer steps each rank logs the mean time of each "
     "phase of its last N steps (reduce, update, gather, exposed communication), the bytes "
     "moved and the achieved bus bandwidths. 0: never.",
     apply_period<&Settings::stats_every>,
     // Per rank: each rank logs its own window of steps, no collective.
     nullptr},
    {"SHARDOPT_STAGED_CHUNK_KB", "4096", "an integer from 4 to 1048576",
     "The staged backend's pipeline step for device buffers over an MPI that is not "
     "CUDA-aware: each collective moves through pinned host memory in chunks of this many KiB "
     "(per rank's block for reduce-scatter and allgather), the copy of one chunk overlapping "
     "MPI on the one before. Smaller chunks start MPI sooner; larger ones cost fewer calls.",
     [](Settings& s, const std::string& v) {
       const auto n = parse_count(v, 1048576);
       if (!n || *n < 4) return false;
       s.staged_chunk_kb = static_cast<std::size_t>(*n);
       return true;
     },
     // Agreed: the staged backend's MPI calls move one chunk each, so ranks
     // with different chunks issue different numbers and sizes of calls.
     value_text<&Settings::staged_chunk_kb>},
    {"SHARDOPT_DEVICE_COMM", "auto", "auto, nccl, mpi, staged (any case)",
     "How communicators move device buffers: nccl the device's own stream-ordered "
     "collectives (NCCL), mpi MPI on the device buffers themselves (a CUDA-aware MPI), staged "
     "through pinned host memory with any MPI; auto nccl when shardopt has it and every rank "
     "has a device of its own, else mpi when every rank's MPI is CUDA-aware "
     "(SHARDOPT_CUDA_AWARE_MPI), else staged. A forced choice that cannot be used is an error "
     "on every rank. CommOptions::device_comm overrides it.",
     [](Settings& s, const std::string& v) {
       return apply_choice(s.device_comm, v,
                           {{"AUTO", DeviceComm::automatic},
                            {"NCCL", DeviceComm::nccl},
                            {"MPI", DeviceComm::mpi},
                            {"STAGED", DeviceComm::staged}});
     },
     // Agreed: each transport makes collectives of its own at construction
     // and for every operation, and a forced one that cannot be used fails
     // only on the ranks that forced it.
     value_text<&Settings::device_comm>},
    {"SHARDOPT_HOST_COMM", "auto", "auto, mpi, shm, hier (any case)",
     "How communicators move host buffers: shm through shared memory the ranks of a node all "
     "map (each rank reduces its part reading the others' data directly, summing in rank "
     "order), hier shm within each node and MPI across nodes among the ranks with the same "
     "place in their node, mpi the MPI library's own collectives; auto shm when all ranks are "
     "on one node, hier when several nodes hold the same number (two or more) of ranks, else "
     "mpi, and mpi with a warning where the shared memory cannot be made (a full /dev/shm). A "
     "forced choice that cannot be used is an error on every rank. CommOptions::host_comm "
     "overrides it.",
     [](Settings& s, const std::string& v) {
       return apply_choice(s.host_comm, v,
                           {{"AUTO", HostComm::automatic},
                            {"MPI", HostComm::mpi},
                            {"SHM", HostComm::shm},
                            {"HIER", HostComm::hier}});
     },
     // Agreed: each choice makes collectives of its own at construction
     // and moves data by different algorithms.
     value_text<&Settings::host_comm>},
    {"SHARDOPT_SHM_CHUNK_KB", "1024", "an integer from 4 to 1048576",
     "The shared-memory collectives' step: each rank of a node owns two slots of this many "
     "KiB in memory all the node's ranks map, and operations move through them a slot at a "
     "time. Small enough that a slot is still in the shared cache when the other ranks read "
     "it; each communicator maps 2 x this x the node's ranks.",
     [](Settings& s, const std::string& v) {
       const auto n = parse_count(v, 1048576);
       if (!n || *n < 4) return false;
       s.shm_chunk_kb = static_cast<std::size_t>(*n);
       return true;
     },
     // Agreed: the ranks of a node must step through the same chunks.
     value_text<&Settings::shm_chunk_kb>},
    {"SHARDOPT_SHM_SINGLE_COPY_KB", "16", "an integer from 0 to 1048576, or off (any case)",
     "The shared-memory collectives' single copy: an operation whose block on each rank (a "
     "reduce-scatter's or allgather's block, a broadcast's buffer; an allreduce's part from 8 "
     "times this, MPI's in-place reduce-scatter from 64 times this) has at least this many KiB "
     "takes no slots: each rank reads what it needs of "
     "the others' buffers directly (process_vm_readv, one copy by the kernel), so each byte "
     "crosses memory once. "
     "Where the kernel refuses those reads (seccomp, Yama's ptrace_scope, a process that is not "
     "dumpable), every operation goes through the slots, with one warning. off: always the "
     "slots.",
     [](Settings& s, const std::string& v) {
       if (upper(v) == "OFF") {
         s.shm_single_copy_kb = SIZE_MAX;
         return true;
       }
       const auto n = v == "0" ? std::optional<unsigned long long>(0) : parse_count(v, 1048576);
       if (!n) return false;
       s.shm_single_copy_kb = static_cast<std::size_t>(*n);
       return true;
     },
     // Agreed: the ranks of a node must take the same path through each
     // operation.
     value_text<&Settings::shm_single_copy_kb>},
    {"SHARDOPT_FUSED_UPDATE", "1", "1, 0 (also true/false, yes/no, on/off)",
     "ZeRO stage 2 on host buffers, all ranks on one node (SHARDOPT_HOST_COMM shm) and "
     "gradient buffers the optimizer owns: keep those buffers in memory the node's ranks all "
     "map, and let each rank's update read every rank's gradients of its shard directly, "
     "summing them in rank order block by block as it updates, so the reduced gradient shard "
     "is never written. The same results bitwise. 0: reduce-scatter into the shard first.",
     apply_bool<&Settings::fused_update>,
     // Agreed: the ranks map the gradients together or not at all, and the
     // fused step makes no reduce-scatters.
     value_text<&Settings::fused_update>},
    {"SHARDOPT_CUDA_AWARE_MPI", "ask", "ask, yes, no (any case)",
     "Whether MPI can be given device buffers. ask: as the MPI library says at run time (Open "
     "MPI's MPIX_Query_cuda_support, MPICH's MPIX_GPU_query_support; an MPI that has neither "
     "is taken as not CUDA-aware). yes or no: for an MPI that cannot say, or says wrongly. "
     "Decides whether SHARDOPT_DEVICE_COMM=auto may take mpi and whether mpi may be forced.",
     [](Settings& s, const std::string& v) {
       return apply_choice(
           s.cuda_aware_mpi, v,
           {{"ASK", CudaAwareMpi::ask}, {"YES", CudaAwareMpi::yes}, {"NO", CudaAwareMpi::no}});
     },
     // Per rank: it describes this rank's MPI library (nodes may differ);
     // the ranks already agree on what it implies (the choice of transport).
     nullptr},
    {"SHARDOPT_CHECK_SYNC", "0", "an integer from 0 to 2147483647",
     "Check every N applied optimizer steps that the parameters are identical on every rank "
     "(a checksum per parameter compared across ranks, check_sync()); a difference stops every "
     "rank with an error naming the first parameter and element that differ. 0: never. "
     "ZeroOptions::check_sync_every overrides it.",
     apply_period<&Settings::check_sync>,
     // Agreed: the check is a collective every N steps.
     value_text<&Settings::check_sync>},
};

}  // namespace

namespace detail {

Settings parse_settings(const EnvLookup& lookup) {
  Settings s;
  for (const VarSpec& var : kVars) {
    const char* raw = lookup(var.name);
    if (raw == nullptr || raw[0] == '\0') continue;  // unset or empty: the default
    const std::string value(raw);
    if (!var.apply(s, value)) {
      // Thrown directly, not through throw_error: that logs, and logging
      // reads the settings being parsed here.
      throw ConfigError(ErrorCode::invalid_config,
                        std::string(var.name) + "='" + value +
                            "' is not a valid value; accepted: " + var.accepted,
                        std::string("set ") + var.name +
                            " to one of the accepted values, or unset it "
                            "to use the default (" +
                            var.default_value + "); see docs/env.md",
                        __FILE__, __LINE__, world_rank());
    }
  }
  return s;
}

std::vector<AgreedSetting> agreed_settings(const Settings& s, const EnvLookup& lookup) {
  std::vector<AgreedSetting> out;
  for (const VarSpec& var : kVars) {
    if (var.agreed == nullptr) continue;
    const char* raw = lookup(var.name);
    out.push_back({var.name, raw == nullptr ? "" : raw, var.default_value, var.agreed(s)});
  }
  return out;
}

}  // namespace detail

const Settings& settings() {
  // Read once per process. A bad value is reported at every call, so every
  // entry point of the library fails the same way.
  static std::once_flag once;
  static Settings cached;
  static std::optional<ConfigError> failure;
  std::call_once(once, [] {
    try {
      cached = detail::parse_settings([](const char* n) { return std::getenv(n); });
    } catch (const ConfigError& e) {
      failure = e;
    }
  });
  if (failure) throw *failure;
  return cached;
}

std::vector<EnvVarInfo> environment_variables() {
  std::vector<EnvVarInfo> out;
  for (const VarSpec& v : kVars)
    out.push_back({v.name, v.default_value, v.accepted, v.description, v.agreed != nullptr});
  return out;
}

}  // namespace shardopt
