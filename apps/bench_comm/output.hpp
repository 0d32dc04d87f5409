// shardopt-bench-comm: what rank 0 prints: the table, or JSON rows.
#pragma once

#include "bench.hpp"
#include "options.hpp"
#include "shardopt/shardopt.hpp"

namespace bench_comm {

struct Summary {
  double min_ratio = std::numeric_limits<double>::infinity();
  const Row* worst = nullptr;
  long long wrong = 0;
  // Host rows of at least kFloorGoalBytes: the lowest xfloor, its row, and
  // the lowest ratio to MPI among them.
  double min_floor = std::numeric_limits<double>::infinity();
  const Row* floor_worst = nullptr;
  double min_mpi_large = std::numeric_limits<double>::infinity();
};

void print_header(const Options& o, const shardopt::Communicator& comm, int iters_cap);
// A table line: a row's out-of-place and in-place variants (either may be null).
void print_line(const Options& o, const Row* out, const Row* in, int nranks);
void print_json(const Options& o, const Row& r, const shardopt::Communicator& comm);

}  // namespace bench_comm
