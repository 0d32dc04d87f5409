// shardopt kernels (internal): turns a step's run-time choices into template
// arguments, so that the element loops carry no branches. Included by the
// kernels' .cpp and .cu files only.
#pragma once

#include "kernels/element.hpp"
#include "shardopt/types.hpp"

namespace shardopt::kernels::detail {

// Calls f.template operator()<G, O>(): G the gradient type (float, bfloat16
// or float16), O the type of the low-precision parameter copy (float when
// there is none, else bfloat16 or float16).
template <class F>
bool dispatch_types(DType grad_type, const void* param_out, DType param_out_type, F&& f) {
  auto with_out = [&]<class G>() {
    if (param_out == nullptr) return f.template operator()<G, float>();
    if (param_out_type == DType::f16) return f.template operator()<G, float16>();
    return f.template operator()<G, bfloat16>();
  };
  switch (grad_type) {
    case DType::bf16:
      return with_out.template operator()<bfloat16>();
    case DType::f16:
      return with_out.template operator()<float16>();
    default:
      return with_out.template operator()<float>();
  }
}

// Calls f.template operator()<Flags...>() with the run-time flags as
// template arguments: with_flags(f, a, b) calls f.operator()<a, b>().
template <bool... Done, class F>
bool with_flags(F&& f) {
  return f.template operator()<Done...>();
}
template <bool... Done, class F, class... Rest>
bool with_flags(F&& f, bool first, Rest... rest) {
  return first ? with_flags<Done..., true>(f, rest...) : with_flags<Done..., false>(f, rest...);
}

}  // namespace shardopt::kernels::detail
