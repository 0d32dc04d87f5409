// shardopt kernels (internal): the step of 4 consecutive elements that the
// CUDA kernels take where every buffer of a range can be read 4 elements at
// a time with one aligned vector access (16 bytes for fp32, 8 for 16-bit),
// generic over the optimizers' loops (kernels/element_loop.hpp, kernels/lamb_loop.hpp). Host and
// device code: on the device each buffer's 4 elements move with one vector load and one vector
// store; on the host with memcpy, so that the CPU tests run the same steps against the reference
// kernel. Included by .cu files and tests only.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <type_traits>

#include "kernels/element.hpp"

#if defined(__CUDA_ARCH__)
#define SHARDOPT_UNROLL _Pragma("unroll")
#elif defined(__CUDACC__)
#define SHARDOPT_UNROLL
#else
#define SHARDOPT_UNROLL _Pragma("GCC unroll 4")
#endif

namespace shardopt::kernels::detail {

// Calls f(pointer, bytes per element, access) on each buffer of b as Loop
// uses them: Loop::each_buffer(b, s, f) where the loop refines the accesses
// (SGD's first step only writes its momentum buffer), else b.each_buffer(f).
template <class Loop, class B, class S, class F>
SHARDOPT_HOST_DEVICE void visit_buffers(B& b, const S& s, F&& f) {
  if constexpr (requires { Loop::each_buffer(b, s, f); })
    Loop::each_buffer(b, s, f);
  else
    b.each_buffer(f);
}

// The element type Loop reads and writes through a buffer whose pointer
// points to Pointee: the pointer's own type, except for the two untyped
// buffers, the gradients (const void*, of Loop::Grad) and the parameter copy
// (void*, of Loop::Storage::Copy). vector_head checks that the sizes agree
// with each_buffer's before a range takes the vector path.
template <class Loop, class Pointee>
using element_t = std::conditional_t<
    std::is_same_v<Pointee, const void>, typename Loop::Grad,
    std::conditional_t<std::is_same_v<Pointee, void>, typename Loop::Storage::Copy,
                       std::remove_const_t<Pointee>>>;

// The first index from which every buffer of b can be accessed 4 elements at
// a time with aligned vector accesses (0 to 3: each buffer's element there is
// at a multiple of 4 elements), or -1 when the buffers disagree (their
// addresses differ modulo 4 elements, or one is not even aligned to its
// element) and the range takes scalar steps only. Null buffers do not count.
template <class Loop, class B, class S>
SHARDOPT_HOST_DEVICE int vector_head(const B& b, const S& s) {
  B copy = b;
  int head = -1;
  bool ok = true;
  visit_buffers<Loop>(copy, s, [&](auto*& ptr, std::size_t bytes, Access) {
    using T = element_t<Loop, std::remove_pointer_t<std::remove_reference_t<decltype(ptr)>>>;
    if (ptr == nullptr) return;
    const auto addr = reinterpret_cast<std::uintptr_t>(ptr);
    if (bytes != sizeof(T) || addr % sizeof(T) != 0) {
      ok = false;
      return;
    }
    const int h = static_cast<int>((4 - (addr / sizeof(T)) % 4) % 4);
    if (head < 0) head = h;
    ok = ok && h == head;
  });
  if (!ok) return -1;
  return head < 0 ? 0 : head;
}

// 4 elements of T (4 or 2 bytes) at src into the registers at slot: on the
// device with one aligned vector load (16 or 8 bytes).
template <class T>
SHARDOPT_HOST_DEVICE SHARDOPT_FORCE_INLINE void load_vector(const T* src, unsigned char* slot) {
  static_assert(sizeof(T) == 4 || sizeof(T) == 2);
#if defined(__CUDA_ARCH__)
  T* out = reinterpret_cast<T*>(slot);
  if constexpr (sizeof(T) == 4) {
    static_assert(std::is_same_v<T, float>);
    const float4 v = *reinterpret_cast<const float4*>(src);
    out[0] = v.x;
    out[1] = v.y;
    out[2] = v.z;
    out[3] = v.w;
  } else {
    const uint2 v = *reinterpret_cast<const uint2*>(src);
    const std::uint16_t halves[4] = {
        static_cast<std::uint16_t>(v.x), static_cast<std::uint16_t>(v.x >> 16),
        static_cast<std::uint16_t>(v.y), static_cast<std::uint16_t>(v.y >> 16)};
    SHARDOPT_UNROLL
    for (int j = 0; j < 4; ++j) std::memcpy(out + j, halves + j, 2);
  }
#else
  std::memcpy(slot, src, 4 * sizeof(T));
#endif
}

// The 4 elements of T at slot to dst: on the device with one aligned vector
// store.
template <class T>
SHARDOPT_HOST_DEVICE SHARDOPT_FORCE_INLINE void store_vector(T* dst, const unsigned char* slot) {
#if defined(__CUDA_ARCH__)
  const T* in = reinterpret_cast<const T*>(slot);
  if constexpr (sizeof(T) == 4) {
    *reinterpret_cast<float4*>(dst) = make_float4(in[0], in[1], in[2], in[3]);
  } else {
    std::uint16_t halves[4];
    SHARDOPT_UNROLL
    for (int j = 0; j < 4; ++j) std::memcpy(halves + j, in + j, 2);
    uint2 v;
    v.x = static_cast<unsigned>(halves[0]) | static_cast<unsigned>(halves[1]) << 16;
    v.y = static_cast<unsigned>(halves[2]) | static_cast<unsigned>(halves[3]) << 16;
    *reinterpret_cast<uint2*>(dst) = v;
  }
#else
  std::memcpy(dst, slot, 4 * sizeof(T));
#endif
}

// Elements i .. i + 3 of b, i at a vector boundary (vector_head): every
// buffer that Loop reads is loaded with one vector load into a per-thread
// copy, Loop::apply runs on a view of b whose pointers point at the copies
// (indices 0 to 3), and every buffer it writes is stored back with one
// vector store. Write-only buffers are not loaded, read-only ones not
// stored. The copies are indexed with constants only, so on the device they
// stay in registers. The store addresses are all taken before the first
// store, so that the compiler keeps each store one vector access. Returns
// whether the 4 gradients were finite.
template <class Loop, class B, class S>
SHARDOPT_HOST_DEVICE SHARDOPT_FORCE_INLINE bool vector_step(const B& b, const S& s, std::size_t i) {
  constexpr int kBuffers = buffer_count<B>();
  alignas(16) unsigned char regs[kBuffers][16];
  void* store_to[kBuffers];  // element i of each buffer stored back, else null
  B view = b;
  int k = 0;
  visit_buffers<Loop>(view, s, [&](auto*& ptr, std::size_t, Access access) {
    using Ptr = std::remove_reference_t<decltype(ptr)>;
    using Pointee = std::remove_pointer_t<Ptr>;
    using T = element_t<Loop, Pointee>;
    unsigned char* slot = regs[k];
    if (ptr != nullptr && access != Access::write)
      load_vector(static_cast<const T*>(static_cast<const void*>(ptr)) + i, slot);
    if constexpr (std::is_const_v<Pointee>)
      store_to[k] = nullptr;
    else
      store_to[k] = ptr != nullptr && access != Access::read
                        ? static_cast<void*>(static_cast<T*>(static_cast<void*>(ptr)) + i)
                        : nullptr;
    ptr = static_cast<Ptr>(static_cast<void*>(slot));
    ++k;
  });
  bool finite = true;
  SHARDOPT_UNROLL
  for (int j = 0; j < 4; ++j) finite = Loop::apply(view, s, j) && finite;
  k = 0;
  visit_buffers<Loop>(view, s, [&](auto*& ptr, std::size_t, Access) {
    using T = element_t<Loop, std::remove_pointer_t<std::remove_reference_t<decltype(ptr)>>>;
    if (store_to[k] != nullptr) store_vector(static_cast<T*>(store_to[k]), regs[k]);
    ++k;
  });
  return finite;
}

// Thread t's share, of `threads`, of elements [begin, end) of b, one element
// at a time: t, t + threads, ... from begin. Returns whether its gradients
// were finite.
template <class Loop, class B, class S>
SHARDOPT_HOST_DEVICE SHARDOPT_FORCE_INLINE bool scalar_share(const B& b, const S& s,
                                                             std::size_t begin, std::size_t end,
                                                             std::size_t t, std::size_t threads) {
  bool bad = false;
  for (std::size_t i = begin + t; i < end; i += threads) bad |= !Loop::apply(b, s, i);
  return !bad;
}

// Thread t's share, of `threads`, of elements [begin, end) of b, whose
// buffers align from `head` on (vector_head >= 0): the groups of 4 that
// start at indices congruent to head modulo 4, group t, t + threads, ...;
// and the at most 3 elements before the first group and 3 after the last
// with scalar steps, element r of those by thread r. Returns whether its
// gradients were finite.
template <class Loop, class B, class S>
SHARDOPT_HOST_DEVICE SHARDOPT_FORCE_INLINE bool vector_share(const B& b, const S& s,
                                                             std::size_t begin, std::size_t end,
                                                             int head, std::size_t t,
                                                             std::size_t threads) {
  const std::size_t lead_count = (static_cast<std::size_t>(head) + 4 - begin % 4) % 4;
  const std::size_t first = end - begin > lead_count ? begin + lead_count : end;
  const std::size_t groups = (end - first) / 4;
  bool bad = false;
  for (std::size_t g = t; g < groups; g += threads) bad |= !vector_step<Loop>(b, s, first + 4 * g);
  const std::size_t lead = first - begin, tail = first + 4 * groups;
  for (std::size_t r = t; r < lead + (end - tail); r += threads)
    bad |= !Loop::apply(b, s, r < lead ? begin + r : tail + (r - lead));
  return !bad;
}

}  // namespace shardopt::kernels::detail
