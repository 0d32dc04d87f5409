// shardopt kernels (internal): the Lion loop over a range (reference and CPU
// kernels), the per-index step (CUDA kernel) and the dispatch over the step's
// types. Included by .cpp and .cu files only.
#pragma once

#include <cstdint>

#include "kernels/dispatch.hpp"
#include "kernels/lion.hpp"

namespace shardopt::kernels::detail {

template <class G, class P>
struct LionLoop {
  // The gradient type and parameter storage, and the same loop over others
  // (kernels/cpu/runner.hpp stages 16-bit buffers through fp32 blocks).
  using Grad = G;
  using Storage = P;
  template <class G2, class P2>
  using Rebind = LionLoop<G2, P2>;
  // Updates [begin, end); returns true if every gradient there was finite.
  [[gnu::always_inline]] static inline bool range(const LionBuffers& b, const LionScalars& s,
                                                  std::size_t begin, std::size_t end) {
    float* __restrict p = b.param;
    typename P::Copy* __restrict copy = static_cast<typename P::Copy*>(b.param_out);
    std::uint16_t* __restrict rem = b.remainder;
    const G* __restrict g = static_cast<const G*>(b.grad);
    float* __restrict m = b.exp_avg;
    return for_range<force_simd<G, P>>(
        begin, end, [&](std::size_t i) __attribute__((always_inline)) {
          float pi = P::load(p, copy, rem, i);
          const bool finite = lion_element(pi, load_grad(g, i), m[i], s);
          P::store(p, copy, rem, i, pi);
          return finite;
        });
  }
  SHARDOPT_HOST_DEVICE static bool apply(const LionBuffers& b, const LionScalars& s,
                                         std::size_t i) {
    typename P::Copy* copy = static_cast<typename P::Copy*>(b.param_out);
    float p = P::load(b.param, copy, b.remainder, i);
    float m = b.exp_avg[i];
    const bool finite = lion_element(p, load_grad(static_cast<const G*>(b.grad), i), m, s);
    P::store(b.param, copy, b.remainder, i, p);
    b.exp_avg[i] = m;
    return finite;
  }
};

// Calls f.template operator()<LionLoop<...>>() for the step's types.
template <class F>
bool dispatch_lion(const LionBuffers& b, const LionScalars&, F&& f) {
  return dispatch_types(
      b.grad_type, b.param_out, b.param_out_type, b.remainder,
      [&]<class G, class P>() { return f.template operator()<LionLoop<G, P>>(); });
}

}  // namespace shardopt::kernels::detail
