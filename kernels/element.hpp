// shardopt kernels: what every optimizer's per-element function shares:
// the finiteness test, the arithmetic it is written in, gradient loads and
// low-precision parameter stores, each one definition for the reference, CPU
// and CUDA kernels, and the storage of the parameters that the loops share.
#pragma once

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <type_traits>

#include "shardopt/half.hpp"
#include "shardopt/types.hpp"

// Forced inline: the element functions and what they call, so that the CPU
// kernels' vector loops hold all of them (kernels/cpu/runner.hpp), and the
// CUDA kernels' vector steps (kernels/vector_step.hpp).
#if defined(__CUDACC__)
#define SHARDOPT_FORCE_INLINE __forceinline__
#else
#define SHARDOPT_FORCE_INLINE [[gnu::always_inline]] inline
#endif

namespace shardopt::kernels {

// True unless x is inf or nan; integer arithmetic, so loops vectorize.
SHARDOPT_HOST_DEVICE inline bool is_finite_bits(float x) {
  std::uint32_t u;
  std::memcpy(&u, &x, sizeof u);
  return (u & 0x7f800000u) != 0x7f800000u;
}

// The element functions (kernels/<name>.hpp) are templates over the type F
// of the values they compute on: float in the reference and CUDA kernels,
// and in the CPU kernels also a vector of lanes (kernels/cpu/lanes.hpp),
// whose operators and overloads of the functions below do the same IEEE
// operation in every lane. So each optimizer's math is written once and the
// vector code computes exactly what the scalar code does. Besides + - * /
// and comparisons, the functions use only these:
//   fma_op(a, b, c):   a * b + c rounded once (fmaf)
//   sqrt_op(x):        the correctly rounded square root (sqrtf)
//   finite_op(x):      whether x is neither inf nor nan (a lane mask for vectors)
//   select_op(c, a, b): c ? a : b, per lane for a mask c
//   splat<F>(x):       x as an F
SHARDOPT_HOST_DEVICE SHARDOPT_FORCE_INLINE float fma_op(float a, float b, float c) {
  return fmaf(a, b, c);
}
SHARDOPT_HOST_DEVICE SHARDOPT_FORCE_INLINE float sqrt_op(float x) { return sqrtf(x); }
SHARDOPT_HOST_DEVICE SHARDOPT_FORCE_INLINE bool finite_op(float x) { return is_finite_bits(x); }
template <class T>
SHARDOPT_HOST_DEVICE SHARDOPT_FORCE_INLINE T select_op(bool c, T a, T b) {
  return c ? a : b;
}
template <class F>
SHARDOPT_HOST_DEVICE SHARDOPT_FORCE_INLINE F splat(float x) {
  return F(x);
}

// Element i of a state buffer as an F: the float itself, or for a vector of
// lanes the F whose address the CPU kernels put in the buffer's pointer (its
// lanes loaded from memory, written back after the step; i is 0 then).
template <class F>
SHARDOPT_HOST_DEVICE SHARDOPT_FORCE_INLINE F& lane(float* p, std::size_t i) {
  if constexpr (std::is_same_v<F, float>)
    return p[i];
  else
    return *reinterpret_cast<F*>(p + i);
}
template <class F>
SHARDOPT_HOST_DEVICE SHARDOPT_FORCE_INLINE F* lane_ptr(float* p, std::size_t i) {
  return &lane<F>(p, i);
}

// How a step uses one of its buffers, as each Buffers struct's each_buffer
// reports it: only read, only written (its contents on entry do not matter,
// and every element is written), or read and written.
enum class Access : unsigned char { read, write, read_write };

// Bytes per gradient element. Gradients are f32, bf16 or f16; unlike
// dtype_size, usable in device code.
SHARDOPT_HOST_DEVICE constexpr std::size_t grad_bytes(DType t) { return t == DType::f32 ? 4 : 2; }

// The buffers every element-wise step has; each optimizer's Buffers struct
// (kernels/<name>.hpp) adds its states.
//   param:      fp32 parameters (the master copy in mixed precision), read and written
//   grad:       gradients of grad_type (f32, bf16 or f16), read
//   param_out:  optional low-precision copy of the new parameters, of
//               param_out_type (bf16 or f16), written; null for none
//   remainder:  optional 16-bit remainders (parameter remainders): when set,
//               param is null and param_out holds the bf16 parameters themselves,
//               read and written; the pair decodes to the fp32 master
//               (decode_remainder, below)
struct StepBuffers {
  float* param = nullptr;
  const void* grad = nullptr;
  DType grad_type = DType::f32;
  void* param_out = nullptr;
  DType param_out_type = DType::bf16;
  std::size_t n = 0;
  std::uint16_t* remainder = nullptr;

  // Calls f(pointer, bytes per element, access) on these buffers, null ones
  // included, with states() (a step's own buffers) between grad and
  // param_out: the body of each step's each_buffer (kernels/element.hpp:
  // subrange; the CUDA kernels' vector loads).
  template <class F, class States>
  SHARDOPT_HOST_DEVICE constexpr void each_step_buffer(F&& f, States&& states) {
    f(param, 4, Access::read_write);
    f(grad, grad_bytes(grad_type), Access::read);
    states();
    f(param_out, 2, remainder != nullptr ? Access::read_write : Access::write);
    f(remainder, 2, Access::read_write);
  }
};

// Calls f(q) with q the pointer p typed for t: float, bfloat16 or float16
// (f32, bf16 or f16; any other type as float), const when p is.
template <class V, class F>
inline decltype(auto) with_float_type(V* p, DType t, F&& f) {
  static_assert(std::is_void_v<V>, "with_float_type takes an untyped pointer");
  using Bf16 = std::conditional_t<std::is_const_v<V>, const bfloat16, bfloat16>;
  using F16 = std::conditional_t<std::is_const_v<V>, const float16, float16>;
  using F32 = std::conditional_t<std::is_const_v<V>, const float, float>;
  switch (t) {
    case DType::bf16:
      return f(static_cast<Bf16*>(p));
    case DType::f16:
      return f(static_cast<F16*>(p));
    default:
      return f(static_cast<F32*>(p));
  }
}

// Converts a stored gradient to float.
SHARDOPT_HOST_DEVICE inline float load_grad(const float* g, std::size_t i) { return g[i]; }
SHARDOPT_HOST_DEVICE inline float load_grad(const bfloat16* g, std::size_t i) {
  return to_float(g[i]);
}
SHARDOPT_HOST_DEVICE inline float load_grad(const float16* g, std::size_t i) {
  return to_float(g[i]);
}

// Writes the low-precision copy of an updated parameter.
SHARDOPT_HOST_DEVICE inline void store_param(bfloat16* out, std::size_t i, float p) {
  out[i] = bf16_from_float(p);
}
SHARDOPT_HOST_DEVICE inline void store_param(float16* out, std::size_t i, float p) {
  out[i] = f16_from_float(p);
}

// Whether a loop over gradients G and parameter storage P is forced to
// vectorize: yes, except where f16 is converted, whose branching software
// conversions run slower as masked vector code than as scalar code.
template <class G, class P>
inline constexpr bool force_simd =
    !std::is_same_v<G, float16> && !std::is_same_v<typename P::Copy, float16>;

// Runs step(i) for i in [begin, end); returns whether every call returned
// true (every gradient finite). With Simd, `#pragma omp simd` makes GCC
// vectorize loops its cost model declines (f32 grads with a bf16 copy, ...);
// the arithmetic of each element is the same either way.
template <bool Simd, class F>
[[gnu::always_inline]] inline bool for_range(std::size_t begin, std::size_t end, F&& step) {
  unsigned bad = 0;
  if constexpr (Simd) {
#pragma omp simd reduction(| : bad)
    for (std::size_t i = begin; i < end; ++i) bad |= !step(i);
  } else {
    for (std::size_t i = begin; i < end; ++i) bad |= !step(i);
  }
  return bad == 0;
}

// Parameter remainders: the fp32 master p kept as its bf16 rounding hi
// (the model's parameter) and a 16-bit remainder, so that
//   bits(p) = (hi << 16) + int16(rem)   (mod 2^32)
// exactly, for every bit pattern. hi = (bits(p) + 0x8000) >> 16 rounds the
// magnitude to nearest, ties away from zero, so hi is within half a bf16 ulp
// of p and the remainder is the signed difference in [-0x8000, 0x7fff].
SHARDOPT_HOST_DEVICE inline float decode_remainder(bfloat16 hi, std::uint16_t rem) {
  const std::uint32_t low = static_cast<std::uint32_t>(
      static_cast<std::int32_t>(static_cast<std::int16_t>(rem)));  // sign-extended
  return shardopt::detail::bits_float((static_cast<std::uint32_t>(hi.bits) << 16) + low);
}
SHARDOPT_HOST_DEVICE inline void encode_remainder(float p, bfloat16& hi, std::uint16_t& rem) {
  const std::uint32_t u = shardopt::detail::float_bits(p);
  hi.bits = static_cast<std::uint16_t>((u + 0x8000u) >> 16);
  rem = static_cast<std::uint16_t>(u - (static_cast<std::uint32_t>(hi.bits) << 16));
}

// How a step stores its parameters: the storage template argument of the
// optimizers' loops, which load each parameter as fp32 before the element
// function and store it after. `p`, `copy` and `rem` are the buffers'
// param, param_out (as Copy*) and remainder.
//
// MasterParams<O>: fp32 parameters (the master copy in mixed precision);
// when O is bfloat16 or float16, a copy of each new value is written to
// `copy` (O float: no copy).
template <class O>
struct MasterParams {
  using Copy = O;
  // The parameters' fp32 values, indexable.
  SHARDOPT_HOST_DEVICE static const float* values(const float* p, const Copy*,
                                                  const std::uint16_t*) {
    return p;
  }
  SHARDOPT_HOST_DEVICE static float load(const float* p, const Copy*, const std::uint16_t*,
                                         std::size_t i) {
    return p[i];
  }
  SHARDOPT_HOST_DEVICE static void store(float* p, Copy* copy, std::uint16_t*, std::size_t i,
                                         float x) {
    p[i] = x;
    if constexpr (!std::is_same_v<O, float>) store_param(copy, i, x);
  }
  // The same for the V::width elements from i, a vector of lanes V
  // (kernels/cpu/lanes.hpp: the CPU kernels).
  template <class V>
  [[gnu::always_inline]] static inline V load_lanes(const float* p, const Copy*,
                                                    const std::uint16_t*, std::size_t i) {
    return V::load(p + i);
  }
  template <class V>
  [[gnu::always_inline]] static inline void store_lanes(float* p, Copy* copy, std::uint16_t*,
                                                        std::size_t i, const V& x) {
    V::store(p + i, x);
    if constexpr (!std::is_same_v<O, float>) V::store(copy + i, x);
  }
};

// MasterParams<float> that also writes each new value to `copy` as fp32:
// the CPU kernels stage a 16-bit copy this way, a block at a time, and
// convert the block with the vector unit's conversions (kernels/cpu/runner.hpp).
struct StagedCopyParams : MasterParams<float> {
  static void store(float* p, float* copy, std::uint16_t*, std::size_t i, float x) {
    p[i] = x;
    copy[i] = x;
  }
};

// RemainderParams: bf16 parameters in `copy`, read and written, with their
// remainders in `rem`; no fp32 buffer (`p` is null). The element function
// sees the decoded fp32 master, so the trajectory is the fp32 one bitwise.
struct RemainderParams {
  using Copy = bfloat16;
  struct Decoded {
    const bfloat16* hi;
    const std::uint16_t* rem;
    SHARDOPT_HOST_DEVICE float operator[](std::size_t i) const {
      return decode_remainder(hi[i], rem[i]);
    }
  };
  SHARDOPT_HOST_DEVICE static Decoded values(const float*, const Copy* copy,
                                             const std::uint16_t* rem) {
    return {copy, rem};
  }
  SHARDOPT_HOST_DEVICE static float load(const float*, const Copy* copy, const std::uint16_t* rem,
                                         std::size_t i) {
    return decode_remainder(copy[i], rem[i]);
  }
  SHARDOPT_HOST_DEVICE static void store(float*, Copy* copy, std::uint16_t* rem, std::size_t i,
                                         float x) {
    encode_remainder(x, copy[i], rem[i]);
  }
  template <class V>
  [[gnu::always_inline]] static inline V load_lanes(const float*, const Copy* copy,
                                                    const std::uint16_t* rem, std::size_t i) {
    return V::load_remainder(copy + i, rem + i);
  }
  template <class V>
  [[gnu::always_inline]] static inline void store_lanes(float*, Copy* copy, std::uint16_t* rem,
                                                        std::size_t i, const V& x) {
    V::store_remainder(copy + i, rem + i, x);
  }
};

// The view of elements [begin, begin + count) of a step's buffers: every
// pointer that B::each_buffer lists (null ones stay null) advanced by begin
// elements, n = count. Host and device code, as each_buffer.
template <class B>
SHARDOPT_HOST_DEVICE B subrange(const B& b, std::size_t begin, std::size_t count) {
  B out = b;
  out.each_buffer([begin](auto*& ptr, std::size_t bytes, Access) {
    using Byte = std::conditional_t<
        std::is_const_v<std::remove_pointer_t<std::remove_reference_t<decltype(ptr)>>>,
        const unsigned char, unsigned char>;
    if (ptr != nullptr)
      ptr = reinterpret_cast<std::remove_reference_t<decltype(ptr)>>(reinterpret_cast<Byte*>(ptr) +
                                                                     begin * bytes);
  });
  out.n = count;
  return out;
}

// The number of buffers B::each_buffer lists (a constant: the CUDA kernels
// size their per-thread copies of the buffers with it).
template <class B>
SHARDOPT_HOST_DEVICE constexpr int buffer_count() {
  B b{};
  int count = 0;
  b.each_buffer([&count](auto*&, std::size_t, Access) { ++count; });
  return count;
}

}  // namespace shardopt::kernels
