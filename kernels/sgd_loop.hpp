// shardopt kernels (internal): the SGD loop over a range (reference and CPU
// kernels), the per-index step (CUDA kernel) and the dispatch over the step's
// types and modes. Included by .cpp and .cu files only.
#pragma once

#include <cstdint>

#include "kernels/dispatch.hpp"
#include "kernels/sgd.hpp"

namespace shardopt::kernels::detail {

template <class G, class P, bool Wd, bool Mom>
struct SgdLoop {
  // The gradient type and parameter storage, and the same loop over others
  // (kernels/cpu/runner.hpp stages 16-bit buffers through fp32 blocks).
  using Grad = G;
  using Storage = P;
  template <class G2, class P2>
  using Rebind = SgdLoop<G2, P2, Wd, Mom>;
  // GCC declines to vectorize this loop with bf16 (and forcing it slows the
  // fp32 one): its 16-bit buffers are staged (kernels/cpu/runner.hpp).
  static constexpr bool direct_bf16 = false;
  // Updates [begin, end); returns true if every gradient there was finite.
  [[gnu::always_inline]] static inline bool range(const SgdBuffers& b, const SgdScalars& s,
                                                  std::size_t begin, std::size_t end) {
    float* __restrict p = b.param;
    typename P::Copy* __restrict copy = static_cast<typename P::Copy*>(b.param_out);
    std::uint16_t* __restrict rem = b.remainder;
    const G* __restrict g = static_cast<const G*>(b.grad);
    float* __restrict buf = b.momentum_buffer;
    unsigned bad = 0;
    for (std::size_t i = begin; i < end; ++i) {
      float pi = P::load(p, copy, rem, i);
      bad |= !sgd_element<Wd, Mom>(pi, load_grad(g, i), Mom ? buf + i : nullptr, s);
      P::store(p, copy, rem, i, pi);
    }
    return bad == 0;
  }
  SHARDOPT_HOST_DEVICE static bool apply(const SgdBuffers& b, const SgdScalars& s, std::size_t i) {
    typename P::Copy* copy = static_cast<typename P::Copy*>(b.param_out);
    float p = P::load(b.param, copy, b.remainder, i);
    // The first step writes the buffer without reading it (torch's clone of d_p).
    float buf = Mom && !s.first_step ? b.momentum_buffer[i] : 0.0f;
    const bool finite =
        sgd_element<Wd, Mom>(p, load_grad(static_cast<const G*>(b.grad), i), &buf, s);
    P::store(b.param, copy, b.remainder, i, p);
    if constexpr (Mom) b.momentum_buffer[i] = buf;
    return finite;
  }
  // The buffers and how this loop uses them (the CUDA kernels' vector loads):
  // with momentum, the first step only writes the momentum buffer.
  template <class F>
  SHARDOPT_HOST_DEVICE static void each_buffer(SgdBuffers& b, const SgdScalars& s, F&& f) {
    b.each_buffer(f, Mom && s.first_step ? Access::write : Access::read_write);
  }
};

// Calls f.template operator()<SgdLoop<...>>() for the step's types and modes.
template <class F>
bool dispatch_sgd(const SgdBuffers& b, const SgdScalars& s, F&& f) {
  return dispatch_types(
      b.grad_type, b.param_out, b.param_out_type, b.remainder, [&]<class G, class P>() {
        return with_flags(
            [&]<bool Wd, bool Mom>() { return f.template operator()<SgdLoop<G, P, Wd, Mom>>(); },
            s.weight_decay != 0.0f, s.momentum != 0.0f);
      });
}

}  // namespace shardopt::kernels::detail
