// shardopt internal: the choice of the transport of host buffers.
#pragma once

#include <cstddef>
#include <memory>

#include "comm/backend.hpp"
#include "shardopt/communicator.hpp"
#include "shardopt/config.hpp"

namespace shardopt::detail {

// Collective over mpi's communicator. Returns `mpi` itself, or a backend of
// shared memory that wraps it (lib/comm/shm/shm_backend.cpp), as `choice`
// and the node layout decide (HostComm). slot_bytes: each rank's slot in
// the node's shared memory (SHARDOPT_SHM_CHUNK_KB); single_copy_bytes: the
// smallest block moved in a single copy (SHARDOPT_SHM_SINGLE_COPY_KB,
// SIZE_MAX: none). Throws ConfigError on every rank for a choice that
// cannot be used or that differs between ranks.
std::unique_ptr<Backend> make_host_backend(std::unique_ptr<Backend> mpi, const NodeLayout& nodes,
                                           HostComm choice, std::size_t slot_bytes,
                                           std::size_t single_copy_bytes);

}  // namespace shardopt::detail
