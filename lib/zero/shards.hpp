// shardopt: the ZeRO engine's sharded layout (internal), computed from the
// parameters' sizes, the rank count, the stage and the bucket size alone: no
// MPI, no buffers, so that it is tested on its own and a planner can compute
// what a run would hold on every rank without starting one.
//
// The parameters, in registration order, form one flat index space of T
// elements. It is cut into buckets of B elements (B a multiple of
// N * kShardAlign, N ranks); the last bucket is padded to such a multiple.
// Each bucket is split into N equal pieces, piece q belonging to rank q, so
// that every bucket's gradients are reduce-scattered with one equal-count
// call and every rank gets a share of every bucket. A rank's shard is the
// concatenation of its pieces of all buckets: S elements, contiguous in its
// state buffers (master weights, moments, gradient shard), each piece
// aligned to kShardAlign elements. Stage 0 keeps every rank's shard: its
// state buffers hold N * S elements, rank q's shard at q * S.
//
// Units (ZeRO stage 3's gather granularity: consecutive parameters that a
// code uses together) end buckets: a bucket never crosses the start of a
// unit, so that a unit's buckets hold its parameters alone and gathering it
// is the allgather of those buckets. A unit longer than B takes several
// buckets. Without units (one unit of everything) the buckets are cut at
// multiples of B alone.
//
// A segment is the part of one parameter inside one rank's piece of one
// bucket: the unit of every kernel call and every partial sum, identical in
// all stages, which is why the stages agree bitwise (the norms are summed
// per segment, then per rank in order, then over ranks in order).
#pragma once

#include <cstddef>
#include <vector>

#include "shardopt/zero.hpp"

namespace shardopt::detail {

// Shard pieces start at multiples of this many elements (64 bytes of fp32).
inline constexpr std::size_t kShardAlign = 16;

struct Segment {
  std::size_t param = 0;
  std::size_t offset = 0;  // within the parameter
  std::size_t count = 0;
  std::size_t flat = 0;     // flat index of the first element
  std::size_t storage = 0;  // index in the state buffers (stage 0: q * S + ...)
  int rank = 0;             // the owner
  std::size_t bucket = 0;
};

// A unit: parameters [first_param, end_param), flat elements [begin, end),
// buckets [first_bucket, end_bucket).
struct UnitRange {
  std::size_t first_param = 0, end_param = 0;
  std::size_t begin = 0, end = 0;
  std::size_t first_bucket = 0, end_bucket = 0;
};

struct BucketRange {
  std::size_t begin = 0;                       // flat index
  std::size_t len = 0;                         // elements of parameters
  std::size_t padded = 0;                      // len rounded up to N * kShardAlign
  std::size_t shard_offset = 0;                // of this bucket's piece in a rank's shard
  std::size_t first_param = 0, end_param = 0;  // parameters overlapping it
};

// The layout of `numel` (each parameter's element count, in registration
// order) on `ranks` ranks, as rank `rank` sees it (every rank's segments,
// and which of them this rank updates), for `stage` and buckets of
// `bucket_elems` elements (bucket_elements(): a multiple of
// ranks * kShardAlign; capped here at the padded total). unit_starts: the
// parameters that start a unit, ascending (parameter 0 always does; empty:
// one unit of every parameter).
struct ShardLayout {
  ShardLayout() = default;
  ShardLayout(const std::vector<std::size_t>& numel, int ranks, int rank, int stage,
              std::size_t bucket_elems, const std::vector<std::size_t>& unit_starts = {});

  // The elements of a bucket of `bucket_mb` MiB of `elem_bytes`-byte
  // reduced gradients, rounded down to a multiple of ranks * kShardAlign
  // (at least one such unit).
  static std::size_t bucket_elements(double bucket_mb, std::size_t elem_bytes, int ranks);
  // The bucket holding flat element x (x < total).
  std::size_t bucket_of(std::size_t x) const;

  std::vector<std::size_t> flat;  // flat index of each parameter
  std::size_t total = 0;          // T
  std::size_t bucket_elems = 0;   // B
  std::size_t shard = 0;          // S
  std::size_t storage = 0;        // S, or N * S in stage 0
  std::vector<BucketRange> buckets;
  std::vector<UnitRange> units;   // in parameter order; one without unit_starts
  std::vector<Segment> segments;  // every rank's, by bucket, rank, parameter
  std::vector<std::size_t> mine;  // indices of the segments this rank updates
  std::vector<ShardRange> owned;  // the same, as the public ShardRange
};

// The parameters that start a unit, of `params` parameters with
// Param::unit `units` (empty: -1 for each): where the index changes or is
// -1, when any parameter sets one; at stage 3 every parameter without one
// is a unit of its own. Empty: no units (stages 0-2 without any
// Param::unit).
std::vector<std::size_t> unit_starts(const std::vector<int>& units, std::size_t params, int stage);

}  // namespace shardopt::detail
