// shardopt: ZeRO stage 3's units (internal). A unit's parameters are
// gathered from every rank's shard into the engine's pool (FirstFit,
// lib/zero/gather_pool.hpp) and released; units below persist_below_bytes
// stay whole in a buffer of their own, allgathered after each step.
//
// A unit is released (its parameters only in the shards), held (between the
// code's gather() and release()), prefetched (gathered by the engine ahead of
// the code's gather(), in the order recorded in the last step) or kept
// (released by the code, kept for the gather that the recorded order makes
// later in the step: reshard_after_forward off). The engine frees prefetched
// and kept units when the pool needs their room, and at step(). Every
// change of state is the same on every rank: gather() and release() agree on
// the unit first, and the rest follows from what the ranks agreed on.
#include <algorithm>
#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include "comm/agree.hpp"
#include "common/check.hpp"
#include "common/language.hpp"
#include "common/log.hpp"
#include "zero/engine.hpp"

namespace shardopt::detail {

namespace {

[[noreturn]] void not_stage3(const char* what, int stage) {
  throw_error(
      ErrorCode::invalid_state,
      std::string(what) + " is stage 3's, and this optimizer is at stage " + std::to_string(stage),
      "at stages 0-2 the parameters are whole in the registered buffers: read them "
      "there, or construct the optimizer with ZeroOptions::stage = 3",
      __FILE__, __LINE__);
}

std::string bytes_text(std::size_t b) {
  std::string t = std::to_string(b);
  t += " bytes";
  return t;
}

}  // namespace

std::string ZeroEngine::unit_text(std::size_t u) const {
  std::string t = "unit ";
  t += index_text(static_cast<long long>(u));
  if (u < layout_.units.size()) {
    t += " ('";
    t += params_[layout_.units[u].first_param].name;
    t += layout_.units[u].end_param - layout_.units[u].first_param > 1 ? "'...)" : "')";
  }
  return t;
}

// Construction, at stage 3: the units' sizes, which stay whole, the pool.
void ZeroEngine::setup_units() {
  const UnitSizes z = unit_sizes(layout_, elem_, opt_.gather_limit_bytes, opt_.persist_below_bytes,
                                 comm_.checks_arguments() && !space_.on_device());
  units_.resize(layout_.units.size());
  for (std::size_t u = 0; u < units_.size(); ++u) {
    Unit& x = units_[u];
    x.bytes = z.bytes[u];
    x.persistent = z.persistent[u];
    if (!x.persistent) continue;
    const UnitRange& r = layout_.units[u];
    x.own = space_.allocate(x.bytes, "a persistent unit");
    for (std::size_t i = r.first_param; i < r.end_param; ++i)
      space_.copy(x.own.as<std::byte>() + (layout_.flat[i] - r.begin) * elem_, params_[i].data,
                  params_[i].numel * elem_);
  }
  if (z.largest != SIZE_MAX && z.limit < z.bytes[z.largest])
    throw_agreed(ctl_, ErrorCode::invalid_config,
                 "ZeroOptions::gather_limit_bytes is " + std::to_string(opt_.gather_limit_bytes) +
                     ", below the " + bytes_text(z.bytes[z.largest]) + " that " +
                     unit_text(z.largest) + " gathers",
                 "raise gather_limit_bytes to at least the largest unit (twice it, for prefetch), "
                 "or 0 for the automatic limit",
                 __FILE__, __LINE__);
  if (z.pool > 0) pool_buf_ = space_.allocate(z.pool, "the pool of gathered units");
  pool_ = FirstFit(z.pool, z.align, z.limit);
  if (z.align != FirstFit::kCharge) {
    std::vector<std::string> names;
    for (std::size_t u = 0; u < units_.size(); ++u) names.push_back(unit_text(u));
    guard_ = std::make_unique<ReleasedGuard>(pool_buf_.as<std::byte>(), z.pool, std::move(names));
  }
  following_ = false;
}

std::byte* ZeroEngine::unit_base(std::size_t u) const {
  const Unit& x = units_[u];
  return x.offset == SIZE_MAX ? const_cast<std::byte*>(x.own.as<std::byte>())
                              : const_cast<std::byte*>(pool_buf_.as<std::byte>()) + x.offset;
}

// The next gather of unit u in the recorded order, from this step's place in
// it: SIZE_MAX when none.
namespace {
std::size_t next_use(const std::vector<std::size_t>& order, std::size_t from, std::size_t u) {
  for (std::size_t p = from; p < order.size(); ++p)
    if (order[p] == u) return p;
  return SIZE_MAX;
}
}  // namespace

bool ZeroEngine::make_room(std::size_t bytes) {
  while (!pool_.within(bytes)) {
    // Kept units before prefetched ones, the one needed last first.
    std::size_t victim = SIZE_MAX, victim_use = 0;
    bool victim_kept = false;
    for (std::size_t u = 0; u < units_.size(); ++u) {
      const Unit::State s = units_[u].state;
      if (units_[u].offset == SIZE_MAX) continue;
      if (s != Unit::State::kept && s != Unit::State::prefetched) continue;
      const bool kept = s == Unit::State::kept;
      const std::size_t use = next_use(order_, trace_.size(), u);
      if (victim == SIZE_MAX || (kept && !victim_kept) ||
          (kept == victim_kept && use >= victim_use)) {
        victim = u;
        victim_use = use;
        victim_kept = kept;
      }
    }
    if (victim == SIZE_MAX) return false;
    drop(victim);
  }
  return true;
}

bool ZeroEngine::place(std::size_t u, bool for_prefetch) {
  Unit& x = units_[u];
  if (!pool_.within(x.bytes) && (for_prefetch || !make_room(x.bytes))) return false;
  if (const auto at = pool_.take(x.bytes)) {
    x.offset = *at;
    if (guard_) guard_->open(x.offset, pool_.rounded(x.bytes));
    return true;
  }
  if (for_prefetch) return false;
  // Within the limit, but the free room is in pieces: a buffer of its own
  // for this gather (freed at its release).
  if (!overflow_logged_)
    SHARDOPT_LOG(info, "ZeRO stage 3: the pool of gathered units has "
                           << pool_.limit() - pool_.charged() << " bytes free, in pieces none of "
                           << "which holds " << unit_text(u)
                           << "; it is gathered in a buffer of its own (counted in "
                              "memory_report().gather_pool; said once)");
  overflow_logged_ = true;
  x.own = space_.allocate(x.bytes, "a gathered unit");
  x.offset = SIZE_MAX;
  pool_.charge_outside(x.bytes);
  return true;
}

// Bucket by bucket, ascending: each allgather lays the bucket's pieces out in
// flat order; its padding is overwritten by the next bucket's.
void ZeroEngine::issue(std::size_t u) {
  const UnitRange& r = layout_.units[u];
  const std::size_t n = static_cast<std::size_t>(nranks_);
  std::byte* base = unit_base(u);
  for (std::size_t bi = r.first_bucket; bi < r.end_bucket; ++bi) {
    const BucketRange& b = layout_.buckets[bi];
    units_[u].pending.push_back(
        comm_.iallgather(param_shard_.as<std::byte>() + b.shard_offset * elem_,
                         base + (b.begin - r.begin) * elem_, b.padded / n, dtype_));
  }
}

void ZeroEngine::finish(std::size_t u) const {
  // In issue order: a bucket's padding is overwritten by the next one's.
  for (Request& r : units_[u].pending) r.wait();
  units_[u].pending.clear();
}

void ZeroEngine::drop(std::size_t u) {
  Unit& x = units_[u];
  finish(u);
  x.state = Unit::State::released;
  if (x.persistent) return;
  if (x.offset == SIZE_MAX) {
    x.own = SpaceBuffer();
    pool_.give_outside(x.bytes);
    return;
  }
  const std::size_t n = pool_.rounded(x.bytes);
  if (guard_) {
    guard_->close(x.offset, n, u);
  } else if (space_.on_device() && comm_.checks_arguments()) {
    // Poisoned: a read after release gives NaN (all bits set in any dtype).
    float nan;
    const std::uint32_t ones = 0xFFFFFFFFu;
    std::memcpy(&nan, &ones, 4);
    space_.fill(reinterpret_cast<float*>(pool_buf_.as<std::byte>() + x.offset), n / 4, nan);
  }
  pool_.give(x.offset, x.bytes);
  x.offset = SIZE_MAX;
}

void ZeroEngine::agree_on_unit(bool gathering, std::size_t u) {
  const char* call = gathering ? "gather()" : "release()";
  const std::string verb = gathering ? "gather(" : "release(";
  require_comm(call);
  if (opt_.stage != 3) not_stage3(call, opt_.stage);
  // Agreed first, so that ranks that name different units, or one that
  // cannot go on, fail together instead of leaving the others in a
  // collective: each rank's unit, and whether it holds it gathered.
  const std::size_t units = units_.size();
  // An index past INT64_MAX reads as negative: from a language that
  // numbers from 1, unit 0 arrives as SIZE_MAX and is named "unit 0".
  const std::int64_t mine[2] = {static_cast<std::int64_t>(u),
                                u < units && units_[u].state == Unit::State::held ? 1 : 0};
  std::vector<std::int64_t> all(2 * std::size_t(nranks_));
  ctl_.allgather(mine, all.data(), 2, DType::i64);
  const auto text = [&](std::int64_t v) {
    return v >= 0 && std::size_t(v) < units ? unit_text(std::size_t(v))
                                            : "unit " + index_text(static_cast<long long>(v));
  };
  std::string each;
  const std::string name = verb + index_text(static_cast<long long>(u)) + ")";
  bool differ = false;
  for (int q = 0; q < nranks_; ++q) {
    differ = differ || all[2 * std::size_t(q)] != all[0];
    each += (q ? ", rank " : "rank ") + std::to_string(q) + ": " + text(all[2 * std::size_t(q)]);
  }
  if (differ)
    throw_agreed(
        ctl_, ErrorCode::invalid_state,
        std::string(call) + ": the ranks name different units at the same point (" + each + ")",
        "every rank gathers and releases the same units in the same order (the "
        "model's layers as its forward and backward passes use them)",
        __FILE__, __LINE__);
  if (u >= units) {
    std::string hint = "the optimizer has no parameters, hence no units";
    if (units > 0) {
      hint = "pass a unit from ";
      hint += index_text(0);
      hint += " to ";
      hint += index_text(static_cast<long long>(units) - 1);
      hint += " (num_units() units, in registration order)";
    }
    throw_agreed(ctl_, ErrorCode::invalid_argument,
                 name + ": there are " + std::to_string(units) + " units", hint, __FILE__,
                 __LINE__);
  }
  for (int q = 0; q < nranks_; ++q)
    if ((all[2 * std::size_t(q) + 1] != 0) == gathering) {
      const std::string what = verb + unit_text(u) + "): rank " + std::to_string(q);
      if (gathering)
        throw_agreed(ctl_, ErrorCode::invalid_state, what + " holds the unit gathered already",
                     "release() a unit before gathering it again", __FILE__, __LINE__);
      throw_agreed(ctl_, ErrorCode::invalid_state, what + " has not gathered the unit",
                   "release a unit once after each gather()", __FILE__, __LINE__);
    }
}

void ZeroEngine::gather(std::size_t u) {
  igather(u);
  finish(u);
}

void ZeroEngine::igather(std::size_t u) {
  agree_on_unit(true, u);
  following_ = following_ && trace_.size() < order_.size() && order_[trace_.size()] == u;
  trace_.push_back(u);
  Unit& x = units_[u];
  if (x.state == Unit::State::prefetched || x.state == Unit::State::kept) {
    ++gathers_ahead_;
    if (guard_ && x.state == Unit::State::kept) guard_->open(x.offset, pool_.rounded(x.bytes));
  } else if (!x.persistent) {
    if (!place(u, false)) {
      std::string held;
      for (std::size_t v = 0; v < units_.size(); ++v)
        if (units_[v].state == Unit::State::held && !units_[v].persistent)
          held += (held.empty() ? "" : ", ") + unit_text(v);
      throw_agreed(ctl_, ErrorCode::invalid_state,
                   "gather(" + unit_text(u) + "): gathers past the limit: the pool holds " +
                       bytes_text(pool_.charged()) + " of units gathered and not released (" +
                       held + "), and this unit needs " + bytes_text(FirstFit::charge(x.bytes)) +
                       " more of ZeroOptions::gather_limit_bytes's " + bytes_text(pool_.limit()),
                   "release() units once they are used, or raise gather_limit_bytes", __FILE__,
                   __LINE__);
    }
    issue(u);
  }
  x.state = Unit::State::held;
  if (opt_.prefetch && following_) prefetch_after();
}

// The units the recorded order gathers next, gathered now while the pool
// has free room, in order: the first that does not fit ends it.
void ZeroEngine::prefetch_after() {
  for (std::size_t p = trace_.size(); p < order_.size(); ++p) {
    const std::size_t v = order_[p];
    Unit& y = units_[v];
    if (y.persistent || y.state != Unit::State::released) continue;
    if (!place(v, true)) break;
    issue(v);
    y.state = Unit::State::prefetched;
  }
}

void ZeroEngine::release(std::size_t u) {
  agree_on_unit(false, u);
  Unit& x = units_[u];
  const std::size_t use = following_ ? next_use(order_, trace_.size(), u) : SIZE_MAX;
  const bool later = use != SIZE_MAX;
  // With prefetch, a unit the recorded order gathers again next (the
  // forward pass's last, the backward pass's first) is kept even when
  // resharding: dropping it would only gather the same bytes again at once.
  const bool next = opt_.prefetch && use == trace_.size();
  // A unit in a buffer of its own is never kept: make_room() could not
  // evict it.
  if ((next || (!opt_.reshard_after_forward && later)) && !x.persistent && x.offset != SIZE_MAX) {
    x.state = Unit::State::kept;
    if (guard_) {
      finish(u);
      guard_->close(x.offset, pool_.rounded(x.bytes), u);
    }
    return;
  }
  drop(u);
}

const void* ZeroEngine::data(std::size_t i) const {
  if (i >= params_.size())
    throw_error(ErrorCode::invalid_argument,
                "data(" + std::to_string(i) + "): there are " + std::to_string(params_.size()) +
                    " parameters",
                "pass a parameter index below num_params()", __FILE__, __LINE__);
  if (opt_.stage != 3) return params_[i].data;
  const std::size_t u = unit_of_[i];
  if (units_[u].state != Unit::State::held) return nullptr;
  finish(u);
  return unit_base(u) + (layout_.flat[i] - layout_.units[u].begin) * elem_;
}

void ZeroEngine::check_released(const char* what) {
  if (opt_.stage != 3) return;
  std::int64_t held = 0, first = -1;
  for (std::size_t u = 0; u < units_.size(); ++u)
    if (units_[u].state == Unit::State::held) {
      ++held;
      if (first < 0) first = static_cast<std::int64_t>(u);
    }
  std::int64_t most[2] = {held, first};
  ctl_.allreduce(most, most, 2, DType::i64, ReduceOp::max);
  if (most[0] > 0)
    throw_agreed(ctl_, ErrorCode::invalid_state,
                 std::string(what) + " with " + std::to_string(most[0]) +
                     " unit(s) still gathered on some rank (" +
                     unit_text(static_cast<std::size_t>(most[1])) + " among them)",
                 "release() every gathered unit before the step: its parameters change in it",
                 __FILE__, __LINE__);
  for (std::size_t u = 0; u < units_.size(); ++u)
    if (units_[u].state != Unit::State::released) drop(u);
}

void ZeroEngine::end_gathers(const char* what) {
  if (opt_.stage != 3) return;
  check_released(what);
  if (trace_ != order_) {
    if (!order_.empty())
      SHARDOPT_LOG(info, "ZeRO stage 3: the gathers before step "
                             << steps_ + 1 << " differ from those recorded (" << trace_.size()
                             << " gathers, " << order_.size()
                             << " before); prefetching follows the new order");
    order_ = trace_;
  }
  trace_.clear();
  gathers_ahead_ = 0;
  following_ = !order_.empty();
}

void ZeroEngine::prefetch_next_step() {
  if (opt_.stage == 3 && opt_.prefetch && following_) prefetch_after();
}

void ZeroEngine::refresh_persistent() {
  if (opt_.stage != 3) return;
  for (std::size_t u = 0; u < units_.size(); ++u)
    if (units_[u].persistent) issue(u);
  for (std::size_t u = 0; u < units_.size(); ++u) finish(u);
}

}  // namespace shardopt::detail
