// The Communicator's choice of transport for device buffers (NCCL's own
// collectives, a CUDA-aware MPI, or staging through pinned host memory):
// the ranks agree on what each can use, then every rank takes the same
// one; and the count of live device transports that keeps NCCL and a
// CUDA-aware MPI from running side by side.
#include <mpi.h>

#include <algorithm>
#include <atomic>
#include <cstdio>
#include <string>
#include <utility>
#include <vector>

#include "comm/backend.hpp"
#include "common/check.hpp"
#include "common/log.hpp"
#include "device/device_runtime.hpp"
#include "shardopt/communicator.hpp"
#include "shardopt/config.hpp"

namespace shardopt {

namespace detail {
namespace {

// Collective over comm: "ranks a and b use the same device (identity)"
// for two ranks whose device identities (DeviceRuntime::device_identity,
// "" for none) are equal, the same pair on every rank, or "" when no two
// are.
std::string shared_device(MPI_Comm comm, const std::string& identity) {
  constexpr std::size_t kLen = 128;
  int size = 0;
  SHARDOPT_CHECK_MPI(MPI_Comm_size(comm, &size), "Communicator: querying the size");
  char mine[kLen] = {};
  std::snprintf(mine, kLen, "%s", identity.c_str());
  std::vector<char> all(kLen * static_cast<std::size_t>(size));
  SHARDOPT_CHECK_MPI(MPI_Allgather(mine, kLen, MPI_CHAR, all.data(), kLen, MPI_CHAR, comm),
                     "Communicator: comparing the ranks' devices");
  std::vector<std::pair<std::string, int>> named;  // (identity, rank), sorted
  for (int r = 0; r < size; ++r) {
    std::string id(all.data() + std::size_t(r) * kLen);
    if (!id.empty()) named.emplace_back(std::move(id), r);
  }
  std::sort(named.begin(), named.end());
  for (std::size_t k = 1; k < named.size(); ++k)
    if (named[k].first == named[k - 1].first)
      return "ranks " + std::to_string(named[k - 1].second) + " and " +
             std::to_string(named[k].second) + " use the same device (" + named[k].first + ")";
  return "";
}

std::atomic<int> g_live_transports[2];

}  // namespace

int live_device_transports(DeviceTransport t) noexcept {
  return g_live_transports[static_cast<int>(t)].load();
}
TransportClaim::TransportClaim(DeviceTransport t) noexcept : t_(t) {
  g_live_transports[static_cast<int>(t_)].fetch_add(1);
}
void TransportClaim::release() noexcept {
  if (held_) g_live_transports[static_cast<int>(t_)].fetch_sub(1);
  held_ = false;
}

}  // namespace detail

// Device buffers: the ranks agree on what each can use, then take the same
// transport, each making the duplicates it needs on every rank alike (a
// rank without a device takes part in them).
void Communicator::choose_device_backend(MPI_Comm comm, DeviceComm choice) {
  using detail::DeviceTransport;
  detail::DeviceRuntime* rt = detail::device_runtime();
  // Each fact true on some rank (the maximum over the ranks).
  enum { kSomeDevice, kNoDevice, kNoNative, kMpiNotAware, kLiveNccl, kLiveMpi, kFacts };
  int facts[kFacts] = {};
  facts[kSomeDevice] = rt != nullptr;
  facts[kNoDevice] = rt == nullptr;
  facts[kNoNative] = rt == nullptr || !rt->has_collectives();
  facts[kMpiNotAware] = !detail::mpi_takes_device_buffers();
  facts[kLiveNccl] = detail::live_device_transports(DeviceTransport::nccl) > 0;
  facts[kLiveMpi] = detail::live_device_transports(DeviceTransport::mpi) > 0;
  const int mine[kFacts] = {facts[0], facts[1], facts[2], facts[3], facts[4], facts[5]};
  SHARDOPT_CHECK_MPI(
      MPI_Allreduce(MPI_IN_PLACE, facts, kFacts, MPI_INT, MPI_MAX, backend_->mpi_comm()),
      "Communicator: agreeing on the transport of device buffers");
  // Collectives of one device per rank (NCCL) refuse ranks that share one:
  // two ranks that do, if any (the same two on every rank).
  std::string shared;
  if (!facts[kNoNative])
    shared = detail::shared_device(backend_->mpi_comm(), rt->device_identity());
  const bool native_ok = !facts[kNoNative] && shared.empty() && !facts[kLiveMpi];
  const bool mpi_ok = !facts[kNoDevice] && !facts[kMpiNotAware] && !facts[kLiveNccl];
  constexpr const char* kDeadlock =
      ", and NCCL and a CUDA-aware MPI must not run collectives on one device side by side "
      "(NCCL documents a deadlock)";
  auto refuse = [&](const char* asked, const std::string& why, const char* fix) {
    backend_->free();
    SHARDOPT_THROW(unsupported,
                   std::string("Communicator: device_comm = ") + asked +
                       " (CommOptions::device_comm or SHARDOPT_DEVICE_COMM) cannot be used: " + why,
                   fix);
  };
  if (choice == DeviceComm::nccl && !native_ok) {
    const std::string why =
        !shared.empty()       ? shared + ", and NCCL takes one device per rank"
        : !facts[kSomeDevice] ? "no rank has a device"
        : rt == nullptr       ? "this rank has no device"
        : !rt->has_collectives()
            ? std::string("this shardopt build has no NCCL collectives for the ") + rt->name()
        : facts[kNoNative] ? "some rank has no device or no NCCL"
        : mine[kLiveMpi]   ? std::string(
                                 "another Communicator of this process moves device "
                                   "buffers over a CUDA-aware MPI") +
                               kDeadlock
                         : std::string(
                               "another Communicator of some rank moves device buffers "
                               "over a CUDA-aware MPI") +
                               kDeadlock;
    refuse("nccl", why,
           "give every rank a device and a shardopt built with NCCL, use one device_comm for "
           "every Communicator of the job, or choose staged (any MPI) or auto");
  }
  if (choice == DeviceComm::mpi && !mpi_ok) {
    const std::string why =
        !facts[kSomeDevice] ? "no rank has a device"
        : mine[kNoDevice]   ? "this rank has no device"
        : facts[kNoDevice]  ? "some rank has no device"
        : mine[kMpiNotAware]
            ? "this rank's MPI is not known to take device buffers (it says it is not "
              "CUDA-aware, cannot say, or SHARDOPT_CUDA_AWARE_MPI=no)"
        : facts[kMpiNotAware] ? "some rank's MPI is not known to take device buffers"
        : mine[kLiveNccl]     ? std::string(
                                    "another Communicator of this process moves device "
                                        "buffers over NCCL") +
                                kDeadlock
                          : std::string(
                                "another Communicator of some rank moves device buffers "
                                "over NCCL") +
                                kDeadlock;
    refuse("mpi", why,
           "run with a CUDA-aware MPI on every rank (SHARDOPT_CUDA_AWARE_MPI=yes for one that "
           "cannot say so), use one device_comm for every Communicator of the job, or choose "
           "staged (any MPI) or auto");
  }
  if (!facts[kSomeDevice]) return;
  const bool nccl = choice == DeviceComm::nccl || (choice == DeviceComm::automatic && native_ok);
  const bool mpi =
      !nccl && (choice == DeviceComm::mpi || (choice == DeviceComm::automatic && mpi_ok));
  if (nccl) {
    backend_ = detail::make_native_backend(std::move(backend_), rt);
  } else {
    backend_ = detail::make_staged_backend(std::move(backend_), comm, rt, mpi);
  }
  if (backend_->rank() == 0) {
    const char* why = choice != DeviceComm::automatic ? "asked for"
                      : nccl            ? "auto: every rank has a device with its own collectives"
                      : mpi             ? "auto: every rank's MPI takes device buffers"
                      : !shared.empty() ? "auto: two ranks share a device, and MPI is not "
                                          "known to take device buffers"
                                        : "auto: no NCCL on every rank, and MPI is not known "
                                          "to take device buffers";
    SHARDOPT_LOG(info, "Communicator of " << backend_->size() << " ranks: device buffers over "
                                          << backend_->device_name() << " (" << why << ")");
  }
}

}  // namespace shardopt
