// shardopt internal: the node access (lib/comm/node_access.hpp) of the
// shared-memory transport with every rank on one node.
#pragma once

#include <mpi.h>

#include <memory>

#include "comm/node_access.hpp"
#include "comm/shm/shm_channel.hpp"

namespace shardopt::detail {

// comm: the transport's communicator (every rank on this node, in rank
// order); channel: its node channel, whose single-copy operations then
// read shared parts in place. Both outlive nothing: the parts keep the
// channel.
std::unique_ptr<NodeAccess> make_shm_access(MPI_Comm comm, std::shared_ptr<NodeChannel> channel);

}  // namespace shardopt::detail
