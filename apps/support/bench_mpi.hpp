// shardopt apps: what the MPI benchmarks (shardopt-bench-comm,
// shardopt-bench-step) share: the start of main() (ranks, options, --help),
// the communicators of their raw MPI references and of their timing, the
// MPI types of those references, the end of a run that failed on some ranks
// only, and table lines without trailing blanks.
#pragma once

#include <mpi.h>

#include <cstdarg>
#include <cstdio>
#include <exception>
#include <optional>
#include <string>

#include "cli.hpp"
#include "shardopt/error.hpp"
#include "shardopt/types.hpp"

namespace bench_mpi {

// This rank and the number of ranks of MPI_COMM_WORLD.
struct World {
  int rank = 0;
  int ranks = 1;
};

inline World world() {
  World w;
  MPI_Comm_rank(MPI_COMM_WORLD, &w.rank);
  MPI_Comm_size(MPI_COMM_WORLD, &w.ranks);
  return w;
}

// Parses the command line (every rank parses the same argv) into `o`.
// Returns the exit status when the program stops here: 2 after a bad
// command line (rank 0 says why), 0 after --help (rank 0 prints `help`).
template <class Options, class Parse>
std::optional<int> parse_or_stop(const char* program, int rank, Options& o, Parse&& parse,
                                 const std::string& help) {
  try {
    o = parse();
  } catch (const cli::UsageError& e) {
    cli::print_usage_error(program, rank, e);
    return 2;
  }
  if (o.help) {
    if (rank == 0) std::fputs(help.c_str(), stdout);
    return 0;
  }
  return std::nullopt;
}

// The raw MPI references get a duplicate of MPI_COMM_WORLD of their own, as
// shardopt does. Barriers and reductions of the results run on a third one:
// a collective that follows a barrier on the same communicator measured up
// to 1% faster, which would favour whichever side shared the barrier's.
struct Comms {
  MPI_Comm raw = MPI_COMM_NULL;
  MPI_Comm timing = MPI_COMM_NULL;

  static Comms duplicate() {
    Comms c;
    MPI_Comm_dup(MPI_COMM_WORLD, &c.raw);
    MPI_Comm_dup(MPI_COMM_WORLD, &c.timing);
    return c;
  }
  // Collective; not a destructor: a run that failed on some ranks aborts
  // instead.
  void free() {
    MPI_Comm_free(&timing);
    MPI_Comm_free(&raw);
  }
};

// How a failure that ends the job is printed.
enum class Hint { omitted, shown };

// Runs fn, which returns the exit status. From the first collective on, a
// failure may strike some ranks only, in the middle of a collective the
// others wait in: print it and abort the job rather than hang.
template <class Fn>
int run_or_abort(const char* program, int rank, Hint hint, Fn&& fn) {
  try {
    return fn();
  } catch (const std::exception& e) {
    std::string what = e.what();
    const auto* error = dynamic_cast<const shardopt::Error*>(&e);
    if (hint == Hint::shown && error != nullptr) what += " (hint: " + error->hint() + ")";
    cli::print_error(program, rank, what);
    MPI_Abort(MPI_COMM_WORLD, 1);
    return 1;
  }
}

// The MPI type of a raw reference over elements of t. bf16 and f16 have
// none: their bits as 16-bit integers, a timing reference only.
inline MPI_Datatype raw_mpi_type(shardopt::DType t) {
  const bool floating = shardopt::is_floating(t);
  switch (shardopt::dtype_size(t)) {
    case 2:
      return MPI_UINT16_T;
    case 4:
      return floating ? MPI_FLOAT : MPI_INT32_T;
    default:
      return floating ? MPI_DOUBLE : MPI_INT64_T;
  }
}

// The MPI reduction of a raw reference; MPI has no average: avg is MPI_SUM.
inline MPI_Op raw_mpi_op(shardopt::ReduceOp op) {
  if (op == shardopt::ReduceOp::max) return MPI_MAX;
  if (op == shardopt::ReduceOp::min) return MPI_MIN;
  return MPI_SUM;
}

// One line of a table, built from printf-style pieces and printed to stdout
// without trailing blanks (or a trailing newline of a piece).
class TableLine {
 public:
  __attribute__((format(printf, 2, 3))) void add(const char* format, ...) {
    char piece[512];
    std::va_list args;
    va_start(args, format);
    std::vsnprintf(piece, sizeof piece, format, args);
    va_end(args);
    text_ += piece;
  }
  void print() {
    text_.erase(text_.find_last_not_of(" \n") + 1);
    std::printf("%s\n", text_.c_str());
  }

 private:
  std::string text_;
};

}  // namespace bench_mpi
