// The ZeRO engine's sharded layout, computed without MPI (lib/zero/shards.hpp),
// against an element-by-element definition: every element of every parameter
// lands in exactly one segment, of the rank and at the storage index that the
// bucket arithmetic gives it, on random layouts at 1 to 5 ranks and every stage.
#include <algorithm>
#include <catch2/catch.hpp>
#include <random>
#include <vector>

#include "zero/shards.hpp"

using shardopt::detail::kShardAlign;
using shardopt::detail::ShardLayout;

namespace {

struct Place {
  int rank = -1;
  std::size_t storage = 0;
};

// Where flat element x lives, from the definition: bucket x / B; in it, the
// piece of rank (x - begin) / (padded / N), at the bucket's shard offset
// plus the offset within the piece (plus q * S in stage 0).
Place expected_place(const ShardLayout& l, std::size_t x, int ranks, int stage) {
  const std::size_t bi = x / l.bucket_elems;
  const auto& b = l.buckets[bi];
  const std::size_t piece = b.padded / std::size_t(ranks);
  const std::size_t q = (x - b.begin) / piece;
  const std::size_t within = x - b.begin - q * piece;
  return {int(q), (stage == 0 ? q * l.shard : 0) + b.shard_offset + within};
}

}  // namespace

TEST_CASE("the sharded layout places every element where the bucket arithmetic says",
          "[unit][zero][layout]") {
  std::mt19937_64 rng(20240611);
  for (int trial = 0; trial < 200; ++trial) {
    const int ranks = 1 + int(rng() % 5);
    const int stage = int(rng() % 3);
    const int rank = int(rng() % std::uint64_t(ranks));
    std::vector<std::size_t> numel(1 + rng() % 12);
    for (auto& n : numel) n = rng() % 4 == 0 ? 0 : rng() % 700;
    const double mb = double(1 + rng() % 64) * 1e-4;
    const std::size_t bucket = ShardLayout::bucket_elements(mb, 4, ranks);
    INFO("trial " << trial << ": " << ranks << " ranks, rank " << rank << ", stage " << stage
                  << ", bucket " << bucket);
    REQUIRE(bucket % (kShardAlign * std::size_t(ranks)) == 0);
    const ShardLayout l(numel, ranks, rank, stage, bucket);

    std::size_t total = 0;
    for (std::size_t n : numel) total += n;
    CHECK(l.total == total);
    std::size_t shard = 0;
    for (const auto& b : l.buckets) {
      CHECK(b.padded % (kShardAlign * std::size_t(ranks)) == 0);
      CHECK(b.padded >= b.len);
      CHECK(b.shard_offset == shard);
      shard += b.padded / std::size_t(ranks);
    }
    CHECK(l.shard == shard);
    CHECK(l.storage == (stage == 0 ? shard * std::size_t(ranks) : shard));

    // Every element once, where expected_place puts it.
    std::vector<int> seen(total, 0);
    bool placed = true, in_parameter = true;
    for (const auto& s : l.segments) {
      in_parameter = in_parameter && s.offset + s.count <= numel[s.param] &&
                     s.flat == l.flat[s.param] + s.offset;
      for (std::size_t k = 0; k < s.count; ++k) {
        const std::size_t x = s.flat + k;
        ++seen[x];
        const Place want = expected_place(l, x, ranks, stage);
        placed = placed && want.rank == s.rank && want.storage == s.storage + k &&
                 s.bucket == x / l.bucket_elems;
      }
    }
    CHECK(in_parameter);
    CHECK(placed);
    CHECK(std::count(seen.begin(), seen.end(), 1) == std::ptrdiff_t(total));

    // This rank updates its own segments (every segment in stage 0), and
    // owned mirrors them.
    std::size_t expected_mine = 0;
    for (const auto& s : l.segments) expected_mine += (stage == 0 || s.rank == rank) ? 1 : 0;
    REQUIRE(l.mine.size() == expected_mine);
    REQUIRE(l.owned.size() == l.mine.size());
    bool mine_ok = true;
    for (std::size_t k = 0; k < l.mine.size(); ++k) {
      const auto& s = l.segments[l.mine[k]];
      mine_ok = mine_ok && (stage == 0 || s.rank == rank) && l.owned[k].param == s.param &&
                l.owned[k].offset == s.offset && l.owned[k].count == s.count &&
                l.owned[k].shard_offset == s.storage;
    }
    CHECK(mine_ok);
  }
}
