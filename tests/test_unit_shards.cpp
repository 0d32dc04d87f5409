// The ZeRO engine's sharded layout, computed without MPI (lib/zero/shards.hpp),
// against an element-by-element definition: every element of every parameter
// lands in exactly one segment, of the rank and at the storage index that the
// bucket arithmetic gives it, on random layouts at 1 to 5 ranks and every stage,
// without units and with random units (no bucket crosses a unit's start).
#include <algorithm>
#include <catch2/catch.hpp>
#include <cstdint>
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

// The bucket of flat element x, from the definition: without units x / B;
// with units, the unit's start u0 holding x, then (x - u0) / B buckets into
// the unit, which starts after the buckets of the units before it (each
// ceil(length / B) of them).
std::size_t expected_bucket(const std::vector<std::size_t>& unit_begin, std::size_t total,
                            std::size_t x, std::size_t b) {
  std::size_t before = 0;
  for (std::size_t u = 0; u < unit_begin.size(); ++u) {
    const std::size_t end = u + 1 < unit_begin.size() ? unit_begin[u + 1] : total;
    if (x < end) return before + (x - unit_begin[u]) / b;
    before += (end - unit_begin[u] + b - 1) / b;
  }
  return SIZE_MAX;
}

// Where flat element x lives, from the definition: bucket bi; in it, the
// piece of rank (x - begin) / (padded / N), at the bucket's shard offset
// plus the offset within the piece (plus q * S in stage 0).
Place expected_place(const ShardLayout& l, std::size_t x, std::size_t bi, int ranks, int stage) {
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
    // Units in half the trials: each parameter after the first starts one
    // with probability 1/3.
    std::vector<std::size_t> starts;
    if (trial % 2 == 1) {
      starts.push_back(0);
      for (std::size_t p = 1; p < numel.size(); ++p)
        if (rng() % 3 == 0) starts.push_back(p);
    }
    INFO("trial " << trial << ": " << ranks << " ranks, rank " << rank << ", stage " << stage
                  << ", bucket " << bucket << ", " << starts.size() << " units");
    REQUIRE(bucket % (kShardAlign * std::size_t(ranks)) == 0);
    const ShardLayout l(numel, ranks, rank, stage, bucket, starts);

    std::size_t total = 0;
    for (std::size_t n : numel) total += n;
    CHECK(l.total == total);
    // The units' flat starts, and their ranges in the layout: consecutive,
    // each tiled by its own buckets.
    std::vector<std::size_t> unit_begin;
    for (std::size_t p : starts.empty() ? std::vector<std::size_t>{0} : starts) {
      std::size_t at = 0;
      for (std::size_t q = 0; q < p; ++q) at += numel[q];
      unit_begin.push_back(at);
    }
    REQUIRE(l.units.size() == unit_begin.size());
    bool tiled = true;
    for (std::size_t u = 0; u < l.units.size(); ++u) {
      const auto& r = l.units[u];
      const std::size_t end = u + 1 < unit_begin.size() ? unit_begin[u + 1] : total;
      tiled = tiled && r.begin == unit_begin[u] && r.end == end &&
              r.first_bucket == (u == 0 ? 0 : l.units[u - 1].end_bucket);
      std::size_t at = r.begin;
      for (std::size_t bi = r.first_bucket; bi < r.end_bucket; ++bi) {
        tiled = tiled && l.buckets[bi].begin == at && l.buckets[bi].len <= l.bucket_elems;
        at += l.buckets[bi].len;
      }
      tiled = tiled && at == r.end;
    }
    CHECK(tiled);
    CHECK(l.units.back().end_bucket == l.buckets.size());
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
        const std::size_t bi = expected_bucket(unit_begin, total, x, l.bucket_elems);
        const Place want = expected_place(l, x, bi, ranks, stage);
        placed = placed && want.rank == s.rank && want.storage == s.storage + k && s.bucket == bi &&
                 l.bucket_of(x) == bi;
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
