// shardopt kernels (internal): turns a step's run-time choices into template
// arguments, so that the element loops carry no branches. Included by the
// kernels' .cpp and .cu files only.
#pragma once

#include <cstdint>

#include "kernels/element.hpp"
#include "shardopt/types.hpp"

namespace shardopt::kernels::detail {

// Calls f.template operator()<G, P>(): G the gradient type (float, bfloat16
// or float16), P the parameters' storage: RemainderParams when `remainder`
// is set, else MasterParams<O> with O the type of the low-precision copy
// (float when there is none, else bfloat16 or float16).
template <class F>
bool dispatch_types(DType grad_type, const void* param_out, DType param_out_type,
                    const std::uint16_t* remainder, F&& f) {
  auto with_storage = [&]<class G>() {
    if (remainder != nullptr) return f.template operator()<G, RemainderParams>();
    if (param_out == nullptr) return f.template operator()<G, MasterParams<float>>();
    if (param_out_type == DType::f16) return f.template operator()<G, MasterParams<float16>>();
    return f.template operator()<G, MasterParams<bfloat16>>();
  };
  switch (grad_type) {
    case DType::bf16:
      return with_storage.template operator()<bfloat16>();
    case DType::f16:
      return with_storage.template operator()<float16>();
    default:
      return with_storage.template operator()<float>();
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
