// shardopt-train: a small data-parallel training job on the ZeRO engine.
//
// A multi-layer perceptron (matmuls through OpenBLAS) learns, with an MSE
// loss, to reproduce a fixed random "teacher" network on random inputs. The
// teacher and the student's initial weights are drawn from the seed, the
// same on every rank; each rank draws its own samples (from the seed and its
// rank), so the global batch is split across the ranks. Each layer's weight
// and bias is one shardopt::Param in the trainer's own buffers; the backward
// pass hands each gradient to the optimizer as soon as it is complete
// (grad_ready, last layer first), so that stage 2 reduces while the rest of
// the backward pass runs, and step() updates and gathers the parameters.
//
//   mpirun -n 2 shardopt-train                          # adamw, stage 2, f32
//   mpirun -n 4 shardopt-train -o lamb -s 1 -p bf16 --clip 1.0 --json
//
// Rank 0 prints the configuration, the memory per rank beside the ZeRO
// formula, a line every --log-every steps and a summary; docs/train.md
// describes the options, the output and the --save-params file. With
// --checkpoint the optimizer saves checkpoints (save()), which --resume
// loads (load()) at any rank count; --export writes the parameters
// (export_params()). Uses only the public API of shardopt, MPI, OpenBLAS
// and the standard library.
//
// This file holds main(); options.cpp the command line (the optimizer's
// options: optimizer_options.cpp); model.cpp the model and the data;
// run.cpp the training from start to summary; output.cpp what it prints;
// files.cpp the --save-params file.
#include <cblas.h>
#include <mpi.h>

#include <cstdio>
#include <cstdlib>
#include <exception>
#include <string>

#include "../support/cli.hpp"
#include "files.hpp"
#include "options.hpp"
#include "output.hpp"
#include "run.hpp"
#include "shardopt/shardopt.hpp"

namespace train {
namespace {

// True on every rank if `ok` is true on every rank: the checks before the
// library is set up (its settings may be what failed) run on raw MPI.
bool all_ok(bool ok) {
  int v = ok ? 1 : 0;
  MPI_Allreduce(MPI_IN_PLACE, &v, 1, MPI_INT, MPI_MIN, MPI_COMM_WORLD);
  return v == 1;
}

// --device cuda: this rank's device, the one of its local rank among its
// node's devices (srun --gpus-per-task=1 shows each rank one); "" or why
// there is none.
std::string choose_device() {
  // Asked first: a program with the simulated device (shardopt-train-sim)
  // has a device in any build.
  const int devices = shardopt::device_count();
  if (devices == 0 && !shardopt::build_info().cuda)
    return "--device cuda: this shardopt was built without CUDA; rebuild it with "
           "-Dcuda=enabled on a machine with the CUDA toolkit, or train on the host "
           "(--device host)";
  if (devices == 0)
    return "--device cuda: this process sees no CUDA device; run it on a GPU node (srun "
           "--gpus-per-task=1, or mpirun with CUDA_VISIBLE_DEVICES set), or train on the host "
           "(--device host)";
  MPI_Comm node = MPI_COMM_NULL;
  MPI_Comm_split_type(MPI_COMM_WORLD, MPI_COMM_TYPE_SHARED, 0, MPI_INFO_NULL, &node);
  int local = 0;
  MPI_Comm_rank(node, &local);
  MPI_Comm_free(&node);
  shardopt::set_device(local % devices);
  return {};
}

// Everything that needs MPI; run_with_mpi's Environment outlives it.
int train_main(int argc, char** argv) {
  int rank = 0;
  int ranks = 1;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &ranks);

  Options opt;
  try {
    opt = parse_options(argc, argv);
  } catch (const cli::UsageError& e) {
    // Every rank parses the same argv: every rank stops here, rank 0 says why.
    cli::print_usage_error(kProgram, rank, e);
    return 2;
  }
  if (opt.help) {
    if (rank == 0) std::printf("%s\n%s", kUsage, optimizer_usage().c_str());
    return 0;
  }

  // Local checks that can fail on some ranks only: agree before going on,
  // so that every rank stops.
  std::string local_error;
  try {
    (void)shardopt::settings();
    if (rank == 0 && !opt.save_params.empty()) local_error = check_writable(opt.save_params);
    if (rank == 0 && local_error.empty() && !opt.checkpoint.empty()) {
      local_error = check_directory("--checkpoint", opt.checkpoint);
    }
    if (rank == 0 && local_error.empty() && !opt.export_path.empty()) {
      local_error = check_directory("--export", opt.export_path);
    }
    if (local_error.empty() && opt.device) local_error = choose_device();
  } catch (const std::exception& e) {
    local_error = cli::error_text(e);
  }
  if (!all_ok(local_error.empty())) {
    cli::print_once(kProgram, MPI_COMM_WORLD, rank, local_error);
    return 1;
  }

  // An existing --checkpoint file is a finished or interrupted run's: a run
  // that starts afresh does not replace it unless told to. Rank 0 looks (a
  // checkpoint directory may be mounted on its node only); every rank stops.
  std::string refusal;
  if (rank == 0 && !opt.checkpoint.empty() && opt.resume.empty() && !opt.overwrite)
    refusal = overwrite_refusal(opt.checkpoint);
  if (!all_ok(refusal.empty())) {
    if (rank == 0) cli::print_error(kProgram, rank, refusal);
    return 2;
  }

  // The ranks are the parallelism: one BLAS thread each, unless the user
  // asks for more.
  if (std::getenv("OPENBLAS_NUM_THREADS") == nullptr) openblas_set_num_threads(1);

  int status = 1;
  cli::ErrorExit error_exit;
  try {
    // The trainer's own reductions and checks run beside the library's.
    shardopt::Communicator stats(MPI_COMM_WORLD);
    shardopt::Communicator comm(MPI_COMM_WORLD);
    const bool live = rank == 0 && !opt.json &&
                      (opt.progress == Progress::on ||
                       (opt.progress == Progress::automatic && output_is_terminal()));
    status = run({opt, comm, stats, rank, ranks, rank == 0, live});
    comm.free();
    stats.free();
  } catch (const std::exception& e) {
    // Every rank failed alike: end with status 1. A failure on some ranks
    // only, possibly in the middle of a collective the others wait in: stop
    // the job rather than hang.
    status = error_exit.end(kProgram, rank, cli::error_text(e), 1);
  }
  return status;
}

}  // namespace
}  // namespace train

int main(int argc, char** argv) {
  return cli::run_with_mpi(train::kProgram, argc, argv, train::train_main,
                           cli::thread_level_for(argc, argv));
}
