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
//   fault_job bcast R    the same stall, the others waiting in a blocking
//                        broadcast of 1 MiB from rank R, which auto's
//                        transport hands to MPI's own blocking MPI_Bcast
//                        at 2 and 3 ranks: the watchdog's backstop ends
//                        the job.
//   fault_job die R      after 3 steps rank R prints "died at <seconds since
//                        the epoch>" and ends at once (_exit(9), no
//                        MPI_Finalize) while the others call step() and wait
//                        for it in the step's first collective.
//   fault_job desync R   after 3 steps rank R calls an allreduce on the
//                        optimizer's communicator while the others call an
//                        allgather: with SHARDOPT_DESYNC_CHECK=1 every rank
//                        prints the DesyncError and exits with status 1.
//   fault_job owned      (tests/cli/test_shm.sh) stage 2 with gradients the
//                        optimizer owns, 5 steps of Adam on gradients that
//                        differ by rank; rank 0 prints "node_shared <bytes>"
//                        (memory_report: the fused update's shared
//                        gradients, 0 without it) and "params <FNV-1a hash
//                        of the parameters' bytes>".
//   fault_job user [nodump|protect]  the same on the user's gradient
//                        buffers; with nodump every rank first makes its
//                        process not dumpable (prctl), as hardened programs
//                        do, so that without CAP_SYS_PTRACE no other process
//                        may read its memory; with protect rank 1, before its
//                        last step, makes the pages of its gradients that
//                        rank 0 reads inaccessible (mprotect): rank 0's read
//                        fails in the middle of the step.
//   fault_job stream     the same job (the same gradients) with stream_grads:
//                        four parameters of 75000 elements without
//                        gradient buffers, their gradients passed to
//                        grad_ready(i, grad) from the last to the first, in
//                        256 KiB buckets (five); rank 0 prints node_shared
//                        (the two bucket buffers of every rank in shared
//                        memory, 0 without them) and params (the four in
//                        order).
#include <mpi.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <unistd.h>

#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string_view>
#include <vector>

#include "shardopt/shardopt.hpp"

namespace {

// The gradient of element i at step s on `rank` in the "owned", "user" and
// "stream" jobs.
float job_grad(int rank, int s, std::size_t i) {
  return 0.01f * static_cast<float>((rank + 1) * (s + 1)) - 1e-7f * static_cast<float>(i % 1000);
}

// The "owned", "user" and "stream" jobs (above).
void run_owned(shardopt::Communicator& comm, int rank, bool user, bool protect, bool stream) {
  // 300000 elements: 1.2 MB of gradients per rank, the user's in pages of
  // their own.
  std::vector<float> w(300000, 0.5f);
  const std::size_t size = w.size() * sizeof(float);
  void* mine = user
                   ? mmap(nullptr, size, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0)
                   : nullptr;
  constexpr std::size_t kPart = 75000;
  std::vector<shardopt::Param> params;
  if (stream) {
    for (const char* name : {"w0", "w1", "w2", "w3"})
      params.push_back({.name = name, .data = w.data() + params.size() * kPart, .numel = kPart});
  } else {
    params.push_back({.name = "w", .data = w.data(), .numel = w.size(), .grad = mine});
  }
  shardopt::ZeroRedundancyOptimizer opt(
      comm, params, shardopt::Adam{.lr = 1e-3},
      {.stage = 2, .bucket_mb = stream ? 0.25 : 0.0, .stream_grads = stream});
  std::vector<float> scratch(stream ? kPart : 0);
  for (int s = 0; s < 5; ++s) {
    if (stream) {
      for (std::size_t k = 4; k-- > 0;) {
        for (std::size_t i = 0; i < kPart; ++i) scratch[i] = job_grad(rank, s, k * kPart + i);
        opt.grad_ready(k, scratch.data());
      }
    } else {
      auto* g = static_cast<float*>(opt.grad(0));
      for (std::size_t i = 0; i < w.size(); ++i) g[i] = job_grad(rank, s, i);
    }
    // Rank 0's slice of rank 1's gradients: the first third, whole pages.
    if (protect && rank == 1 && s == 4) mprotect(mine, size / 3 / 4096 * 4096, PROT_NONE);
    opt.step();
  }
  std::uint64_t h = 1469598103934665603ULL;
  const auto* bytes = reinterpret_cast<const unsigned char*>(w.data());
  for (std::size_t k = 0; k < w.size() * sizeof(float); ++k) h = (h ^ bytes[k]) * 1099511628211ULL;
  if (rank == 0)
    std::printf("node_shared %zu\nparams %016llx\n", opt.memory_report().node_shared,
                static_cast<unsigned long long>(h));
}

// The other jobs (above), by mode: stall, apart, die, desync or bcast.
void run_fault(shardopt::Communicator& comm, int rank, int odd, std::string_view mode) {
  const bool die = mode == "die";
  std::vector<float> w(4096, 0.5f), g(4096, 0.01f);
  shardopt::ZeroRedundancyOptimizer opt(
      comm, {{.name = "w", .data = w.data(), .numel = w.size(), .grad = g.data()}},
      shardopt::Adam{.lr = 1e-3}, {.stage = 2});
  for (int s = 0; s < 3; ++s) opt.step();
  if (mode == "desync") {
    std::vector<double> x(3 * static_cast<std::size_t>(comm.size()), 1.0);
    if (rank == odd)
      comm.allreduce(x.data(), x.data(), 3, shardopt::DType::f64, shardopt::ReduceOp::sum);
    else
      comm.allgather(x.data() + 3 * rank, x.data(), 3, shardopt::DType::f64);
  } else if (mode == "apart" && rank == odd) {
    comm.barrier();
  } else if (rank == odd) {
    const double now =
        std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
    std::printf("%s at %.3f\n", die ? "died" : "stalled", now);
    std::fflush(stdout);
    if (die) _exit(9);
    sleep(600);
  }
  if (mode == "bcast") {
    std::vector<float> b(262144, static_cast<float>(rank));
    comm.broadcast(b.data(), b.size(), shardopt::DType::f32, odd);
    return;
  }
  opt.step();
}

}  // namespace

int main(int argc, char** argv) {
  MPI_Init(&argc, &argv);
  const std::string_view mode = argc > 1 ? argv[1] : "";
  const bool die = mode == "die";
  const bool owned = mode == "owned";
  const bool user = mode == "user";
  const bool stream = mode == "stream";
  if (user && argc > 2 && std::strcmp(argv[2], "nodump") == 0) prctl(PR_SET_DUMPABLE, 0);
  const bool protect = user && argc > 2 && std::strcmp(argv[2], "protect") == 0;
  const int odd = argc > 2 ? std::atoi(argv[2]) : 0;
  int rank = 0, status = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  try {
    shardopt::Communicator comm(MPI_COMM_WORLD);
    if (owned || user || stream) {
      run_owned(comm, rank, user, protect, stream);
    } else {
      run_fault(comm, rank, odd, mode);
    }
  } catch (const shardopt::Error& e) {
    std::fprintf(stderr, "fault_job: rank %d: %s\n", rank, e.what());
    status = 1;
    if (die) {
      // A rank of the job is dead: Open MPI's MPI_Finalize waits in a fence
      // for every rank, the dead one too, and now and then never returns
      // (tests/repro/finalize_after_death.c shows it without shardopt). A
      // program that lost a rank ends without it.
      std::fflush(stderr);
      std::_Exit(status);
    }
  }
  MPI_Finalize();
  return status;
}
