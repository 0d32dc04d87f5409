// shardopt: the ZeRO engine's sharded layout (see shards.hpp).
#include "zero/shards.hpp"

#include <algorithm>

namespace shardopt::detail {

std::size_t ShardLayout::bucket_elements(double bucket_mb, std::size_t elem_bytes, int ranks) {
  const std::size_t unit = kShardAlign * static_cast<std::size_t>(ranks);
  const double bytes = bucket_mb * 1024.0 * 1024.0;
  const std::size_t b = static_cast<std::size_t>(bytes / double(elem_bytes));
  return std::max(unit, b / unit * unit);
}

std::size_t ShardLayout::bucket_of(std::size_t x) const {
  const auto after =
      std::upper_bound(buckets.begin(), buckets.end(), x,
                       [](std::size_t v, const BucketRange& b) { return v < b.begin; });
  return static_cast<std::size_t>(after - buckets.begin()) - 1;
}

ShardLayout::ShardLayout(const std::vector<std::size_t>& numel, int ranks, int rank, int stage,
                         std::size_t bucket, const std::vector<std::size_t>& unit_starts) {
  const std::size_t n = static_cast<std::size_t>(ranks);
  const std::size_t np = numel.size();
  flat.resize(np);
  for (std::size_t i = 0; i < np; ++i) {
    flat[i] = total;
    total += numel[i];
  }
  const std::size_t align = kShardAlign * n;
  bucket_elems = std::min(bucket, std::max(align, (total + align - 1) / align * align));
  // The units, each cut into buckets of at most B elements.
  std::vector<std::size_t> starts = unit_starts;
  if (starts.empty() || starts.front() != 0) starts.insert(starts.begin(), 0);
  for (std::size_t u = 0; u < starts.size() && starts[u] < np; ++u) {
    UnitRange r;
    r.first_param = starts[u];
    r.end_param = u + 1 < starts.size() ? std::min(starts[u + 1], np) : np;
    r.begin = flat[r.first_param];
    r.end = r.end_param < np ? flat[r.end_param] : total;
    r.first_bucket = buckets.size();
    for (std::size_t begin = r.begin; begin < r.end; begin += bucket_elems) {
      BucketRange b;
      b.begin = begin;
      b.len = std::min(bucket_elems, r.end - begin);
      b.padded = (b.len + align - 1) / align * align;
      b.shard_offset = shard;
      shard += b.padded / n;
      buckets.push_back(b);
    }
    r.end_bucket = buckets.size();
    units.push_back(r);
  }
  if (np == 0) units.push_back({});
  storage = stage == 0 ? shard * n : shard;
  // Segments: bucket by bucket, rank by rank, parameter by parameter.
  std::size_t first = 0;  // the first parameter that may overlap the bucket
  for (std::size_t bi = 0; bi < buckets.size(); ++bi) {
    BucketRange& b = buckets[bi];
    const std::size_t end = b.begin + b.len;
    while (first < np && flat[first] + numel[first] <= b.begin) ++first;
    b.first_param = first;
    std::size_t last = first;
    while (last < np && flat[last] < end) ++last;
    b.end_param = last;
    const std::size_t pc = b.padded / n;
    for (int q = 0; q < ranks; ++q) {
      const std::size_t lo = b.begin + std::size_t(q) * pc;
      const std::size_t hi = std::min(lo + pc, end);
      for (std::size_t p = first; p < last && lo < hi; ++p) {
        const std::size_t s = std::max(lo, flat[p]);
        const std::size_t e = std::min(hi, flat[p] + numel[p]);
        if (s >= e) continue;
        Segment seg;
        seg.param = p;
        seg.offset = s - flat[p];
        seg.count = e - s;
        seg.flat = s;
        seg.storage = (stage == 0 ? std::size_t(q) * shard : 0) + b.shard_offset + (s - lo);
        seg.rank = q;
        seg.bucket = bi;
        if (stage == 0 || q == rank) {
          mine.push_back(segments.size());
          owned.push_back({p, seg.offset, seg.count, seg.storage});
        }
        segments.push_back(seg);
      }
    }
  }
}

std::vector<std::size_t> unit_starts(const std::vector<int>& units, std::size_t params, int stage) {
  std::vector<std::size_t> starts;
  const bool any =
      stage == 3 || std::any_of(units.begin(), units.end(), [](int u) { return u >= 0; });
  const auto unit = [&](std::size_t i) { return i < units.size() ? units[i] : -1; };
  for (std::size_t i = 0; any && i < params; ++i)
    if (i == 0 || unit(i) < 0 || unit(i) != unit(i - 1)) starts.push_back(i);
  return starts;
}

}  // namespace shardopt::detail
