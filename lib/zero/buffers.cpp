// shardopt: the sizes of the ZeRO engine's buffers (lib/zero/buffers.hpp).
#include "zero/buffers.hpp"

#include <algorithm>

#include "zero/optimizer_config.hpp"

namespace shardopt::detail {

std::size_t custom_scratch_bytes(const ShardLayout& l) {
  std::size_t longest = 0;
  for (std::size_t s : l.mine) longest = std::max(longest, l.segments[s].count);
  return longest * 4;
}

std::size_t pool_bytes(const ShardLayout& l, int ranks, int stage, DType dtype, DType reduce_type,
                       bool reduced_buffer, const std::vector<BucketInPlace>& in_place) {
  const std::size_t n = static_cast<std::size_t>(ranks);
  const std::size_t rsize = dtype_size(reduce_type), elem = dtype_size(dtype);
  std::size_t bytes = 0;
  for (std::size_t bi = 0; bi < l.buckets.size(); ++bi) {
    const BucketRange& b = l.buckets[bi];
    const bool packs_grads = !reduced_buffer && !in_place[bi].grads;
    if (packs_grads) bytes = std::max(bytes, b.padded * rsize);
    if (stage == 2)  // the packed bucket, if any, and the reduced piece
      bytes = std::max(bytes, (packs_grads ? b.padded * rsize : 0) + b.padded / n * rsize);
    if (stage > 0 && !in_place[bi].params) bytes = std::max(bytes, b.padded * elem);
  }
  return bytes;
}

std::vector<std::string> state_slots(const std::vector<OptimizerConfig>& groups) {
  std::vector<std::string> names;
  for (const OptimizerConfig& g : groups) {
    const std::vector<Slot> slots = slots_of(g);
    if (names.empty()) names.assign(slots.size(), std::string());
    for (std::size_t k = 0; k < slots.size(); ++k)
      if (slots[k].used) names[k] = slots[k].name;
  }
  std::erase(names, std::string());
  return names;
}

}  // namespace shardopt::detail
