// shardopt kernels (internal): the Lion loop over a range (reference and CPU
// kernels), the per-index step (CUDA kernel) and the dispatch over the step's
// types. Included by .cpp and .cu files only.
#pragma once

#include <type_traits>

#include "kernels/dispatch.hpp"
#include "kernels/lion.hpp"

namespace shardopt::kernels::detail {

template <class G, class O>
struct LionLoop {
  // Updates [begin, end); returns true if every gradient there was finite.
  [[gnu::always_inline]] static inline bool range(const LionBuffers& b, const LionScalars& s,
                                                  std::size_t begin, std::size_t end) {
    float* __restrict p = b.param;
    const G* __restrict g = static_cast<const G*>(b.grad);
    float* __restrict m = b.exp_avg;
    O* __restrict out = static_cast<O*>(b.param_out);
    unsigned bad = 0;
    for (std::size_t i = begin; i < end; ++i) {
      float pi = p[i];
      bad |= !lion_element(pi, load_grad(g, i), m[i], s);
      p[i] = pi;
      if constexpr (!std::is_same_v<O, float>) store_param(out, i, pi);
    }
    return bad == 0;
  }
  SHARDOPT_HOST_DEVICE static bool apply(const LionBuffers& b, const LionScalars& s,
                                         std::size_t i) {
    float p = b.param[i];
    float m = b.exp_avg[i];
    const bool finite = lion_element(p, load_grad(static_cast<const G*>(b.grad), i), m, s);
    b.param[i] = p;
    b.exp_avg[i] = m;
    if constexpr (!std::is_same_v<O, float>) store_param(static_cast<O*>(b.param_out), i, p);
    return finite;
  }
};

// Calls f.template operator()<LionLoop<...>>() for the step's types.
template <class F>
bool dispatch_lion(const LionBuffers& b, const LionScalars&, F&& f) {
  return dispatch_types(b.grad_type, b.param_out, b.param_out_type, [&]<class G, class O>() {
    return f.template operator()<LionLoop<G, O>>();
  });
}

}  // namespace shardopt::kernels::detail
