// A job in which one rank stops taking part: for the watchdog test
// (tests/cli/test_watchdog.sh). Every rank takes 3 optimizer steps; then
// rank STALL_RANK prints "stalled at <seconds since the epoch>" and sleeps
// for 10 minutes, while the others call step() and wait for it in the
// step's first collective. With SHARDOPT_TIMEOUT set, the waiting ranks'
// watchdogs end the job; without it, this program hangs (by design).
// Usage: watchdog_stall STALL_RANK
#include <mpi.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <vector>

#include "shardopt/shardopt.hpp"

int main(int argc, char** argv) {
  MPI_Init(&argc, &argv);
  const int stall = argc > 1 ? std::atoi(argv[1]) : 0;
  int rank = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  {
    shardopt::Communicator comm(MPI_COMM_WORLD);
    std::vector<float> w(4096, 0.5f), g(4096, 0.01f);
    shardopt::ZeroRedundancyOptimizer opt(
        comm, {{.name = "w", .data = w.data(), .numel = w.size(), .grad = g.data()}},
        shardopt::Adam{.lr = 1e-3}, {.stage = 2});
    for (int s = 0; s < 3; ++s) opt.step();
    if (rank == stall) {
      const double now =
          std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch())
              .count();
      std::printf("stalled at %.3f\n", now);
      std::fflush(stdout);
      sleep(600);
    }
    opt.step();
  }
  MPI_Finalize();
  return 0;
}
