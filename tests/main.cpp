// The Catch2 runner shared by shardopt's MPI test programs (compiled once
// into the test_main library).
//
// Every rank runs the whole Catch session. Rank 0 writes Catch's report to
// stdout; every other rank writes its output (Catch's report, the library's
// log, anything on stdout or stderr) to its own file,
//   <log dir>/<program>.np<N>.rank<R>.log,
// so the job's output stays readable. The log folder is
// SHARDOPT_TEST_LOG_DIR, or <cwd>/test-logs when it is unset or empty. At
// the end the ranks agree on the result: every rank exits with the same
// code, and rank 0 names the log files of the ranks that failed.
//
// Environment:
//   SHARDOPT_TEST_SEED     seed of the random test data (default 20240611);
//                          rank 0's value is used by every rank.
//   SHARDOPT_TEST_TIMEOUT  watchdog in seconds (default 240): a rank still
//                          running after that prints
//                          "test watchdog: rank R hung for N s" and exits with
//                          124, so a hang ends the job instead of stalling CI.
//   SHARDOPT_TEST_LOG_DIR  the folder of the other ranks' logs (default
//                          <cwd>/test-logs; created if missing, its parent
//                          must exist), read by each rank.
//   SHARDOPT_TEST_MAX_DEVICE_COMMS
//                          the most device communicators (NCCL's: an
//                          ncclCommInitRank each) a rank may make in the
//                          whole run; more fails it. Each rank that made
//                          any, or runs with it set, prints how many.
#define CATCH_CONFIG_RUNNER
#include <catch2/catch.hpp>
// catch.hpp first: it configures the runner.
#include <fcntl.h>
#include <mpi.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <csignal>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <memory>
#include <stdexcept>
#include <string>
#include <vector>

#include "comm/backend.hpp"
#include "mpi_test.hpp"
#include "shardopt/communicator.hpp"

namespace {

constexpr std::uint64_t kDefaultSeed = 20240611;
constexpr unsigned kDefaultWatchdogSeconds = 240;

int g_rank = 0;
int g_size = 1;
std::uint64_t g_seed = kDefaultSeed;
unsigned g_watchdog_seconds = kDefaultWatchdogSeconds;
// The job's stderr as it was before this rank's output was redirected, so the
// watchdog's message reaches the console (and CI's log) from every rank.
int g_console_fd = STDERR_FILENO;
std::unique_ptr<shardopt::Communicator> g_world;
std::unique_ptr<shardopt::Communicator> g_verdicts;

// ------------------------------------------------------------- watchdog

// Async-signal-safe: no allocation, no stdio.
void write_all(int fd, const char* text, std::size_t n) noexcept {
  while (n > 0) {
    const ssize_t w = ::write(fd, text, n);
    if (w < 0 && errno == EINTR) continue;
    if (w <= 0) return;
    text += w;
    n -= static_cast<std::size_t>(w);
  }
}

// Appends the decimal digits of `v` at `out`; returns the new end.
char* append_unsigned(char* out, unsigned long v) noexcept {
  char digits[24];
  int n = 0;
  do {
    digits[n++] = static_cast<char>('0' + v % 10);
    v /= 10;
  } while (v != 0);
  while (n > 0) *out++ = digits[--n];
  return out;
}

char* append_text(char* out, const char* text) noexcept {
  while (*text != '\0') *out++ = *text++;
  return out;
}

extern "C" void on_watchdog(int) {
  char line[128];
  char* p = append_text(line, "test watchdog: rank ");
  p = append_unsigned(p, static_cast<unsigned long>(g_rank));
  p = append_text(p, " hung for ");
  p = append_unsigned(p, g_watchdog_seconds);
  p = append_text(p, " s\n");
  write_all(g_console_fd, line, static_cast<std::size_t>(p - line));
  if (g_console_fd != STDERR_FILENO)
    write_all(STDERR_FILENO, line, static_cast<std::size_t>(p - line));
  _exit(124);
}

void start_watchdog() {
  struct sigaction sa;
  std::memset(&sa, 0, sizeof sa);
  sa.sa_handler = on_watchdog;
  sigemptyset(&sa.sa_mask);
  sigaction(SIGALRM, &sa, nullptr);
  alarm(g_watchdog_seconds);
}

// ------------------------------------------------------------ settings

// A positive decimal integer, or false.
bool parse_positive(const char* text, unsigned long long& value) {
  if (text == nullptr || *text == '\0') return false;
  for (const char* c = text; *c != '\0'; ++c)
    if (*c < '0' || *c > '9') return false;
  errno = 0;
  value = std::strtoull(text, nullptr, 10);
  return errno == 0;
}

// Reads the test settings on rank 0 and shares them, so that every rank uses
// the same seed. Returns false (on every rank) if a variable is malformed.
bool read_settings() {
  unsigned long long values[3] = {1, kDefaultSeed, kDefaultWatchdogSeconds};  // ok, seed, watchdog
  if (g_rank == 0) {
    unsigned long long v = 0;
    if (const char* s = std::getenv("SHARDOPT_TEST_SEED"); s != nullptr && *s != '\0') {
      if (parse_positive(s, v)) {
        values[1] = v;
      } else {
        std::fprintf(stderr, "SHARDOPT_TEST_SEED=\"%s\" is not a non-negative integer\n", s);
        values[0] = 0;
      }
    }
    if (const char* s = std::getenv("SHARDOPT_TEST_TIMEOUT"); s != nullptr && *s != '\0') {
      if (parse_positive(s, v) && v > 0 && v < 100000) {
        values[2] = v;
      } else {
        std::fprintf(stderr, "SHARDOPT_TEST_TIMEOUT=\"%s\" is not a number of seconds (1-99999)\n",
                     s);
        values[0] = 0;
      }
    }
  }
  MPI_Bcast(values, 3, MPI_UNSIGNED_LONG_LONG, 0, MPI_COMM_WORLD);
  g_seed = values[1];
  g_watchdog_seconds = static_cast<unsigned>(values[2]);
  return values[0] != 0;
}

// --------------------------------------------------------- per-rank logs

std::string program_name(const char* argv0) {
  std::string name = argv0 != nullptr ? argv0 : "test";
  const auto slash = name.find_last_of('/');
  return slash == std::string::npos ? name : name.substr(slash + 1);
}

std::string current_dir() {
  std::vector<char> buf(4096);
  if (::getcwd(buf.data(), buf.size()) == nullptr) return ".";
  return buf.data();
}

// SHARDOPT_TEST_LOG_DIR, or <cwd>/test-logs.
std::string log_dir() {
  if (const char* dir = std::getenv("SHARDOPT_TEST_LOG_DIR"); dir != nullptr && *dir != '\0')
    return dir;
  return current_dir() + "/test-logs";
}

std::string log_path(const std::string& program, int rank) {
  return log_dir() + "/" + program + ".np" + std::to_string(g_size) + ".rank" +
         std::to_string(rank) + ".log";
}

// Sends this rank's stdout and stderr to its log file. Returns false (and
// leaves the output alone) if the file cannot be opened.
bool redirect_output(const std::string& path) {
  const std::string dir = log_dir();
  if (::mkdir(dir.c_str(), 0755) != 0 && errno != EEXIST) {
    std::fprintf(stderr, "rank %d: cannot create %s: %s\n", g_rank, dir.c_str(),
                 std::strerror(errno));
    return false;
  }
  const int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) {
    std::fprintf(stderr, "rank %d: cannot open %s: %s\n", g_rank, path.c_str(),
                 std::strerror(errno));
    return false;
  }
  std::fflush(stdout);
  std::fflush(stderr);
  g_console_fd = ::dup(STDERR_FILENO);
  if (g_console_fd < 0) g_console_fd = STDERR_FILENO;
  ::dup2(fd, STDOUT_FILENO);
  ::dup2(fd, STDERR_FILENO);
  ::close(fd);
  // Line-buffered, so that a rank ended by the watchdog leaves a complete log.
  std::setvbuf(stdout, nullptr, _IOLBF, 0);
  return true;
}

}  // namespace

namespace shardopt::test {

int world_rank() noexcept { return g_rank; }
int world_size() noexcept { return g_size; }
std::uint64_t test_seed() noexcept { return g_seed; }

Communicator& world() {
  if (!g_world) {
    throw std::logic_error("shardopt::test::world() used before MPI_Init or after MPI_Finalize");
  }
  return *g_world;
}

Communicator& verdicts() {
  if (!g_verdicts) {
    throw std::logic_error("shardopt::test::verdicts() used before MPI_Init or after MPI_Finalize");
  }
  return *g_verdicts;
}

}  // namespace shardopt::test

int main(int argc, char** argv) {
  // MPI_THREAD_FUNNELED, as most applications; SHARDOPT_TEST_MPI_THREADS=multiple
  // for the programs that need more (the staged backend's progress thread).
  const char* threads = std::getenv("SHARDOPT_TEST_MPI_THREADS");
  const int level = threads != nullptr && std::string(threads) == "multiple" ? MPI_THREAD_MULTIPLE
                                                                             : MPI_THREAD_FUNNELED;
  int provided = MPI_THREAD_SINGLE;
  if (MPI_Init_thread(&argc, &argv, level, &provided) != MPI_SUCCESS) {
    std::fprintf(stderr, "MPI_Init_thread failed\n");
    return 1;
  }
  MPI_Comm_rank(MPI_COMM_WORLD, &g_rank);
  MPI_Comm_size(MPI_COMM_WORLD, &g_size);

  const std::string program = program_name(argc > 0 ? argv[0] : nullptr);
  bool ok = read_settings();
  start_watchdog();
  if (g_rank != 0 && !redirect_output(log_path(program, g_rank))) ok = false;

  if (g_rank == 0) {
    const std::string others = g_size > 1 ? ", other ranks log to " + log_dir() + "/" : "";
    std::printf(
        "%s: %d rank%s, seed %llu (SHARDOPT_TEST_SEED), watchdog %u s "
        "(SHARDOPT_TEST_TIMEOUT)%s\n",
        program.c_str(), g_size, g_size == 1 ? "" : "s", static_cast<unsigned long long>(g_seed),
        g_watchdog_seconds, others.c_str());
    std::fflush(stdout);
  } else {
    std::printf("%s: rank %d of %d, seed %llu\n", program.c_str(), g_rank, g_size,
                static_cast<unsigned long long>(g_seed));
  }
  if (provided < MPI_THREAD_FUNNELED) {
    std::fprintf(stderr, "MPI provides thread level %d, less than MPI_THREAD_FUNNELED\n", provided);
    ok = false;
  }

  // The world communicator (and the verdicts' one) is created on every
  // rank, or on none.
  try {
    if (ok) {
      g_world = std::make_unique<shardopt::Communicator>(MPI_COMM_WORLD);
      // Host buffers only: a transport of device buffers that never stands
      // in the way of one a test forces (NCCL and MPI never side by side).
      g_verdicts = std::make_unique<shardopt::Communicator>(
          MPI_COMM_WORLD, shardopt::CommOptions{.device_comm = shardopt::DeviceComm::staged});
    }
  } catch (const std::exception& e) {
    std::fprintf(stderr, "creating the world communicator failed: %s\n", e.what());
    ok = false;
  }

  int failed = 0;
  int all_ok = 0;
  const int local_ok = ok ? 1 : 0;
  MPI_Allreduce(&local_ok, &all_ok, 1, MPI_INT, MPI_LAND, MPI_COMM_WORLD);
  if (!all_ok) {
    failed = 1;
  } else {
    Catch::Session session;
    const int rc = session.applyCommandLine(argc, argv);
    if (rc != 0) {
      failed = rc;
    } else {
      // Catch returns the number of tests listed for --list-*: not a failure.
      const Catch::ConfigData& cfg = session.configData();
      const bool listing =
          cfg.listTests || cfg.listTestNamesOnly || cfg.listTags || cfg.listReporters;
      try {
        failed = session.run();
        if (listing) failed = 0;
      } catch (const std::exception& e) {
        std::fprintf(stderr, "rank %d: the test session failed: %s\n", g_rank, e.what());
        failed = 1;
      }
    }
  }
  // Each device communicator is an ncclCommInitRank on a GPU: only the
  // communicators that move device buffers make one, so a run makes few.
  const int made = shardopt::detail::device_collectives_made();
  if (made > 0 || std::getenv("SHARDOPT_TEST_MAX_DEVICE_COMMS") != nullptr) {
    std::printf("rank %d: %d device communicator%s made (an ncclCommInitRank each on a GPU)\n",
                g_rank, made, made == 1 ? "" : "s");
    if (const char* s = std::getenv("SHARDOPT_TEST_MAX_DEVICE_COMMS"); s != nullptr && *s != '\0') {
      const long most = std::strtol(s, nullptr, 10);
      if (made > most) {
        std::printf(
            "rank %d: FAILED: more than SHARDOPT_TEST_MAX_DEVICE_COMMS=%ld device "
            "communicators\n",
            g_rank, most);
        failed = 1;
      }
    }
  }
  std::fflush(stdout);
  std::fflush(stderr);

  // Every rank learns which ranks failed, and returns the same code.
  std::vector<int> per_rank(static_cast<std::size_t>(g_size), 0);
  const int mine = failed != 0 ? 1 : 0;
  MPI_Allgather(&mine, 1, MPI_INT, per_rank.data(), 1, MPI_INT, MPI_COMM_WORLD);
  int any_failed = 0;
  for (int f : per_rank) any_failed |= f;
  if (g_rank == 0 && any_failed) {
    std::printf("\n%s failed with %d ranks; the output of each failed rank:\n", program.c_str(),
                g_size);
    for (int r = 0; r < g_size; ++r) {
      if (!per_rank[static_cast<std::size_t>(r)]) continue;
      if (r == 0) {
        std::printf("  rank 0: the report above\n");
      } else {
        std::printf("  rank %d: %s\n", r, log_path(program, r).c_str());
      }
    }
    std::fflush(stdout);
  }

  g_verdicts.reset();
  g_world.reset();
  MPI_Finalize();
  alarm(0);
  return any_failed ? 1 : 0;
}
