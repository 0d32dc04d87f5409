// The CPU kernels stage 16-bit gradients and 16-bit parameter copies through
// fp32 blocks, converted by the vector unit (F16C for f16): every bit
// pattern of each 16-bit type, and parameters that round to every kind of
// 16-bit value (ties, subnormals, overflow, inf, NaN), must come out of the
// CPU kernel exactly as out of the reference kernel, which converts each
// element with the software conversions of shardopt/half.hpp.
#include <catch2/catch.hpp>
#include <cstdint>
#include <cstring>
#include <limits>
#include <vector>

#include "kernels/adam.hpp"
#include "kernels/sgd.hpp"
#include "optim_helpers.hpp"

using namespace shardopt;
using namespace shardopt::test;

namespace {

// All 65536 patterns of a 16-bit type, in a scrambled order, repeated to n.
template <class T>
std::vector<T> every_pattern(std::size_t n) {
  std::vector<T> out(n);
  for (std::size_t i = 0; i < n; ++i)
    out[i].bits = static_cast<std::uint16_t>((i * 40503u) & 0xffffu);  // odd: a permutation
  return out;
}

// fp32 values that round to every kind of 16-bit result: halfway cases of
// both types, f16 subnormals and underflow, values just below and above the
// f16 overflow threshold, infinities, NaNs with payloads, signed zeros,
// then random bit patterns.
std::vector<float> awkward_params(std::size_t n) {
  const float inf = std::numeric_limits<float>::infinity();
  std::vector<float> special = {0.0f,
                                -0.0f,
                                1.0f,
                                -1.0f,
                                65504.0f,
                                65519.99f,
                                65520.0f,
                                -65520.0f,
                                1e-5f,
                                6.1e-5f,
                                5.96e-8f,
                                2.98e-8f,
                                2.99e-8f,
                                1e-9f,
                                inf,
                                -inf,
                                1.00048828125f /* f16 tie */,
                                1.00390625f /* bf16 tie */,
                                3.4e38f,
                                -3.4e38f};
  std::uint32_t nan_bits[] = {0x7fc00000u, 0xffc00001u, 0x7f800001u, 0x7fa02000u};
  for (std::uint32_t b : nan_bits) {
    float f;
    std::memcpy(&f, &b, 4);
    special.push_back(f);
  }
  std::vector<float> out(n);
  std::uint64_t x = 0x9e3779b97f4a7c15ull;
  for (std::size_t i = 0; i < n; ++i) {
    if (i < special.size()) {
      out[i] = special[i];
    } else {
      x = x * 6364136223846793005ull + 1442695040888963407ull;
      const std::uint32_t b = static_cast<std::uint32_t>(x >> 32);
      std::memcpy(&out[i], &b, 4);
    }
  }
  return out;
}

}  // namespace

TEST_CASE("CPU kernels convert every 16-bit gradient pattern as the reference does",
          "[kernels][staging]") {
  // Past 2^16 elements, so the run is threaded and spans many staged blocks,
  // with a tail that is not a multiple of the vector width.
  const std::size_t n = 65536 * 2 + 13;
  for (DType gt : {DType::bf16, DType::f16}) {
    const auto g_bf16 = every_pattern<bfloat16>(n);
    const auto g_f16 = every_pattern<float16>(n);
    const void* grad = gt == DType::bf16 ? static_cast<const void*>(g_bf16.data())
                                         : static_cast<const void*>(g_f16.data());
    const auto p0 = uniform(n, 5, -1, 1);
    std::vector<float> p_ref = p0, p_cpu = p0, m_ref(n, 0.0f), m_cpu(n, 0.0f);
    std::vector<float> v_ref(n, 0.0f), v_cpu(n, 0.0f);
    auto buffers = [&](std::vector<float>& p, std::vector<float>& m, std::vector<float>& v) {
      kernels::AdamBuffers b;
      b.param = p.data();
      b.grad = grad;
      b.grad_type = gt;
      b.exp_avg = m.data();
      b.exp_avg_sq = v.data();
      b.n = n;
      return b;
    };
    const auto s =
        kernels::make_adam_scalars(1e-3, 0.9, 0.999, 1e-8, 0.0, false, false, false, 1, 1.0);
    const bool f_ref = kernels::reference::step<Adam>(buffers(p_ref, m_ref, v_ref), s);
    const bool f_cpu = kernels::cpu::step<Adam>(buffers(p_cpu, m_cpu, v_cpu), s);
    INFO("grad type " << dtype_name(gt));
    CHECK_FALSE(f_ref);  // the patterns include inf and NaN
    CHECK(f_cpu == f_ref);
    CHECK(count_diff(p_cpu, p_ref) == 0);
    CHECK(count_diff(m_cpu, m_ref) == 0);
    CHECK(count_diff(v_cpu, v_ref) == 0);
  }
}

TEST_CASE("CPU kernels write 16-bit parameter copies as the reference does", "[kernels][staging]") {
  // lr = 0: the parameters stay as they are (inf and NaN included) and the
  // copy is their rounding, for every kind of value.
  const std::size_t n = 65536 + 4099;
  const Grads g(uniform(n, 7, -1, 1));
  for (DType ot : {DType::bf16, DType::f16}) {
    const auto p0 = awkward_params(n);
    std::vector<float> p_ref = p0, p_cpu = p0;
    std::vector<std::uint16_t> out_ref(n, 0x1234), out_cpu(n, 0x4321);
    auto buffers = [&](std::vector<float>& p, std::vector<std::uint16_t>& out) {
      kernels::SgdBuffers b;
      b.param = p.data();
      b.grad = g.data(DType::f32);
      b.grad_type = DType::f32;
      b.param_out = out.data();
      b.param_out_type = ot;
      b.n = n;
      return b;
    };
    const auto s = kernels::make_sgd_scalars(0.0, 0.0, 0.0, 0.0, false, false, 1, 1.0);
    kernels::reference::step<SGD>(buffers(p_ref, out_ref), s);
    kernels::cpu::step<SGD>(buffers(p_cpu, out_cpu), s);
    INFO("copy type " << dtype_name(ot));
    CHECK(count_diff(p_cpu, p_ref) == 0);
    CHECK(out_cpu == out_ref);
    // The reference itself against the conversions of shardopt/half.hpp.
    std::size_t wrong = 0;
    for (std::size_t i = 0; i < n; ++i) {
      const std::uint16_t want =
          ot == DType::bf16 ? bf16_from_float(p_ref[i]).bits : f16_from_float(p_ref[i]).bits;
      wrong += out_ref[i] != want;
    }
    CHECK(wrong == 0);
  }
}
