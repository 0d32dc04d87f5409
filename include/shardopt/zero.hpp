// shardopt: the ZeRO engine. A distributed optimizer over the user's own
// parameter and gradient buffers that keeps every rank's parameters
// identical while the optimizer state (stage 1) and the gradients (stage 2)
// are sharded across the ranks of a Communicator.
//
//   stage 0 (DistributedOptimizer): gradients allreduced in buckets, every
//           rank holds the whole optimizer state and updates everything.
//   stage 1: gradients allreduced as in stage 0; each rank holds the fp32
//           master weights and optimizer state of its shard only, updates
//           its shard, and the new parameters are allgathered.
//   stage 2: gradients reduce-scattered in buckets as they become ready, so
//           each rank keeps only its shard of them (an fp32 accumulator);
//           update and allgather as in stage 1.
//
// The three stages reduce with the same operations (a reduce-scatter per
// bucket; stages 0 and 1 then allgather the reduced gradients), so at the
// same rank count they give bitwise the same parameters. docs/zero.md
// describes the layout, the memory per rank, and when to pick which.
//
// Host memory. Every member function documents whether it is collective
// (every rank of the communicator calls it, in the same order) or local.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <variant>
#include <vector>

#include "shardopt/communicator.hpp"
#include "shardopt/export.h"
#include "shardopt/optim.hpp"
#include "shardopt/types.hpp"

namespace shardopt {

// One parameter, registered from the user's buffers. The optimizer reads
// `data` at construction (the initial values of the master weights) and
// writes it in every step; it never frees either buffer, which must stay
// valid for the optimizer's lifetime.
struct Param {
  std::string name;          // unique among the parameters
  void* data = nullptr;      // numel elements of dtype
  std::size_t numel = 0;     // 0 is allowed (the parameter takes no room)
  DType dtype = DType::f32;  // f32, bf16 or f16; the same for every parameter
  // The gradient: numel elements of dtype, written by the user's backward
  // pass. Null: the optimizer allocates it (see grad()), as one flat
  // buffer laid out by buckets, so no gradient is ever packed; or, with
  // ZeroOptions::stream_grads, there is none (see there).
  void* grad = nullptr;
  int group = 0;  // index into the optimizer's parameter groups
  // The unit (ZeRO stage 3's gather granularity): consecutive parameters
  // with the same unit index form one unit; -1 (the default) makes the
  // parameter a unit of its own at stage 3. Units end gradient buckets at
  // every stage when any parameter sets one, so that the stages agree
  // bitwise with the same units.
  int unit = -1;
  // The tensor's shape, written to checkpoints and exports (its product is
  // numel); empty: one dimension of numel.
  std::vector<std::size_t> shape = {};
};

// What a custom element-wise optimizer receives: a run of consecutive
// elements of one parameter, all of one group.
struct CustomStep {
  std::span<float> params;             // fp32 values to update (the master weights)
  std::span<const float> grads;        // reduced, averaged, unscaled and clipped
  std::span<std::span<float>> states;  // one per state slot, zero before step 1
  std::int64_t step = 0;               // steps applied so far, this one included
  int group = 0;
};

// A user-supplied element-wise optimizer: `update` must compute each
// element from that element alone (params, grads and its state slots),
// since shards cut through parameters.
struct CustomOptimizer {
  std::string name = "custom";           // part of the layout fingerprint
  std::vector<std::string> state_names;  // one fp32 state per element each
  double lr = 1e-3;                      // passed through set_lr(); read it in update
  std::function<void(const CustomStep&, double lr)> update;
};

namespace detail {
template <class List>
struct ConfigOf;
template <class... O>
struct ConfigOf<OptimizerList<O...>> {
  using type = std::variant<O..., CustomOptimizer>;
};
}  // namespace detail

// The optimizer of a parameter group, with its hyper-parameters: one of
// shardopt/optimizers.hpp's (SHARDOPT_OPTIMIZERS, in that order), or a
// CustomOptimizer (always the last alternative).
using OptimizerConfig = detail::ConfigOf<Optimizers>::type;

// What step() does when a reduced gradient holds an inf or a NaN. The
// check is one pass over the rank's shard of the gradients before the
// update, and its verdict is agreed across ranks, so every rank does the
// same.
enum class NonFinite : int {
  automatic = 0,  // skip with a loss scaler, ignore without one
  skip = 1,       // skip the step: parameters, state and step count untouched; counted
  error = 2,      // throw NonFiniteError naming the first parameter and element; no update
  ignore = 3,     // no check: the update runs on what the gradients hold
};

// How gradients are combined across ranks.
enum class GradReduction : int {
  avg = 0,  // the mean over ranks, as DistributedDataParallel
  sum = 1,  // the sum
};

// Dynamic loss scaling for fp16 (and bf16) training. Multiply the loss by
// loss_scale() before the backward pass; step() unscales the gradients in
// the fused update, skips the step on every rank when any rank saw an inf
// or nan (the master weights and optimizer state stay untouched), and
// adapts the scale: after `hysteresis` consecutive overflowing steps it is
// multiplied by backoff_factor; after growth_interval steps in a row without
// overflow, by growth_factor. Defaults of torch.amp.GradScaler.
struct LossScaler {
  double init_scale = 65536.0;
  double growth_factor = 2.0;
  double backoff_factor = 0.5;
  int growth_interval = 2000;
  int hysteresis = 1;
  double min_scale = 1.0;  // the scale never backs off below this
};

struct ZeroOptions {
  int stage = 1;  // 0, 1, 2 or 3
  // Gradient bucket size in MiB (of reduced gradients). 0 takes
  // SHARDOPT_BUCKET_MB (default 25).
  double bucket_mb = 0.0;
  GradReduction reduction = GradReduction::avg;
  // Gradients are multiplied by 1 / predivide_factor before the reduction
  // (and the average finished after it), against fp16 overflow in the sum.
  double predivide_factor = 1.0;
  // Reduce 16-bit gradients in fp32 (twice the traffic, no rounding per
  // combination).
  bool reduce_in_fp32 = false;
  // bf16 parameters: keep the fp32 master as a 16-bit remainder beside the
  // bf16 parameters instead of a separate fp32 copy (docs/optimizers.md).
  bool param_remainders = false;
  // Stage 2: parameters registered with a null Param::grad get no gradient
  // buffer at all; their gradients are passed to grad_ready(i, grad) and
  // copied straight into their bucket, so no full-size gradient exists
  // anywhere (the memory of the ZeRO formula). Their buckets fill in
  // bucket buffers, two of them when gradients are marked ready in backward
  // order (each bucket launches as soon as it is complete), one more for
  // each bucket left filling by gradients marked in another order.
  bool stream_grads = false;
  std::optional<LossScaler> loss_scaler = std::nullopt;
  // Run check_sync() after every N-th applied step and throw DesyncError
  // (on every rank) if the parameters differ between ranks. 0 takes
  // SHARDOPT_CHECK_SYNC (default 0: never); -1 never, whatever the
  // environment says.
  int check_sync_every = 0;
  // Inf or NaN in a reduced gradient (NonFinite above). With a loss scaler
  // only automatic, skip and error are accepted: the scaler needs the check.
  NonFinite non_finite = NonFinite::automatic;
  // Parameters in device memory: the CUDA stream (a cudaStream_t) the
  // engine orders its work on, the one the gradients are computed on; null:
  // the device's default stream. docs/gpu.md says when the host waits.
  void* stream = nullptr;

  // Stage 3 (docs/zero.md, "Stage 3"). The most bytes of gathered units
  // a rank holds at once: those the code holds between gather() and
  // release(), those prefetched and those kept for backward. One pool of
  // this size is allocated at construction. 0: automatic, three times the
  // largest unit and at least 64 MiB, at most the whole model.
  std::size_t gather_limit_bytes = 0;
  // Gather the next units of the recorded order (the gathers of the last
  // step) ahead of the code's gather() calls, as far as the pool has room.
  bool prefetch = true;
  // true: release() frees the unit. false: a unit released that the
  // recorded order gathers again later in the step (after the forward
  // pass, for backward) is kept until then, while the pool has room.
  bool reshard_after_forward = true;
  // Units of fewer bytes stay whole on every rank (allgathered once after
  // each step): their gather would cost more in latency than their memory
  // saves. 0: none.
  std::size_t persist_below_bytes = 65536;
};

// What step() did.
struct StepInfo {
  bool applied = true;       // false: skipped (non-finite gradients, NonFinite::skip)
  bool grads_finite = true;  // agreed across ranks (checked unless NonFinite::ignore)
  double grad_norm = -1.0;   // the norm clip_grad_norm() returned this step; -1 if not called
  double loss_scale = 1.0;   // the scale of this step's gradients (1 without a scaler)
  std::int64_t step = 0;     // steps applied so far
  // Device parameters under NonFinite::skip (the default with a loss
  // scaler): the device decides whether the step applies (the non-finite
  // check agreed over ranks, which the fused update reads as its noop flag)
  // and step() returns without waiting for that verdict. pending is then
  // true, and applied, grads_finite and step say what the step does if the
  // gradients are finite, the ordinary case. steps(), skipped_steps(),
  // loss_scale() and the next step() wait for the verdict and count it.
  bool pending = false;
  // Stage 3: the code's gather() calls since the last step, and of them
  // those whose unit the engine had gathered ahead (prefetched, or kept
  // from the forward pass: ZeroOptions::prefetch, reshard_after_forward).
  std::int64_t gathers = 0;
  std::int64_t gathers_ahead = 0;
  // Wall seconds of this call's phases on this rank: finishing the gradient
  // reduction (waits included), the update (norm, checks, fused kernels),
  // and the allgather of the parameters (stages 1 and 2).
  double reduce_seconds = 0.0;
  double update_seconds = 0.0;
  double gather_seconds = 0.0;
  // The communication of this step on this rank, since the previous step()
  // (reductions started by grad_ready during the backward pass included).
  // Bytes: each collective's whole buffer, as nccl-tests counts them; the
  // reduction is the gradients' reduce-scatters (and, at stages 0 and 1,
  // their allgather), the gather the parameters' allgather. reduce_span:
  // from the first reduce-scatter's start to the reduction's end. exposed:
  // the time blocked waiting for these collectives, which no computation
  // hid. Bus bandwidth: bytes x (N-1)/N / time (the span, or
  // gather_seconds), in 1e9 bytes/s; 0 when nothing moved.
  std::uint64_t reduce_bytes = 0;
  std::uint64_t gather_bytes = 0;
  double reduce_span_seconds = 0.0;
  double exposed_comm_seconds = 0.0;
  double reduce_busbw_gbps = 0.0;
  double gather_busbw_gbps = 0.0;
};

// What check_sync() found; the same on every rank.
struct SyncReport {
  bool in_sync = true;
  // The first parameter (in registration order) whose bytes differ between
  // ranks, and the first element of it that differs from rank 0's copy.
  std::string param;
  std::size_t index = 0;
  std::size_t element = 0;
  // In words: which ranks hold which copy, and the element's value on each
  // rank; "" when in sync.
  std::string message;
};

// Bytes this rank allocated, by category, and the user's buffers the
// optimizer works on (not allocated by shardopt), for comparison with the
// ZeRO formula (docs/zero.md).
struct MemoryReport {
  std::size_t master_params = 0;      // fp32 master weights (or remainders)
  std::size_t optimizer_state = 0;    // moments, momentum buffers, ...
  std::size_t grad_shard = 0;         // stage 2: the fp32 gradient shard
  std::size_t reduced_grads = 0;      // full fp32 gradients (reduce_in_fp32, 16-bit, stages 0/1)
  std::size_t owned_grads = 0;        // gradient buffers the optimizer owns (Param::grad null)
  std::size_t buckets = 0;            // communication buckets and scratch
  std::size_t param_shard = 0;        // stage 3: this rank's pieces of the parameters
  std::size_t gather_pool = 0;        // stage 3: the gathered units' pool (and any overflow)
  std::size_t persistent_params = 0;  // stage 3: the units kept whole (persist_below_bytes)
  std::size_t user_params = 0;        // the registered parameter buffers
  std::size_t user_grads = 0;         // registered gradient buffers (not owned ones)
  // Where allocated() is: in device memory (parameters on a device) and in
  // host memory. The pinned slots of a communicator's staged backend (3 x
  // SHARDOPT_STAGED_CHUNK_KB KiB x ranks per communicator) and the shared
  // memory of its shm or hier backend (2 x SHARDOPT_SHM_CHUNK_KB KiB x the
  // node's ranks per communicator, once per node) are not counted.
  std::size_t device_bytes = 0;
  std::size_t host_bytes = 0;
  // Of allocated(): this rank's part of memory the ranks of its node share
  // (stage 2's fused update keeps the owned gradients there,
  // SHARDOPT_FUSED_UPDATE). Each rank counts its own part, so the sum over
  // a node's ranks counts the shared memory once.
  std::size_t node_shared = 0;
  // Everything shardopt allocated.
  std::size_t allocated() const noexcept {
    return master_params + optimizer_state + grad_shard + reduced_grads + owned_grads + buckets +
           param_shard + gather_pool + persistent_params;
  }
};

// What a run would allocate, described without running it: the inputs of
// plan_memory().
struct MemoryPlan {
  std::vector<std::size_t> numel;  // each parameter's elements, in registration order
  // Each parameter's Param::unit (empty: -1 for every one): units end
  // buckets at every stage, and are stage 3's gathers.
  std::vector<int> units;
  DType dtype = DType::f32;                        // of every parameter (f32, bf16, f16)
  std::vector<OptimizerConfig> groups = {Adam{}};  // the parameter groups' optimizers
  // stage, bucket_mb (0: SHARDOPT_BUCKET_MB), reduce_in_fp32,
  // param_remainders, stream_grads, predivide_factor, and at stage 3
  // gather_limit_bytes and persist_below_bytes are read.
  ZeroOptions options = {};
  int ranks = 1;  // the communicator's size
  int rank = 0;   // whose memory
  int nodes = 1;  // nodes the ranks span (the same number on each)
  // Where the parameters live: host memory, or one device per rank.
  bool device = false;
  // The gradients: in buffers of the user's (Param::grad set), or owned by
  // the optimizer (Param::grad null; with options.stream_grads, streamed).
  bool user_grads = false;
  // Whether the user's parameter (and gradient) buffers are each one flat
  // buffer, in registration order (as a framework's flat parameter
  // buffer): buckets are then reduced and gathered in place, without
  // bucket buffers. false: each parameter its own allocation.
  bool contiguous = true;
  // OpenMP threads per rank (stage 2's fused update keeps a block per
  // thread); 0: this process's omp_get_max_threads(), as the engine counts
  // them (OMP_NUM_THREADS, else the cores): see plan_threads().
  int threads = 0;
};

// Local, no MPI: the OpenMP threads per rank that plan_memory() counts for
// `plan`: plan.threads when it is 1 or more; when 0, the threads a
// ZeroRedundancyOptimizer constructed in this process would use,
// omp_get_max_threads() (OMP_NUM_THREADS if set, else the cores), at
// least 1. Throws InvalidArgument when plan.threads is negative.
SHARDOPT_API int plan_threads(const MemoryPlan& plan);

// Local, no MPI: the MemoryReport that memory_report() gives on `rank`
// right after constructing a ZeroRedundancyOptimizer with these
// parameters, options and ranks, computed by the engine's own layout and
// buffer-sizing code, with this process's SHARDOPT_* settings
// (SHARDOPT_BUCKET_MB, SHARDOPT_HOST_COMM, SHARDOPT_FUSED_UPDATE). It
// assumes what the engine finds out at construction goes the common way:
// the shared memory and the reads of other ranks' memory that the fused
// stage-2 update needs are available. Buckets filled out of backward order
// with stream_grads add bucket buffers later (one per bucket left filling). Throws
// InvalidArgument naming a bad input.
SHARDOPT_API MemoryReport plan_memory(const MemoryPlan& plan);

// The layout of the same run (docs/zero.md): each gradient bucket's
// elements, padded to a multiple of 16 x ranks (what each bucket's
// collectives move), the elements of a rank's shard (its piece of every
// bucket), and of its state buffers (the shard; stage 0: ranks x shard).
// At stage 3 also each unit as the engine gathers it: its buckets
// [first_bucket, end_bucket), the bytes a gather writes (to its last
// bucket's padding) and whether it stays whole (persist_below_bytes).
// Local, no MPI; throws as plan_memory().
struct LayoutPlan {
  struct Unit {
    std::size_t first_bucket = 0, end_bucket = 0;
    std::size_t bytes = 0;
    bool persistent = false;
  };
  std::vector<std::size_t> buckets;
  std::size_t shard = 0;
  std::size_t storage = 0;
  std::vector<Unit> units;  // stage 3 only
};
SHARDOPT_API LayoutPlan plan_layout(const MemoryPlan& plan);

// The optimizer-state bytes per parameter of a group's optimizer: 4 (fp32)
// for each state slot its options use (Adam: 8, with amsgrad 12), the
// state_bytes of zero_memory_formula. Local.
inline double state_bytes_per_param(const OptimizerConfig& config) {
  return std::visit(
      [](const auto& o) {
        double bytes = 0.0;
        if constexpr (is_optimizer<std::remove_cvref_t<decltype(o)>>)
          o.slots([&bytes](const Slot& s) { bytes += s.used ? 4.0 : 0.0; });
        else
          bytes = 4.0 * static_cast<double>(o.state_names.size());
        return bytes;
      },
      config);
}

// The memory per rank of the ZeRO paper for psi parameters of `dtype` on
// `ranks` ranks with state_bytes optimizer-state bytes per parameter (Adam:
// 8): model parameters and gradients (dtype), fp32 master weights for 16-bit
// dtypes, the state, and in stages 2 and 3 shardopt's fp32 gradient shard
// (the paper counts a 16-bit one). Mixed-precision Adam: stage 0: 16 psi,
// stage 1: 4 psi + 12 psi / N, stage 2: 2 psi + 16 psi / N, stage 3:
// 18 psi / N. Buckets, and at stage 3 the units gathered at a time (the
// pool) and those kept whole, are not included. Local.
SHARDOPT_API double zero_memory_formula(int stage, double psi, int ranks, DType dtype,
                                        double state_bytes);

// One run of consecutive elements of one parameter that this rank owns.
struct ShardRange {
  std::size_t param = 0;   // index of the parameter
  std::size_t offset = 0;  // first element within the parameter
  std::size_t count = 0;
  std::size_t shard_offset = 0;  // position in this rank's state buffers
};

// Checkpoints (docs/checkpoint.md; the file format: docs/checkpoint-format.md).
struct SaveOptions {
  // Keep this many checkpoints: the newest at the path, older ones at
  // path.1 (the newest of them), path.2, ... 1: replace the file.
  int keep_last = 1;
  std::uint64_t chunk_bytes = 1 << 20;  // checksum chunk size
  // The application's own values (its data position, an epoch, ...),
  // stored in the file's metadata as "user.<key>" and returned by load() in
  // LoadReport::metadata. Rank 0's are written.
  std::map<std::string, std::string> metadata = {};
};

struct LoadOptions {
  // true: any difference between the file and the optimizer (a tensor
  // missing, unexpected or of another shape or dtype, another optimizer
  // kind or number of groups) is an error, and nothing changes. false:
  // the tensors that match are loaded and the rest reported.
  bool strict = true;
  // Take every group's hyper-parameters from the file (as torch's
  // load_state_dict does) when the optimizer kind and the number of groups
  // match; false keeps the current ones.
  bool hyper_parameters = true;
};

// What load() did; the same on every rank.
struct LoadReport {
  std::vector<std::string> loaded;              // tensors loaded
  std::vector<std::string> missing;             // the optimizer's tensors not in the file
  std::vector<std::string> unexpected;          // tensors of the file the optimizer has not
  std::vector<std::string> mismatched;          // in both, another shape or dtype ("name: why")
  std::int64_t step = 0;                        // the step count restored
  int saved_ranks = 0;                          // the rank count the file was saved at
  bool hyper_parameters = false;                // whether the groups' values were restored
  std::map<std::string, std::string> metadata;  // SaveOptions::metadata of the save
  // One line per non-empty list, for logs.
  SHARDOPT_API std::string summary() const;
};

struct ExportOptions {
  // true: fp32 values (the master weights); false: the model's dtype (the
  // parameter buffers as they are).
  bool fp32 = true;
};

namespace detail {
class ZeroEngine;
}

class SHARDOPT_API ZeroRedundancyOptimizer {
 public:
  // Collective over comm. Registers the parameters (in this order, the same
  // on every rank), allocates every buffer once, and agrees on the layout
  // across ranks: every rank must pass the same parameters (names, sizes,
  // dtypes, groups), the same optimizer kind and hyper-parameters, and the
  // same options. On any difference, or a bad argument on any rank, every
  // rank throws the same error naming the first difference (a
  // LayoutMismatch error, ErrorCode::layout_mismatch) or the bad argument.
  // `groups[g]` is the optimizer of parameter group g; every group uses the
  // same kind of optimizer. The communicator must outlive the optimizer.
  ZeroRedundancyOptimizer(Communicator& comm, std::vector<Param> params,
                          std::vector<OptimizerConfig> groups, ZeroOptions options = {});
  // One group.
  ZeroRedundancyOptimizer(Communicator& comm, std::vector<Param> params, OptimizerConfig optimizer,
                          ZeroOptions options = {});
  ZeroRedundancyOptimizer(ZeroRedundancyOptimizer&&) noexcept;
  ZeroRedundancyOptimizer& operator=(ZeroRedundancyOptimizer&&) noexcept;
  ZeroRedundancyOptimizer(const ZeroRedundancyOptimizer&) = delete;
  ZeroRedundancyOptimizer& operator=(const ZeroRedundancyOptimizer&) = delete;
  // Waits for any communication still in flight. Never throws.
  virtual ~ZeroRedundancyOptimizer();

  // Local (waits for reductions in flight): zeroes every gradient buffer
  // (registered or owned) and discards what was marked ready or reduced
  // since the last step, micro-batches reduced into the stage-2 shard
  // included.
  void zero_grad();

  // Local (communication may start): parameter i's gradient is complete
  // for this micro-batch. In stage 2 its bucket is reduce-scattered,
  // without blocking, as soon as the bucket is full; buckets start in
  // descending order (the order of a backward pass over parameters
  // registered in forward order), so a bucket waits for those after it.
  // Until step() or reduce_gradients() returns, the gradient buffer must
  // not change. Marking no parameter ready is fine: step() then reduces
  // everything at once. Marking some but not all is an error, on every
  // rank, at the next reduce_gradients(), clip_grad_norm() or step(), which
  // lists the parameters never marked. Stages 0 and 1 reduce once per step:
  // marking gradients after their reduction is an error.
  void grad_ready(std::size_t i);
  // As grad_ready(i), with the gradient in `grad` (numel elements of the
  // parameter's dtype): it is copied into the parameter's gradient buffer
  // (grad(i)) before the call returns, so the caller may reuse `grad`.
  void grad_ready(std::size_t i, const void* grad);
  // Device parameters: as grad_ready(i) (grad null) or grad_ready(i, grad),
  // for a gradient written by work on `stream` (a cudaStream_t of the
  // parameters' device) rather than on the optimizer's (ZeroOptions::stream).
  // The optimizer's stream waits for what `stream` has enqueued so far (an
  // event; the host does not wait) before it reads the gradient, so a bucket
  // whose gradients come from several streams waits for each of them.
  // A null stream: the device's default stream. Host parameters: an error.
  void grad_ready_on(void* stream, std::size_t i, const void* grad = nullptr);

  // Collective: ends a micro-batch. Stage 2: reduces every gradient not
  // reduced yet into the fp32 gradient shard, which sums the micro-batches,
  // and zeroes the gradient buffers for the next micro-batch; call it after
  // each micro-batch but the last, whose gradients step() (or
  // clip_grad_norm()) reduces. Stages 0 and 1 reduce once per step, in
  // place: accumulate micro-batches in the gradient buffers instead and let
  // step() reduce them (calling this once before step() is allowed).
  void reduce_gradients();

  // Collective: finishes the reduction (as reduce_gradients() when a
  // micro-batch is pending), computes the global L2 norm of the reduced,
  // averaged, unscaled gradients from the shards (one small collective),
  // and sets the clip coefficient max_norm / (norm + 1e-6) (at most 1) that
  // the next step() applies inside its fused update. Returns the norm, as
  // torch.nn.utils.clip_grad_norm_ does (inf or nan if a gradient is).
  double clip_grad_norm(double max_norm);

  // Collective: one optimizer step. Finishes the reduction, checks the
  // gradients (with a loss scaler), runs the fused update on this rank's
  // shard (stage 0: on everything) and allgathers the new parameters into
  // every rank's parameter buffers. Afterwards every rank's parameters are
  // identical. Gradient buffers: in stages 0 and 1 they hold the sums over
  // ranks afterwards (of the predivided gradients; not averaged, not
  // unscaled), except with reduce_in_fp32; otherwise they are as the user
  // left them.
  StepInfo step();

  // The loss scale to multiply the loss by (1 without a loss scaler). Local.
  double loss_scale() const;
  // Steps applied so far. Local.
  std::int64_t steps() const;
  // Steps skipped for non-finite gradients since construction.
  std::int64_t skipped_steps() const;
  int stage() const;
  std::size_t num_params() const;
  const Param& param(std::size_t i) const;
  // Parameter i's gradient buffer (the registered or the owned one; null
  // for a streamed one, see ZeroOptions::stream_grads). Local.
  void* grad(std::size_t i);

  // The hyper-parameters of group g; change them between steps (learning
  // rate schedules), keeping the kind of optimizer and the same values on
  // every rank. Local.
  OptimizerConfig& param_group(int g);
  int num_groups() const;
  // Sets the learning rate of every group (or of group g). Local.
  void set_lr(double lr, int group = -1);

  // Inspection. The names of the fp32 state kept per element: "master"
  // (the fp32 master weights; the parameters themselves for fp32), then the
  // optimizer's ("exp_avg", "exp_avg_sq", "max_exp_avg_sq",
  // "momentum_buffer", "sum", "square_avg", "grad_avg", or a custom
  // optimizer's state_names). Local.
  std::vector<std::string> state_names() const;
  // The runs of parameters whose state this rank holds (stage 0: all).
  // Local.
  std::span<const ShardRange> owned_ranges() const;
  // Collective: the whole of state `name` of parameter i, gathered from the
  // shards onto every rank. Throws InvalidArgument for an unknown name.
  std::vector<float> gather_state(std::string_view name, std::size_t i) const;
  // Collective: every state of parameter i by name, each gathered as by
  // gather_state() (torch's optimizer.state[p]; the step count is steps()).
  std::map<std::string, std::vector<float>> state(std::size_t i) const;

  // Bytes allocated by category. Local.
  MemoryReport memory_report() const;

  // Collective: writes a checkpoint to `path` (one safetensors file): every
  // parameter's fp32 master values (tensor "<name>"), every optimizer state
  // ("<name>.<state>", state_names()), the loss scaler's state, the step
  // count and every group's hyper-parameters. Every rank writes the ranges
  // of its own shard with collective MPI-IO; the file appears at `path`
  // only once every rank's write succeeded (atomic rename), otherwise every
  // rank throws the same IoError and the previous file at `path` is
  // untouched. Pending gradient reductions are discarded first (save
  // between steps). The file loads at any rank count.
  void save(const std::string& path, const SaveOptions& options = {});
  // Collective: restores a checkpoint written by save(), at any rank count
  // and stage: each rank reads only the ranges of its shard and verifies
  // their checksums; the parameters are then allgathered into every rank's
  // parameter buffers. Everything is validated before anything changes: on
  // any error (a bad or corrupted file, a mismatch in strict mode) every
  // rank throws the same CheckpointError or IoError and the optimizer and
  // the parameters are unchanged.
  LoadReport load(const std::string& path, const LoadOptions& options = {});
  // Collective: writes the parameters only (tensor "<name>" each) as a plain
  // safetensors file, for inference, in parallel and atomically as save().
  void export_params(const std::string& path, const ExportOptions& options = {});

  // Stage 3. Units in registration order (Param::unit). Collective:
  // gathers unit u's parameters from the shards into a buffer of the
  // optimizer's; data(i) then points at parameter i of it until
  // release(u) (local). Until then the parameters are read only.
  std::size_t num_units() const;
  void gather(std::size_t unit);
  // Collective: as gather(), returning once the allgathers are issued, so
  // that they move while the caller computes (prefetch the next unit);
  // data(i) and release(unit) wait for them.
  void igather(std::size_t unit);
  void release(std::size_t unit);
  // Parameter i's whole values: the registered buffer at stages 0-2; at
  // stage 3 the gathered unit's buffer, null while it is not gathered.
  // Local.
  const void* data(std::size_t i) const;

  // Collective: whether every rank's parameter buffers hold the same bytes
  // (one 64-bit checksum per parameter, compared across ranks), and if not,
  // the first parameter and element that differ. Call between steps. At
  // stage 3, with no unit gathered: each unit as a gather gives it (one at
  // a time through the pool) and the units kept whole.
  // ZeroOptions::check_sync_every (SHARDOPT_CHECK_SYNC) runs it after steps.
  SyncReport check_sync();

 protected:
  std::unique_ptr<detail::ZeroEngine> engine_;
};

// Stage 0 under the name torch.distributed.optim users know: gradients
// allreduced in buckets, the whole update on every rank. options.stage is
// ignored (always 0).
class SHARDOPT_API DistributedOptimizer : public ZeroRedundancyOptimizer {
 public:
  DistributedOptimizer(Communicator& comm, std::vector<Param> params,
                       std::vector<OptimizerConfig> groups, ZeroOptions options = {});
  DistributedOptimizer(Communicator& comm, std::vector<Param> params, OptimizerConfig optimizer,
                       ZeroOptions options = {});
};

}  // namespace shardopt
