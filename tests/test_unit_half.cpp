// bfloat16 / float16 conversions against independent references:
// f16 against the compiler's _Float16 conversions (libgcc's soft-float code),
// bf16 against a nearest-value search done in double.
#include <catch2/catch.hpp>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <random>

#include "optim_helpers.hpp"
#include "shardopt/half.hpp"

using shardopt::bf16_from_float;
using shardopt::bfloat16;
using shardopt::f16_from_float;
using shardopt::float16;
using shardopt::to_float;
using shardopt::test::bits;
using shardopt::test::from_bits;

namespace {

// Round-to-nearest-even to bf16 worked out in double: the two bf16 values
// around x are the truncation and the next one up; pick the nearer.
std::uint16_t bf16_reference(float x) {
  if (std::isnan(x)) return 0x7fc0;
  const std::uint32_t u = bits(x);
  const std::uint16_t lo = static_cast<std::uint16_t>(u >> 16);
  const std::uint16_t hi = static_cast<std::uint16_t>(lo + 1);
  const double dlo = from_bits(static_cast<std::uint32_t>(lo) << 16);
  const double dhi_f = from_bits(static_cast<std::uint32_t>(hi) << 16);
  // Past the largest finite bf16 the next value is inf; treat it as 2^128 for distance.
  const double dhi = std::isinf(dhi_f) ? std::copysign(std::ldexp(1.0, 128), x) : dhi_f;
  const double dx = x;
  const double elo = std::fabs(dx - dlo), ehi = std::fabs(dhi - dx);
  if (elo < ehi) return lo;
  if (ehi < elo) return hi;
  return (lo & 1) ? hi : lo;
}

bool same_value(float a, float b) { return (std::isnan(a) && std::isnan(b)) || bits(a) == bits(b); }

}  // namespace

TEST_CASE("bf16: every 16-bit pattern converts to float and back unchanged", "[half]") {
  for (std::uint32_t b = 0; b < 65536; ++b) {
    const bfloat16 h{static_cast<std::uint16_t>(b)};
    const float f = to_float(h);
    const bfloat16 back = bf16_from_float(f);
    if (std::isnan(f)) {
      CHECK(std::isnan(to_float(back)));
    } else if (back.bits != h.bits) {
      FAIL_CHECK("bf16 round trip failed for 0x" << std::hex << b);
    }
  }
}

TEST_CASE("bf16: rounding matches round-to-nearest-even computed in double", "[half]") {
  std::mt19937 rng(12345);
  std::uniform_int_distribution<std::uint32_t> any;
  int wrong = 0;
  auto check = [&](float x) {
    const std::uint16_t got = bf16_from_float(x).bits;
    const std::uint16_t want = bf16_reference(x);
    if (std::isnan(x)) {
      if (!std::isnan(to_float(bfloat16{got}))) ++wrong;
    } else if (got != want) {
      ++wrong;
    }
  };
  for (int i = 0; i < 2000000; ++i) check(from_bits(any(rng)));
  // Exact ties, both parities, and the overflow boundary.
  for (std::uint32_t hi = 0; hi < 65536; hi += 97) {
    check(from_bits((hi << 16) | 0x8000u));
    check(from_bits((hi << 16) | 0x7fffu));
    check(from_bits((hi << 16) | 0x8001u));
  }
  check(std::numeric_limits<float>::max());
  check(std::numeric_limits<float>::infinity());
  check(-std::numeric_limits<float>::infinity());
  check(std::numeric_limits<float>::denorm_min());
  CHECK(wrong == 0);
  CHECK(bf16_from_float(1.0f).bits == 0x3f80);
  CHECK(bf16_from_float(-2.0f).bits == 0xc000);
  CHECK(std::isinf(to_float(bf16_from_float(std::numeric_limits<float>::max()))));
}

#if defined(__FLT16_MAX__)
TEST_CASE("f16: conversions match the compiler's _Float16", "[half]") {
  int wrong = 0;
  for (std::uint32_t b = 0; b < 65536; ++b) {
    const std::uint16_t h = static_cast<std::uint16_t>(b);
    _Float16 ref;
    std::memcpy(&ref, &h, 2);
    if (!same_value(to_float(float16{h}), static_cast<float>(ref))) ++wrong;
  }
  CHECK(wrong == 0);

  std::mt19937 rng(777);
  std::uniform_int_distribution<std::uint32_t> any;
  std::uniform_real_distribution<float> near(-70000.f, 70000.f);
  std::uniform_real_distribution<float> tiny(-1e-4f, 1e-4f);
  auto check = [&](float x) {
    const _Float16 ref = static_cast<_Float16>(x);
    std::uint16_t want;
    std::memcpy(&want, &ref, 2);
    const std::uint16_t got = f16_from_float(x).bits;
    if (std::isnan(x)) {
      if (!std::isnan(to_float(float16{got}))) ++wrong;
    } else if (got != want) {
      ++wrong;
    }
  };
  for (int i = 0; i < 1000000; ++i) {
    check(from_bits(any(rng)));
    check(near(rng));
    check(tiny(rng));  // subnormal halves
  }
  // Ties between neighbouring halves, normal and subnormal.
  for (std::uint32_t b = 0; b < 0x7bff; b += 3) {
    const float a = to_float(float16{static_cast<std::uint16_t>(b)});
    const float c = to_float(float16{static_cast<std::uint16_t>(b + 1)});
    check((a + c) / 2);  // exact in float
    check(-(a + c) / 2);
  }
  check(65519.f);
  check(65520.f);
  check(std::ldexp(1.0f, -25));
  check(std::ldexp(1.5f, -25));
  CHECK(wrong == 0);
}
#endif

TEST_CASE("f16: known values", "[half]") {
  CHECK(f16_from_float(1.0f).bits == 0x3c00);
  CHECK(f16_from_float(-2.0f).bits == 0xc000);
  CHECK(f16_from_float(65504.f).bits == 0x7bff);
  CHECK(f16_from_float(65520.f).bits == 0x7c00);  // rounds to inf
  CHECK(f16_from_float(std::ldexp(1.0f, -24)).bits == 0x0001);
  CHECK(to_float(float16{0x0001}) == std::ldexp(1.0f, -24));
  CHECK(std::isnan(to_float(f16_from_float(std::nanf("")))));
  // NaNs as x86's F16C converts them: made quiet, the payload kept or cut.
  CHECK(bits(to_float(float16{0x7c01})) == 0x7fc02000u);
  CHECK(bits(to_float(float16{0xfe00})) == 0xffc00000u);
  CHECK(f16_from_float(from_bits(0x7f800001u)).bits == 0x7e00);
  CHECK(f16_from_float(from_bits(0xffbfe000u)).bits == 0xffff);
}
