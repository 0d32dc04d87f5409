// shardopt kernels: the loop every element-wise optimizer runs, written once.
// An optimizer's math header (kernels/<key>.hpp) gives
//
//   - its Buffers: StateBuffers<Buffers> (below) with one float* per state
//     slot and each_state() listing them in slot order;
//   - its element steps: one small struct per combination of the step's
//     modes (weight decay, amsgrad, ...), each deriving from
//     StepTypes<Buffers, Scalars> (below), with
//       SHARDOPT_HOST_DEVICE static bool apply(float& p, float g, const Buffers& b,
//                                              std::size_t i, const Scalars& s);
//     which updates the parameter's fp32 value p and element i of b's
//     states, g being the gradient as float (before grad_mul), and returns
//     whether the gradient was finite; and, optionally,
//       static constexpr bool plain_loop = true;
//     when GCC vectorizes its CPU loop unforced (plain_loop(), below), and
//       each_buffer(Buffers&, const Scalars&, F&&)
//     where it refines the buffers' accesses (kernels/vector_step.hpp);
//   - Kernel<O> deriving from ElementKernel<O, Buffers, Scalars> with
//       static Scalars scalars(const O&, std::int64_t step, double grad_mul);
//       template <class F> static bool modes(const Scalars& s, F&& f);
//     which calls f.template operator()<Step>() with the step struct of s's modes.
//
// ElementLoop<Step, G, P> then loads each parameter as fp32 from its storage
// P (kernels/element.hpp), converts the gradient from G, runs Step::apply and
// stores the parameter back: a whole range for the reference and CPU kernels
// (range), one element for the CUDA kernels (apply).
#pragma once

#include <cstddef>
#include <cstdint>

#include "kernels/dispatch.hpp"
#include "kernels/element.hpp"
#include "kernels/optimizer.hpp"

namespace shardopt::kernels {

// The types an element step and Kernel<O> name: the step's buffers and scalars.
template <class B, class S>
struct StepTypes {
  using Buffers = B;
  using Scalars = S;
};

// The buffers of an element-wise step: StepBuffers' and the states that D,
// the optimizer's Buffers struct deriving from this one, lists with
//   template <class F> SHARDOPT_HOST_DEVICE constexpr void each_state(F&& f);
// calling f(float*&) on each state pointer in slot order. Every state is
// read and written.
template <class D>
struct StateBuffers : StepBuffers {
  // Calls f(pointer, bytes per element, access) on every buffer, null ones
  // included: StepBuffers' and the states.
  template <class F>
  SHARDOPT_HOST_DEVICE constexpr void each_buffer(F&& f) {
    each_step_buffer(f, [&] {
      static_cast<D*>(this)->each_state([&](float*& state) { f(state, 4, Access::read_write); });
    });
  }
};

}  // namespace shardopt::kernels

namespace shardopt::kernels::detail {

// The number of states B::each_state lists.
template <class B>
constexpr int state_count() {
  B b{};
  int n = 0;
  b.each_state([&n](float*&) { ++n; });
  return n;
}

// Whether Step says its loop vectorizes without help (Step::plain_loop):
// then the CPU loop is not forced to vectorize, and its 16-bit buffers are
// staged through fp32 (kernels/cpu/runner.hpp).
template <class Step>
constexpr bool plain_loop() {
  if constexpr (requires { Step::plain_loop; })
    return Step::plain_loop;
  else
    return false;
}

template <class Step, class G, class P>
struct ElementLoop {
  using Buffers = typename Step::Buffers;
  using Scalars = typename Step::Scalars;
  // The gradient type and parameter storage, and the same loop over others
  // (kernels/cpu/runner.hpp stages 16-bit buffers through fp32 blocks).
  using Grad = G;
  using Storage = P;
  template <class G2, class P2>
  using Rebind = ElementLoop<Step, G2, P2>;
  static constexpr bool direct_bf16 = !plain_loop<Step>();

  // Updates [begin, end); returns true if every gradient there was finite.
  [[gnu::always_inline]] static inline bool range(const Buffers& b, const Scalars& s,
                                                  std::size_t begin, std::size_t end) {
    float* __restrict p = b.param;
    typename P::Copy* __restrict copy = static_cast<typename P::Copy*>(b.param_out);
    std::uint16_t* __restrict rem = b.remainder;
    const G* __restrict g = static_cast<const G*>(b.grad);
    // A local copy: no store of the loop can change the state pointers.
    const Buffers states = b;
    constexpr bool simd = !plain_loop<Step>() && force_simd<G, P>;
    return for_range<simd>(
        begin, end, [&](std::size_t i) __attribute__((always_inline)) {
          float pi = P::load(p, copy, rem, i);
          const bool finite = Step::apply(pi, load_grad(g, i), states, i, s);
          P::store(p, copy, rem, i, pi);
          return finite;
        });
  }
  // Updates the V::width elements from i at once, V a vector of lanes (the
  // CPU kernels: kernels/cpu/lanes.hpp): the parameters, gradients and every
  // state there loaded into V's lanes (16-bit buffers converted), the element
  // step run on the lanes, what it writes stored back. Returns a mask of the
  // lanes whose gradient was finite (bit l for lane l).
  template <class V>
  [[gnu::always_inline]] static inline unsigned lanes(const Buffers& b, const Scalars& s,
                                                      std::size_t i) {
    using Copy = typename P::Copy;
    Copy* copy = static_cast<Copy*>(b.param_out);
    V p = P::template load_lanes<V>(b.param, copy, b.remainder, i);
    const V g = V::load(static_cast<const G*>(b.grad) + i);
    // The element step finds each state's lanes through the buffers' pointer
    // (lane<V>(ptr, 0), kernels/element.hpp), set whether or not the state
    // is there: a step never touches a state its modes do not use (the
    // buffers of an unused slot are null), and pointers that are always
    // those of `states` let the compiler keep the lanes in registers. The
    // lambdas only move pointers: the lanes' operations are inlined only
    // into the vector unit's loop, never into generic code
    // (kernels/cpu/lanes.hpp).
    constexpr int kStates = state_count<Buffers>();
    float* in[kStates];
    V states[kStates];
    Buffers view = b;
    int k = 0;
    view.each_state([&](float*& ptr) __attribute__((always_inline)) {
      in[k] = ptr;
      ptr = reinterpret_cast<float*>(&states[k]);
      ++k;
    });
    for (int j = 0; j < kStates; ++j) {
      if (in[j] != nullptr) states[j] = V::load(in[j] + i);
    }
    const unsigned finite = V::bits(Step::apply(p, g, view, 0, s));
    for (int j = 0; j < kStates; ++j) {
      if (in[j] != nullptr) V::store(in[j] + i, states[j]);
    }
    P::template store_lanes<V>(b.param, copy, b.remainder, i, p);
    return finite;
  }
  // Updates element i (the CUDA kernels: kernels/vector_step.hpp).
  SHARDOPT_HOST_DEVICE static bool apply(const Buffers& b, const Scalars& s, std::size_t i) {
    typename P::Copy* copy = static_cast<typename P::Copy*>(b.param_out);
    float p = P::load(b.param, copy, b.remainder, i);
    const bool finite = Step::apply(p, load_grad(static_cast<const G*>(b.grad), i), b, i, s);
    P::store(b.param, copy, b.remainder, i, p);
    return finite;
  }
  // The buffers and how this step uses them, where Step refines them.
  template <class F>
  requires requires(Buffers& b, const Scalars& s, F&& f) { Step::each_buffer(b, s, f); }
  SHARDOPT_HOST_DEVICE static void each_buffer(Buffers& b, const Scalars& s, F&& f) {
    Step::each_buffer(b, s, f);
  }
};

}  // namespace shardopt::kernels::detail

namespace shardopt::kernels {

// What Kernel<O> (kernels/optimizer.hpp) has in common for every
// element-wise optimizer O: its types, the states set in slot order, and the
// dispatch of a step to the loop of its types and modes (Kernel<O>::modes).
template <class O, class B, class S>
struct ElementKernel : StepTypes<B, S> {
  using Family = O;
  static void set_states(B& b, float* const* states) {
    int k = 0;
    b.each_state([&](float*& state) { state = states[k++]; });
  }
  template <class F>
  static bool dispatch(const B& b, const S& s, F&& f) {
    return detail::dispatch_types(
        b.grad_type, b.param_out, b.param_out_type, b.remainder, [&]<class G, class P>() {
          return Kernel<O>::modes(s, [&]<class Step>() {
            return f.template operator()<detail::ElementLoop<Step, G, P>>();
          });
        });
  }
};

}  // namespace shardopt::kernels
