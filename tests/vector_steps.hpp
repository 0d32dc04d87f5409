// What the tests of the CUDA kernels' 4-element vector steps share
// (tests/test_kernels_vector_*.cpp): the steps, run over ranges and chunks
// on the CPU the way the CUDA kernels run them (memcpy standing in for the
// vector loads and stores), against the reference kernels, bitwise, for
// every size, alignment and chunking of compare(). One file per optimizer
// family, so that the instantiations compile in parallel.
#pragma once

#include <catch2/catch.hpp>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <functional>
#include <limits>
#include <map>
#include <random>
#include <string>
#include <tuple>
#include <vector>

#include "kernels/vector_step.hpp"
#include "optim_helpers.hpp"

namespace shardopt::test {

using namespace shardopt::kernels;
namespace kd = shardopt::kernels::detail;

// Buffers of n elements (plus room to shift them): floats 0 param, 1-3
// states, 4 f32 gradients, 5 LAMB's update; 16-bit 0 bf16 and 1 f16
// gradients, 2 the parameter copy, 3 bf16 parameters and 4 their
// remainders. Each buffer starts `shift` elements into its storage.
struct Arena {
  std::vector<std::vector<float>> f;
  std::vector<std::vector<std::uint16_t>> h;
  std::vector<std::size_t> f_shift, h_shift;

  Arena() = default;
  Arena(std::size_t n, std::uint64_t seed, std::size_t shift, int odd_one) {
    std::mt19937_64 rng(seed);
    std::uniform_real_distribution<float> sym(-1.0f, 1.0f), pos(0.01f, 1.0f);
    const std::size_t room = n + 4;
    f.assign(6, std::vector<float>(room));
    h.assign(5, std::vector<std::uint16_t>(room));
    for (std::size_t i = 0; i < room; ++i) {
      f[0][i] = sym(rng);
      for (int k = 1; k <= 3; ++k) f[k][i] = pos(rng);
      f[4][i] = sym(rng);
      f[5][i] = sym(rng);
      h[0][i] = bf16_from_float(f[4][i]).bits;
      h[1][i] = f16_from_float(f[4][i]).bits;
      h[2][i] = static_cast<std::uint16_t>(rng());
      bfloat16 hi;
      encode_remainder(sym(rng), hi, h[4][i]);
      h[3][i] = hi.bits;
    }
    f_shift.assign(6, shift);
    h_shift.assign(5, shift);
    // One buffer out of step with the others: the scalar path.
    if (odd_one >= 0) f_shift[static_cast<std::size_t>(odd_one)] = shift + 1;
    if (odd_one == -2) h_shift[3] = h_shift[4] = shift + 1;
  }
  // Becomes a copy of o, reusing its own storage once it is large enough.
  void copy_from(const Arena& o) {
    f.resize(o.f.size());
    h.resize(o.h.size());
    for (std::size_t k = 0; k < f.size(); ++k) f[k].assign(o.f[k].begin(), o.f[k].end());
    for (std::size_t k = 0; k < h.size(); ++k) h[k].assign(o.h[k].begin(), o.h[k].end());
    f_shift.assign(o.f_shift.begin(), o.f_shift.end());
    h_shift.assign(o.h_shift.begin(), o.h_shift.end());
  }
  float* fp(int k) { return f[k].data() + f_shift[k]; }
  std::uint16_t* hp(int k) { return h[k].data() + h_shift[k]; }
  bool operator==(const Arena& o) const {
    for (std::size_t k = 0; k < f.size(); ++k)
      if (std::memcmp(f[k].data(), o.f[k].data(), f[k].size() * 4) != 0) return false;
    for (std::size_t k = 0; k < h.size(); ++k)
      if (std::memcmp(h[k].data(), o.h[k].data(), h[k].size() * 2) != 0) return false;
    return true;
  }
};

// Storage 0: fp32; 1: fp32 with a bf16 copy; 2: with an f16 copy; 3: bf16
// parameters with remainders.
template <class B>
void set_params(B& b, Arena& a, int storage) {
  if (storage == 3) {
    b.param = nullptr;
    b.param_out = a.hp(3);
    b.param_out_type = DType::bf16;
    b.remainder = a.hp(4);
  } else {
    b.param = a.fp(0);
    b.param_out = storage != 0 ? a.hp(2) : nullptr;
    b.param_out_type = storage == 2 ? DType::f16 : DType::bf16;
    b.remainder = nullptr;
  }
}

template <class B>
void set_grad(B& b, Arena& a, DType gt) {
  b.grad = gt == DType::f32    ? static_cast<const void*>(a.fp(4))
           : gt == DType::bf16 ? static_cast<const void*>(a.hp(0))
                               : static_cast<const void*>(a.hp(1));
  b.grad_type = gt;
}

inline int g_vector_ranges = 0;  // ranges that took the vector path

// Runs Loop over b as the CUDA kernels do with `threads` threads: the vector
// kernel's shares when the buffers align, else the scalar kernel's; with
// chunk > 0, in chunks of that many elements as the multi-tensor kernel.
template <class Loop, class B, class S>
bool like_cuda(const B& b, const S& s, std::size_t threads, std::size_t chunk) {
  const int head = kd::vector_head<Loop>(b, s);
  if (head >= 0 && (chunk > 0 || b.n >= static_cast<std::size_t>(head) + 4)) ++g_vector_ranges;
  bool finite = true;
  const std::size_t step = chunk > 0 ? chunk : (b.n == 0 ? 1 : b.n);
  for (std::size_t begin = 0; begin < b.n; begin += step) {
    const std::size_t end = std::min(b.n, begin + step);
    for (std::size_t t = 0; t < threads; ++t) {
      const bool ok = head >= 0 && (chunk > 0 || b.n >= static_cast<std::size_t>(head) + 4)
                          ? kd::vector_share<Loop>(b, s, begin, end, head, t, threads)
                          : kd::scalar_share<Loop>(b, s, begin, end, t, threads);
      finite = ok && finite;
    }
  }
  return finite;
}

// One configuration of a kernel: run(arena, emulate, threads, chunk) runs
// the reference kernel (emulate false) or like_cuda on the arena's buffers.
using Run = std::function<bool(Arena&, bool, std::size_t, std::size_t)>;

// The random inputs of one size, shift and odd buffer, made once per
// program: every kernel configuration starts from the same arenas.
inline const Arena& input_arena(std::size_t n, std::size_t shift, int odd_one) {
  static std::map<std::tuple<std::size_t, std::size_t, int>, Arena> made;
  const auto key = std::make_tuple(n, shift, odd_one);
  auto it = made.find(key);
  if (it != made.end()) return it->second;
  const std::uint64_t seed = n * 131 + shift * 7 + static_cast<std::uint64_t>(odd_one + 2);
  Arena a(n, seed, shift, odd_one);
  if (n > 5 && seed % 3 == 0) {  // a gradient that is not finite
    a.f[4][a.f_shift[4] + 5] = std::numeric_limits<float>::infinity();
    a.h[0][a.h_shift[0] + 5] = bf16_from_float(a.f[4][a.f_shift[4] + 5]).bits;
    a.h[1][a.h_shift[1] + 5] = f16_from_float(a.f[4][a.f_shift[4] + 5]).bits;
  }
  return made.emplace(key, std::move(a)).first->second;
}

// Runs `run` on the reference and emulated kernels for every size, shift,
// odd buffer and chunking; a difference in the results or in the finiteness
// they report fails, naming the configuration.
inline void compare(const std::string& what, const Run& run) {
  static Arena ref, cuda;  // reused: the loop allocates nothing once warm
  std::size_t compared = 0;
  for (std::size_t n : {std::size_t{1}, std::size_t{3}, std::size_t{4}, std::size_t{7},
                        std::size_t{64}, std::size_t{1003}}) {
    for (std::size_t shift : {std::size_t{0}, std::size_t{1}, std::size_t{3}}) {
      for (int odd_one : {-1, 1, 4, -2}) {
        const Arena& input = input_arena(n, shift, odd_one);
        for (std::size_t chunk : {std::size_t{0}, std::size_t{12}}) {
          ref.copy_from(input);
          cuda.copy_from(input);
          const bool want = run(ref, false, 1, 0);
          const bool got = run(cuda, true, 5, chunk);
          ++compared;
          if (got != want || !(cuda == ref)) {
            FAIL_CHECK(
                what << ", n " << n << ", shift " << shift << ", odd buffer " << odd_one
                     << ", chunk " << chunk << ": "
                     << (got != want ? "the finiteness reported differs" : "the results differ"));
          }
        }
      }
    }
  }
  CHECK(compared == 6 * 3 * 4 * 2);
}

inline constexpr DType kGradTypes[] = {DType::f32, DType::bf16, DType::f16};

// Calls f(gt, storage) for every gradient type and parameter storage
// (set_params): the cases of compare_step.
template <class F>
void each_grad_and_storage(F&& f) {
  for (DType gt : kGradTypes)
    for (int storage = 0; storage < 4; ++storage) f(gt, storage);
}

// compare() of one element-wise step of Opt with scalars s, named
// "<name> grad <gt> storage <storage><suffix>": the buffers B take the
// gradient of type gt, the states that states(b, arena) points into the
// arena, and the parameters of `storage` (set_params).
template <class Opt, class S, class States>
void compare_step(const std::string& name, const std::string& suffix, DType gt, int storage,
                  const S& s, States states) {
  using B = typename kernels::Kernel<Opt>::Buffers;
  compare(name + " grad " + dtype_name(gt) + " storage " + std::to_string(storage) + suffix,
          [&](Arena& a, bool emulate, std::size_t threads, std::size_t chunk) {
            B b;
            set_grad(b, a, gt);
            states(b, a);
            set_params(b, a, storage);
            b.n = a.f[0].size() - 4;
            if (!emulate) return reference::step<Opt>(b, s);
            return kernels::Kernel<Opt>::dispatch(
                b, s, [&]<class Loop>() { return like_cuda<Loop>(b, s, threads, chunk); });
          });
}

}  // namespace shardopt::test
