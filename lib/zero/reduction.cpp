// shardopt: the ZeRO engine's gradient reduction and parameter allgather
// (lib/zero/reduction.hpp) through the collectives; the fused step's own
// part is fused_reduction.cpp.
#include "zero/reduction.hpp"

#include <mpi.h>

#include <algorithm>
#include <climits>
#include <cstdint>
#include <cstring>
#include <string>

#include "comm/agree.hpp"
#include "comm/node_access.hpp"
#include "common/check.hpp"
#include "common/language.hpp"
#include "common/log.hpp"
#include "device/device.hpp"
#include "kernels/reduce.hpp"
#include "shardopt/config.hpp"

namespace shardopt::detail {

namespace {
// Streamed gradients copied into a bucket from this many bytes on are
// written past the caches: every rank reads the bucket later, from memory.
constexpr std::size_t kStreamCopyBytes = std::size_t{4} << 20;
}  // namespace

GradReducer::GradReducer(Communicator& comm, Communicator& ctl, const Space& space,
                         const std::vector<Param>& params, const ShardLayout& layout,
                         const ZeroOptions& options, DType dtype, DType reduce_type, Watch watch,
                         bool fusable, bool gathers_params)
    : comm_(comm),
      ctl_(ctl),
      space_(space),
      params_(params),
      layout_(layout),
      opt_(options),
      dtype_(dtype),
      reduce_type_(reduce_type),
      elem_(dtype_size(dtype)),
      rank_(comm.rank()),
      nranks_(comm.size()),
      watch_(std::move(watch)),
      fusable_(fusable),
      gathers_params_(gathers_params) {
  for (const BucketRange& b : layout_.buckets) buckets_.push_back(Bucket{b});
  ready_.assign(params_.size(), 0);
  next_launch_ = buckets_.size();
  allocate();
}

GradReducer::~GradReducer() {
  for (Flight& f : flights_) {
    try {
      f.request.wait();
    } catch (...) {  // a destructor never throws; the Request logs
    }
  }
}

// The gradient buffers, and which buckets the collectives can run on in
// place.
void GradReducer::allocate() {
  // The sizes of lib/zero/buffers.hpp, which plan_memory() adds up.
  grad_shard_ = space_.allocate(grad_shard_bytes(layout_, opt_.stage), "the gradient shard");
  reduced_ = space_.allocate(reduced_bytes(layout_, nranks_, opt_.stage, dtype_, reduce_type_),
                             "the fp32 reduced gradients");
  // Null gradients: the optimizer owns them, or, with stream_grads (stage
  // 2), they exist only in their buckets, copied in by grad_ready(i, grad).
  bool owned = false;
  streamed_.assign(params_.size(), 0);
  for (std::size_t i = 0; i < params_.size(); ++i) {
    if (params_[i].grad != nullptr || params_[i].numel == 0) continue;
    if (opt_.stream_grads)
      streamed_[i] = 1;
    else
      owned = true;
  }
  // The fused step (reduction.hpp): decided on agreed values only, then
  // agreed on whether every rank's gradients are all owned (kept in shared
  // memory) or all the user's (read from the other ranks' memory).
  // The same conditions, not the fused update, share the streamed
  // gradients' bucket buffers.
  std::int64_t fuse[3] = {0, 0, 0};  // all owned, all the user's, streamed buckets shared
  if (opt_.stage == 2 && settings().fused_update && !space_.on_device() && nranks_ > 1 &&
      node_access(comm_) != nullptr) {
    bool all_owned = true, all_user = true;
    for (const Param& p : params_) {
      all_owned = all_owned && (p.grad == nullptr || p.numel == 0);
      all_user = all_user && (p.grad != nullptr || p.numel == 0);
    }
    const bool plain = !opt_.stream_grads && reduce_type_ == dtype_ && opt_.predivide_factor == 1.0;
    fuse[0] = fusable_ && plain && owned && all_owned;
    fuse[1] = fusable_ && plain && all_user;
    fuse[2] = std::find(streamed_.begin(), streamed_.end(), 1) != streamed_.end();
    ctl_.allreduce(fuse, fuse, 3, DType::i64, ReduceOp::min);
    if (fuse[0] != 0) share_owned_grads(owned_grad_bytes(layout_, nranks_, dtype_));
  }
  if (owned && !fused_)
    owned_grads_ = space_.allocate(owned_grad_bytes(layout_, nranks_, dtype_), "the gradients");
  std::byte* owned_base =
      fused_ ? const_cast<std::byte*>(peers_[std::size_t(rank_)]) : owned_grads_.as<std::byte>();
  grad_ptr_.resize(params_.size());
  for (std::size_t i = 0; i < params_.size(); ++i) {
    grad_ptr_[i] = params_[i].grad != nullptr ? static_cast<std::byte*>(params_[i].grad)
                   : owned                    ? owned_base + layout_.flat[i] * elem_
                                              : nullptr;
  }
  if (fuse[1] != 0) read_peer_grads();  // needs every rank's grad_ptr_
  std::vector<BucketInPlace> in_place;
  for (Bucket& b : buckets_) {
    const auto contiguous = [&](auto ptr_of) {
      std::byte* base = nullptr;
      std::byte* next = nullptr;
      for (std::size_t p = b.first_param; p < b.end_param; ++p) {
        if (params_[p].numel == 0) continue;
        std::byte* ptr = ptr_of(p);
        if (base == nullptr) {
          base = ptr + (b.begin - layout_.flat[p]) * elem_;
        } else if (ptr != next) {
          return static_cast<std::byte*>(nullptr);
        }
        next = ptr + params_[p].numel * elem_;
      }
      return base;
    };
    bool all_owned = true, any_streamed = false;
    for (std::size_t p = b.first_param; p < b.end_param; ++p) {
      all_owned = all_owned && (params_[p].grad == nullptr || params_[p].numel == 0);
      any_streamed = any_streamed || streamed_[p] != 0;
    }
    if (opt_.predivide_factor == 1.0 && reduce_type_ == dtype_ && !any_streamed &&
        (b.len == b.padded || all_owned))
      b.grad_base = contiguous([&](std::size_t p) { return grad_ptr_[p]; });
    if (b.len == b.padded)
      b.param_base =
          contiguous([&](std::size_t p) { return static_cast<std::byte*>(params_[p].data); });
    in_place.push_back({b.grad_base != nullptr, b.param_base != nullptr || !gathers_params_});
  }
  const std::size_t pool_bytes = detail::pool_bytes(layout_, nranks_, opt_.stage, dtype_,
                                                    reduce_type_, reduced_.size() > 0, in_place);
  pool_bytes_ = pool_bytes;
  if (fuse[2] != 0) share_pool(pool_bytes);  // every rank: each has a streamed bucket
  if (pool_bytes > 0) {
    while (pool_.size() < 2) pool_.push_back(space_.allocate(pool_bytes, "the bucket buffers"));
    pool_busy_.assign(pool_.size(), false);
  }
}

const void* GradReducer::reduced_grad(const Segment& s, DType& type) const {
  if (pending_)
    throw_error(ErrorCode::internal, "the reduced gradients were read before materialize()",
                "report this as a bug in shardopt", __FILE__, __LINE__);
  if (opt_.stage == 2) {
    type = DType::f32;
    return grad_shard_.as<float>() + s.storage;
  }
  if (reduced_.size() > 0) {
    type = DType::f32;
    return reduced_.as<float>() + s.flat;
  }
  type = dtype_;
  return grad_ptr_[s.param] + s.offset * elem_;
}

void GradReducer::end_step() {
  pending_ = false;
  release_held();
  stats_ = CommStats{};
  micro_batches_ = 0;
  reduced_once_ = false;
  open_ = true;
}

void GradReducer::add_memory(MemoryReport& m) const {
  m.grad_shard = grad_shard_.size();
  m.reduced_grads = reduced_.size();
  m.owned_grads = shared_ != nullptr ? shared_bytes_ : owned_grads_.size();
  m.node_shared =
      (shared_ != nullptr ? shared_bytes_ : 0) + (shared_pool_ != nullptr ? 2 * pool_bytes_ : 0);
  m.buckets += blocks_.size() + slices_.size();
  for (const SpaceBuffer& b : pool_) m.buckets += b.size();
}

void GradReducer::to_bucket(const Bucket& b, std::size_t lo, std::size_t hi, const UserPtr& user,
                            std::byte* buf) const {
  for (std::size_t p = b.first_param; p < b.end_param; ++p) {
    const auto [s, e] = overlap(p, lo, hi);
    if (s < e)
      space_.copy(buf + (s - b.begin) * elem_, user(p) + (s - layout_.flat[p]) * elem_,
                  (e - s) * elem_);
  }
}

void GradReducer::from_bucket(const Bucket& b, std::size_t lo, std::size_t hi, const UserPtr& user,
                              const std::byte* buf) const {
  for (std::size_t p = b.first_param; p < b.end_param; ++p) {
    const auto [s, e] = overlap(p, lo, hi);
    if (s < e)
      space_.copy(user(p) + (s - layout_.flat[p]) * elem_, buf + (s - b.begin) * elem_,
                  (e - s) * elem_);
  }
}

void GradReducer::drain() {
  while (!flights_.empty()) {
    complete(flights_.front());
    flights_.pop_front();
  }
}

void GradReducer::clear_marks() {
  std::fill(ready_.begin(), ready_.end(), 0);
  for (Bucket& b : buckets_) b.ready = 0;
  next_launch_ = buckets_.size();
  marked_any_ = false;
}

void GradReducer::discard() {
  drain();
  clear_marks();
  for (Bucket& b : buckets_) {
    if (b.staging >= 0) pool_busy_[std::size_t(b.staging)] = false;
    b.staging = -1;
  }
  micro_batches_ = 0;
  reduced_once_ = false;
  open_ = true;
  pending_ = holding_ = false;
}

void GradReducer::zero_grad_buffers() {
  for (std::size_t i = 0; i < params_.size(); ++i)
    if (grad_ptr_[i] != nullptr && params_[i].numel > 0)
      space_.zero(grad_ptr_[i], params_[i].numel * elem_);
}

void GradReducer::grad_ready(std::size_t i, const void* grad,
                             std::optional<StreamHandle> producer) {
  const Param& p = params_[i];
  if (opt_.stage < 2 && reduced_once_)
    throw_error(ErrorCode::invalid_state,
                "grad_ready(" + index_text(i) +
                    ") after the gradients of this step were "
                    "reduced (stage " +
                    std::to_string(opt_.stage) + ")",
                "stages 0 and 1 reduce once per step: accumulate micro-batches in the gradient "
                "buffers and mark them ready in the last one only, or use stage 2",
                __FILE__, __LINE__);
  if (ready_[i] != 0)
    throw_error(
        ErrorCode::invalid_state,
        "grad_ready(" + index_text(i) + ") ('" + p.name + "') was called twice in one micro-batch",
        "mark each gradient ready once per micro-batch; reduce_gradients() or step() "
        "starts the next one",
        __FILE__, __LINE__);
  if (streamed_[i] != 0 && grad == nullptr)
    throw_error(ErrorCode::invalid_argument,
                "grad_ready(" + index_text(i) + ") ('" + p.name +
                    "'): the parameter has no gradient buffer (Param::grad is null in stage 2)",
                "pass its gradient: grad_ready(i, grad), which copies it into its bucket", __FILE__,
                __LINE__);
  // The registered buffer was checked at construction; another one is
  // located here (one pointer query, off the common path).
  if (grad != nullptr && p.numel > 0 && grad != grad_ptr_[i] &&
      space_.on_device() != (locate(grad).kind != MemoryKind::host))
    throw_error(ErrorCode::wrong_device,
                "grad_ready(" + index_text(i) + ") ('" + p.name + "'): the gradient is in " +
                    location_name(locate(grad)) + " but the optimizer's parameters are in " +
                    space_.name(),
                "pass a gradient in the memory the optimizer was built on (copy it there first)",
                __FILE__, __LINE__);
  if (producer) {
    if (!space_.on_device())
      throw_error(ErrorCode::invalid_argument,
                  "grad_ready(" + index_text(i) + ") ('" + p.name +
                      "'): a stream was given but the optimizer's parameters are in host memory",
                  "pass no stream (null) for host parameters", __FILE__, __LINE__);
    const int sd = space_.stream_device(*producer);
    if (sd != space_.location().device)
      throw_error(
          ErrorCode::wrong_device,
          "grad_ready(" + index_text(i) + ") ('" + p.name + "'): the stream belongs to device " +
              std::to_string(sd) + " but the optimizer's parameters are in " + space_.name(),
          "pass the stream that wrote the gradient, on the parameters' device", __FILE__, __LINE__);
    // Every stream that wrote into a bucket is waited on: each call orders
    // the engine's stream after its own producer.
    space_.order_after(*producer, produced_);
  }
  if (streamed_[i] == 0 && grad != nullptr && p.numel > 0 && grad != grad_ptr_[i])
    space_.copy(grad_ptr_[i], grad, p.numel * elem_);
  marked_any_ = true;
  open_ = true;
  ready_[i] = 1;
  // The buckets the parameter spans, from its last to its first, as they
  // launch. Each one launches as soon as it is complete, before the next is
  // filled: a parameter that spans many buckets streams through the two
  // bucket buffers, one filling while the one before is in flight.
  const std::size_t first = p.numel > 0 ? layout_.bucket_of(layout_.flat[i]) : 0;
  for (std::size_t b = p.numel > 0 ? layout_.bucket_of(layout_.flat[i] + p.numel - 1) + 1 : first;
       b-- > first;) {
    if (streamed_[i] != 0) stream_grad(b, i, static_cast<const std::byte*>(grad));
    const auto [s, e] = overlap(i, buckets_[b].begin, buckets_[b].begin + buckets_[b].len);
    buckets_[b].ready += e - s;
    launch_ready_buckets(hold_);
  }
  progress();
}

void GradReducer::launch_ready_buckets(std::size_t floor) {
  if (fused_) return;  // the update reads the gradients where they are
  while (next_launch_ > floor &&
         buckets_[next_launch_ - 1].ready == buckets_[next_launch_ - 1].len) {
    --next_launch_;
    launch(next_launch_);
  }
}

int GradReducer::acquire_pool() {
  for (;;) {
    for (std::size_t k = 0; k < pool_.size(); ++k) {
      if (!pool_busy_[k]) {
        pool_busy_[k] = true;
        return static_cast<int>(k);
      }
    }
    if (flights_.empty()) break;
    complete(flights_.front());  // the oldest reduction frees its buffer
    flights_.pop_front();
  }
  // Every buffer holds a bucket still being filled while the bucket that
  // launches next is incomplete (gradients streamed out of backward order):
  // one more, kept for later steps.
  pool_.push_back(space_.allocate(pool_bytes_, "the bucket buffers"));
  pool_busy_.push_back(true);
  std::string filling;
  for (std::size_t b = 0; b < buckets_.size(); ++b)
    if (buckets_[b].staging >= 0) filling += (filling.empty() ? "" : ", ") + std::to_string(b);
  SHARDOPT_LOG(
      info, "ZeRO engine: " << pool_.size() << " bucket buffers: buckets " << filling
                            << " are being filled while bucket " << next_launch_ - 1
                            << ", which launches next, is incomplete (buckets launch from the "
                               "last parameter's to the first's: mark gradients ready in backward "
                               "order to stream them through two buffers)");
  return static_cast<int>(pool_.size() - 1);
}

void GradReducer::stream_grad(std::size_t bi, std::size_t p, const std::byte* grad) {
  Bucket& b = buckets_[bi];
  const std::size_t rsize = dtype_size(reduce_type_);
  if (b.staging < 0) {
    b.staging = acquire_pool();
    std::byte* buf = pool_[std::size_t(b.staging)].as<std::byte>();
    space_.zero(buf + b.len * rsize, (b.padded - b.len) * rsize);
  }
  std::byte* buf = pool_[std::size_t(b.staging)].as<std::byte>();
  const auto [s, e] = overlap(p, b.begin, b.begin + b.len);
  if (!space_.on_device() && reduce_type_ == dtype_ && opt_.predivide_factor == 1.0) {
    // Large copies go past the caches: the bucket is read by every rank,
    // from memory, once it is full. (Host only: non-temporal stores are the
    // CPU's; on a device the copy below is enqueued like any other.)
    const std::size_t bytes = (e - s) * elem_;
    kernels::cpu::copy_bytes(buf + (s - b.begin) * rsize, grad + (s - layout_.flat[p]) * elem_,
                             bytes, bytes >= kStreamCopyBytes);
    return;
  }
  space_.convert(grad + (s - layout_.flat[p]) * elem_, dtype_, buf + (s - b.begin) * rsize,
                 reduce_type_, e - s, static_cast<float>(1.0 / opt_.predivide_factor));
}

void GradReducer::pack_grads(std::size_t bi, void* dst) const {
  const Bucket& b = buckets_[bi];
  const std::size_t rsize = dtype_size(reduce_type_);
  auto* out = static_cast<std::byte*>(dst);
  const float mul = static_cast<float>(1.0 / opt_.predivide_factor);
  for (std::size_t p = b.first_param; p < b.end_param; ++p) {
    const auto [s, e] = overlap(p, b.begin, b.begin + b.len);
    if (s >= e || streamed_[p] != 0) continue;  // streamed ones are in place already
    space_.convert(grad_ptr_[p] + (s - layout_.flat[p]) * elem_, dtype_,
                   out + (s - b.begin) * rsize, reduce_type_, e - s, mul);
  }
  space_.zero(out + b.len * rsize, (b.padded - b.len) * rsize);
}

void GradReducer::launch(std::size_t bi) {
  const Bucket& b = buckets_[bi];
  const std::size_t pc = piece(b);
  const std::size_t rsize = dtype_size(reduce_type_);
  if (stats_.first_launch < 0) stats_.first_launch = MPI_Wtime();
  stats_.reduce_bytes += pc * std::size_t(nranks_) * rsize;
  Flight f;
  f.bucket = bi;
  if (opt_.stage < 2) {
    // In place: this rank's reduced piece lands where its block was.
    std::byte* base = nullptr;
    if (reduced_.size() > 0) {
      base = reduced_.as<std::byte>() + b.begin * rsize;
      pack_grads(bi, base);
    } else if (b.grad_base != nullptr) {
      base = const_cast<std::byte*>(b.grad_base);
    } else {
      f.pool = acquire_pool();
      base = pool_[std::size_t(f.pool)].as<std::byte>();
      pack_grads(bi, base);
    }
    f.request = on_stream([&] {
      return comm_.ireduce_scatter(base, base + std::size_t(rank_) * pc * rsize, pc, reduce_type_,
                                   ReduceOp::sum);
    });
  } else {
    const std::byte* send = b.grad_base;
    std::byte* scratch = nullptr;
    const bool direct_recv = reduce_type_ == DType::f32 && micro_batches_ == 0;
    if (b.staging >= 0) {  // streamed gradients: the bucket is half packed already
      f.pool = b.staging;
      buckets_[bi].staging = -1;
      std::byte* buf = pool_[std::size_t(f.pool)].as<std::byte>();
      pack_grads(bi, buf);
      send = buf;
      scratch = buf + b.padded * rsize;
    } else if (send == nullptr || !direct_recv) {
      f.pool = acquire_pool();
      std::byte* buf = pool_[std::size_t(f.pool)].as<std::byte>();
      // The reduced piece lands behind the packed bucket, if there is one.
      scratch = send == nullptr ? buf + b.padded * rsize : buf;
      if (send == nullptr) {
        pack_grads(bi, buf);
        send = buf;
      }
    }
    void* recv = direct_recv ? static_cast<void*>(grad_shard_.as<float>() + b.shard_offset)
                             : static_cast<void*>(scratch);
    f.scratch = direct_recv ? nullptr : scratch;
    f.request = on_stream(
        [&] { return comm_.ireduce_scatter(send, recv, pc, reduce_type_, ReduceOp::sum); });
  }
  flights_.push_back(std::move(f));
}

void GradReducer::complete(Flight& f) {
  watch_("the reduce-scatter of the gradients", f.bucket, false);
  const double t0 = MPI_Wtime();
  f.request.wait();
  stats_.waited += MPI_Wtime() - t0;
  const Bucket& b = buckets_[f.bucket];
  const std::size_t pc = piece(b);
  if (opt_.stage < 2 && f.pool >= 0) {
    // This rank's reduced piece goes back into the user's gradients now;
    // the allgather at the end of the reduction fills in the others'.
    const std::size_t lo = b.begin + std::size_t(rank_) * pc;
    from_bucket(b, lo, std::min(lo + pc, b.begin + b.len), grads_of(),
                pool_[std::size_t(f.pool)].as<std::byte>());
  }
  if (opt_.stage == 2 && f.scratch != nullptr) {
    float* acc = grad_shard_.as<float>() + b.shard_offset;
    if (micro_batches_ == 0) {
      space_.convert(f.scratch, reduce_type_, acc, DType::f32, pc, 1.0f);
    } else {
      // Accumulate in fp32, in the order the micro-batches came.
      space_.accumulate(f.scratch, reduce_type_, acc, pc);
    }
  }
  if (f.pool >= 0) pool_busy_[std::size_t(f.pool)] = false;
}

void GradReducer::progress() {
  while (!flights_.empty() && flights_.front().request.test()) {
    complete(flights_.front());
    flights_.pop_front();
  }
}

void GradReducer::finish() {
  // Agree on what was marked: partly marked gradients on any rank are an
  // error on every rank (after every rank has started the same
  // reduce-scatters, so that none is left waiting on another).
  std::vector<std::string> missing;
  // Streamed gradients exist only through grad_ready(i, grad): always
  // required. The others may all be left unmarked.
  for (std::size_t i = 0; i < params_.size(); ++i)
    if (ready_[i] == 0 && params_[i].numel > 0 && (marked_any_ || streamed_[i] != 0))
      missing.push_back(params_[i].name);
  // Held buckets (hold_) stay where they are only if every rank has all of
  // them in shared buffers.
  const bool held = hold_ > 0 && missing.empty() && prepare_held();
  std::int64_t agreed[3] = {missing.empty() ? 0 : 1,
                            static_cast<std::int64_t>(buckets_.size() - next_launch_),
                            hold_ > 0 && !held ? 1 : 0};
  ctl_.allreduce(agreed, agreed, 3, DType::i64, ReduceOp::max);
  if (agreed[0] != 0) {
    const std::size_t launched = static_cast<std::size_t>(agreed[1]);
    while (buckets_.size() - next_launch_ < launched) launch(--next_launch_);
    std::string mine;
    for (std::size_t k = 0; k < missing.size() && k < 20; ++k)
      mine += (k ? ", '" : "'") + missing[k] + "'";
    if (missing.size() > 20) mine += ", ... (" + std::to_string(missing.size()) + " in all)";
    discard();
    agree_or_throw(ctl_,
                   missing.empty() ? std::string()
                                   : "gradients never marked ready in this micro-batch: " + mine,
                   ErrorCode::invalid_state,
                   "call grad_ready(i) for every parameter of the micro-batch (or for none: "
                   "step() then takes every gradient at once; a parameter registered without a "
                   "gradient buffer in stage 2 always needs grad_ready(i, grad)); the gradients "
                   "reduced so far in "
                   "this step were discarded, so redo its micro-batches");
  }
  if (!marked_any_) {
    for (Bucket& b : buckets_) b.ready = b.len;
  }
  if (fused_) {
    if (stats_.first_launch < 0) stats_.first_launch = MPI_Wtime();
    stats_.reduce_bytes += layout_.shard * std::size_t(nranks_) * dtype_size(reduce_type_);
    node_barrier("the fused reduction: every rank's gradients written");
    pending_ = true;
    pending_accumulate_ = micro_batches_ > 0;
  } else if (hold_ > 0 && agreed[2] == 0) {
    launch_ready_buckets(hold_);
    drain();
    for (std::size_t b = 0; b < hold_; ++b)
      stats_.reduce_bytes += piece(buckets_[b]) * std::size_t(nranks_) * dtype_size(reduce_type_);
    node_barrier("the held buckets: every rank's gradients written");
    find_held();
    holding_ = pending_ = true;
    pending_accumulate_ = micro_batches_ > 0;
  } else {
    launch_ready_buckets(0);
    drain();
  }
  if (opt_.stage < 2) allgather_grads();
  stats_.reduce_end = MPI_Wtime();
  clear_marks();
  ++micro_batches_;
  reduced_once_ = true;
  open_ = false;
}

// Stages 0 and 1: the allgather that completes the allreduce (reduce-scatter
// + allgather, so that the reduced values are those of stage 2).
void GradReducer::allgather_grads() {
  if (reduced_.size() > 0) {
    const std::size_t rsize = dtype_size(reduce_type_);
    allgather_buckets(reduce_type_, stats_.reduce_bytes, grads_of(),
                      [&](const Bucket& b) { return reduced_.as<std::byte>() + b.begin * rsize; });
  } else {
    allgather_buckets(dtype_, stats_.reduce_bytes, grads_of(),
                      [](const Bucket& b) { return const_cast<std::byte*>(b.grad_base); });
  }
}

// Stages 1 and 2: every rank's updated pieces into every rank's parameters.
void GradReducer::gather_params() {
  allgather_buckets(dtype_, stats_.gather_bytes, params_of(),
                    [](const Bucket& b) { return b.param_base; });
}

// Bucket by bucket, in ascending order: an in-place allgather on `direct(b)`
// where that is not null, else through a pool buffer (this rank's piece
// copied in from `user`, the others' copied out to it), two in flight.
void GradReducer::allgather_buckets(DType type, std::uint64_t& bytes, const UserPtr& user,
                                    const std::function<std::byte*(const Bucket&)>& direct) {
  struct Gather {
    std::size_t bucket;
    Request request;
    int pool;
  };
  std::deque<Gather> open;
  const std::size_t size = dtype_size(type);
  const auto finish = [&](Gather& g) {
    watch_("the allgather of the parameters", g.bucket, true);
    const double t0 = MPI_Wtime();
    g.request.wait();
    stats_.waited += MPI_Wtime() - t0;
    if (g.pool < 0) return;
    const Bucket& b = buckets_[g.bucket];
    from_bucket(b, b.begin, b.begin + b.len, user, pool_[std::size_t(g.pool)].as<std::byte>());
    pool_busy_[std::size_t(g.pool)] = false;
  };
  for (std::size_t bi = 0; bi < buckets_.size(); ++bi) {
    const Bucket& b = buckets_[bi];
    const std::size_t pc = piece(b);
    Gather g{bi, Request(), -1};
    std::byte* base = direct(b);
    if (base == nullptr) {
      for (;;) {
        const auto free = std::find(pool_busy_.begin(), pool_busy_.end(), false);
        if (free != pool_busy_.end()) {
          g.pool = static_cast<int>(free - pool_busy_.begin());
          break;
        }
        finish(open.front());
        open.pop_front();
      }
      pool_busy_[std::size_t(g.pool)] = true;
      base = pool_[std::size_t(g.pool)].as<std::byte>();
      const std::size_t lo = b.begin + std::size_t(rank_) * pc;
      to_bucket(b, lo, std::min(lo + pc, b.begin + b.len), user, base);
    }
    bytes += pc * std::size_t(nranks_) * size;
    g.request = on_stream(
        [&] { return comm_.iallgather(base + std::size_t(rank_) * pc * size, base, pc, type); });
    open.push_back(std::move(g));
  }
  while (!open.empty()) {
    finish(open.front());
    open.pop_front();
  }
}

}  // namespace shardopt::detail
