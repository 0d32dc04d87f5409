// shardopt-bench-step: one whole ZeRO optimizer step on host memory beside
// its limit, measured in the same run on the same sizes.
//
// For each stage, parameter count and model dtype it builds a model of
// several parameters of varied sizes (the blocks of an MLP: a few large
// weights, small biases and norms) in one contiguous parameter buffer and one
// contiguous gradient buffer, registers them with a ZeroRedundancyOptimizer,
// and times the step as a training loop would run it: grad_ready(i) for each
// parameter in reverse (backward) order, then step(). In the same iterations,
// in an order drawn at random, it times what the step cannot avoid: the raw
// MPI collectives of the stage on buffers of the same total size (whole, and
// again cut into buckets as the engine cuts them), and the functional
// optimizer alone on a buffer the size of the shard. The table prints the
// phases of the step, the limit, their ratio, and the memory per rank beside
// the ZeRO formula plus the buckets.
//
//   mpirun -n 2 shardopt-bench-step                       # 1M,4M,25M, stages 0-2
//   mpirun -n 2 shardopt-bench-step -p 100M -d bf16 --json
//
// Uses only the public API of shardopt, MPI, OpenMP and the standard library.
//
// options.cpp: the command line; bench.cpp: the model and the timing of a
// row; output.cpp: what it prints.
#include <mpi.h>

#include <cstdio>
#include <string>
#include <vector>

#include "../support/bench_mpi.hpp"
#include "../support/cli.hpp"
#include "../support/machine.hpp"
#include "bench.hpp"
#include "device.hpp"
#include "options.hpp"
#include "output.hpp"
#include "shardopt/shardopt.hpp"
#include "units.hpp"

namespace bench_step {
namespace {

using cli::human_count;

int bench_main(int argc, char** argv) {
  const bench_mpi::World world = bench_mpi::world();
  const int rank = world.rank, nranks = world.ranks;
  Options opt;
  const auto stop = bench_mpi::parse_or_stop(
      kProgram, rank, opt, [&] { return parse_options(argc, argv); }, usage());
  if (stop) return *stop;

  // Ranks sharing this node's memory, and what it has free.
  MPI_Comm node = MPI_COMM_NULL;
  MPI_Comm_split_type(MPI_COMM_WORLD, MPI_COMM_TYPE_SHARED, rank, MPI_INFO_NULL, &node);
  int local_ranks = 1;
  MPI_Comm_size(node, &local_ranks);
  double available = static_cast<double>(machine::mem_available_bytes());
  MPI_Allreduce(MPI_IN_PLACE, &available, 1, MPI_DOUBLE, MPI_MIN, MPI_COMM_WORLD);

  return bench_mpi::run_or_abort(kProgram, rank, bench_mpi::Hint::shown, [&] {
    shardopt::Communicator comm(MPI_COMM_WORLD);
    bench_mpi::Comms comms = bench_mpi::Comms::duplicate();
    if (opt.device) {
      const int status = run_device(opt, comm, comms.timing);
      comms.free();
      MPI_Comm_free(&node);
      comm.free();
      return status;
    }
    // -s 3: its own table (units.hpp), after the other stages'.
    Options rest = opt;
    const bool units = rest.stages.back() == 3;
    if (units) rest.stages.pop_back();
    Bench bench(rest, comm, comms.raw, comms.timing, node);
    const bool printer = rank == 0;
    if (printer && !rest.stages.empty()) print_header(rest, bench, nranks, local_ranks);

    std::vector<Row> rows;
    bool any_differ = false;
    for (std::size_t psi : rest.stages.empty() ? std::vector<std::size_t>{} : opt.params) {
      const double need = bench.bytes_needed(psi) * local_ranks;
      if (available > 0 && need > 0.9 * available) {
        if (printer) {
          std::fprintf(opt.json ? stderr : stdout,
                       "# skipping %s params: %d ranks here need about %.1f GiB, %.1f GiB "
                       "available\n",
                       human_count(psi).c_str(), local_ranks, need / (1 << 30),
                       available / (1 << 30));
        }
        continue;
      }
      bench.allocate(psi);
      for (DType t : opt.dtypes) {
        for (int stage : rest.stages) {
          // Stage 2: a row for each -g; the others register their buffers.
          const std::vector<Options::Grads> modes =
              stage == 2 ? opt.grads : std::vector<Options::Grads>{Options::Grads::user};
          for (Options::Grads g : modes) {
            bench.fill(t);
            bool differ = false;
            const Row r = bench.run(stage, t, g, differ);
            if (printer) print_row(opt, r, bench.bucket_mb());
            if (differ) {
              any_differ = true;
              if (printer) {
                std::fprintf(stderr,
                             "%s: stage %d, %s params, %s, %s gradients: the ranks' parameters "
                             "differ after the steps\n",
                             kProgram, stage, human_count(psi).c_str(), shardopt::dtype_name(t),
                             grads_name(g));
              }
            }
            rows.push_back(r);
          }
        }
      }
    }
    if (printer && !rest.stages.empty()) print_goals(rest, rows);
    if (units && run_units(opt, comm, comms.raw, comms.timing) != 0) any_differ = true;
    comms.free();
    MPI_Comm_free(&node);
    comm.free();
    return any_differ ? 1 : 0;
  });
}

}  // namespace
}  // namespace bench_step

int main(int argc, char** argv) {
  return cli::run_with_mpi(bench_step::kProgram, argc, argv, bench_step::bench_main,
                           cli::thread_level_for(argc, argv));
}
