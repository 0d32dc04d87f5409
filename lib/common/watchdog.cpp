#include "common/watchdog.hpp"

#include <mpi.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <mutex>
#include <thread>
#include <utility>

#include "common/check.hpp"
#include "common/log.hpp"
#include "shardopt/config.hpp"
#include "shardopt/status.h"

namespace shardopt::detail {

namespace {

using Clock = std::chrono::steady_clock;

// The question a timed-out rank sends on a WatchChannel, and the answer.
constexpr int kAskTag = 1;
constexpr int kReportTag = 2;
const char kAsk = '?';
struct Report {
  std::uint64_t count = 0;
  std::int32_t dtype = 0;
  std::int32_t inside = 0;  // 1: inside a blocking operation of the library
  char op[48] = {};
  char context[208] = {};
};

struct State {
  std::mutex m;
  // The operation under way, written by the thread that enters it and read
  // by the others (the monitor, a report): atomics, so that entering one
  // costs a few plain stores and one increment, no lock and no clock.
  std::atomic<int> depth{0};        // nested scopes: only the outermost is timed
  std::atomic<const char*> op{""};  // the operation waited for
  std::atomic<std::size_t> count{0};
  std::atomic<DType> dtype{DType::f32};
  std::atomic<int> ranks{0};
  std::atomic<std::uint64_t> seq{0};  // blocking operations entered so far
  std::atomic<bool> polled{false};    // the waiting thread polls and reports itself
  // Where the library is (watch_context), formatted for a report only.
  std::atomic<std::int64_t> step{0};
  std::atomic<const char*> where{nullptr};  // null: no step yet
  std::atomic<std::size_t> bucket{SIZE_MAX};
  std::atomic<std::size_t> buckets{0};
  int world_rank = -1;
  std::once_flag started;
  std::vector<WatchChannel*> channels;  // the channels this process answers on
  std::vector<std::pair<const void*, std::function<void()>>> aborts;  // on_watchdog_exit
  // Answers in flight (sent with MPI_Request_free): kept until exit, a few
  // per process at most.
  std::deque<Report> sent_reports;
};

// Never destroyed: the monitor thread may look at it while the process
// exits.
State& state() {
  static State* s = new State;
  return *s;
}

// "step 12: the reduce-scatter of the gradients, bucket 3 of 8", or "(no
// step yet)": watch_context's record.
std::string context_text(const State& s) {
  const char* what = s.where.load(std::memory_order_acquire);
  if (what == nullptr) return "(no step yet)";
  std::string t = "step " + std::to_string(s.step.load(std::memory_order_relaxed)) + ": " + what;
  const std::size_t b = s.bucket.load(std::memory_order_relaxed);
  if (b != SIZE_MAX)
    t += ", bucket " + std::to_string(b + 1) + " of " +
         std::to_string(s.buckets.load(std::memory_order_relaxed));
  return t;
}

double timeout_seconds() noexcept {
  try {
    return settings().timeout;
  } catch (...) {
    return 0.0;  // a bad value is reported by the library's other calls
  }
}

// How long a timed-out rank waits for the answers: ranks inside the
// library answer within milliseconds.
double grace_seconds(double timeout) { return std::clamp(timeout / 10.0, 0.5, 2.0); }

void copy_text(char* to, std::size_t size, const char* from) {
  std::snprintf(to, size, "%s", from);
}

Report snapshot(State& s) {
  std::lock_guard<std::mutex> lock(s.m);
  Report r;
  r.count = s.count.load(std::memory_order_relaxed);
  r.dtype = static_cast<std::int32_t>(s.dtype.load(std::memory_order_relaxed));
  r.inside = s.depth.load(std::memory_order_relaxed) > 0 ? 1 : 0;
  copy_text(r.op, sizeof r.op, s.op.load(std::memory_order_relaxed));
  copy_text(r.context, sizeof r.context, context_text(s).c_str());
  return r;
}

// A report that stays valid until exit, for a send with MPI_Request_free.
Report* keep(State& s, const Report& r) {
  std::lock_guard<std::mutex> lock(s.m);
  s.sent_reports.push_back(r);
  return &s.sent_reports.back();
}

// Answers every question waiting on this process's channels. Errors are
// ignored: the answer is a courtesy to a rank that is about to end the job.
void serve_asks(State& s) {
  std::vector<WatchChannel*> channels;
  {
    std::lock_guard<std::mutex> lock(s.m);
    channels = s.channels;
  }
  for (WatchChannel* ch : channels) {
    for (;;) {
      int flag = 0;
      MPI_Status st;
      if (MPI_Iprobe(MPI_ANY_SOURCE, kAskTag, ch->comm(), &flag, &st) != MPI_SUCCESS || !flag)
        break;
      char ask = 0;
      if (MPI_Recv(&ask, 1, MPI_CHAR, st.MPI_SOURCE, kAskTag, ch->comm(), MPI_STATUS_IGNORE) !=
          MPI_SUCCESS)
        break;
      Report* out = keep(s, snapshot(s));
      MPI_Request req;
      if (MPI_Isend(out, sizeof *out, MPI_BYTE, st.MPI_SOURCE, kReportTag, ch->comm(), &req) ==
          MPI_SUCCESS)
        MPI_Request_free(&req);
    }
  }
}

// "allreduce of 10 f32", or the bare name of an operation without data.
std::string op_text(const char* op, std::size_t count, DType dtype) {
  if (count == 0) return op;
  return std::string(op) + " of " + std::to_string(count) + " " + dtype_name(dtype);
}

std::string describe(const Report& r) {
  return op_text(r.op, r.count, static_cast<DType>(r.dtype)) + ", at: " + r.context;
}

std::string peer_name(const WatchChannel& ch, int r) {
  const WatchChannel::Peer& p = ch.peers()[static_cast<std::size_t>(r)];
  std::string s = "rank " + std::to_string(r);
  if (p.world_rank != r) s += " (world rank " + std::to_string(p.world_rank) + ")";
  return s + " on " + p.host + " (pid " + std::to_string(p.pid) + ")";
}

// At most `limit` names, then how many more.
std::string name_list(const std::vector<std::string>& names, std::size_t limit = 8) {
  std::string s;
  for (std::size_t k = 0; k < names.size() && k < limit; ++k) s += (k ? "; " : "") + names[k];
  if (names.size() > limit) s += "; and " + std::to_string(names.size() - limit) + " more";
  return s;
}

// Asks every other rank of the channel where it is and sorts the answers:
// silent (not in the library), in another operation, waiting in this one.
std::string ask_peers(State& s, const WatchChannel& ch, double grace) {
  const int size = static_cast<int>(ch.peers().size());
  const Report mine = snapshot(s);
  for (int r = 0; r < size; ++r) {
    if (r == ch.rank()) continue;
    MPI_Request req;
    if (MPI_Isend(&kAsk, 1, MPI_CHAR, r, kAskTag, ch.comm(), &req) == MPI_SUCCESS)
      MPI_Request_free(&req);
  }
  std::vector<Report> got(static_cast<std::size_t>(size));
  std::vector<bool> answered(static_cast<std::size_t>(size), false);
  int missing = size - 1;
  // The whole grace period, even once every rank has answered: ranks whose
  // own timeout comes a moment later get their answers from this one.
  const auto until = Clock::now() + std::chrono::duration<double>(grace);
  while (Clock::now() < until) {
    serve_asks(s);
    int flag = 0;
    MPI_Status st;
    if (missing == 0 ||
        MPI_Iprobe(MPI_ANY_SOURCE, kReportTag, ch.comm(), &flag, &st) != MPI_SUCCESS || !flag) {
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
      continue;
    }
    Report r;
    if (MPI_Recv(&r, sizeof r, MPI_BYTE, st.MPI_SOURCE, kReportTag, ch.comm(), MPI_STATUS_IGNORE) !=
        MPI_SUCCESS)
      break;
    r.op[sizeof r.op - 1] = r.context[sizeof r.context - 1] = '\0';
    const auto q = static_cast<std::size_t>(st.MPI_SOURCE);
    if (!answered[q]) {
      answered[q] = true;
      got[q] = r;
      --missing;
    }
  }
  std::vector<std::string> silent, elsewhere, same, idle;
  for (int r = 0; r < size; ++r) {
    const auto q = static_cast<std::size_t>(r);
    if (r == ch.rank()) continue;
    if (!answered[q]) {
      silent.push_back(peer_name(ch, r));
    } else if (!got[q].inside) {
      idle.push_back(peer_name(ch, r));
    } else if (std::strcmp(got[q].op, mine.op) == 0 && got[q].count == mine.count &&
               got[q].dtype == mine.dtype && std::strcmp(got[q].context, mine.context) == 0) {
      same.push_back("rank " + std::to_string(r));
    } else {
      elsewhere.push_back(peer_name(ch, r) + ": " + describe(got[q]));
    }
  }
  char g[32];
  std::snprintf(g, sizeof g, "%.1f", grace);
  std::string out;
  if (!silent.empty()) {
    out += "\n  waiting for: " + name_list(silent) + ": no answer within " + g +
           " s, so not inside any shardopt operation that answers (computing, in I/O, in a "
           "blocking MPI call: the application's own, or one of shardopt's that MPI does "
           "faster blocking; stopped, or dead)";
  }
  if (!idle.empty()) {
    out += "\n  waiting for: " + name_list(idle) +
           ": between shardopt operations (in the application's code)";
  }
  if (!elsewhere.empty()) out += "\n  in another shardopt operation: " + name_list(elsewhere, 4);
  if (!same.empty()) out += "\n  waiting in the same operation: " + name_list(same, 16);
  return out;
}

// Sends this rank's answer to every other rank unasked, just before it
// ends the job: a rank whose own timeout comes later then finds it waiting
// instead of a silence. Waits up to 0.2 s for the sends to leave.
void announce(State& s, const WatchChannel& ch) {
  Report* mine = keep(s, snapshot(s));
  std::vector<MPI_Request> reqs;
  for (int r = 0; r < static_cast<int>(ch.peers().size()); ++r) {
    MPI_Request req;
    if (r != ch.rank() &&
        MPI_Isend(mine, sizeof *mine, MPI_BYTE, r, kReportTag, ch.comm(), &req) == MPI_SUCCESS)
      reqs.push_back(req);
  }
  const auto until = Clock::now() + std::chrono::milliseconds(200);
  int done = 0;
  while (!done && Clock::now() < until &&
         MPI_Testall(static_cast<int>(reqs.size()), reqs.data(), &done, MPI_STATUSES_IGNORE) ==
             MPI_SUCCESS) {
  }
}

[[noreturn]] void fire(State& s, const WatchChannel* channel, double timeout, double waited) {
  const std::string h = host_name();
  std::string findings;
  if (channel != nullptr && channel->peers().size() > 1) {
    findings = ask_peers(s, *channel, grace_seconds(timeout));
    announce(s, *channel);
  } else {
    findings =
        "\n  the other ranks could not be asked from inside this blocking call: the ranks "
        "that print this message are waiting, the others are the ones to look at";
  }
  std::lock_guard<std::mutex> lock(s.m);
  const std::string what = op_text(s.op.load(), s.count.load(), s.dtype.load());
  std::fprintf(stderr,
               "shardopt watchdog on rank %d (host %s, pid %ld) [SHARDOPT_ERR_TIMEOUT]: %s "
               "over %d rank(s) has not completed after %.1f s (SHARDOPT_TIMEOUT=%g); "
               "the library was at: %s; blocking operation #%llu of this rank.%s\n"
               "  fix: look at what the ranks named above were doing (py-spy/gdb -p, their "
               "logs); ranks in another shardopt operation issued different collectives (run "
               "with SHARDOPT_DESYNC_CHECK=1 to stop at the first one); raise SHARDOPT_TIMEOUT "
               "if a step can legitimately take longer\n"
               "  ending the job: exit status %d\n",
               s.world_rank, h.c_str(), static_cast<long>(getpid()), what.c_str(), s.ranks.load(),
               waited, timeout, context_text(s).c_str(),
               static_cast<unsigned long long>(s.seq.load()), findings.c_str(),
               SHARDOPT_WATCHDOG_EXIT_CODE);
  std::fflush(stderr);
  for (auto& [key, abort] : s.aborts) abort();
  std::_Exit(SHARDOPT_WATCHDOG_EXIT_CODE);
}

// The backstop: fires for a wait that is not polled, and for a polled one
// only well after its poll loop should have (it never returns to poll).
void monitor(double timeout) {
  State& s = state();
  const auto tick = std::chrono::duration<double>(std::min(0.1, timeout / 10.0));
  const double backstop = grace_seconds(timeout) + 3.0;
  // The operation seen at the last tick and since when (within a tick):
  // the scopes record no time of their own.
  std::uint64_t seen = 0;
  Clock::time_point since = Clock::now();
  for (;;) {
    std::this_thread::sleep_for(tick);
    const auto now = Clock::now();
    const std::uint64_t seq = s.seq.load(std::memory_order_acquire);
    if (s.depth.load(std::memory_order_acquire) == 0 || seq != seen) {
      seen = seq;
      since = now;
      continue;
    }
    const double waited = std::chrono::duration<double>(now - since).count();
    if (waited <= timeout + (s.polled.load(std::memory_order_relaxed) ? backstop : 0.0)) continue;
    fire(s, nullptr, timeout, waited);
  }
}

void start_monitor(State& s) {
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
  start_monitor(s);
  if (s.depth.fetch_add(1, std::memory_order_acq_rel) > 0) return;
  s.op.store(op, std::memory_order_relaxed);
  s.count.store(count, std::memory_order_relaxed);
  s.dtype.store(dtype, std::memory_order_relaxed);
  s.ranks.store(ranks, std::memory_order_relaxed);
  s.polled.store(false, std::memory_order_relaxed);
  s.seq.fetch_add(1, std::memory_order_release);
}

WatchScope::~WatchScope() {
  if (!armed_) return;
  state().depth.fetch_sub(1, std::memory_order_acq_rel);
}

WatchChannel::WatchChannel(MPI_Comm comm) {
  SHARDOPT_CHECK_MPI(MPI_Comm_dup(comm, &comm_), "SHARDOPT_TIMEOUT: duplicating the communicator");
  int size = 0, world = -1;
  SHARDOPT_CHECK_MPI(MPI_Comm_rank(comm_, &rank_), "SHARDOPT_TIMEOUT: querying the rank");
  SHARDOPT_CHECK_MPI(MPI_Comm_size(comm_, &size), "SHARDOPT_TIMEOUT: querying the size");
  MPI_Comm_rank(MPI_COMM_WORLD, &world);
  // Each rank's world rank, pid and host name, for the report.
  struct Card {
    std::int64_t world_rank, pid;
    char host[64];
  } mine{}, none{};
  mine.world_rank = world;
  mine.pid = static_cast<std::int64_t>(getpid());
  copy_text(mine.host, sizeof mine.host, host_name().c_str());
  std::vector<Card> all(static_cast<std::size_t>(size), none);
  SHARDOPT_CHECK_MPI(
      MPI_Allgather(&mine, sizeof mine, MPI_BYTE, all.data(), sizeof mine, MPI_BYTE, comm_),
      "SHARDOPT_TIMEOUT: exchanging host names");
  for (Card& c : all) {
    c.host[sizeof c.host - 1] = '\0';
    peers_.push_back({static_cast<int>(c.world_rank), static_cast<long>(c.pid), c.host});
  }
  State& s = state();
  std::lock_guard<std::mutex> lock(s.m);
  s.channels.push_back(this);
}

void WatchChannel::free() {
  {
    State& s = state();
    std::lock_guard<std::mutex> lock(s.m);
    s.channels.erase(std::remove(s.channels.begin(), s.channels.end(), this), s.channels.end());
  }
  if (comm_ == MPI_COMM_NULL) return;
  int fin = 0;
  MPI_Finalized(&fin);
  if (!fin) MPI_Comm_free(&comm_);
  comm_ = MPI_COMM_NULL;
}

WatchChannel::~WatchChannel() { free(); }

void watch_wait(const std::function<bool(std::chrono::microseconds)>& wait_for,
                const WatchChannel* channel) {
  State& s = state();
  const double timeout = timeout_seconds();
  // Timed from the first wait: the operation started a moment before.
  const Clock::time_point since = Clock::now();
  s.polled.store(true, std::memory_order_relaxed);
  // Between two waits for the operation, the questions of other ranks and
  // the clock: every 100 us at most, so that a poll costs one test.
  while (!wait_for(std::chrono::microseconds(100))) {
    serve_asks(s);
    const double waited = std::chrono::duration<double>(Clock::now() - since).count();
    if (waited > timeout) fire(s, channel, timeout, waited);
  }
}

void watch_poll(const std::function<bool()>& done, const WatchChannel* channel) {
  watch_wait([&](std::chrono::microseconds d) { return test_for(d, done); }, channel);
}

void on_watchdog_exit(const void* key, std::function<void()> abort) {
  State& s = state();
  std::lock_guard<std::mutex> lock(s.m);
  s.aborts.emplace_back(key, std::move(abort));
}

void forget_watchdog_exit(const void* key) noexcept {
  State& s = state();
  std::lock_guard<std::mutex> lock(s.m);
  std::erase_if(s.aborts, [key](const auto& a) { return a.first == key; });
}

void watch_context(std::int64_t step, const char* what, std::size_t bucket,
                   std::size_t buckets) noexcept {
  if (!watchdog_armed()) return;
  State& s = state();
  s.step.store(step, std::memory_order_relaxed);
  s.bucket.store(bucket, std::memory_order_relaxed);
  s.buckets.store(buckets, std::memory_order_relaxed);
  s.where.store(what, std::memory_order_release);
}

}  // namespace shardopt::detail
