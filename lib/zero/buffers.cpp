// shardopt: the sizes of the ZeRO engine's buffers (lib/zero/buffers.hpp).
#include "zero/buffers.hpp"

#include <algorithm>

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

BufferSizes buffer_sizes(const ShardLayout& l, const BufferFacts& f) {
  BufferSizes s;
  s.master = master_bytes(l, f.dtype, f.remainders);
  s.slots = f.slots;
  s.state = f.slots > 0 ? state_bytes(l) : 0;
  if (f.lamb) s.lamb = state_bytes(l);
  if (f.custom) s.custom_scratch = custom_scratch_bytes(l);
  s.grad_shard = grad_shard_bytes(l, f.stage);
  s.reduced = reduced_bytes(l, f.ranks, f.stage, f.dtype, f.reduce_type);
  if (f.owned) s.owned = owned_grad_bytes(l, f.ranks, f.dtype);
  s.owned_shared = f.fused == Fused::shared;
  if (f.fused != Fused::off) s.blocks = fused_block_bytes(f.threads);
  if (f.fused == Fused::peer) s.slices = fused_slice_bytes(f.threads, f.ranks, f.dtype);
  s.pool = pool_bytes(l, f.ranks, f.stage, f.dtype, f.reduce_type, s.reduced > 0, f.in_place);
  s.pools = s.pool > 0 ? 2 : 0;
  return s;
}

}  // namespace shardopt::detail
