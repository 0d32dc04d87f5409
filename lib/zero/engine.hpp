// shardopt: the ZeRO engine behind ZeroRedundancyOptimizer (internal). Its
// sharded layout (buckets, shards, segments) is a ShardLayout
// (lib/zero/shards.hpp), computed without MPI; the engine adds the buffers,
// the reductions, the update and the checkpoints.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "shardopt/checkpoint.hpp"
#include "shardopt/communicator.hpp"
#include "shardopt/error.hpp"
#include "shardopt/memory.hpp"
#include "shardopt/zero.hpp"
#include "zero/optimizer_config.hpp"
#include "zero/shards.hpp"

namespace shardopt::detail {

// A bucket of the layout with the engine's state of it.
struct Bucket : BucketRange {
  // Whether the user's (or owned) gradients / parameters of the whole padded
  // bucket are one contiguous buffer of the communicated type, so that the
  // collectives run on it in place, without packing.
  const std::byte* grad_base = nullptr;  // non-null: direct
  std::byte* param_base = nullptr;       // non-null: direct
  int staging = -1;                      // pool buffer receiving streamed gradients, -1 for none
  std::size_t ready = 0;                 // elements marked ready this micro-batch
};

class ZeroEngine {
 public:
  ZeroEngine(Communicator& comm, std::vector<Param> params, std::vector<OptimizerConfig> groups,
             ZeroOptions options);
  ~ZeroEngine();

  void zero_grad();
  void grad_ready(std::size_t i, const void* grad);
  void reduce_gradients();
  double clip_grad_norm(double max_norm);
  StepInfo step();

  double loss_scale() const noexcept { return scale_; }
  std::int64_t steps() const noexcept { return steps_; }
  std::int64_t skipped_steps() const noexcept { return skipped_; }
  int stage() const noexcept { return opt_.stage; }
  std::size_t num_params() const noexcept { return params_.size(); }
  const Param& param(std::size_t i) const;
  void* grad(std::size_t i);
  OptimizerConfig& param_group(int g);
  int num_groups() const noexcept { return static_cast<int>(groups_.size()); }
  void set_lr(double lr, int group);
  std::vector<std::string> state_names() const;
  std::span<const ShardRange> owned_ranges() const noexcept { return layout_.owned; }
  std::vector<float> gather_state(std::string_view name, std::size_t i) const;
  MemoryReport memory_report() const;

  // Checkpoints (lib/zero/checkpoint.cpp).
  void save(const std::string& path, const SaveOptions& options);
  LoadReport load(const std::string& path, const LoadOptions& options);
  void export_params(const std::string& path, const ExportOptions& options);

  // Parameters identical on every rank (lib/zero/sync.cpp).
  SyncReport check_sync();

 private:
  // One reduce-scatter in flight.
  struct Flight {
    std::size_t bucket = 0;
    Request request;
    int pool = -1;            // pool buffer used, -1 for none
    void* scratch = nullptr;  // stage 2: reduced piece to add to the shard
  };

  // Construction.
  void validate_locally(std::string& error, ErrorCode& code) const;
  void agree_on_layout();
  void build_layout();
  void allocate();
  void init_state();

  // Reduction.
  std::size_t piece(const Bucket& b) const noexcept { return b.padded / nranks_; }
  void mark_ready(std::size_t i);
  void launch_ready_buckets();
  void launch(std::size_t b);
  void complete(Flight& f);
  void progress();
  // A free pool buffer: completes the oldest reduction in flight if none is
  // free, or adds a buffer when every one is filling a bucket.
  int acquire_pool();
  void stream_grad(std::size_t bucket, std::size_t param, const std::byte* grad);
  void finish_reduction();
  // Completes what is in flight and forgets the marks and reductions since
  // the last step.
  void discard_reduction();
  void drain();        // completes every reduction in flight, in order
  void clear_marks();  // forgets what grad_ready() marked in this micro-batch
  void zero_grad_buffers();
  // Flat elements [s, e) of parameter p inside [lo, hi) (s >= e if none).
  std::pair<std::size_t, std::size_t> overlap(std::size_t p, std::size_t lo,
                                              std::size_t hi) const noexcept {
    return {std::max(lo, layout_.flat[p]), std::min(hi, layout_.flat[p] + params_[p].numel)};
  }
  void allgather_grads();
  void pack_grads(std::size_t b, void* dst) const;
  // The user's buffer of parameter p (gradients or parameters).
  using UserPtr = std::function<std::byte*(std::size_t p)>;
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

  // Update. A run: consecutive elements of one group whose buffers
  // (parameters, gradients, states, parameter copy) are each contiguous.
  struct Run {
    int group = 0;
    std::size_t storage = 0, count = 0;
    std::byte* param = nullptr;  // fp32 master, fp32 parameters, or bf16 with remainders
    const std::byte* grad = nullptr;
    DType grad_type = DType::f32;
    std::byte* out = nullptr;  // the 16-bit parameters beside an fp32 master
  };
  Run run_of(const Segment& s);
  void for_each_run(const std::function<void(const Run&)>& f);
  void ensure_reduced();
  double grad_multiplier() const;
  const void* reduced_grad(const Segment& s, DType& type) const;
  double local_sum_squares(int q) const;
  bool local_grads_finite(double mul) const;
  void check_hyper_parameters() const;
  void update(double mul);
  void update_lamb(double mul);
  void update_custom(double mul);
  void gather_params();
  void update_scaler(bool finite);
  // Throws StateError (on every rank alike: free() is collective) when the
  // application has freed the communicator the optimizer was built on.
  void require_comm(const char* what) const;
  // For the watchdog's message (SHARDOPT_TIMEOUT): "step N: what[, bucket
  // b of B]", buckets counted from 1, N the step under way (after_update:
  // the step the update just counted); nothing is built when the watchdog
  // is off.
  void watch(const char* what, std::size_t bucket = SIZE_MAX, bool after_update = false) const;
  // The policy in force (automatic resolved).
  NonFinite non_finite_policy() const noexcept;
  // Collective, on non-finite gradients: throws NonFiniteError on every
  // rank naming the first parameter (registration order) and element.
  [[noreturn]] void throw_non_finite(double mul);
  void end_step();

  std::byte* user_param(const Segment& s) const;

  // Checkpoints.
  std::map<std::string, std::string> checkpoint_metadata(const char* content) const;
  void add_pieces(std::size_t first, std::size_t bytes,
                  const std::function<const void*(const Segment&)>& data,
                  std::vector<ckpt::Piece>& pieces) const;
  std::function<const void*(const Segment&)> master_source(std::vector<float>& decoded) const;
  std::byte* user_grad(std::size_t param, std::size_t offset) const;

  Communicator& comm_;
  mutable Communicator ctl_;  // a duplicate for agreements, never busy with data
  std::vector<Param> params_;
  std::vector<OptimizerConfig> groups_;
  ZeroOptions opt_;
  OptKind kind_ = 0;  // OptimizerConfig's alternative, the same in every group
  int rank_ = 0, nranks_ = 1;
  DType dtype_ = DType::f32;        // of parameters and gradients
  DType reduce_type_ = DType::f32;  // of the communicated gradients
  std::size_t elem_ = 4;            // bytes of dtype_
  bool master_ = false;             // a separate fp32 master copy
  bool remainders_ = false;
  ShardLayout layout_;
  std::size_t bucket_elems_ = 0;    // B asked for (agreed), before the layout caps it
  std::vector<Bucket> buckets_;     // the layout's, with the engine's state of each
  std::vector<std::string> slots_;  // state names after "master"

  // Buffers, allocated once.
  HostBuffer master_buf_;           // fp32 master, or 16-bit remainders
  std::vector<HostBuffer> states_;  // one per slot
  HostBuffer lamb_update_;          // LAMB's direction
  HostBuffer grad_shard_;           // stage 2: fp32 accumulator, S
  HostBuffer reduced_;              // stages 0/1 with fp32 reduction of 16-bit grads: N * S fp32
  HostBuffer owned_grads_;          // Param::grad null: N * S of dtype
  std::vector<HostBuffer> pool_;    // bucket-sized scratch for packing
  std::vector<bool> pool_busy_;
  std::size_t pool_bytes_ = 0;
  std::vector<char> streamed_;        // stage 2, Param::grad null: given in grad_ready
  HostBuffer custom_scratch_;         // custom optimizer: fp32 gradients of one segment
  std::vector<std::byte*> grad_ptr_;  // each parameter's gradient buffer

  // Step state.
  std::deque<Flight> flights_;
  std::size_t next_launch_ = 0;  // buckets [next_launch_, nb) were launched
  bool marked_any_ = false;
  std::vector<char> ready_;    // whether each parameter was marked ready
  int micro_batches_ = 0;      // reduced since the last step
  bool reduced_once_ = false;  // a reduction happened since the last step
  // Gradients may have changed since the last reduction: set by zero_grad(),
  // grad_ready() and step(), cleared by each reduction.
  bool open_ = true;
  double clip_coef_ = 1.0;
  double grad_norm_ = -1.0;
  std::int64_t steps_ = 0;
  int check_sync_every_ = 0;  // resolved ZeroOptions::check_sync_every; 0: never
  std::int64_t skipped_ = 0;  // steps skipped for non-finite gradients
  // Communication since the last step (StepInfo), and the SHARDOPT_DEBUG=INFO
  // summary every SHARDOPT_STATS_EVERY steps.
  struct CommStats {
    std::uint64_t reduce_bytes = 0, gather_bytes = 0;
    double first_launch = -1.0, reduce_end = -1.0, waited = 0.0;
  } comm_stats_;
  struct Window {
    int steps = 0;
    double reduce = 0, update = 0, gather = 0, exposed = 0, span = 0;
    std::uint64_t reduce_bytes = 0, gather_bytes = 0;
  } window_;
  void fill_comm(StepInfo& info) const;
  void log_window(const StepInfo& info);
  double scale_ = 1.0;
  int good_steps_ = 0;
  int hysteresis_left_ = 1;
};

}  // namespace shardopt::detail
