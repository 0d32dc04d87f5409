// shardopt kernels (internal): the Adagrad loop over a range (reference and
// CPU kernels), the per-index step (CUDA kernel) and the dispatch over the
// step's types and modes. Included by .cpp and .cu files only.
#pragma once

#include <cstdint>

#include "kernels/adagrad.hpp"
#include "kernels/dispatch.hpp"

namespace shardopt::kernels::detail {

template <class G, class P, bool Wd>
struct AdagradLoop {
  // The gradient type and parameter storage, and the same loop over others
  // (kernels/cpu/runner.hpp stages 16-bit buffers through fp32 blocks).
  using Grad = G;
  using Storage = P;
  template <class G2, class P2>
  using Rebind = AdagradLoop<G2, P2, Wd>;
  // Updates [begin, end); returns true if every gradient there was finite.
  [[gnu::always_inline]] static inline bool range(const AdagradBuffers& b, const AdagradScalars& s,
                                                  std::size_t begin, std::size_t end) {
    float* __restrict p = b.param;
    typename P::Copy* __restrict copy = static_cast<typename P::Copy*>(b.param_out);
    std::uint16_t* __restrict rem = b.remainder;
    const G* __restrict g = static_cast<const G*>(b.grad);
    float* __restrict sum = b.sum;
    return for_range<force_simd<G, P>>(
        begin, end, [&](std::size_t i) __attribute__((always_inline)) {
          float pi = P::load(p, copy, rem, i);
          const bool finite = adagrad_element<Wd>(pi, load_grad(g, i), sum[i], s);
          P::store(p, copy, rem, i, pi);
          return finite;
        });
  }
  SHARDOPT_HOST_DEVICE static bool apply(const AdagradBuffers& b, const AdagradScalars& s,
                                         std::size_t i) {
    typename P::Copy* copy = static_cast<typename P::Copy*>(b.param_out);
    float p = P::load(b.param, copy, b.remainder, i);
    float sum = b.sum[i];
    const bool finite = adagrad_element<Wd>(p, load_grad(static_cast<const G*>(b.grad), i), sum, s);
    P::store(b.param, copy, b.remainder, i, p);
    b.sum[i] = sum;
    return finite;
  }
};

// Calls f.template operator()<AdagradLoop<...>>() for the step's types and modes.
template <class F>
bool dispatch_adagrad(const AdagradBuffers& b, const AdagradScalars& s, F&& f) {
  return dispatch_types(
      b.grad_type, b.param_out, b.param_out_type, b.remainder, [&]<class G, class P>() {
        return with_flags([&]<bool Wd>() { return f.template operator()<AdagradLoop<G, P, Wd>>(); },
                          s.weight_decay != 0.0f);
      });
}

}  // namespace shardopt::kernels::detail
