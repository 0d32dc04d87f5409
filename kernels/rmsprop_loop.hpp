// shardopt kernels (internal): the RMSprop loop over a range (reference and
// CPU kernels), the per-index step (CUDA kernel) and the dispatch over the
// step's types and modes. Included by .cpp and .cu files only.
#pragma once

#include <cstdint>

#include "kernels/dispatch.hpp"
#include "kernels/rmsprop.hpp"

namespace shardopt::kernels::detail {

template <class G, class P, bool Wd, bool Centered, bool Mom>
struct RmspropLoop {
  // The gradient type and parameter storage, and the same loop over others
  // (kernels/cpu/runner.hpp stages 16-bit buffers through fp32 blocks).
  using Grad = G;
  using Storage = P;
  template <class G2, class P2>
  using Rebind = RmspropLoop<G2, P2, Wd, Centered, Mom>;
  // Updates [begin, end); returns true if every gradient there was finite.
  [[gnu::always_inline]] static inline bool range(const RmspropBuffers& b, const RmspropScalars& s,
                                                  std::size_t begin, std::size_t end) {
    float* __restrict p = b.param;
    typename P::Copy* __restrict copy = static_cast<typename P::Copy*>(b.param_out);
    std::uint16_t* __restrict rem = b.remainder;
    const G* __restrict g = static_cast<const G*>(b.grad);
    float* __restrict sq = b.square_avg;
    float* __restrict ga = b.grad_avg;
    float* __restrict buf = b.momentum_buffer;
    return for_range<force_simd<G, P>>(
        begin, end, [&](std::size_t i) __attribute__((always_inline)) {
          float pi = P::load(p, copy, rem, i);
          const bool finite = rmsprop_element<Wd, Centered, Mom>(
              pi, load_grad(g, i), sq[i], Centered ? ga + i : nullptr, Mom ? buf + i : nullptr, s);
          P::store(p, copy, rem, i, pi);
          return finite;
        });
  }
  SHARDOPT_HOST_DEVICE static bool apply(const RmspropBuffers& b, const RmspropScalars& s,
                                         std::size_t i) {
    typename P::Copy* copy = static_cast<typename P::Copy*>(b.param_out);
    float p = P::load(b.param, copy, b.remainder, i);
    float sq = b.square_avg[i];
    float ga = Centered ? b.grad_avg[i] : 0.0f;
    float buf = Mom ? b.momentum_buffer[i] : 0.0f;
    const bool finite = rmsprop_element<Wd, Centered, Mom>(
        p, load_grad(static_cast<const G*>(b.grad), i), sq, &ga, &buf, s);
    P::store(b.param, copy, b.remainder, i, p);
    b.square_avg[i] = sq;
    if constexpr (Centered) b.grad_avg[i] = ga;
    if constexpr (Mom) b.momentum_buffer[i] = buf;
    return finite;
  }
};

// Calls f.template operator()<RmspropLoop<...>>() for the step's types and modes.
template <class F>
bool dispatch_rmsprop(const RmspropBuffers& b, const RmspropScalars& s, F&& f) {
  return dispatch_types(
      b.grad_type, b.param_out, b.param_out_type, b.remainder, [&]<class G, class P>() {
        return with_flags(
            [&]<bool Wd, bool Centered, bool Mom>() {
              return f.template operator()<RmspropLoop<G, P, Wd, Centered, Mom>>();
            },
            s.weight_decay != 0.0f, s.centered, s.momentum != 0.0f);
      });
}

}  // namespace shardopt::kernels::detail
