// shardopt CPU kernels (internal): the split of a range across OpenMP threads
// and the run-time choice of the vector unit (AVX-512, AVX2 or the x86-64
// baseline: one binary for every node type), shared by the CPU kernels.
// With AVX-512 or AVX2 the optimizers' kernels run their element step on 16
// lanes at a time (Loop::lanes or Loop::range_lanes, over the lanes of
// kernels/cpu/lanes.hpp) and the last elements of a range with
// Loop::range. On the baseline unit they run Loop::range(b, s, begin, end),
// an always-inline loop the compiler vectorizes; there loops over f16
// gradients or with an f16 parameter copy (and bf16 where a loop does not
// vectorize it) run in blocks staged through fp32 (see range_staged). The
// other kernels split the range with for_slices. Included by .cpp files
// only.
#pragma once

#include <omp.h>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <type_traits>

#include "kernels/cpu/float_vectors.hpp"
#include "kernels/cpu/isa.hpp"
#include "kernels/cpu/lanes.hpp"
#include "kernels/element.hpp"

namespace shardopt::kernels::cpu::detail {

// The elements of one staged block: small, so that the conversions and the
// loop take turns often and every array streams steadily (a conversion of a
// whole page at once stalls on memory with the hardware prefetcher idle).
// A loop whose ranges must start on a coarser grid says so in
// Loop::stage_block (LAMB's direction pass: whole norm blocks).
inline constexpr std::size_t kStageBlock = 128;
template <class Loop>
constexpr std::size_t stage_block() {
  if constexpr (requires { Loop::stage_block; })
    return Loop::stage_block;
  else
    return kStageBlock;
}

// Conversions of a staged block, 16-bit <-> fp32, by the vector unit's
// conversions (kernels/cpu/float_vectors.hpp: F16C for f16), with exactly the
// results of load_grad and store_param (kernels/element.hpp).
template <Isa I, class Dst, class Src>
[[gnu::always_inline]] inline void convert_block(const Src* in, Dst* out, std::size_t n) {
  if constexpr (I == Isa::avx512)
    convert_avx512(in, out, 0, n);
  else if constexpr (I == Isa::avx2)
    convert_avx2(in, out, 0, n);
  else
    convert_scalar(in, out, 0, n);
}

// The buffers of a loop's first argument: itself, or what it wraps
// (an overload beside such a wrapper, found by argument-dependent lookup).
template <class B>
B& buffers_of(B& b) {
  return b;
}

// Whether Loop reads 16-bit gradients or writes a 16-bit parameter copy
// (not parameter remainders: their bf16 halves are read and written as they are).
// Whether Loop's own loop vectorizes bf16 gradients and copies (a shift in,
// integer rounding out): then bf16 is not staged, which would only add the
// block's extra passes. Loops say otherwise in Loop::direct_bf16.
template <class Loop>
constexpr bool direct_bf16() {
  if constexpr (requires { Loop::direct_bf16; })
    return Loop::direct_bf16;
  else
    return true;
}
template <class Loop>
inline constexpr bool stage_grad = std::is_same_v<typename Loop::Grad, float16> ||
                                   (std::is_same_v<typename Loop::Grad, bfloat16> &&
                                    !direct_bf16<Loop>());
template <class Loop>
inline constexpr bool stage_copy =
    std::is_same_v<typename Loop::Storage, MasterParams<float16>> ||
    (std::is_same_v<typename Loop::Storage, MasterParams<bfloat16>> && !direct_bf16<Loop>());

// Runs Loop over [begin, end) in blocks of kStageBlock: staged 16-bit
// gradients are converted into an fp32 block first, a staged 16-bit copy of
// the new parameters is written to an fp32 block and converted after, and
// between the two the loop vectorizes as the fp32 step does. The
// element function sees the same values, so the results are bitwise those
// of Loop::range.
template <class Loop, Isa I, class B, class S>
[[gnu::always_inline]] inline bool range_staged(const B& b, const S& s, std::size_t begin,
                                                std::size_t end) {
  using Copy = typename Loop::Storage::Copy;
  using Inner = typename Loop::template Rebind<
      std::conditional_t<stage_grad<Loop>, float, typename Loop::Grad>,
      std::conditional_t<stage_copy<Loop>, StagedCopyParams, typename Loop::Storage>>;
  constexpr std::size_t block = stage_block<Loop>();
  alignas(64) float grad[block];
  alignas(64) float copy[block];
  bool finite = true;
  for (std::size_t k = begin; k < end; k += block) {
    const std::size_t count = std::min(block, end - k);
    B part = subrange(b, k, count);
    auto& buffers = buffers_of(part);
    if constexpr (stage_grad<Loop>) {
      convert_block<I>(static_cast<const typename Loop::Grad*>(buffers.grad), grad, count);
      buffers.grad = grad;
    }
    if constexpr (stage_copy<Loop>) buffers.param_out = copy;
    finite = Inner::range(part, s, 0, count) && finite;
    if constexpr (stage_copy<Loop>)
      convert_block<I>(copy, static_cast<Copy*>(buffers_of(b).param_out) + k, count);
  }
  return finite;
}

template <class Loop, Isa I, class B, class S>
[[gnu::always_inline]] inline bool range_isa(const B& b, const S& s, std::size_t begin,
                                             std::size_t end) {
  if constexpr (stage_grad<Loop> || stage_copy<Loop>)
    return range_staged<Loop, I>(b, s, begin, end);
  else
    return Loop::range(b, s, begin, end);
}

#if defined(__x86_64__)
// The prefetch of every stream of a loop's buffers kPrefetchAhead elements
// ahead of the lanes (512 bytes of an fp32 array). The steps that divide and
// take square roots keep the core busy enough that the hardware prefetcher
// alone leaves the memory idle between requests when it is fast (this
// machine's bandwidth at 16M-64M parameters moves between ~55 and ~115
// GB/s): measured, 128 elements took Adam bf16 with AVX2 from 0.81 to 0.87
// of its limit in the fast stretches and changed nothing in the slow ones;
// 512 was worse than none.
inline constexpr std::size_t kPrefetchAhead = 128;
class Prefetch {
 public:
  template <class B>
  explicit Prefetch(const B& b) {
    B copy = b;
    buffers_of(copy).each_buffer([&](auto*& ptr, std::size_t bytes, Access) {
      if (ptr != nullptr && n_ < kMax) {
        base_[n_] = reinterpret_cast<std::uintptr_t>(ptr);
        bytes_[n_] = bytes;
        ++n_;
      }
    });
  }
  // Prefetches the line of each stream that holds element i + kPrefetchAhead
  // (an address past the end is never accessed: a prefetch does not fault).
  [[gnu::always_inline]] void operator()(std::size_t i) const {
    for (int k = 0; k < n_; ++k)
      __builtin_prefetch(
          reinterpret_cast<const void*>(base_[k] + (i + kPrefetchAhead) * bytes_[k]));
  }

 private:
  static constexpr int kMax = 8;
  std::uintptr_t base_[kMax] = {};
  std::size_t bytes_[kMax] = {};
  int n_ = 0;
};

// Loop over [begin, end) with the vector of lanes V: Loop::range_lanes where
// the loop has its own (LAMB's direction pass, with its norm sums), else
// Loop::lanes on each whole group of V::width elements and Loop::range on
// the rest. The lanes compute what the element loop computes, bitwise
// (kernels/cpu/lanes.hpp), in registers, with 16-bit buffers converted by
// the unit's own instructions: the compiler's vectorization of the element
// loop ran loops with 16-bit buffers at half the vector width (or staged
// them through fp32 blocks, an extra pass over L1 each) and reloaded the
// element function's values after each store to a state, since any of them
// might alias another.
template <class Loop, class V, class B, class S>
[[gnu::always_inline]] inline bool range_lanes(const B& b, const S& s, std::size_t begin,
                                               std::size_t end) {
  const Prefetch prefetch(b);
  if constexpr (requires { Loop::template range_lanes<V>(b, s, begin, end, prefetch); }) {
    return Loop::template range_lanes<V>(b, s, begin, end, prefetch);
  } else {
    // A local copy of the buffers, whose pointers no store of the loop can
    // change. The scalars stay where they are: each use is one broadcast
    // load (with AVX-512 part of the instruction that uses it), where a
    // local copy would hold them in registers and broadcast them anew.
    const B buffers = b;
    unsigned finite = ~0u;
    std::size_t i = begin;
    for (; i + V::width <= end; i += V::width) {
      prefetch(i);
      finite &= Loop::template lanes<V>(buffers, s, i);
    }
    bool all = (finite & 0xffffu) == 0xffffu;
    if (i < end) all = Loop::range(buffers, s, i, end) && all;
    return all;
  }
}

// flatten: the lanes' operations are not forced inline (kernels/cpu/lanes.hpp);
// this inlines them, and everything else the loop calls, here.
template <class Loop, class B, class S>
SHARDOPT_CPU_TARGET_AVX512 __attribute__((flatten)) bool range_avx512(const B& b, const S& s,
                                                                      std::size_t begin,
                                                                      std::size_t end) {
  return range_lanes<Loop, Lanes512>(b, s, begin, end);
}
template <class Loop, class B, class S>
SHARDOPT_CPU_TARGET_AVX2 __attribute__((flatten)) bool range_avx2(const B& b, const S& s,
                                                                  std::size_t begin,
                                                                  std::size_t end) {
  return range_lanes<Loop, Lanes256x2>(b, s, begin, end);
}
#else
template <class Loop, class B, class S>
bool range_avx512(const B& b, const S& s, std::size_t begin, std::size_t end) {
  return range_isa<Loop, Isa::avx512>(b, s, begin, end);
}
template <class Loop, class B, class S>
bool range_avx2(const B& b, const S& s, std::size_t begin, std::size_t end) {
  return range_isa<Loop, Isa::avx2>(b, s, begin, end);
}
#endif
template <class Loop, class B, class S>
bool range_baseline(const B& b, const S& s, std::size_t begin, std::size_t end) {
  return range_isa<Loop, Isa::baseline>(b, s, begin, end);
}

template <class Loop, class B, class S>
bool range_best(const B& b, const S& s, std::size_t begin, std::size_t end) {
  switch (current_isa()) {
    case Isa::avx512:
      return range_avx512<Loop>(b, s, begin, end);
    case Isa::avx2:
      return range_avx2<Loop>(b, s, begin, end);
    default:
      return range_baseline<Loop>(b, s, begin, end);
  }
}

// Calls f(begin, end) on slices of [0, n), one per OpenMP thread, each
// starting at a multiple of `align` elements; small ranges in one call on
// this thread. Returns the logical and of the calls' results.
template <class F>
bool for_slices(std::size_t n, std::size_t align, F&& f) {
  // Below a few pages the threads cost more than they save.
  if (n < (std::size_t{1} << 15) || omp_get_max_threads() == 1) return f(std::size_t{0}, n);
  bool all = true;
#pragma omp parallel reduction(&& : all)
  {
    const std::size_t threads = static_cast<std::size_t>(omp_get_num_threads());
    const std::size_t t = static_cast<std::size_t>(omp_get_thread_num());
    const std::size_t share = (n + threads - 1) / threads;
    const std::size_t per = (share + align - 1) / align * align;
    const std::size_t begin = std::min(n, t * per);
    const std::size_t end = std::min(n, begin + per);
    all = f(begin, end);
  }
  return all;
}

// Runs Loop over [0, n), each thread on one slice whose start is a multiple
// of `align` elements (16: whole cache lines of fp32). Returns the logical
// and of the slices' results.
template <class Loop, class B, class S>
bool run(const B& b, const S& s, std::size_t n, std::size_t align = 16) {
  return for_slices(n, align, [&](std::size_t begin, std::size_t end) {
    return range_best<Loop>(b, s, begin, end);
  });
}

}  // namespace shardopt::kernels::cpu::detail
