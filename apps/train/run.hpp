// shardopt-train: a run: what every rank knows of it (RunContext), and
// run(), the training from the model's construction to the summary.
#pragma once

#include <mpi.h>

#include "options.hpp"
#include "shardopt/shardopt.hpp"

namespace train {

inline constexpr const char* kProgram = "shardopt-train";

struct RunContext {
  const Options& o;
  shardopt::Communicator& comm;
  MPI_Comm stats;  // the trainer's own reductions (losses, times)
  int rank;
  int ranks;
  bool printer;
  bool live;  // a progress line redrawn in place
};

// True on every rank if `ok` is true on every rank.
bool all_ok(bool ok, MPI_Comm comm);

// Runs the training on every rank; returns the exit status.
int run(const RunContext& c);

}  // namespace train
