#include "common/mpi_lifetime.hpp"

#include <mpi.h>

#include <atomic>
#include <mutex>
#include <vector>

#include "common/check.hpp"
#include "common/log.hpp"

namespace shardopt::detail {

namespace {

std::mutex g_mutex;
std::vector<std::function<void()>> g_callbacks;
std::atomic<bool> g_watching{false};
std::atomic<bool> g_finalizing{false};

int on_finalize(MPI_Comm, int, void*, void*) {
  g_finalizing.store(true);
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
  if (!g_watching.load()) {
    int keyval = MPI_KEYVAL_INVALID;
    SHARDOPT_CHECK_MPI(
        MPI_Comm_create_keyval(MPI_COMM_NULL_COPY_FN, &on_finalize, &keyval, nullptr),
        "registering shardopt's MPI_Finalize hook");
    SHARDOPT_CHECK_MPI(MPI_Comm_set_attr(MPI_COMM_SELF, keyval, nullptr),
                       "registering shardopt's MPI_Finalize hook");
    g_watching.store(true);
  }
  if (fn) g_callbacks.push_back(std::move(fn));
}

bool mpi_finalize_started() noexcept {
  if (g_watching.load(std::memory_order_relaxed)) {
    return g_finalizing.load(std::memory_order_relaxed);
  }
  int flag = 0;
  MPI_Finalized(&flag);
  return flag != 0;
}

}  // namespace shardopt::detail
