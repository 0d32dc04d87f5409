// Stage 3's pool (FirstFit, lib/zero/gather_pool.hpp) against a byte map:
// random takes and gives; each take lands at the lowest aligned offset
// whose run of free bytes holds it (or fails when none does), no two
// pieces overlap, and what is charged against the limit is their sum.
#include <catch2/catch.hpp>
#include <cstddef>
#include <map>
#include <random>
#include <vector>

#include "zero/gather_pool.hpp"

using shardopt::detail::FirstFit;

TEST_CASE("FirstFit places at the lowest free offset and merges what is given back",
          "[unit][stage3]") {
  std::mt19937_64 rng(7);
  for (std::size_t align : {std::size_t(256), std::size_t(4096)}) {
    const std::size_t capacity = 64 * align;
    FirstFit pool(capacity, align, capacity);
    std::vector<bool> used(capacity / align, false);  // per aligned block
    std::map<std::size_t, std::size_t> pieces;        // offset -> bytes asked
    std::size_t charged = 0;
    for (int op = 0; op < 4000; ++op) {
      if (pieces.empty() || rng() % 2 == 0) {
        const std::size_t bytes = 1 + rng() % (8 * align);
        const std::size_t blocks = (bytes + align - 1) / align;
        // The model: the first run of `blocks` free blocks.
        std::size_t want = SIZE_MAX, run = 0;
        for (std::size_t b = 0; b < used.size() && want == SIZE_MAX; ++b) {
          run = used[b] ? 0 : run + 1;
          if (run == blocks) want = (b + 1 - blocks) * align;
        }
        const auto at = pool.take(bytes);
        REQUIRE(at.has_value() == (want != SIZE_MAX));
        if (!at) continue;
        REQUIRE(*at == want);
        for (std::size_t b = *at / align; b < *at / align + blocks; ++b) used[b] = true;
        pieces[*at] = bytes;
        charged += FirstFit::charge(bytes);
      } else {
        auto it = pieces.begin();
        std::advance(it, static_cast<long>(rng() % pieces.size()));
        pool.give(it->first, it->second);
        const std::size_t blocks = (it->second + align - 1) / align;
        for (std::size_t b = it->first / align; b < it->first / align + blocks; ++b)
          used[b] = false;
        charged -= FirstFit::charge(it->second);
        pieces.erase(it);
      }
      REQUIRE(pool.charged() == charged);
    }
    // All given back: one free range again, the whole capacity in one take.
    for (const auto& [at, bytes] : pieces) pool.give(at, bytes);
    CHECK(pool.charged() == 0);
    CHECK(pool.take(capacity) == std::optional<std::size_t>(0));
  }
}

TEST_CASE("FirstFit's limit counts pieces in 256 bytes, whatever the alignment", "[unit][stage3]") {
  FirstFit pool(16 * 4096, 4096, 1024);
  CHECK(pool.within(1024));
  CHECK(!pool.within(1025));
  REQUIRE(pool.take(300).has_value());  // charged 512, placed on a page of its own
  CHECK(pool.charged() == 512);
  CHECK(pool.within(512));
  CHECK(!pool.within(513));
  // A unit held outside the pool counts against the limit too.
  pool.charge_outside(200);
  CHECK(pool.charged() == 768);
  CHECK(!pool.within(257));
  pool.give_outside(200);
  CHECK(pool.within(512));
}
