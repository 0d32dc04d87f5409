// shardopt internal: a capability of the Communicator for a fused
// reduce-scatter, which reads every rank's data where it is instead of
// moving it. A transport whose ranks all share one node's memory (the
// shared-memory transport, lib/comm/shm/, with every rank on one node)
// offers it; the others do not, and their users reduce through the
// collectives. It gives:
//   - memory that every rank maps, one part per rank;
//   - the communicator's collectives reading buffers in that memory where
//     they are, rather than through copies;
//   - the other ranks' private memory, read by the kernel in one copy.
// The reduction itself is kernels/reduce.hpp's, the one the transport's
// reduce-scatter runs, so that a fused result is bitwise the collective's.
// The ZeRO engine's fused step (lib/zero/reduction.cpp) is its user: with
// the Communicator and the agreement (comm/agree.hpp), the one part of
// lib/comm/ the engine sees.
#pragma once

#include <sys/uio.h>

#include <cstddef>
#include <memory>
#include <string>
#include <vector>

#include "shardopt/communicator.hpp"

namespace shardopt::detail {

// Memory every rank of a communicator maps: rank q's part, part_bytes()
// long, at part(q) in every process. The memory lives as long as some
// rank's object does.
class SharedParts {
 public:
  virtual ~SharedParts() = default;
  virtual std::byte* part(int q) const noexcept = 0;
  virtual std::size_t part_bytes() const noexcept = 0;
};

// The other ranks' private memory.
class PeerReader {
 public:
  virtual ~PeerReader() = default;
  // Copies rank q's range remote[k] into local[k], for every k; false, with
  // errno set, if a byte could not be read (q ended, or unmapped the
  // range). Threads may read at once, each with lists of its own.
  virtual bool read(int q, std::vector<iovec>& local, std::vector<iovec>& remote) const = 0;
};

class NodeAccess {
 public:
  virtual ~NodeAccess() = default;
  // Collective: part_bytes of memory per rank that every rank maps, each
  // rank's part first touched by itself (zeroed). in_place: the
  // communicator's collectives read buffers inside it where they are, not
  // through copies, for as long as the parts live. Null where the node
  // cannot give the memory (a full /dev/shm), with the same outcome on
  // every rank and `error` saying why in words a user can act on.
  virtual std::unique_ptr<SharedParts> share(std::size_t part_bytes, bool in_place,
                                             std::string& error) = 0;
  // Collective: a reader of every other rank's memory, tried by reading
  // `bytes` at every other rank's `probe` (bytes 0: not tried). Null on
  // every rank where any rank cannot read another's (a seccomp filter,
  // Yama's ptrace_scope, a process that is not dumpable), with `error`
  // naming the first such rank and why, on every rank.
  virtual std::unique_ptr<PeerReader> peer_reader(const void* probe, std::size_t bytes,
                                                  std::string& error) = 0;
};

// comm's node access: its transport's, where it has every rank on one node
// sharing memory; else null. Local. Throws StateError for a freed
// communicator.
NodeAccess* node_access(Communicator& comm);

}  // namespace shardopt::detail
