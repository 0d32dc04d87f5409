#include "shardopt/environment.hpp"

#include <mpi.h>

#include <string>

#include "common/check.hpp"
#include "common/log.hpp"

namespace shardopt {

namespace {

int to_mpi(ThreadLevel l) {
  switch (l) {
    case ThreadLevel::single:
      return MPI_THREAD_SINGLE;
    case ThreadLevel::funneled:
      return MPI_THREAD_FUNNELED;
    case ThreadLevel::serialized:
      return MPI_THREAD_SERIALIZED;
    case ThreadLevel::multiple:
      return MPI_THREAD_MULTIPLE;
  }
  return MPI_THREAD_SINGLE;
}

ThreadLevel from_mpi(int l) {
  if (l == MPI_THREAD_MULTIPLE) return ThreadLevel::multiple;
  if (l == MPI_THREAD_SERIALIZED) return ThreadLevel::serialized;
  if (l == MPI_THREAD_FUNNELED) return ThreadLevel::funneled;
  return ThreadLevel::single;
}

}  // namespace

const char* thread_level_name(ThreadLevel level) noexcept {
  switch (level) {
    case ThreadLevel::single:
      return "MPI_THREAD_SINGLE";
    case ThreadLevel::funneled:
      return "MPI_THREAD_FUNNELED";
    case ThreadLevel::serialized:
      return "MPI_THREAD_SERIALIZED";
    case ThreadLevel::multiple:
      return "MPI_THREAD_MULTIPLE";
  }
  return "invalid";
}

bool mpi_is_initialized() noexcept {
  int flag = 0;
  MPI_Initialized(&flag);
  return flag != 0;
}

bool mpi_is_finalized() noexcept {
  int flag = 0;
  MPI_Finalized(&flag);
  return flag != 0;
}

Environment::Environment(int* argc, char*** argv, ThreadLevel level) {
  if (static_cast<int>(level) < 0 || static_cast<int>(level) > 3) {
    SHARDOPT_THROW(
        invalid_argument,
        "Environment: invalid ThreadLevel value " + std::to_string(static_cast<int>(level)),
        "pass one of ThreadLevel::single, funneled, serialized, multiple");
  }
  if (mpi_is_finalized()) {
    SHARDOPT_THROW(mpi_finalized,
                   "shardopt::Environment created after MPI_Finalize: MPI cannot be initialized "
                   "a second time in one process",
                   "create the Environment once, at the top of main(), and keep it alive until "
                   "the end of the program");
  }
  int provided = MPI_THREAD_SINGLE;
  if (!mpi_is_initialized()) {
    SHARDOPT_CHECK_MPI(MPI_Init_thread(argc, argv, to_mpi(level), &provided),
                       "shardopt::Environment initializing MPI");
    owns_ = true;
  } else {
    SHARDOPT_CHECK_MPI(MPI_Query_thread(&provided), "shardopt::Environment");
  }
  provided_ = from_mpi(provided);
  if (static_cast<int>(provided_) < static_cast<int>(level)) {
    const std::string msg = std::string("MPI provides ") + thread_level_name(provided_) + " but " +
                            thread_level_name(level) + " was asked for";
    if (owns_) {
      MPI_Finalize();
      owns_ = false;
    }
    SHARDOPT_THROW(mpi_not_initialized, msg,
                   "use an MPI library built with thread support (Open MPI and MPICH are by "
                   "default), or initialize MPI yourself with MPI_Init_thread at that level");
  }
  SHARDOPT_LOG(info, "Environment: " << (owns_ ? "initialized" : "found") << " MPI with "
                                     << thread_level_name(provided_));
}

Environment::~Environment() {
  if (!owns_) return;
  if (mpi_is_finalized()) {
    SHARDOPT_LOG(warn,
                 "Environment: MPI was finalized by someone else before the Environment "
                 "ended; nothing left to do");
    return;
  }
  MPI_Finalize();
}

}  // namespace shardopt
