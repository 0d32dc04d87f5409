// The shared-memory transport's node access (lib/comm/node_access.hpp):
// POSIX shared memory for the parts (shm_segment.hpp), the node channel's
// in-place reads of it (shm_channel.hpp), and cross-memory attach for the
// other ranks' private memory (shm_peer.hpp).
#include "comm/shm/shm_access.hpp"

#include <unistd.h>

#include <cerrno>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <utility>

#include "comm/shm/shm_peer.hpp"
#include "comm/shm/shm_segment.hpp"
#include "common/check.hpp"

namespace shardopt::detail {

namespace {

class ShmParts final : public SharedParts {
 public:
  ShmParts(std::unique_ptr<NodeSegment> seg, std::size_t part_bytes,
           std::shared_ptr<NodeChannel> reader)
      : seg_(std::move(seg)), part_bytes_(part_bytes), reader_(std::move(reader)) {}
  ~ShmParts() override {
    if (reader_ != nullptr) reader_->forget_shared(seg_->data());
  }
  std::byte* part(int q) const noexcept override {
    return seg_->data() + std::size_t(q) * part_bytes_;
  }
  std::size_t part_bytes() const noexcept override { return part_bytes_; }

 private:
  std::unique_ptr<NodeSegment> seg_;
  std::size_t part_bytes_;
  std::shared_ptr<NodeChannel> reader_;  // in place: the channel reading the parts
};

class ShmPeers final : public PeerReader {
 public:
  explicit ShmPeers(std::vector<pid_t> pids) : pids_(std::move(pids)) {}
  bool read(int q, std::vector<iovec>& local, std::vector<iovec>& remote) const override {
    return read_process(pids_[std::size_t(q)], local, remote);
  }

 private:
  std::vector<pid_t> pids_;
};

class ShmAccess final : public NodeAccess {
 public:
  ShmAccess(MPI_Comm comm, std::shared_ptr<NodeChannel> channel)
      : comm_(comm), channel_(std::move(channel)) {
    SHARDOPT_CHECK_MPI(MPI_Comm_rank(comm_, &rank_), "querying the rank");
    SHARDOPT_CHECK_MPI(MPI_Comm_size(comm_, &size_), "querying the size");
  }

  std::unique_ptr<SharedParts> share(std::size_t part_bytes, bool in_place,
                                     std::string& error) override {
    // Every rank of the communicator is on this node, in rank order.
    auto seg = NodeSegment::create(comm_, part_bytes * std::size_t(size_), error);
    if (seg == nullptr) return nullptr;
    std::byte* mine = seg->data() + std::size_t(rank_) * part_bytes;
    std::memset(mine, 0, part_bytes);  // its pages first touched by this rank
    if (!in_place) return std::make_unique<ShmParts>(std::move(seg), part_bytes, nullptr);
    // Where every rank maps the memory, for the channel to find buffers
    // inside it in each rank's address space.
    const auto base = static_cast<std::uint64_t>(reinterpret_cast<std::uintptr_t>(seg->data()));
    std::vector<std::uint64_t> bases(std::size_t(size_), 0);
    SHARDOPT_CHECK_MPI(MPI_Allgather(&base, 1, MPI_UINT64_T, bases.data(), 1, MPI_UINT64_T, comm_),
                       "exchanging where the ranks map their shared memory");
    channel_->map_shared(seg->data(), seg->size(),
                         std::vector<std::uintptr_t>(bases.begin(), bases.end()));
    return std::make_unique<ShmParts>(std::move(seg), part_bytes, channel_);
  }

  std::unique_ptr<PeerReader> peer_reader(const void* probe, std::size_t bytes,
                                          std::string& error) override {
    struct Id {
      std::int64_t pid;
      std::uint64_t probe;
    };
    const Id mine{static_cast<std::int64_t>(getpid()),
                  static_cast<std::uint64_t>(reinterpret_cast<std::uintptr_t>(probe))};
    std::vector<Id> all(static_cast<std::size_t>(size_));
    SHARDOPT_CHECK_MPI(
        MPI_Allgather(&mine, sizeof(Id), MPI_BYTE, all.data(), sizeof(Id), MPI_BYTE, comm_),
        "exchanging the ranks' processes");
    std::vector<pid_t> pids;
    for (const Id& id : all) pids.push_back(static_cast<pid_t>(id.pid));
    std::string why;
    std::vector<std::byte> got(bytes);
    for (int q = 0; q < size_ && bytes > 0 && why.empty(); ++q) {
      if (q == rank_) continue;
      if (!read_process(pids[std::size_t(q)], got.data(),
                        reinterpret_cast<const void*>(all[std::size_t(q)].probe), bytes))
        why = "reading rank " + std::to_string(q) +
              "'s memory (process_vm_readv): " + std::strerror(errno);
    }
    // The first failing rank's reason, on every rank.
    int first = why.empty() ? size_ : rank_;
    SHARDOPT_CHECK_MPI(MPI_Allreduce(MPI_IN_PLACE, &first, 1, MPI_INT, MPI_MIN, comm_),
                       "agreeing on reading the other ranks' memory");
    if (first == size_) return std::make_unique<ShmPeers>(std::move(pids));
    char text[512] = {};
    if (rank_ == first) std::snprintf(text, sizeof text, "%s", why.c_str());
    SHARDOPT_CHECK_MPI(MPI_Bcast(text, sizeof text, MPI_CHAR, first, comm_),
                       "sending why the other ranks' memory cannot be read");
    error = "rank " + std::to_string(first) + ": " + text;
    return nullptr;
  }

 private:
  MPI_Comm comm_;
  std::shared_ptr<NodeChannel> channel_;
  int rank_ = 0, size_ = 1;
};

}  // namespace

std::unique_ptr<NodeAccess> make_shm_access(MPI_Comm comm, std::shared_ptr<NodeChannel> channel) {
  return std::make_unique<ShmAccess>(comm, std::move(channel));
}

}  // namespace shardopt::detail
