// shardopt kernels (internal): the LAMB loops over a range (reference and CPU
// kernels), the per-index steps (CUDA kernels) and the dispatch over the
// types. Included by .cpp and .cu files only.
#pragma once

#include <cstdint>
#include <type_traits>

#include "kernels/dispatch.hpp"
#include "kernels/lamb.hpp"

namespace shardopt::kernels::detail {

// The direction pass and where it leaves each norm block's squared sums
// (block k: sums[2k] for p, sums[2k + 1] for r).
struct LambWork {
  LambBuffers b;
  double* sums = nullptr;
};

// The view of elements [begin, begin + count) of the direction pass, begin a
// multiple of kLambNormBlock: its buffers and its blocks' sums.
inline LambWork subrange(const LambWork& w, std::size_t begin, std::size_t count) {
  return {kernels::subrange(w.b, begin, count), w.sums + 2 * (begin / kLambNormBlock)};
}

// The direction pass's buffers (kernels/cpu/runner.hpp: buffers_of).
inline LambBuffers& buffers_of(LambWork& w) { return w.b; }

template <class G, class P>
struct LambDirectionLoop {
  // The gradient type and parameter storage, and the same loop over others
  // (kernels/cpu/runner.hpp stages 16-bit buffers through fp32 blocks).
  using Grad = G;
  using Storage = P;
  template <class G2, class P2>
  using Rebind = LambDirectionLoop<G2, P2>;
  // Staged blocks hold whole norm blocks, whose sums one range computes.
  static constexpr std::size_t stage_block = kLambNormBlock;
  // Computes [begin, end), begin a multiple of kLambNormBlock, and the sums
  // of its blocks; returns true if every gradient there was finite.
  [[gnu::always_inline]] static inline bool range(const LambWork& w, const LambScalars& s,
                                                  std::size_t begin, std::size_t end) {
    const auto p = values(w.b);
    const G* __restrict g = static_cast<const G*>(w.b.grad);
    float* __restrict m = w.b.exp_avg;
    float* __restrict v = w.b.exp_avg_sq;
    float* __restrict r = w.b.update;
    // A norm block at a time, so that its sums read p and r from cache.
    bool all_finite = true;
    for (std::size_t k = begin; k < end; k += kLambNormBlock) {
      const std::size_t count = end - k < kLambNormBlock ? end - k : kLambNormBlock;
      all_finite = for_range<force_simd<G, P>>(
                       k, k + count,
                       [&](std::size_t i) __attribute__((always_inline)) {
                         return lamb_direction_element(p[i], load_grad(g, i), m[i], v[i], r[i], s);
                       }) &&
                   all_finite;
      lane_sum_squares2(p, r, k, count, w.sums[2 * (k / kLambNormBlock)],
                        w.sums[2 * (k / kLambNormBlock) + 1]);
    }
    return all_finite;
  }
  SHARDOPT_HOST_DEVICE static bool apply(const LambBuffers& b, const LambScalars& s,
                                         std::size_t i) {
    return lamb_direction_element(values(b)[i], load_grad(static_cast<const G*>(b.grad), i),
                                  b.exp_avg[i], b.exp_avg_sq[i], b.update[i], s);
  }
  // The parameters' fp32 values, indexable (decoded with remainders).
  SHARDOPT_HOST_DEVICE static auto values(const LambBuffers& b) {
    return P::values(b.param, reinterpret_cast<const typename P::Copy*>(b.param_bf16), b.remainder);
  }
};

template <class P>
struct LambApplyLoop {
  // The gradient type and parameter storage, and the same loop over others
  // (kernels/cpu/runner.hpp stages 16-bit buffers through fp32 blocks).
  using Grad = float;
  using Storage = P;
  template <class G2, class P2>
  using Rebind = LambApplyLoop<P2>;
  [[gnu::always_inline]] static inline bool range(const LambApplyBuffers& b, const float& neg_step,
                                                  std::size_t begin, std::size_t end) {
    float* __restrict p = b.param;
    typename P::Copy* __restrict copy = static_cast<typename P::Copy*>(b.param_out);
    std::uint16_t* __restrict rem = b.remainder;
    const float* __restrict r = b.update;
#pragma omp simd
    for (std::size_t i = begin; i < end; ++i) {
      float pi = P::load(p, copy, rem, i);
      lamb_apply_element(pi, r[i], neg_step);
      P::store(p, copy, rem, i, pi);
    }
    return true;
  }
  SHARDOPT_HOST_DEVICE static bool apply(const LambApplyBuffers& b, const float& neg_step,
                                         std::size_t i) {
    typename P::Copy* copy = static_cast<typename P::Copy*>(b.param_out);
    float p = P::load(b.param, copy, b.remainder, i);
    lamb_apply_element(p, b.update[i], neg_step);
    P::store(b.param, copy, b.remainder, i, p);
    return true;
  }
};

// The norms from the blocks' sums, added in block order.
inline LambNorms lamb_sum_blocks(const double* sums, std::size_t n, bool finite) {
  LambNorms out;
  out.grads_finite = finite;
  for (std::size_t k = 0; k < (n + kLambNormBlock - 1) / kLambNormBlock; ++k) {
    out.param_sq = out.param_sq + sums[2 * k];
    out.update_sq = out.update_sq + sums[2 * k + 1];
  }
  return out;
}

template <class F>
bool dispatch_lamb_direction(const LambBuffers& b, F&& f) {
  return dispatch_types(b.grad_type, nullptr, DType::f32, b.remainder, [&]<class G, class P>() {
    // The pass writes no copy: P is MasterParams<float> or RemainderParams.
    using Q = std::conditional_t<std::is_same_v<P, RemainderParams>, P, MasterParams<float>>;
    return f.template operator()<LambDirectionLoop<G, Q>>();
  });
}

template <class F>
bool dispatch_lamb_apply(const LambApplyBuffers& b, F&& f) {
  return dispatch_types(
      DType::f32, b.param_out, b.param_out_type, b.remainder,
      [&]<class G, class P>() { return f.template operator()<LambApplyLoop<P>>(); });
}

}  // namespace shardopt::kernels::detail
