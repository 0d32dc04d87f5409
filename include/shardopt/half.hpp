// shardopt: 16-bit floating-point storage types and their conversions.
//
// bfloat16 and float16 are plain 16-bit storage (trivially copyable, the same
// bits as torch.bfloat16 / torch.float16, __nv_bfloat16 / __half). Arithmetic
// is done in float: convert with to_float() and from_float(). from_float()
// rounds to nearest, ties to even, keeps NaN a NaN and overflows to inf,
// exactly as a hardware conversion does. to_float(float16) turns a signaling
// NaN into a quiet one with the same payload, as x86's F16C conversion does
// (vcvtph2ps), so that the CPU kernels may use either bitwise; bfloat16 is
// the high half of a float and converts by a shift, NaNs unchanged. The
// functions are usable in CUDA device code.
#pragma once

#include <cstdint>
#include <cstring>

#if defined(__CUDACC__)
#define SHARDOPT_HOST_DEVICE __host__ __device__
#else
#define SHARDOPT_HOST_DEVICE
#endif

namespace shardopt {

struct bfloat16 {
  std::uint16_t bits;
};
struct float16 {
  std::uint16_t bits;
};

namespace detail {
SHARDOPT_HOST_DEVICE inline std::uint32_t float_bits(float f) {
  std::uint32_t u;
  std::memcpy(&u, &f, sizeof u);
  return u;
}
SHARDOPT_HOST_DEVICE inline float bits_float(std::uint32_t u) {
  float f;
  std::memcpy(&f, &u, sizeof f);
  return f;
}
}  // namespace detail

// The identity, so templates can read any of float, bfloat16 and float16.
SHARDOPT_HOST_DEVICE inline float to_float(float x) { return x; }

SHARDOPT_HOST_DEVICE inline float to_float(bfloat16 h) {
  return detail::bits_float(static_cast<std::uint32_t>(h.bits) << 16);
}

SHARDOPT_HOST_DEVICE inline bfloat16 bf16_from_float(float f) {
  std::uint32_t u = detail::float_bits(f);
  if ((u & 0x7fffffffu) > 0x7f800000u) {  // NaN: keep sign, force a quiet NaN
    return bfloat16{static_cast<std::uint16_t>((u >> 16) | 0x0040u)};
  }
  u += 0x7fffu + ((u >> 16) & 1u);  // round to nearest, ties to even
  return bfloat16{static_cast<std::uint16_t>(u >> 16)};
}

SHARDOPT_HOST_DEVICE inline float to_float(float16 h) {
  const std::uint32_t sign = static_cast<std::uint32_t>(h.bits & 0x8000u) << 16;
  const std::uint32_t exp = (h.bits >> 10) & 0x1fu;
  std::uint32_t mant = h.bits & 0x3ffu;
  if (exp == 0x1fu) {  // inf, or NaN made quiet (the payload kept)
    const std::uint32_t quiet = mant != 0 ? 0x00400000u : 0u;
    return detail::bits_float(sign | 0x7f800000u | quiet | (mant << 13));
  }
  if (exp != 0) {  // normal
    return detail::bits_float(sign | ((exp + 112u) << 23) | (mant << 13));
  }
  if (mant == 0) return detail::bits_float(sign);  // signed zero
  // subnormal: value = mant * 2^-24, exact in float
  const float mag = static_cast<float>(mant) * 5.9604644775390625e-8f;
  return detail::bits_float(sign | detail::float_bits(mag));
}

SHARDOPT_HOST_DEVICE inline float16 f16_from_float(float f) {
  const std::uint32_t u = detail::float_bits(f);
  const std::uint16_t sign = static_cast<std::uint16_t>((u >> 16) & 0x8000u);
  const std::uint32_t abs = u & 0x7fffffffu;
  if (abs > 0x7f800000u) {  // NaN: quiet, the payload truncated (as vcvtps2ph)
    return float16{static_cast<std::uint16_t>(sign | 0x7e00u | ((abs >> 13) & 0x3ffu))};
  }
  if (abs >= 0x477ff000u) {  // rounds to >= 65520: overflow to inf
    return float16{static_cast<std::uint16_t>(sign | 0x7c00u)};
  }
  if (abs >= 0x38800000u) {  // normal half (>= 2^-14)
    std::uint32_t v = abs - (112u << 23);
    v += 0xfffu + ((v >> 13) & 1u);  // round to nearest, ties to even
    return float16{static_cast<std::uint16_t>(sign | (v >> 13))};
  }
  if (abs < 0x33000000u) {  // below half the smallest subnormal (2^-25): zero
    return float16{sign};
  }
  // subnormal half: shift the 24-bit significand right, round to nearest even
  const std::uint32_t e = abs >> 23;
  const std::uint32_t m = (abs & 0x7fffffu) | 0x800000u;
  const std::uint32_t shift = 126u - e;  // 14..24
  std::uint32_t q = m >> shift;
  const std::uint32_t rem = m & ((1u << shift) - 1u);
  const std::uint32_t half = 1u << (shift - 1u);
  if (rem > half || (rem == half && (q & 1u))) ++q;
  return float16{static_cast<std::uint16_t>(sign | q)};
}

}  // namespace shardopt
