// What the device suites (test_device_*.cpp, on the simulated device or,
// through simdevice/real_device.cpp, on a GPU) share.
#pragma once

#include <mpi.h>

#include <cstddef>
#include <cstdio>
#include <set>
#include <string>
#include <vector>

#include "mpi_test.hpp"
#include "simdevice/sim_device.hpp"

namespace shardopt::test {

// Whether two ranks of the job work on one device, as the Communicator
// tells (the devices' names): the device's own collectives, which take one
// device per rank as NCCL's do, then refuse them, and auto takes another
// transport. Collective over MPI_COMM_WORLD.
inline bool ranks_share_a_device() {
  constexpr int kLen = 128;
  char mine[kLen] = {};
  std::snprintf(mine, kLen, "%s", sim::runtime().device_identity().c_str());
  std::vector<char> all(std::size_t(kLen) * std::size_t(world_size()));
  MPI_Allgather(mine, kLen, MPI_CHAR, all.data(), kLen, MPI_CHAR, MPI_COMM_WORLD);
  std::set<std::string> seen;
  for (int r = 0; r < world_size(); ++r) {
    const std::string id(all.data() + std::size_t(r) * kLen);
    if (!id.empty() && !seen.insert(id).second) return true;
  }
  return false;
}

}  // namespace shardopt::test
