// shardopt kernels: the fused step of every element-wise optimizer, declared
// once for the three backends. Each optimizer's math header
// (kernels/<key>.hpp: its scalars, its per-element function, its buffers and
// its loops) specializes Kernel<O> for its options struct O
// (shardopt/optimizers.hpp):
//
//   using Family = O, or the optimizer whose kernels also run O (AdamW: Adam)
//   using Buffers = ...;   StepBuffers plus one float* per state slot
//   using Scalars = ...;   the step's scalars, rounded as torch rounds them
//   static Scalars scalars(const O&, std::int64_t step, double grad_mul);
//   static void set_states(Buffers&, float* const* states);  // slot order, null if unused
//   template <class F>     // Family only: f.template operator()<Loop>() with the
//   static bool dispatch(const Buffers&, const Scalars&, F&& f);  // step's loop
//
// The build compiles step<O> once per backend for every family from the
// templates below (kernels/meson.build), so adding an optimizer adds no
// kernel source file.
#pragma once

#include <cstdint>
#include <span>

#include "shardopt/optimizers.hpp"

namespace shardopt::kernels {

template <class O>
struct Kernel;

// The options type whose kernels run O.
template <class O>
using family_of = typename Kernel<O>::Family;

// Each returns true if every gradient was finite (after grad_mul); the
// update is applied either way (callers that skip on overflow check first).
namespace reference {
// One plain loop, no threads, no vector paths: the result the other
// backends must match bitwise.
template <class O>
bool step(const typename Kernel<O>::Buffers& b, const typename Kernel<O>::Scalars& s);
}  // namespace reference
namespace cpu {
// OpenMP across threads, AVX-512 / AVX2 / baseline chosen at run time.
template <class O>
bool step(const typename Kernel<O>::Buffers& b, const typename Kernel<O>::Scalars& s);
}  // namespace cpu
namespace cuda {
// Device buffers; `stream` is a cudaStream_t (null: the default stream).
// Synchronous: returns when the step is done. Not built without CUDA (the
// functional layer raises NotCompiledError first).
template <class O>
bool step(const typename Kernel<O>::Buffers& b, const typename Kernel<O>::Scalars& s, void* stream);
// The same step on a list of tensors, one Buffers each (device buffers, not
// overlapping), with the same scalars: one launch per group of tensors of
// the same types and modes, or a few for long lists
// (kernels/cuda/multi_tensor.cuh).
template <class O>
bool step(std::span<const typename Kernel<O>::Buffers> tensors,
          const typename Kernel<O>::Scalars& s, void* stream);
// The list step enqueued on `stream`, returning at once: no finiteness
// result, and nothing is written when the device word *skip (may be null)
// is non-zero as the stream reaches the step (apex's noop flag).
template <class O>
void step_async(std::span<const typename Kernel<O>::Buffers> tensors,
                const typename Kernel<O>::Scalars& s, const unsigned* skip, void* stream);
}  // namespace cuda

}  // namespace shardopt::kernels
