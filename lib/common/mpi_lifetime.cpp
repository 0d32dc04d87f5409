#include "common/mpi_lifetime.hpp"

#include <mpi.h>

#include <atomic>
#include <mutex>
#include <vector>

#include "common/check.hpp"
#include "common/log.hpp"

namespace shardopt::detail {

std::atomic<bool> g_finalize_watched{false};
std::atomic<bool> g_finalize_started{false};

namespace {

std::mutex g_mutex;
std::vector<std::function<void()>> g_callbacks;

int on_finalize(MPI_Comm, int, void*, void*) {
  // MPI still runs here: remember the rank, for what is logged or raised
  // after MPI_Finalize.
  world_rank();
  g_finalize_started.store(true);
  std::vector<std::function<void()>> callbacks;
  {
    std::lock_guard<std::mutex> lock(g_mutex);
    callbacks.swap(g_callbacks);
  }
  for (auto& fn : callbacks) {
    try {
      fn();
    } catch (const std::exception& e) {
      SHARDOPT_LOG(warn, "at MPI_Finalize: " << e.what());
    }
  }
  return MPI_SUCCESS;
}

}  // namespace

void at_mpi_finalize(std::function<void()> fn) {
  std::lock_guard<std::mutex> lock(g_mutex);
  if (!g_finalize_watched.load()) {
    int keyval = MPI_KEYVAL_INVALID;
    SHARDOPT_CHECK_MPI(
        MPI_Comm_create_keyval(MPI_COMM_NULL_COPY_FN, &on_finalize, &keyval, nullptr),
        "registering shardopt's MPI_Finalize hook");
    SHARDOPT_CHECK_MPI(MPI_Comm_set_attr(MPI_COMM_SELF, keyval, nullptr),
                       "registering shardopt's MPI_Finalize hook");
    g_finalize_watched.store(true);
  }
  if (fn) g_callbacks.push_back(std::move(fn));
}

bool ask_mpi_finalized() noexcept {
  int flag = 0;
  MPI_Finalized(&flag);
  return flag != 0;
}

}  // namespace shardopt::detail
