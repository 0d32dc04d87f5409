// shardopt: stage 3's pool of gathered units (lib/zero/gather_pool.hpp).
#include "zero/gather_pool.hpp"

#include <iterator>

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

}  // namespace shardopt::detail
