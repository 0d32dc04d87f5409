// shardopt kernels: what every optimizer's per-element function shares:
// the finiteness test, gradient loads and low-precision parameter stores,
// each one definition for the reference, CPU and CUDA kernels.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstring>

#include "shardopt/half.hpp"

namespace shardopt::kernels {

// True unless x is inf or nan; integer arithmetic, so loops vectorize.
SHARDOPT_HOST_DEVICE inline bool is_finite_bits(float x) {
  std::uint32_t u;
  std::memcpy(&u, &x, sizeof u);
  return (u & 0x7f800000u) != 0x7f800000u;
}

// Converts a stored gradient to float.
SHARDOPT_HOST_DEVICE inline float load_grad(const float* g, std::size_t i) { return g[i]; }
SHARDOPT_HOST_DEVICE inline float load_grad(const bfloat16* g, std::size_t i) {
  return to_float(g[i]);
}
SHARDOPT_HOST_DEVICE inline float load_grad(const float16* g, std::size_t i) {
  return to_float(g[i]);
}

// Writes the low-precision copy of an updated parameter.
SHARDOPT_HOST_DEVICE inline void store_param(bfloat16* out, std::size_t i, float p) {
  out[i] = bf16_from_float(p);
}
SHARDOPT_HOST_DEVICE inline void store_param(float16* out, std::size_t i, float p) {
  out[i] = f16_from_float(p);
}

}  // namespace shardopt::kernels
