// shardopt: the ZeRO engine's gradient reduction and parameter allgather
// (internal). A GradReducer owns the gradient side of the engine: the
// buckets' state, the reduce-scatters in flight, the buffers they use (the
// bucket pool, the stage-2 fp32 gradient shard, fp32 reductions of 16-bit
// gradients, the gradients the optimizer owns) and the allgathers that
// complete a step. The engine (lib/zero/engine.hpp) drives it; the update
// reads the reduced gradients through reduced_grad().
//
// Every collective on the data communicator is started in the same order on
// every rank: reduce-scatters in descending bucket order (as buckets fill,
// or all at the end), then the allgathers in ascending order. Decisions that
// could differ between ranks (which gradients were marked ready) are agreed
// on the control communicator, so they never interleave with the data.
#pragma once

#include <sys/uio.h>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <optional>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include "comm/node_access.hpp"
#include "shardopt/communicator.hpp"
#include "shardopt/memory.hpp"
#include "shardopt/zero.hpp"
#include "zero/buffers.hpp"
#include "zero/shards.hpp"
#include "zero/space.hpp"

namespace shardopt::detail {

// A bucket of the layout with the reducer's state of it.
struct Bucket : BucketRange {
  // Whether the user's (or owned) gradients / parameters of the whole padded
  // bucket are one contiguous buffer of the communicated type, so that the
  // collectives run on it in place, without packing.
  const std::byte* grad_base = nullptr;  // non-null: direct
  std::byte* param_base = nullptr;       // non-null: direct
  int staging = -1;                      // pool buffer receiving streamed gradients, -1 for none
  std::size_t ready = 0;                 // elements marked ready this micro-batch
};

// Communication since the last step (StepInfo).
struct CommStats {
  std::uint64_t reduce_bytes = 0, gather_bytes = 0;
  double first_launch = -1.0, reduce_end = -1.0, waited = 0.0;
};

// The fused step could not read another rank's gradients (the user's
// buffers, through the node access): what() names the rank and the reason. Caught
// where the fused reduction ends, and agreed there, so that every rank
// throws (release_fused, materialize).
struct PeerReadError : std::runtime_error {
  using std::runtime_error::runtime_error;
};

class GradReducer {
 public:
  // For the watchdog's message (SHARDOPT_TIMEOUT): what is under way (a
  // string literal), the bucket (SIZE_MAX for none), and whether the
  // update has counted the step.
  using Watch = std::function<void(const char* what, std::size_t bucket, bool after_update)>;

  // Allocates the buffers. params, layout and options must outlive the
  // reducer (the engine's own); dtype is the parameters' and gradients',
  // reduce_type the communicated one.
  // fusable: the update can take the reduced gradients block by block
  // (element-wise optimizers); with the conditions of fused() below, the
  // owned gradients then live in the node's shared memory. gathers_params:
  // gather_params() is used (false at stage 3, whose reducer is stage 2's
  // without the parameters' allgather: no bucket buffer is sized for it).
  GradReducer(Communicator& comm, Communicator& ctl, const Space& space,
              const std::vector<Param>& params, const ShardLayout& layout,
              const ZeroOptions& options, DType dtype, DType reduce_type, Watch watch, bool fusable,
              bool gathers_params);
  ~GradReducer();  // waits for the reductions in flight
  GradReducer(const GradReducer&) = delete;
  GradReducer& operator=(const GradReducer&) = delete;

  // Parameter i's gradient buffer (the user's, owned, or null when streamed).
  std::byte* grad(std::size_t i) const noexcept { return grad_ptr_[i]; }
  // Marks gradient i ready (i a valid index), written by the work enqueued
  // on `producer` (device: the engine's stream waits for it; none: the
  // engine's own), and starts the reduce-scatter of every bucket that is
  // complete.
  void grad_ready(std::size_t i, const void* grad, std::optional<StreamHandle> producer);
  // Completes the reduction of the micro-batch: agrees on what was marked
  // (partly marked gradients throw on every rank), reduces the rest, and in
  // stages 0 and 1 allgathers the reduced gradients back.
  void finish();
  // Completes what is in flight and forgets the marks and reductions since
  // the last step.
  void discard();
  void zero_grad_buffers();
  // Stages 1 and 2: every rank's updated pieces into every rank's parameters.
  void gather_params();
  // The start of the next step: no reduction, statistics cleared.
  void end_step();

  // Gradients may have changed since the last reduction.
  bool open() const noexcept { return open_; }
  // Stage 2 after reduce_gradients(): the next micro-batch is open.
  void reopen() noexcept { open_ = true; }
  // A reduction happened since the last step.
  bool reduced_once() const noexcept { return reduced_once_; }

  // The reduced gradients of segment s: fp32 (the stage-2 shard, or fp32
  // reductions of 16-bit gradients) or the user's buffer, of `type`. Not
  // while a fused reduction is pending (materialize() first).
  const void* reduced_grad(const Segment& s, DType& type) const;

  // The fused stage-2 step (SHARDOPT_FUSED_UPDATE): a communicator with
  // node access (comm/node_access.hpp: every rank on one node sharing
  // memory), host buffers, and either gradients the optimizer owns, kept in
  // memory every rank maps (rank q's buffers in its part), or the user's
  // gradient buffers, which the update reads from the other ranks' memory
  // (a single copy by the kernel, into a slice in cache). finish() then reduces nothing: it waits
  // until every rank's gradients are written and leaves the reduction pending, for the update to
  // read every rank's slices of its shard (reduce_block) as it goes, or for materialize() to write
  // them into the shard when something needs the reduced gradients first.
  bool fused_pending() const noexcept { return pending_; }
  // Collective: the pending reduction into the gradient shard (nothing if
  // none), bitwise what the reduce-scatters would have made.
  void materialize();
  // The reduced gradients of shard elements [storage, storage + count)
  // into out (fp32), as materialize() would make them; count <=
  // block_elements(); thread t < block_threads() uses its own scratch. No
  // collective; throws only if another rank's buffers cannot be read (the
  // user's gradients, read through the node access).
  void reduce_block(std::size_t storage, std::size_t count, float* out, int t) const;
  // Where shard elements [storage, ...) are reduced already while the
  // reduction is pending (the buckets that were not held), else null: the
  // update reads them there rather than through reduce_block.
  const float* reduced_block(std::size_t storage) const noexcept {
    return holding_ && hold_ < buckets_.size() && storage >= buckets_[hold_].shard_offset
               ? grad_shard_.as<float>() + storage
               : nullptr;
  }
  float* block(int t) const noexcept {
    return blocks_.as<float>() + std::size_t(t) * fused_block_elements(layout_);
  }
  static constexpr std::size_t block_elements() noexcept { return kBlock; }
  int block_threads() const noexcept { return block_threads_; }
  // Collective, after the update read the pending reduction: no rank
  // writes its gradients before every rank has read them.
  // error: this rank's PeerReadError message, if the update had one;
  // throws on every rank when some rank had one.
  void release_fused(const std::string& error = {});
  const CommStats& stats() const noexcept { return stats_; }
  std::size_t bucket_count() const noexcept { return buckets_.size(); }
  // Adds the reducer's buffers to m.
  void add_memory(MemoryReport& m) const;

 private:
  // One reduce-scatter in flight.
  struct Flight {
    std::size_t bucket = 0;
    Request request;
    int pool = -1;            // pool buffer used, -1 for none
    void* scratch = nullptr;  // stage 2: reduced piece to add to the shard
  };
  // The user's buffer of parameter p (gradients or parameters).
  using UserPtr = std::function<std::byte*(std::size_t p)>;

  void allocate();
  // The fused step's setup: on shared owned gradients, on the user's
  // (read_peer_grads, which may leave it off), and their common part.
  void share_owned_grads(std::size_t bytes);
  // Stage 2 with stream_grads on one node: the two bucket buffers of every
  // rank in one segment of shared memory, mapped into the communicator, so
  // that the reduce-scatter reads the other ranks' buckets in place; with
  // an element-wise optimizer, the last two buckets (0 and 1, which fill
  // last) are held there and reduced by the update as it goes (hold_).
  void share_pool(std::size_t pool_bytes);
  // finish(), holding: gives every held bucket a buffer and packs its
  // gradients that were not streamed; whether all are in shared buffers.
  bool prepare_held();
  // Rank q's part of the shared segment: a page naming the buffers of its
  // held buckets, then its two buffers.
  std::byte* pool_part(int q) const noexcept;
  // After every rank's held buckets are written: where each rank's are.
  void find_held();
  // The held buckets' buffers free again (after every rank has read them).
  void release_held() noexcept;
  // Rank q's held bucket b (its shared buffer, mapped here).
  const std::byte* held_of(int q, std::size_t b) const noexcept {
    return held_src_[std::size_t(q) * hold_ + b];
  }
  // Memory every rank maps, `bytes` per rank (null, after a warning naming
  // `what` from rank 0, where it cannot be had).
  std::unique_ptr<SharedParts> node_segment(std::size_t bytes, bool in_place, const char* what);
  void read_peer_grads();
  void start_fused();   // fused_, with the blocks below
  void start_blocks();  // the update's blocks of reduced gradients
  const std::byte* slice_of(int q, std::size_t f0, std::size_t n, int t) const;
  std::size_t piece(const Bucket& b) const noexcept { return b.padded / nranks_; }
  // Flat elements [s, e) of parameter p inside [lo, hi) (s >= e if none).
  std::pair<std::size_t, std::size_t> overlap(std::size_t p, std::size_t lo,
                                              std::size_t hi) const noexcept {
    return {std::max(lo, layout_.flat[p]), std::min(hi, layout_.flat[p] + params_[p].numel)};
  }
  // Launches the complete buckets from the next one down, above `floor`.
  void launch_ready_buckets(std::size_t floor);
  void launch(std::size_t b);
  void complete(Flight& f);
  void progress();
  // A free pool buffer: completes the oldest reduction in flight if none is
  // free, or adds a buffer when every one is filling a bucket.
  int acquire_pool();
  void stream_grad(std::size_t bucket, std::size_t param, const std::byte* grad);
  void drain();        // completes every reduction in flight, in order
  void clear_marks();  // forgets what grad_ready() marked in this micro-batch
  void allgather_grads();
  void pack_grads(std::size_t b, void* dst) const;
  UserPtr grads_of() const {
    return [this](std::size_t p) { return grad_ptr_[p]; };
  }
  UserPtr params_of() const {
    return [this](std::size_t p) { return static_cast<std::byte*>(params_[p].data); };
  }
  // Copies flat elements [lo, hi) of bucket b between the user's buffers
  // and a bucket-shaped buffer of the parameters' dtype.
  void to_bucket(const Bucket& b, std::size_t lo, std::size_t hi, const UserPtr& user,
                 std::byte* buf) const;
  void from_bucket(const Bucket& b, std::size_t lo, std::size_t hi, const UserPtr& user,
                   const std::byte* buf) const;
  void allgather_buckets(DType type, std::uint64_t& bytes, const UserPtr& user,
                         const std::function<std::byte*(const Bucket&)>& direct);

  // Starts a collective on comm_ with the engine's stream (device buffers
  // are ordered on it), leaving the communicator's own stream as it was.
  template <class F>
  Request on_stream(F&& start) {
    void* saved = comm_.stream();
    comm_.set_stream(space_.stream());
    Request r = start();
    comm_.set_stream(saved);
    return r;
  }

  Communicator& comm_;
  Communicator& ctl_;
  const Space& space_;
  const std::vector<Param>& params_;
  const ShardLayout& layout_;
  const ZeroOptions& opt_;
  DType dtype_, reduce_type_;
  std::size_t elem_;  // bytes of dtype_
  int rank_, nranks_;
  Watch watch_;
  std::vector<Bucket> buckets_;

  // Every rank's gradients written (finish), or read (after the update).
  void node_barrier(const char* what);
  // The end of a fused reduction: a barrier that also agrees on whether a
  // rank failed to read another's gradients (then a throw on every rank).
  void end_fused(const char* what, const std::string& error);

  // Buffers, allocated once.
  SpaceBuffer grad_shard_;         // stage 2: fp32 accumulator, S
  SpaceBuffer reduced_;            // stages 0/1 with fp32 reduction of 16-bit grads: N * S fp32
  SpaceBuffer owned_grads_;        // Param::grad null: N * S of dtype
  std::vector<SpaceBuffer> pool_;  // bucket-sized scratch for packing
  std::vector<bool> pool_busy_;
  std::size_t pool_bytes_ = 0;
  std::unique_ptr<SharedParts> shared_pool_;  // share_pool: the first two of pool_
  std::size_t pool_stride_ = 0;               // of the buffers in a rank's part
  // Buckets [0, hold_) stay in their shared buffers until the update
  // reduces them (0: none held); holding_: the pending reduction holds
  // them, rank q's bucket b at held_src_[q * hold_ + b].
  std::size_t hold_ = 0;
  bool holding_ = false;
  std::vector<const std::byte*> held_src_;
  // The fused step: the segment holding every rank's owned gradients,
  // rank q's at peers_[q]; per thread, a block of reduced gradients and
  // the scratch of its reduction (kBlock elements each).
  static constexpr std::size_t kBlock = kFusedBlock;
  bool fusable_ = false, fused_ = false;
  bool gathers_params_ = true;
  // The user's gradients, read from the other ranks' processes: the
  // reader, and every parameter's gradient address there (rank-major); per
  // thread, a slice of kBlock elements per rank and its lists of pieces.
  bool peer_read_ = false;
  std::unique_ptr<PeerReader> peer_reader_;
  std::vector<std::uintptr_t> peer_grads_;
  SpaceBuffer slices_;
  mutable std::vector<std::pair<std::vector<iovec>, std::vector<iovec>>> iov_;
  std::unique_ptr<SharedParts> shared_;
  std::vector<const std::byte*> peers_;
  std::size_t shared_bytes_ = 0;  // per rank
  SpaceBuffer blocks_;
  mutable std::vector<const void*> block_srcs_;  // per thread, a pointer per rank
  int block_threads_ = 0;
  bool pending_ = false;              // a fused reduction not yet read
  bool pending_accumulate_ = false;   // it adds to the micro-batches in the shard
  std::vector<char> streamed_;        // stage 2, Param::grad null: given in grad_ready
  std::vector<std::byte*> grad_ptr_;  // each parameter's gradient buffer
  SpaceEvent produced_;               // device: carries producer streams' work

  // Step state.
  std::deque<Flight> flights_;
  std::size_t next_launch_ = 0;  // buckets [next_launch_, nb) were launched
  bool marked_any_ = false;
  std::vector<char> ready_;    // whether each parameter was marked ready
  int micro_batches_ = 0;      // reduced since the last step
  bool reduced_once_ = false;  // a reduction happened since the last step
  // Gradients may have changed since the last reduction: set by
  // grad_ready(), discard() and end_step(), cleared by each reduction.
  bool open_ = true;
  CommStats stats_;
};

}  // namespace shardopt::detail
