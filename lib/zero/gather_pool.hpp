// shardopt: stage 3's pool of gathered units (internal). One buffer,
// allocated with the engine, that the units gathered at a time share:
// FirstFit places each unit at the lowest offset with room and merges the
// free ranges a release leaves. Deterministic, so that every rank places the
// same units at the same offsets after the same gathers and releases.
#pragma once

#include <cstddef>
#include <map>
#include <optional>
#include <vector>

#include "zero/shards.hpp"

namespace shardopt::detail {

// Stage 3's units as the engine sizes them, from the layout: the bytes of
// each gathered unit (its elements to its last bucket's padding, which the
// allgathers write), which stay whole (fewer bytes of parameters than
// persist_below_bytes), the gather limit (0 asked: automatic) and the pool's
// bytes (under SHARDOPT_CHECK_ARGS on the host: whole pages, a page more per
// unit). `largest`: the unit gathered of most bytes (SIZE_MAX if none).
struct UnitSizes {
  std::vector<std::size_t> bytes;
  std::vector<bool> persistent;
  std::size_t largest = SIZE_MAX;
  std::size_t limit = 0;
  std::size_t pool = 0;
  std::size_t align = 0;
  std::size_t persistent_bytes() const;
};
UnitSizes unit_sizes(const ShardLayout& l, std::size_t elem, std::size_t limit_asked,
                     std::size_t persist_below, bool page_guard);

class FirstFit {
 public:
  FirstFit() = default;
  // `bytes` of room in pieces aligned to `align` (a power of two), of
  // which at most `limit` are taken at once, each piece counted rounded to
  // 256 bytes (so that a larger alignment, a page under
  // SHARDOPT_CHECK_ARGS, moves no limit).
  FirstFit(std::size_t bytes, std::size_t align, std::size_t limit);

  static constexpr std::size_t kCharge = 256;
  static std::size_t charge(std::size_t bytes) noexcept {
    return (bytes + kCharge - 1) / kCharge * kCharge;
  }
  std::size_t capacity() const noexcept { return capacity_; }
  std::size_t limit() const noexcept { return limit_; }
  std::size_t charged() const noexcept { return charged_; }
  // `bytes` rounded up to the alignment: what take() reserves.
  std::size_t rounded(std::size_t bytes) const noexcept {
    return (bytes + align_ - 1) / align_ * align_;
  }
  // Whether charged() + charge(bytes) <= limit(), though the room may be in
  // pieces (then take() fails).
  bool within(std::size_t bytes) const noexcept { return charged_ + charge(bytes) <= limit_; }
  // The offset of rounded(bytes) reserved, or none when no free range holds
  // them.
  std::optional<std::size_t> take(std::size_t bytes);
  // Gives back what take(bytes) returned at `offset`.
  void give(std::size_t offset, std::size_t bytes);
  // A unit held outside the pool (in a buffer of its own, when the room is
  // in pieces) counts against the limit all the same, until given back.
  void charge_outside(std::size_t bytes) noexcept { charged_ += charge(bytes); }
  void give_outside(std::size_t bytes) noexcept { charged_ -= charge(bytes); }

 private:
  std::size_t capacity_ = 0, align_ = 1, limit_ = 0, charged_ = 0;
  std::map<std::size_t, std::size_t> free_;  // offset -> bytes, no two adjacent
};

}  // namespace shardopt::detail
