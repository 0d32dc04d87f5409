// shardopt kernels (internal): the Adam loop over a range (reference and CPU
// kernels), the per-index step (CUDA kernel) and the dispatch over the step's
// types and modes. Included by .cpp and .cu files only.
#pragma once

#include <type_traits>

#include "kernels/adam.hpp"
#include "kernels/dispatch.hpp"

namespace shardopt::kernels::detail {

template <class G, class O, WeightDecay W, bool Ams>
struct AdamLoop {
  // Updates [begin, end); returns true if every gradient there was finite.
  [[gnu::always_inline]] static inline bool range(const AdamBuffers& b, const AdamScalars& s,
                                                  std::size_t begin, std::size_t end) {
    float* __restrict p = b.param;
    const G* __restrict g = static_cast<const G*>(b.grad);
    float* __restrict m = b.exp_avg;
    float* __restrict v = b.exp_avg_sq;
    float* __restrict vmax = b.max_exp_avg_sq;
    O* __restrict out = static_cast<O*>(b.param_out);
    unsigned bad = 0;
    for (std::size_t i = begin; i < end; ++i) {
      float pi = p[i];
      bad |= !adam_element<W, Ams>(pi, load_grad(g, i), m[i], v[i], Ams ? vmax + i : nullptr, s);
      p[i] = pi;
      if constexpr (!std::is_same_v<O, float>) store_param(out, i, pi);
    }
    return bad == 0;
  }
  SHARDOPT_HOST_DEVICE static bool apply(const AdamBuffers& b, const AdamScalars& s,
                                         std::size_t i) {
    float p = b.param[i], m = b.exp_avg[i], v = b.exp_avg_sq[i];
    const bool finite = adam_element<W, Ams>(p, load_grad(static_cast<const G*>(b.grad), i), m, v,
                                             Ams ? b.max_exp_avg_sq + i : nullptr, s);
    b.param[i] = p;
    b.exp_avg[i] = m;
    b.exp_avg_sq[i] = v;
    if constexpr (!std::is_same_v<O, float>) store_param(static_cast<O*>(b.param_out), i, p);
    return finite;
  }
};

// Calls f.template operator()<AdamLoop<...>>() for the step's types and modes.
template <class F>
bool dispatch_adam(const AdamBuffers& b, const AdamScalars& s, F&& f) {
  return dispatch_types(b.grad_type, b.param_out, b.param_out_type, [&]<class G, class O>() {
    auto with_ams = [&]<WeightDecay W>() {
      return s.amsgrad ? f.template operator()<AdamLoop<G, O, W, true>>()
                       : f.template operator()<AdamLoop<G, O, W, false>>();
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
