// shardopt-bench-step --device cuda: the ZeRO step on device buffers beside
// its limit (device.cpp).
#pragma once

#include <mpi.h>

#include "options.hpp"
#include "shardopt/shardopt.hpp"

namespace bench_step {

// The device rows of every stage, parameter count and dtype asked for, on
// `comm`'s transport of device buffers; `timing` for the barriers and the
// slowest rank. Returns the exit status: 1 when the ranks' parameters
// differ after the steps.
int run_device(const Options& o, shardopt::Communicator& comm, MPI_Comm timing);

}  // namespace bench_step
