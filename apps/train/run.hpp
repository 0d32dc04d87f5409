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
  shardopt::Communicator& stats;  // the trainer's own reductions (losses, times) and checks
  int rank;
  int ranks;
  bool printer;
  bool live;  // a progress line redrawn in place
};

// Runs the training on every rank; returns the exit status.
int run(const RunContext& c);

}  // namespace train
