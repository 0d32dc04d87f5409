// shardopt: ZeRO stage 3's units (internal): a unit's parameters gathered
// from every rank's shard into a buffer of the engine's, and released.
#include <algorithm>
#include <string>

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
  require_comm("gather()");
  if (opt_.stage != 3) not_stage3("gather()", opt_.stage);
  if (u >= layout_.units.size())
    throw_error(ErrorCode::invalid_argument,
                "gather(" + std::to_string(u) + "): there are " +
                    std::to_string(layout_.units.size()) + " units",
                "pass a unit index below num_units()", __FILE__, __LINE__);
  if (gathered_[u].size() > 0)
    throw_error(ErrorCode::invalid_state,
                "gather(" + std::to_string(u) + "): the unit is gathered already",
                "release() it before gathering it again", __FILE__, __LINE__);
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
    comm_.allgather(param_shard_.as<std::byte>() + b.shard_offset * elem_,
                    gathered_[u].as<std::byte>() + (b.begin - r.begin) * elem_, b.padded / n,
                    dtype_);
  }
}

void ZeroEngine::release(std::size_t u) {
  if (opt_.stage != 3) not_stage3("release()", opt_.stage);
  if (u >= layout_.units.size() || gathered_[u].size() == 0)
    throw_error(ErrorCode::invalid_state,
                "release(" + std::to_string(u) + "): the unit is not gathered",
                "release a unit once after each gather()", __FILE__, __LINE__);
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
  return gathered_[u].as<std::byte>() + (layout_.flat[i] - layout_.units[u].begin) * elem_;
}

}  // namespace shardopt::detail
