// HostBuffer: alignment, zero fill, move semantics.
#include <catch2/catch.hpp>
#include <cstdint>
#include <utility>

#include "shardopt/memory.hpp"

using shardopt::HostBuffer;

TEST_CASE("HostBuffer: 2 MiB aligned, zero-filled, writable", "[memory]") {
  for (std::size_t bytes :
       {std::size_t{1}, std::size_t{4096}, std::size_t{3} << 20, std::size_t{64} << 20}) {
    HostBuffer b(bytes);
    REQUIRE(b.data() != nullptr);
    CHECK(b.size() == bytes);
    CHECK(reinterpret_cast<std::uintptr_t>(b.data()) % (std::size_t{2} << 20) == 0);
    auto* p = b.as<unsigned char>();
    std::size_t nonzero = 0;
    for (std::size_t i = 0; i < bytes; i += 511) nonzero += p[i] != 0;
    CHECK(nonzero == 0);
    p[bytes - 1] = 7;
    CHECK(p[bytes - 1] == 7);
  }
}

TEST_CASE("HostBuffer: empty and moved-from buffers hold nothing", "[memory]") {
  HostBuffer empty(0);
  CHECK(empty.data() == nullptr);
  CHECK(empty.size() == 0);
  HostBuffer a(1000);
  void* p = a.data();
  HostBuffer b(std::move(a));
  CHECK(b.data() == p);
  CHECK(a.data() == nullptr);
  HostBuffer c;
  c = std::move(b);
  CHECK(c.data() == p);
  CHECK(c.size() == 1000);
  CHECK(b.size() == 0);
}
