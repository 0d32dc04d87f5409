// shardopt kernels (internal): the Adam loop over a range (reference and CPU
// kernels), the per-index step (CUDA kernel) and the dispatch over the step's
// types and modes. Included by .cpp and .cu files only.
#pragma once

#include <cstdint>

#include "kernels/adam.hpp"
#include "kernels/dispatch.hpp"

namespace shardopt::kernels::detail {

template <class G, class P, WeightDecay W, bool Ams>
struct AdamLoop {
  // The gradient type and parameter storage, and the same loop over others
  // (kernels/cpu/runner.hpp stages 16-bit buffers through fp32 blocks).
  using Grad = G;
  using Storage = P;
  template <class G2, class P2>
  using Rebind = AdamLoop<G2, P2, W, Ams>;
  // Updates [begin, end); returns true if every gradient there was finite.
  [[gnu::always_inline]] static inline bool range(const AdamBuffers& b, const AdamScalars& s,
                                                  std::size_t begin, std::size_t end) {
    float* __restrict p = b.param;
    typename P::Copy* __restrict copy = static_cast<typename P::Copy*>(b.param_out);
    std::uint16_t* __restrict rem = b.remainder;
    const G* __restrict g = static_cast<const G*>(b.grad);
    float* __restrict m = b.exp_avg;
    float* __restrict v = b.exp_avg_sq;
    float* __restrict vmax = b.max_exp_avg_sq;
    return for_range<force_simd<G, P>>(
        begin, end, [&](std::size_t i) __attribute__((always_inline)) {
          float pi = P::load(p, copy, rem, i);
          const bool finite =
              adam_element<W, Ams>(pi, load_grad(g, i), m[i], v[i], Ams ? vmax + i : nullptr, s);
          P::store(p, copy, rem, i, pi);
          return finite;
        });
  }
  SHARDOPT_HOST_DEVICE static bool apply(const AdamBuffers& b, const AdamScalars& s,
                                         std::size_t i) {
    typename P::Copy* copy = static_cast<typename P::Copy*>(b.param_out);
    float p = P::load(b.param, copy, b.remainder, i), m = b.exp_avg[i], v = b.exp_avg_sq[i];
    const bool finite = adam_element<W, Ams>(p, load_grad(static_cast<const G*>(b.grad), i), m, v,
                                             Ams ? b.max_exp_avg_sq + i : nullptr, s);
    P::store(b.param, copy, b.remainder, i, p);
    b.exp_avg[i] = m;
    b.exp_avg_sq[i] = v;
    return finite;
  }
};

// Calls f.template operator()<AdamLoop<...>>() for the step's types and modes.
template <class F>
bool dispatch_adam(const AdamBuffers& b, const AdamScalars& s, F&& f) {
  return dispatch_types(b.grad_type, b.param_out, b.param_out_type, b.remainder,
                        [&]<class G, class P>() {
                          auto with_ams = [&]<WeightDecay W>() {
                            return s.amsgrad ? f.template operator()<AdamLoop<G, P, W, true>>()
                                             : f.template operator()<AdamLoop<G, P, W, false>>();
                          };
                          switch (s.wd_mode) {
                            case WeightDecay::l2:
                              return with_ams.template operator()<WeightDecay::l2>();
                            case WeightDecay::decoupled:
                              return with_ams.template operator()<WeightDecay::decoupled>();
                            default:
                              return with_ams.template operator()<WeightDecay::none>();
                          }
                        });
}

}  // namespace shardopt::kernels::detail
