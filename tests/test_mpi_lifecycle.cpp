// shardopt before MPI_Init, with an Environment, and after MPI_Finalize.
// Runs as its own program (the state of MPI is what it tests), under mpirun
// at 1, 2 and 3 ranks; prints one line per check and "N passed, M failed".
// The library's log goes to a file of its own (SHARDOPT_DEBUG_FILE), read
// back to check the warning about objects that outlived MPI_Finalize.
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <optional>
#include <string>
#include <vector>

#include "shardopt/shardopt.hpp"

namespace {

int g_passed = 0;
int g_failed = 0;

void check(bool ok, const char* what) {
  (ok ? g_passed : g_failed)++;
  std::printf("%s: %s\n", ok ? "ok" : "FAILED", what);
}

// Runs f, expects a shardopt::Error with `code` whose message contains `text`.
template <class F>
bool throws(F f, shardopt::ErrorCode code, const std::string& text) {
  try {
    f();
  } catch (const shardopt::Error& e) {
    const bool ok = e.code() == code && std::string(e.what()).find(text) != std::string::npos &&
                    !e.hint().empty();
    if (!ok) std::printf("  unexpected error: %s\n", e.what());
    return ok;
  } catch (...) {
    return false;
  }
  return false;
}

// The lines of `path` that contain `text`.
std::vector<std::string> lines_with(const std::filesystem::path& path, const std::string& text) {
  std::vector<std::string> found;
  std::ifstream in(path);
  for (std::string line; std::getline(in, line);)
    if (line.find(text) != std::string::npos) found.push_back(line);
  return found;
}

}  // namespace

int main(int argc, char** argv) {
  using shardopt::ErrorCode;
  // Before anything reads the settings.
  const std::filesystem::path log = std::filesystem::temp_directory_path() /
                                    ("shardopt-lifecycle-" + std::to_string(::getpid()) + ".log");
  std::filesystem::remove(log);
  ::setenv("SHARDOPT_DEBUG_FILE", log.c_str(), 1);

  check(!shardopt::mpi_is_initialized(), "MPI starts uninitialized");
  check(throws([] { shardopt::Communicator c(MPI_COMM_WORLD); }, ErrorCode::mpi_not_initialized,
               "MPI_Init"),
        "a Communicator before MPI_Init is a clear error");
  check(!shardopt::build_info().version.empty(), "build_info works before MPI_Init");

  std::optional<shardopt::Environment> env;
  env.emplace(&argc, &argv);
  check(env->owns_mpi(), "the Environment initialized MPI");
  check(static_cast<int>(env->provided()) >= static_cast<int>(shardopt::ThreadLevel::funneled),
        "MPI provides at least MPI_THREAD_FUNNELED");
  {
    shardopt::Environment inner;
    check(!inner.owns_mpi(), "a second Environment does not own MPI");
  }
  check(shardopt::mpi_is_initialized() && !shardopt::mpi_is_finalized(),
        "MPI still running after the inner Environment ended");

  std::optional<shardopt::Communicator> comm;
  comm.emplace(MPI_COMM_WORLD);
  double x = comm->rank() + 1, sum = 0;
  comm->allreduce(&x, &sum, 1, shardopt::DType::f64, shardopt::ReduceOp::sum);
  const int n = comm->size();
  const int rank = comm->rank();
  check(sum == n * (n + 1) / 2.0, "allreduce inside the Environment");

  // An optimizer whose communicator the application frees under it: a clear
  // error on every rank at the next step, not a crash or a hang.
  std::vector<float> w(100, 1.0f), g(100, 0.5f);
  const std::vector<shardopt::Param> params = {
      {.name = "w", .data = w.data(), .numel = w.size(), .grad = g.data()}};
  {
    shardopt::Communicator own(MPI_COMM_WORLD);
    shardopt::ZeroRedundancyOptimizer opt(own, params, shardopt::SGD{.lr = 0.1}, {.stage = 2});
    opt.step();
    own.free();
    const std::string freed = "the communicator this optimizer was built on has been freed";
    check(throws([&] { opt.step(); }, ErrorCode::invalid_state, "step(): " + freed),
          "step() over a freed communicator is a clear error");
    check(throws([&] { opt.check_sync(); }, ErrorCode::invalid_state, "check_sync(): " + freed),
          "check_sync() over a freed communicator is a clear error");
    check(throws([&] { opt.save("never-written.safetensors"); }, ErrorCode::invalid_state,
                 "save(): " + freed),
          "save() over a freed communicator is a clear error");
  }
  // An optimizer still alive when MPI is finalized.
  std::optional<shardopt::ZeroRedundancyOptimizer> late;
  late.emplace(*comm, params, shardopt::Adam{.lr = 0.1}, shardopt::ZeroOptions{.stage = 1});
  late->step();

  env.reset();  // MPI_Finalize
  check(shardopt::mpi_is_finalized(), "the Environment finalized MPI");
  check(throws([&] { comm->allreduce(&x, &sum, 1, shardopt::DType::f64, shardopt::ReduceOp::sum); },
               ErrorCode::mpi_finalized, "after MPI_Finalize"),
        "an operation after MPI_Finalize is a clear error");
  check(throws([] { shardopt::Communicator c(MPI_COMM_WORLD); }, ErrorCode::mpi_finalized,
               "after MPI_Finalize"),
        "a Communicator after MPI_Finalize is a clear error");
  check(throws([] { shardopt::Environment again; }, ErrorCode::mpi_finalized, "MPI_Finalize"),
        "an Environment after MPI_Finalize is a clear error");
  // The optimizer's calls name themselves, not the collective inside them.
  check(throws([&] { late->step(); }, ErrorCode::mpi_finalized,
               "ZeroRedundancyOptimizer::step() called after MPI_Finalize"),
        "an optimizer step after MPI_Finalize is a clear error naming step()");
  check(throws([&] { late->check_sync(); }, ErrorCode::mpi_finalized,
               "ZeroRedundancyOptimizer::check_sync() called after MPI_Finalize"),
        "check_sync() after MPI_Finalize is a clear error naming check_sync()");
  check(throws([&] { late->save("never-written.safetensors"); }, ErrorCode::mpi_finalized,
               "ZeroRedundancyOptimizer::save() called after MPI_Finalize"),
        "save() after MPI_Finalize is a clear error naming save()");
  late.reset();  // must not call MPI, must not throw
  check(true, "an optimizer destroyed after MPI_Finalize does not crash");
  comm.reset();  // must not call MPI, must not throw
  check(true, "a Communicator destroyed after MPI_Finalize does not crash");

  // Two Communicators outlived MPI_Finalize (comm, and the one `late` kept
  // for itself): one warning, logged with this process's rank.
  const std::vector<std::string> warned = lines_with(log, "outlived MPI_Finalize");
  check(warned.size() == 1, "one warning for the objects that outlived MPI_Finalize");
  const std::string tag = " [" + std::to_string(rank) + "] SHARDOPT WARN ";
  check(warned.size() == 1 && warned[0].find(tag) != std::string::npos,
        "the warning names this process's rank");
  for (const std::string& line : warned) std::printf("  logged: %s\n", line.c_str());
  std::filesystem::remove(log);

  std::printf("lifecycle: %d passed, %d failed\n", g_passed, g_failed);
  return g_failed == 0 ? 0 : 1;
}
