// A job whose device stalls on purpose, for tests/cli/test_watchdog.sh (on
// the simulated device): every rank takes 3 optimizer steps on device
// parameters with a loss scaler; then rank R's device stream is held (a
// host flag that nothing raises: a kernel that never ends), and every rank
// calls step(), which only enqueues, then steps(), which waits for the
// step's verdict: the other ranks' devices wait for R's in the step's
// collectives, so no rank's host gets its answer. R prints "stalled at
// <seconds since the epoch>". With SHARDOPT_TIMEOUT set every rank's
// watchdog ends the job; without it this hangs (by design).
//   fault_device_job stall R
#include <mpi.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <vector>

#include "device/device_runtime.hpp"
#include "shardopt/shardopt.hpp"
#include "simdevice/sim_device.hpp"

int main(int argc, char** argv) {
  int provided = 0;
  MPI_Init_thread(&argc, &argv, MPI_THREAD_MULTIPLE, &provided);
  const int odd = argc > 2 ? std::atoi(argv[2]) : 0;
  int rank = 0, status = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  shardopt::detail::DeviceRuntime& rt = shardopt::sim::runtime();
  const std::size_t n = 4096;
  void* w = rt.allocate(n * 4, "w");
  void* g = rt.allocate(n * 4, "g");
  std::vector<float> host(n, 0.5f);
  rt.copy(w, host.data(), n * 4, nullptr);
  std::fill(host.begin(), host.end(), 0.01f);
  rt.copy(g, host.data(), n * 4, nullptr);
  try {
    shardopt::Communicator comm(MPI_COMM_WORLD);
    shardopt::ZeroRedundancyOptimizer opt(comm, {{.name = "w", .data = w, .numel = n, .grad = g}},
                                          shardopt::Adam{.lr = 1e-3},
                                          {.stage = 2, .loss_scaler = shardopt::LossScaler{}});
    for (int s = 0; s < 3; ++s) opt.step();
    std::printf("rank %d: %lld steps\n", rank, static_cast<long long>(opt.steps()));
    if (rank == odd) {
      rt.wait_flag(nullptr, rt.allocate_flags(1), 1);
      const double now =
          std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch())
              .count();
      std::printf("stalled at %.3f\n", now);
    }
    std::fflush(stdout);
    opt.step();
    std::printf("rank %d: step 4 enqueued\n", rank);
    std::fflush(stdout);
    std::printf("rank %d: %lld steps\n", rank, static_cast<long long>(opt.steps()));
  } catch (const shardopt::Error& e) {
    std::fprintf(stderr, "fault_device_job: rank %d: %s\n", rank, e.what());
    status = 1;
  }
  MPI_Finalize();
  return status;
}
