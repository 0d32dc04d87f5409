// Jobs that go wrong on purpose, for tests/cli/test_watchdog.sh.
//   fault_job stall R    every rank takes 3 optimizer steps; then rank R
//                        prints "stalled at <seconds since the epoch>" and
//                        sleeps for 10 minutes while the others call step()
//                        and wait for it in the step's first collective. With
//                        SHARDOPT_TIMEOUT set the waiting ranks' watchdogs end
//                        the job; without it this hangs (by design).
//   fault_job apart R    after 3 steps rank R calls a barrier on the
//                        optimizer's communicator while the others call
//                        step(): every rank waits in a shardopt operation,
//                        each in its own (a hang by design, which the
//                        watchdog reports as operations that differ).
//   fault_job die R      after 3 steps rank R prints "died at <seconds since
//                        the epoch>" and ends at once (_exit(9), no
//                        MPI_Finalize) while the others call step() and wait
//                        for it in the step's first collective.
//   fault_job desync R   after 3 steps rank R calls an allreduce on the
//                        optimizer's communicator while the others call an
//                        allgather: with SHARDOPT_DESYNC_CHECK=1 every rank
//                        prints the DesyncError and exits with status 1.
#include <mpi.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <vector>

#include "shardopt/shardopt.hpp"

int main(int argc, char** argv) {
  MPI_Init(&argc, &argv);
  const bool desync = argc > 1 && std::strcmp(argv[1], "desync") == 0;
  const bool apart = argc > 1 && std::strcmp(argv[1], "apart") == 0;
  const bool die = argc > 1 && std::strcmp(argv[1], "die") == 0;
  const int odd = argc > 2 ? std::atoi(argv[2]) : 0;
  int rank = 0, status = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  try {
    shardopt::Communicator comm(MPI_COMM_WORLD);
    std::vector<float> w(4096, 0.5f), g(4096, 0.01f);
    shardopt::ZeroRedundancyOptimizer opt(
        comm, {{.name = "w", .data = w.data(), .numel = w.size(), .grad = g.data()}},
        shardopt::Adam{.lr = 1e-3}, {.stage = 2});
    for (int s = 0; s < 3; ++s) opt.step();
    if (desync) {
      std::vector<double> x(3 * static_cast<std::size_t>(comm.size()), 1.0);
      if (rank == odd)
        comm.allreduce(x.data(), x.data(), 3, shardopt::DType::f64, shardopt::ReduceOp::sum);
      else
        comm.allgather(x.data() + 3 * rank, x.data(), 3, shardopt::DType::f64);
    } else if (apart && rank == odd) {
      comm.barrier();
    } else if (rank == odd) {
      const double now =
          std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch())
              .count();
      std::printf("%s at %.3f\n", die ? "died" : "stalled", now);
      std::fflush(stdout);
      if (die) _exit(9);
      sleep(600);
    }
    opt.step();
  } catch (const shardopt::Error& e) {
    std::fprintf(stderr, "fault_job: rank %d: %s\n", rank, e.what());
    status = 1;
  }
  MPI_Finalize();
  return status;
}
