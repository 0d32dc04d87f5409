// shardopt: stage 3's pool of gathered units (lib/zero/gather_pool.hpp).
#include "zero/gather_pool.hpp"

#include <algorithm>
#include <iterator>

#include "zero/released_guard.hpp"

namespace shardopt::detail {

FirstFit::FirstFit(std::size_t bytes, std::size_t align, std::size_t limit)
    : capacity_(bytes / align * align), align_(align), limit_(limit) {
  if (capacity_ > 0) free_.emplace(0, capacity_);
}

std::optional<std::size_t> FirstFit::take(std::size_t bytes) {
  const std::size_t n = rounded(bytes);
  for (auto it = free_.begin(); it != free_.end(); ++it) {
    if (it->second < n) continue;
    const std::size_t at = it->first, left = it->second - n;
    free_.erase(it);
    if (left > 0) free_.emplace(at + n, left);
    charged_ += charge(bytes);
    return at;
  }
  return std::nullopt;
}

void FirstFit::give(std::size_t offset, std::size_t bytes) {
  std::size_t at = offset, n = rounded(bytes);
  charged_ -= charge(bytes);
  auto next = free_.lower_bound(at);
  if (next != free_.begin()) {
    auto prev = std::prev(next);
    if (prev->first + prev->second == at) {
      at = prev->first;
      n += prev->second;
      free_.erase(prev);
    }
  }
  if (next != free_.end() && next->first == offset + rounded(bytes)) {
    n += next->second;
    free_.erase(next);
  }
  free_.emplace(at, n);
}

UnitSizes unit_sizes(const ShardLayout& l, std::size_t elem, std::size_t limit_asked,
                     std::size_t persist_below, bool page_guard) {
  constexpr std::size_t kAutoFloor = std::size_t(64) << 20;
  UnitSizes s;
  std::size_t whole = 0;
  for (std::size_t u = 0; u < l.units.size(); ++u) {
    const UnitRange& r = l.units[u];
    std::size_t elems = 0;
    for (std::size_t bi = r.first_bucket; bi < r.end_bucket; ++bi)
      elems = std::max(elems, l.buckets[bi].begin - r.begin + l.buckets[bi].padded);
    s.bytes.push_back(std::max<std::size_t>(elems, 1) * elem);
    s.persistent.push_back((r.end - r.begin) * elem < persist_below);
    if (s.persistent.back()) continue;
    if (s.largest == SIZE_MAX || s.bytes[u] > s.bytes[s.largest]) s.largest = u;
    whole += FirstFit::charge(s.bytes[u]);
  }
  const std::size_t largest = s.largest == SIZE_MAX ? 0 : s.bytes[s.largest];
  s.limit = limit_asked > 0 ? limit_asked : std::min(whole, std::max(3 * largest, kAutoFloor));
  s.limit = FirstFit::charge(s.limit);
  s.align = page_guard && s.limit > 0 ? ReleasedGuard::page() : FirstFit::kCharge;
  s.pool = s.limit;
  if (s.align != FirstFit::kCharge)
    s.pool = (s.limit + s.align - 1) / s.align * s.align + s.align * l.units.size();
  return s;
}

std::size_t UnitSizes::persistent_bytes() const {
  std::size_t n = 0;
  for (std::size_t u = 0; u < bytes.size(); ++u) n += persistent[u] ? bytes[u] : 0;
  return n;
}

}  // namespace shardopt::detail
