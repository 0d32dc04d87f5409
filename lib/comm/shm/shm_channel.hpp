// shardopt internal: the collectives of the ranks of one node through
// memory they all map (NodeSegment). Each rank owns two slots of the
// segment; an operation moves through them in steps. In a step every rank
// writes its slot (fill), announces it, waits for every other rank's, reads
// them all (use) and announces that it has. Steps alternate between the
// two slots, so a rank writes a slot again only after every rank has read
// what it held two steps before: two counters per rank, and no lock.
// Chunks are a slot's size (SHARDOPT_SHM_CHUNK_KB), small enough that what
// one rank writes is still in the shared cache when the others read it: a
// reduce-scatter then costs about one read of the input and one write of
// the result in memory bandwidth.
//
// Reductions combine every rank's data in one pass in local-rank order
// (reduce_arrays), so results do not depend on timing, and an allreduce
// adds exactly as a reduce-scatter does.
//
// Single copy: operations on blocks of at least single_copy_bytes (where
// the kernel lets the node's ranks read each other's memory, checked when
// the channel is made) take no slots. A rank announces the address of its
// buffer with a step; each rank then reads what it needs of the others'
// buffers with process_vm_readv, straight into its output (allgather,
// broadcast) or into tiles that stay in cache and are reduced from there
// (reduce-scatter, allreduce), and announces that it has; every rank waits
// for every other's announcement before it returns, since its buffer is
// read until then. A read that fails is announced too, so every rank
// throws the same error. Each byte then crosses memory once instead of
// twice (into a slot and out of it). The same order of summation.
//
// A channel is used by one thread at a time (ShmBackend's caller or its
// worker); the steps of an operation are the same on every rank, since
// every rank runs the same operations with the same counts.
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <span>
#include <vector>

#include "comm/shm/shm_segment.hpp"
#include "shardopt/types.hpp"

namespace shardopt::detail {

class NodeChannel {
 public:
  // Collective over node_comm. Null (with `error`) where the segment cannot
  // be made; see NodeSegment::create.
  // single_copy_bytes: the smallest block an operation takes in a single
  // copy (SIZE_MAX: none).
  static std::unique_ptr<NodeChannel> create(MPI_Comm node_comm, std::size_t slot_bytes,
                                             std::size_t single_copy_bytes, std::string& error);
  ~NodeChannel();
  NodeChannel(const NodeChannel&) = delete;
  NodeChannel& operator=(const NodeChannel&) = delete;

  int rank() const noexcept { return rank_; }
  int ranks() const noexcept { return ranks_; }
  std::size_t slot_bytes() const noexcept { return slot_bytes_; }
  // Whether operations on large blocks take a single copy (above).
  bool single_copy() const noexcept { return single_copy_bytes_ != SIZE_MAX; }
  // Bytes of shared memory this channel maps (the same on every rank of
  // the node: the node holds it once).
  std::size_t segment_bytes() const noexcept { return seg_->size(); }

  // Reduce-scatter over the node's ranks of `groups` groups: local rank l's
  // result is, for each group g, the reduction of block blocks[l * groups +
  // g] of every rank's `in` (blocks of n elements), written at out + g * n.
  // out may be in's block 0 (MPI's in-place form) or this rank's block when
  // groups == 1 (NCCL's), and nothing else of in.
  void reduce_scatter(const void* in, void* out, std::size_t n, DType t, ReduceOp op, int groups,
                      std::span<const int> blocks);
  // The reverse: this rank's `groups` blocks of n elements at in (in + g *
  // n) go to block blocks[l * groups + g] of every rank's out, l this rank.
  // in may be out's block blocks[rank * groups] when groups == 1 (in place).
  void allgather(const void* in, void* out, std::size_t n, DType t, int groups,
                 std::span<const int> blocks);
  // Every rank's `in` reduced into every rank's `out` (may be `in`).
  void allreduce(const void* in, void* out, std::size_t n, DType t, ReduceOp op);
  // The root's buf into every rank's.
  void broadcast(void* buf, std::size_t bytes, int root);
  void barrier();

  // Node shared memory a single-copy operation reads in place instead of
  // through process_vm_readv: local rank q's range [bases[q], bases[q] +
  // bytes) of its address space is mapped at `local` here. Until
  // forget_shared(local). Either may be called while operations run.
  void map_shared(const std::byte* local, std::size_t bytes, std::vector<std::uintptr_t> bases);
  void forget_shared(const std::byte* local) noexcept;

  // What the channel is doing, for the message when a rank of the node
  // ends while the others wait for it (a string literal).
  void set_operation(const char* what) noexcept { what_ = what; }
  // Waits longer than a brief spin call (*waiter)(attempt) (null: loop on
  // attempt() here), attempt() sleeping up to 1 ms and saying whether the
  // wait is over: the caller's thread lets the watchdog poll them.
  using Waiter = std::function<void(const std::function<bool()>& attempt)>;
  void set_waiter(const Waiter* waiter) noexcept { waiter_ = waiter; }
  // Makes every wait of the channel throw from now on (another thread
  // stopping a worker stuck in a wait).
  void stop() noexcept { stop_.store(true, std::memory_order_relaxed); }

 private:
  struct Control;
  NodeChannel(std::unique_ptr<NodeSegment> seg, int rank, int ranks, std::size_t slot_bytes);
  // "" where this rank can read every other rank's memory; else why not.
  std::string probe_peers() const;
  std::byte* slot(int q, std::uint32_t step) const noexcept;
  std::size_t pieces_of(int groups) const noexcept;  // blocks of an operation: ranks x groups
  // One step: fill(own slot), then use(slot of each rank), as above.
  template <class Fill, class Use>
  void step(Fill&& fill, Use&& use);
  void wait_all(bool posted, std::uint32_t step);
  void wait_one(int q, bool posted, std::uint32_t step);
  // Until rank q's `word` (in its line) reaches `step`.
  void wait_word(int q, std::atomic<std::uint32_t>& word, std::uint32_t step);
  void publish(std::atomic<std::uint32_t>& word, std::uint32_t value) noexcept;
  void post(bool posted, std::uint32_t step) noexcept;
  [[noreturn]] void peer_gone(int q) const;
  // A single-copy step: announce `mine`, use(base) (base(q): rank q's
  // announced buffer, read through read_peer), announce that this rank is
  // done, wait until every rank is, and throw the first failed read's
  // error on every rank. A rank that declines makes every rank return
  // false before use (the operation then takes the slots).
  template <class Use>
  bool direct_step(const void* mine, Use&& use, bool decline = false);
  // `bytes` of rank q's memory at `from` into `to`; a failure is noted for
  // direct_step's end (and the step's later reads skipped).
  void read_peer(int q, void* to, const std::byte* from, std::size_t bytes);
  // Where rank q's `bytes` at `from` (its address) are mapped in this
  // process (map_shared), or null.
  const std::byte* mapped(int q, const std::byte* from, std::size_t bytes) const;
  // out[0, n) = the reduction of every rank's n elements at byte `at` of
  // its announced buffer (this rank's own at `own`), through tiles; each
  // tile of out written once rank `reader` (-1: none) has read as many
  // tiles (out is what it reads of this rank's buffer). Publishes this
  // rank's own progress.
  template <class Base>
  void reduce_direct(Base&& base, std::size_t at, const std::byte* own, std::byte* out,
                     std::size_t n, DType t, ReduceOp op, bool stream, int reader = -1);

  std::unique_ptr<NodeSegment> seg_;
  Control* control_;
  std::byte* slots_;
  int rank_, ranks_;
  std::size_t slot_bytes_;
  std::size_t single_copy_bytes_ = SIZE_MAX;
  std::uint32_t step_ = 0;
  bool read_failed_ = false;      // in this single-copy step
  std::uint32_t tiles_read_ = 0;  // in this single-copy step
  std::int64_t probe_;            // this process's pid, where the others read it to probe
  const char* what_ = "a collective";
  std::atomic<bool> stop_{false};
  const Waiter* waiter_ = nullptr;
  std::vector<const void*> srcs_;         // per rank, reused
  std::vector<const std::byte*> direct_;  // per rank: its buffer mapped here (reduce_direct)
  std::vector<std::byte> tiles_;          // single copy: what the reductions read, kTile per rank
  struct Window {
    const std::byte* local;
    std::size_t bytes;
    std::vector<std::uintptr_t> bases;  // per local rank
  };
  mutable std::mutex windows_mutex_;
  std::vector<Window> windows_;  // map_shared
};

}  // namespace shardopt::detail
