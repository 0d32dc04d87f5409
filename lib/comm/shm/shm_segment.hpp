// shardopt internal: memory every rank of a node maps. POSIX shared memory
// (shm_open under /dev/shm): the node's first rank creates the segment
// under a fresh random name (O_EXCL: never one left by another job),
// reserves its pages (posix_fallocate, so a full /dev/shm is an error now,
// not a SIGBUS later), the others map it, and the name is removed as soon as
// every rank has it mapped. The memory then lives exactly as long as some
// rank maps it: a killed job leaves nothing behind, except when it dies in
// the few milliseconds between creation and removal; such names are
// removed by the next creation on the host once their creator is gone.
#pragma once

#include <mpi.h>

#include <cstddef>
#include <memory>
#include <string>

namespace shardopt::detail {

class NodeSegment {
 public:
  // Collective over node_comm (the ranks of one node, node rank 0
  // creating). Returns null on failure, with `error` saying why in words a
  // user can act on (the same outcome on every rank of node_comm; `error`
  // is the failing rank's own text on that rank, else a pointer to it).
  static std::unique_ptr<NodeSegment> create(MPI_Comm node_comm, std::size_t bytes,
                                             std::string& error);
  ~NodeSegment();
  NodeSegment(const NodeSegment&) = delete;
  NodeSegment& operator=(const NodeSegment&) = delete;

  std::byte* data() const noexcept { return data_; }
  std::size_t size() const noexcept { return size_; }

 private:
  NodeSegment(std::byte* data, std::size_t size) : data_(data), size_(size) {}
  std::byte* data_;
  std::size_t size_;
};

// The directory POSIX shared memory lives in on Linux.
inline constexpr const char* kShmDir = "/dev/shm";
// Segment names: shardopt-<uid>-<pid>-<random hex>.
inline constexpr const char* kShmPrefix = "shardopt-";

// Removes this user's segment names under /dev/shm whose creating process
// is gone (a job killed while creating one). Local; errors are ignored.
void remove_stale_segments() noexcept;

}  // namespace shardopt::detail
