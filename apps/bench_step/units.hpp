// shardopt-bench-step -s 3: stage 3's step, a unit at a time, beside its
// limit and beside stage 2 in the same iterations (units.cpp).
#pragma once

#include <mpi.h>

#include "options.hpp"
#include "shardopt/communicator.hpp"

namespace bench_step {

// The goals of -s 3: the step within this factor of its limit, and where a
// unit's compute takes at least its gather's time, the gather time the step
// waits for at most this fraction of the gathers' time.
inline constexpr double kUnitsGoalRatio = 1.2;
inline constexpr double kExposedGoal = 0.2;

// Every row of -p and -d at stages 2 and 3; prints the table (rank 0) and
// returns the exit status (1 when the ranks' parameters differ).
int run_units(const Options& o, shardopt::Communicator& comm, MPI_Comm raw, MPI_Comm timing);

}  // namespace bench_step
