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
  // range with a vector of lanes V (the CPU kernels: kernels/cpu/lanes.hpp):
  // 16 elements at a time, element j of a norm block in lane j % 16 of the
  // block's sums, so that the sums are lane_sum_squares2's bitwise, taken
  // while p and r are still in registers. prefetch(i) prefetches the
  // buffers ahead of the group of elements from i.
  template <class V, class Prefetch>
  [[gnu::always_inline]] static inline bool range_lanes(const LambWork& w, const LambScalars& s,
                                                        std::size_t begin, std::size_t end,
                                                        const Prefetch& prefetch) {
    static_assert(V::width == kNormLanes && kLambNormBlock % kNormLanes == 0);
    const LambBuffers& b = w.b;
    const auto* hi = reinterpret_cast<const typename P::Copy*>(b.param_bf16);
    const G* g = static_cast<const G*>(b.grad);
    unsigned finite = ~0u;
    bool tail_finite = true;
    for (std::size_t k = begin; k < end; k += kLambNormBlock) {
      const std::size_t count = end - k < kLambNormBlock ? end - k : kLambNormBlock;
      typename V::Sums sp = V::zero_sums(), sr = V::zero_sums();
      std::size_t j = 0;
      for (; j + V::width <= count; j += V::width) {
        const std::size_t i = k + j;
        prefetch(i);
        const V p = P::template load_lanes<V>(b.param, hi, b.remainder, i);
        V m = V::load(b.exp_avg + i), v = V::load(b.exp_avg_sq + i), r;
        finite &= V::bits(lamb_direction_element(p, V::load(g + i), m, v, r, s));
        V::store(b.exp_avg + i, m);
        V::store(b.exp_avg_sq + i, v);
        V::store(b.update + i, r);
        V::add_squares(sp, p);
        V::add_squares(sr, r);
      }
      double lp[kNormLanes], lr[kNormLanes];
      V::store_sums(lp, sp);
      V::store_sums(lr, sr);
      // The block's last count - j elements (the end of the range), element
      // j + l to lane l, then the lanes' tree: as lane_sum_squares2.
      const auto p = values(b);
      for (std::size_t l = 0; j + l < count; ++l) {
        const std::size_t i = k + j + l;
        tail_finite = lamb_direction_element(p[i], load_grad(g, i), b.exp_avg[i], b.exp_avg_sq[i],
                                             b.update[i], s) &&
                      tail_finite;
        const double u = static_cast<double>(p[i]), x = static_cast<double>(b.update[i]);
        lp[l] += u * u;
        lr[l] += x * x;
      }
      for (int width = kNormLanes / 2; width > 0; width /= 2) {
        for (int l = 0; l < width; ++l) {
          lp[l] += lp[l + width];
          lr[l] += lr[l + width];
        }
      }
      w.sums[2 * (k / kLambNormBlock)] = lp[0];
      w.sums[2 * (k / kLambNormBlock) + 1] = lr[0];
    }
    return (finite & 0xffffu) == 0xffffu && tail_finite;
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
  // The V::width elements from i with a vector of lanes V (kernels/cpu/lanes.hpp).
  template <class V>
  [[gnu::always_inline]] static inline unsigned lanes(const LambApplyBuffers& b,
                                                      const float& neg_step, std::size_t i) {
    using Copy = typename P::Copy;
    Copy* copy = static_cast<Copy*>(b.param_out);
    V p = P::template load_lanes<V>(b.param, copy, b.remainder, i);
    lamb_apply_element(p, V::load(b.update + i), neg_step);
    P::template store_lanes<V>(b.param, copy, b.remainder, i, p);
    return ~0u;
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
