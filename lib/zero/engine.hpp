// shardopt: the ZeRO engine behind ZeroRedundancyOptimizer (internal). Its
// parts, each with its own file:
//   layout      ShardLayout (lib/zero/shards.hpp): buckets, shards and
//               segments, computed without MPI; the engine agrees on its
//               inputs and builds it (lib/zero/construction.cpp);
//   reduction   GradReducer (lib/zero/reduction.hpp): the gradient buffers,
//               the reduce-scatters and the allgathers;
//   update      ShardState (lib/zero/shard_state.hpp): the fp32 master and
//               states and the fused update; the engine's step around it,
//               the checks, the norm and the loss scaler (lib/zero/update.cpp);
//   checkpoint  save, load and export on lib/ckpt's file format
//               (lib/zero/save_load.cpp); check_sync (lib/zero/sync.cpp).
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "shardopt/checkpoint.hpp"
#include "shardopt/communicator.hpp"
#include "shardopt/error.hpp"
#include "shardopt/memory.hpp"
#include "shardopt/zero.hpp"
#include "zero/gather_pool.hpp"
#include "zero/optimizer_config.hpp"
#include "zero/reduction.hpp"
#include "zero/released_guard.hpp"
#include "zero/shard_state.hpp"
#include "zero/shards.hpp"
#include "zero/space.hpp"

namespace shardopt::detail {

class ZeroEngine {
 public:
  ZeroEngine(Communicator& comm, std::vector<Param> params, std::vector<OptimizerConfig> groups,
             ZeroOptions options);
  ~ZeroEngine();

  void zero_grad();
  void grad_ready(std::size_t i, const void* grad,
                  std::optional<StreamHandle> producer = std::nullopt);
  void reduce_gradients();
  double clip_grad_norm(double max_norm);
  StepInfo step();

  // Each counts the last step's verdict first (settle()).
  double loss_scale() {
    settle();
    return scale_;
  }
  std::int64_t steps() {
    settle();
    return steps_;
  }
  std::int64_t skipped_steps() {
    settle();
    return skipped_;
  }
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

  // Checkpoints (lib/zero/save_load.cpp).
  void save(const std::string& path, const SaveOptions& options);
  LoadReport load(const std::string& path, const LoadOptions& options);
  void export_params(const std::string& path, const ExportOptions& options);

  // Parameters identical on every rank (lib/zero/sync.cpp).
  SyncReport check_sync();

  // Stage 3 (lib/zero/units.cpp).
  std::size_t num_units() const noexcept { return layout_.units.size(); }
  void gather(std::size_t unit);
  void igather(std::size_t unit);
  void release(std::size_t unit);
  const void* data(std::size_t i) const;
  // Collective: throws on every rank when some rank holds a unit gathered
  // (stage 3), naming `what`; then drops the units prefetched and kept.
  void check_released(const char* what);
  // check_released, then this step's gathers recorded as the order to
  // prefetch by.
  void end_gathers(const char* what);
  // Collective: the units kept whole, allgathered from the parameter shard
  // (after the update, after a load).
  void refresh_persistent();
  // Collective, after the update: with prefetch, the first units of the
  // recorded order gathered from the new shards, while the code does what
  // it does between steps.
  void prefetch_next_step();

 private:
  // Construction.
  void validate_locally(std::string& error, ErrorCode& code) const;
  // Where the parameters live, agreed across ranks: space_.
  void agree_on_space();
  void agree_on_layout();
  void build_layout();
  void allocate();

  // Update.
  void ensure_reduced();
  GradReducer& reducer() const noexcept { return *reducer_; }
  ShardState& shard() const noexcept { return *shard_; }
  double grad_multiplier() const;
  double local_sum_squares(int q) const;
  bool local_grads_finite(double mul) const;
  void check_hyper_parameters() const;
  void update_scaler(bool finite);
  // Device steps whose non-finite verdict stays on the device: whether this
  // step decides so, the verdict raised (agreed over ranks on the engine's
  // stream, then copied to host memory), and its count on the host.
  bool verdict_on_device(NonFinite policy) const noexcept;
  void raise_verdict(double mul);
  // Counts a pending verdict (steps or skipped, the scaler), waiting for it
  // if the device has not reached it. Everything that reads the counts or
  // the scale calls it first.
  void settle();
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
  // check_sync every check_sync_every_ steps (when the count is known).
  void after_step();

  // Stage 3's units (lib/zero/units.cpp).
  void setup_units();
  std::byte* unit_base(std::size_t u) const;
  // Collective over the ranks' agreement words: {unit, whether held}, for
  // a gather (true) or a release.
  void agree_on_unit(bool gathering, std::size_t u);
  // Reserves unit u's bytes in the pool (an overflow buffer when the room
  // is in pieces); false when the pool has no room even so.
  bool place(std::size_t u, bool for_prefetch);
  // Frees engine-held (prefetched, kept) units, the furthest needed first,
  // until `bytes` more fit the limit; whether they do.
  bool make_room(std::size_t bytes);
  void issue(std::size_t u);
  void finish(std::size_t u) const;
  void drop(std::size_t u);
  void prefetch_after();
  std::string unit_text(std::size_t u) const;

  // Checkpoints.
  std::map<std::string, std::string> checkpoint_metadata(const char* content) const;
  void add_pieces(std::size_t first, std::size_t bytes,
                  const std::function<const void*(const Segment&)>& data,
                  std::vector<ckpt::Piece>& pieces) const;
  // On a device: source's segments (of `bytes` per element) downloaded to
  // host memory kept in `store`, for the file layer. On the host: source.
  using Source = std::function<const void*(const Segment&)>;
  Source master_source(std::vector<float>& decoded,
                       std::deque<std::vector<std::byte>>& store) const;
  Source on_host(Source source, std::size_t bytes, std::deque<std::vector<std::byte>>& store) const;

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
  std::size_t bucket_elems_ = 0;
  // Stage 3: this rank's pieces of the parameters (S elements of dtype_),
  // the units' state and the pool they are gathered in, the gathers
  // recorded (the last step's, and this step's so far), and the options
  // the gradient reducer sees (stage 2's).
  SpaceBuffer param_shard_;
  struct Unit {
    enum class State : std::uint8_t { released, prefetched, held, kept };
    State state = State::released;
    bool persistent = false;
    std::size_t bytes = 0;          // gathered: the elements to the last bucket's padding
    std::size_t offset = SIZE_MAX;  // in the pool; SIZE_MAX: in `own`
    SpaceBuffer own;                // a persistent unit's buffer, or an overflow one
    std::vector<Request> pending;   // allgathers in flight
  };
  mutable std::vector<Unit> units_;
  SpaceBuffer pool_buf_;
  FirstFit pool_;
  std::unique_ptr<ReleasedGuard> guard_;  // SHARDOPT_CHECK_ARGS on the host
  std::vector<std::size_t> order_, trace_;
  bool following_ = false;  // this step's gathers so far are order_'s first ones
  bool overflow_logged_ = false;
  std::int64_t gathers_ahead_ = 0;  // this step's gathers of units prefetched or kept
  std::vector<std::size_t> unit_of_;
  ZeroOptions reducer_opt_;
  Space space_;  // the host, or the parameters' device  // B asked for (agreed), before the layout
                 // caps it

  // Step state.
  // The parts made once the layout is known.
  std::unique_ptr<GradReducer> reducer_;
  std::unique_ptr<ShardState> shard_;
  double clip_coef_ = 1.0;
  double grad_norm_ = -1.0;
  std::int64_t steps_ = 0;
  int check_sync_every_ = 0;  // resolved ZeroOptions::check_sync_every; 0: never
  std::int64_t skipped_ = 0;  // steps skipped for non-finite gradients
  // The SHARDOPT_DEBUG=INFO summary every SHARDOPT_STATS_EVERY steps.
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

  // The verdict of a device step (verdict_on_device): a word on the device,
  // non-zero when some rank's gradient was not finite, that the fused update
  // reads as its noop flag, and its copy for the host. Made with the engine.
  struct Verdict {
    SpaceBuffer flag;
    HostWord host;
    bool pending = false;  // raised, not yet counted
  } verdict_;
};

}  // namespace shardopt::detail
