// shardopt: ZeRO stage 3's units (internal): a unit's parameters gathered
// from every rank's shard into a buffer of the engine's, and released.
#include <algorithm>
#include <cstdint>
#include <string>
#include <vector>

#include "comm/agree.hpp"
#include "common/check.hpp"
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

}  // namespace

void ZeroEngine::gather(std::size_t u) {
  igather(u);
  finish_gather(u);
}

void ZeroEngine::igather(std::size_t u) {
  require_comm("gather()");
  if (opt_.stage != 3) not_stage3("gather()", opt_.stage);
  // Agreed first, so that ranks that gather different units, or one that
  // cannot gather, fail together instead of leaving the others in the
  // allgather: each rank's unit, and whether it holds it gathered already.
  const std::size_t units = layout_.units.size();
  const std::int64_t mine[2] = {static_cast<std::int64_t>(std::min<std::size_t>(u, INT64_MAX)),
                                u < units && gathered_[u].size() > 0 ? 1 : 0};
  std::vector<std::int64_t> all(2 * std::size_t(nranks_));
  ctl_.allgather(mine, all.data(), 2, DType::i64);
  const auto unit_text = [&](std::int64_t v) {
    std::string t = std::to_string(v);
    if (v >= 0 && std::size_t(v) < units)
      t += " ('" + params_[layout_.units[std::size_t(v)].first_param].name + "'...)";
    return t;
  };
  std::string each;
  bool differ = false;
  for (int q = 0; q < nranks_; ++q) {
    differ = differ || all[2 * std::size_t(q)] != all[0];
    each += (q ? ", rank " : "rank ") + std::to_string(q) + ": unit " +
            unit_text(all[2 * std::size_t(q)]);
  }
  if (differ)
    throw_agreed(ctl_, ErrorCode::invalid_state,
                 "gather(): the ranks gather different units at the same point (" + each + ")",
                 "every rank gathers the same units in the same order (the model's layers as "
                 "its forward pass uses them)",
                 __FILE__, __LINE__);
  if (u >= units)
    throw_agreed(ctl_, ErrorCode::invalid_argument,
                 "gather(" + std::to_string(u) + "): there are " + std::to_string(units) + " units",
                 "pass a unit index below num_units()", __FILE__, __LINE__);
  for (int q = 0; q < nranks_; ++q)
    if (all[2 * std::size_t(q) + 1] != 0)
      throw_agreed(ctl_, ErrorCode::invalid_state,
                   "gather(" + unit_text(all[0]) + "): rank " + std::to_string(q) +
                       " holds the unit gathered already",
                   "release() a unit before gathering it again", __FILE__, __LINE__);
  const UnitRange& r = layout_.units[u];
  // The unit's elements and the padding of its last bucket's last piece.
  std::size_t elems = 0;
  for (std::size_t bi = r.first_bucket; bi < r.end_bucket; ++bi)
    elems = std::max(elems, layout_.buckets[bi].begin - r.begin + layout_.buckets[bi].padded);
  gathered_[u] = space_.allocate(std::max<std::size_t>(elems, 1) * elem_, "a gathered unit");
  // Bucket by bucket, ascending: each allgather lays the bucket's pieces
  // out in flat order; its padding is overwritten by the next bucket's.
  const std::size_t n = static_cast<std::size_t>(nranks_);
  for (std::size_t bi = r.first_bucket; bi < r.end_bucket; ++bi) {
    const BucketRange& b = layout_.buckets[bi];
    pending_[u].push_back(comm_.iallgather(
        param_shard_.as<std::byte>() + b.shard_offset * elem_,
        gathered_[u].as<std::byte>() + (b.begin - r.begin) * elem_, b.padded / n, dtype_));
  }
}

void ZeroEngine::finish_gather(std::size_t u) const {
  // In issue order: a bucket's padding is overwritten by the next one's.
  for (Request& r : pending_[u]) r.wait();
  pending_[u].clear();
}

void ZeroEngine::release(std::size_t u) {
  if (opt_.stage != 3) not_stage3("release()", opt_.stage);
  if (u >= layout_.units.size() || gathered_[u].size() == 0)
    throw_error(ErrorCode::invalid_state,
                "release(" + std::to_string(u) + "): the unit is not gathered",
                "release a unit once after each gather()", __FILE__, __LINE__);
  finish_gather(u);
  gathered_[u] = SpaceBuffer();
}

const void* ZeroEngine::data(std::size_t i) const {
  if (i >= params_.size())
    throw_error(ErrorCode::invalid_argument,
                "data(" + std::to_string(i) + "): there are " + std::to_string(params_.size()) +
                    " parameters",
                "pass a parameter index below num_params()", __FILE__, __LINE__);
  if (opt_.stage != 3) return params_[i].data;
  const std::size_t u = unit_of_[i];
  if (gathered_[u].size() == 0) return nullptr;
  finish_gather(u);
  return gathered_[u].as<std::byte>() + (layout_.flat[i] - layout_.units[u].begin) * elem_;
}

}  // namespace shardopt::detail

namespace shardopt::detail {

void ZeroEngine::check_released(const char* what) {
  if (opt_.stage != 3) return;
  std::int64_t held = 0, first = -1;
  for (std::size_t u = 0; u < gathered_.size(); ++u)
    if (gathered_[u].size() > 0) {
      ++held;
      if (first < 0) first = static_cast<std::int64_t>(u);
    }
  std::int64_t most[2] = {held, first};
  ctl_.allreduce(most, most, 2, DType::i64, ReduceOp::max);
  if (most[0] > 0)
    throw_agreed(ctl_, ErrorCode::invalid_state,
                 std::string(what) + " with " + std::to_string(most[0]) +
                     " unit(s) still gathered on some rank (unit " + std::to_string(most[1]) +
                     " among them)",
                 "release() every gathered unit before the step: its parameters change in it",
                 __FILE__, __LINE__);
}

}  // namespace shardopt::detail
