// shardopt kernels (internal): the Adam loop over a range, shared by the
// reference and CPU kernels, and the dispatch over the step's types and
// modes. Included by .cpp files only.
#pragma once

#include <type_traits>

#include "kernels/adam.hpp"

namespace shardopt::kernels::detail {

// Updates [begin, end); returns true if every gradient there was finite.
template <class G, class O, WeightDecay W, bool Ams>
[[gnu::always_inline]] inline bool adam_range(const AdamBuffers& b, const AdamScalars& s,
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

// Calls f.template operator()<G, O, W, Ams>() for the step's types and modes.
template <class F>
bool dispatch_adam(const AdamBuffers& b, const AdamScalars& s, F&& f) {
  auto with_mode = [&]<class G, class O>() {
    switch (s.wd_mode) {
      case WeightDecay::none:
        return s.amsgrad ? f.template operator()<G, O, WeightDecay::none, true>()
                         : f.template operator()<G, O, WeightDecay::none, false>();
      case WeightDecay::l2:
        return s.amsgrad ? f.template operator()<G, O, WeightDecay::l2, true>()
                         : f.template operator()<G, O, WeightDecay::l2, false>();
      case WeightDecay::decoupled:
        return s.amsgrad ? f.template operator()<G, O, WeightDecay::decoupled, true>()
                         : f.template operator()<G, O, WeightDecay::decoupled, false>();
    }
    return false;
  };
  auto with_out = [&]<class G>() {
    if (b.param_out == nullptr) return with_mode.template operator()<G, float>();
    if (b.param_out_type == DType::f16) return with_mode.template operator()<G, float16>();
    return with_mode.template operator()<G, bfloat16>();
  };
  switch (b.grad_type) {
    case DType::bf16:
      return with_out.template operator()<bfloat16>();
    case DType::f16:
      return with_out.template operator()<float16>();
    default:
      return with_out.template operator()<float>();
  }
}

}  // namespace shardopt::kernels::detail
