// shardopt: the sizes of the ZeRO engine's buffers (internal), computed from
// the layout (lib/zero/shards.hpp) and a few facts about the run, without
// MPI and without allocating. The engine allocates exactly these sizes
// (lib/zero/shard_state.cpp, lib/zero/reduction.cpp), and plan_memory()
// (lib/zero/plan.cpp) adds them up into the MemoryReport a run would give,
// so that the two cannot drift apart.
#pragma once

#include <algorithm>
#include <cstddef>
#include <string>
#include <vector>

#include "shardopt/types.hpp"
#include "shardopt/zero.hpp"
#include "zero/shards.hpp"

namespace shardopt::detail {

// The fused stage-2 step (lib/zero/reduction.hpp) works on blocks of this
// many elements of each rank's gradients.
inline constexpr std::size_t kFusedBlock = 65536;

// How one bucket moves without a bucket buffer: its gradients reduced where
// they are (one contiguous run of buffers, in the reduced dtype), its
// parameters gathered where they are.
struct BucketInPlace {
  bool grads = false;
  bool params = false;
};

// The fp32 state slots allocated for these groups, by name, in slot order:
// each slot some group's options use.
std::vector<std::string> state_slots(const std::vector<OptimizerConfig>& groups);

// The fp32 master (or the 2-byte remainders of bf16 parameters).
inline std::size_t master_bytes(const ShardLayout& l, DType dtype, bool remainders) {
  if (remainders) return l.storage * 2;
  return dtype != DType::f32 ? l.storage * 4 : 0;
}
inline std::size_t state_bytes(const ShardLayout& l) { return l.storage * 4; }
// A custom optimizer's fp32 gradients of its longest segment.
std::size_t custom_scratch_bytes(const ShardLayout& l);
inline std::size_t grad_shard_bytes(const ShardLayout& l, int stage) {
  return stage == 2 ? l.shard * 4 : 0;
}
// The flat, padded gradients of every rank's shard: N * S elements.
inline std::size_t full_elements(const ShardLayout& l, int ranks) {
  return l.shard * static_cast<std::size_t>(ranks);
}
inline std::size_t reduced_bytes(const ShardLayout& l, int ranks, int stage, DType dtype,
                                 DType reduce_type) {
  return stage < 2 && reduce_type != dtype ? full_elements(l, ranks) * 4 : 0;
}
inline std::size_t owned_grad_bytes(const ShardLayout& l, int ranks, DType dtype) {
  return full_elements(l, ranks) * dtype_size(dtype);
}
// The fused step's per-thread blocks (a block of reduced fp32 gradients and
// the scratch of its reduction; no block is longer than the shard) and,
// reading the user's buffers, a slice of every rank's gradients per thread.
inline std::size_t fused_block_elements(const ShardLayout& l) {
  return std::max<std::size_t>(1, std::min(kFusedBlock, l.shard));
}
inline std::size_t fused_block_bytes(const ShardLayout& l, int threads) {
  return static_cast<std::size_t>(threads) * fused_block_elements(l) * 8;
}
inline std::size_t fused_slice_bytes(int threads, int ranks, DType dtype) {
  return static_cast<std::size_t>(threads) * static_cast<std::size_t>(ranks) * kFusedBlock *
         dtype_size(dtype);
}
// Each bucket buffer: the largest of what a bucket needs that cannot move
// in place (in_place[b] for bucket b): its gradients packed (when there is
// no fp32 reduction buffer), stage 2's reduced piece beside them, its
// parameters packed for the allgather (stages 1 and 2).
std::size_t pool_bytes(const ShardLayout& l, int ranks, int stage, DType dtype, DType reduce_type,
                       bool reduced_buffer, const std::vector<BucketInPlace>& in_place);

}  // namespace shardopt::detail
