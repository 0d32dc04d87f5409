// The CPU kernels run each optimizer's element function on 16 lanes at a
// time (kernels/cpu/lanes.hpp) and the last elements of a range one by one:
// for every element-wise optimizer, every gradient type and every way of
// storing the parameters (fp32; fp32 with a bf16 or f16 copy; bf16 with
// remainders), over sizes with a partial vector at the end and sizes split
// across threads, the CPU kernel must leave parameters, states and copies
// bitwise as the reference kernel does, over steps that take each mode of
// the step (SGD's first step, RAdam before and after its rectification),
// and report non-finite gradients alike. The gradients hold inf, NaN and
// subnormal values at fixed places (the same NaN every step, so that the
// NaN that comes out is defined), and the parameters values that round to
// ties and subnormals of the 16-bit types.
#include <catch2/catch.hpp>
#include <cstdint>
#include <cstring>
#include <limits>
#include <vector>

#include "kernels/optimizer_kernels.hpp"
#include "optim_helpers.hpp"
#include "shardopt/optimizers.hpp"

using namespace shardopt;
using namespace shardopt::test;

namespace {

enum class Storage { fp32, bf16_copy, f16_copy, remainders };

const char* storage_name(Storage s) {
  switch (s) {
    case Storage::fp32:
      return "fp32";
    case Storage::bf16_copy:
      return "fp32 + bf16 copy";
    case Storage::f16_copy:
      return "fp32 + f16 copy";
    default:
      return "bf16 + remainders";
  }
}

// The options of every mode the benchmarks time: torch's defaults, SGD
// with momentum (so that it keeps a state) and RMSprop centered with
// momentum (its three states).
template <class O>
O options() {
  O o{};
  if constexpr (std::is_same_v<O, SGD>) o.momentum = 0.9;
  if constexpr (std::is_same_v<O, RMSprop>) {
    o.momentum = 0.9;
    o.centered = true;
  }
  return o;
}

std::vector<float> gradients(std::size_t n, std::uint64_t seed) {
  std::vector<float> g = uniform(n, seed, -1.0f, 1.0f);
  const float nan = from_bits(0x7fc01234u);  // one NaN, its payload the same every step
  for (std::size_t i = 0; i < n; ++i) {
    if (i % 997 == 5) g[i] = std::numeric_limits<float>::infinity();
    if (i % 991 == 7) g[i] = nan;
    if (i % 31 == 3) g[i] = 1e-40f;  // subnormal in f32 and zero in the 16-bit types
  }
  return g;
}

std::vector<float> parameters(std::size_t n, std::uint64_t seed) {
  std::vector<float> p = uniform(n, seed, -1.0f, 1.0f);
  for (std::size_t i = 0; i < n; ++i) {
    if (i % 13 == 1) p[i] = 1.00390625f;     // a bf16 tie
    if (i % 17 == 2) p[i] = 1.00048828125f;  // an f16 tie
    if (i % 19 == 4) p[i] = 3e-6f;           // an f16 subnormal
    if (i % 23 == 6) p[i] = 1e-39f;          // an f32 (and bf16) subnormal
  }
  return p;
}

// One tensor's arrays.
struct Tensor {
  std::vector<float> p;
  std::vector<bfloat16> hi;  // with remainders: the bf16 parameters
  std::vector<std::uint16_t> rem, copy;
  std::vector<std::vector<float>> states;
};

Tensor tensor(std::size_t n, Storage st, int slots) {
  Tensor t;
  t.p = parameters(n, 11 + n);
  if (st == Storage::remainders) {
    t.hi.resize(n);
    t.rem.resize(n);
    for (std::size_t i = 0; i < n; ++i) kernels::encode_remainder(t.p[i], t.hi[i], t.rem[i]);
    t.p.clear();
  }
  t.copy.assign(n, 0x5555);
  for (int k = 0; k < slots; ++k) t.states.push_back(uniform(n, 20 + k, 0.0f, 1e-2f));
  return t;
}

template <class O>
typename kernels::Kernel<O>::Buffers buffers(Tensor& t, const Grads& g, DType gt, Storage st,
                                             const std::vector<bool>& used) {
  typename kernels::Kernel<O>::Buffers b;
  b.grad = g.data(gt);
  b.grad_type = gt;
  b.n = g.f32.size();
  if (st == Storage::remainders) {
    b.param_out = t.hi.data();
    b.remainder = t.rem.data();
  } else {
    b.param = t.p.data();
    if (st != Storage::fp32) {
      b.param_out = t.copy.data();
      b.param_out_type = st == Storage::f16_copy ? DType::f16 : DType::bf16;
    }
  }
  std::vector<float*> states;
  for (std::size_t k = 0; k < used.size(); ++k)
    states.push_back(used[k] ? t.states[k].data() : nullptr);
  kernels::Kernel<O>::set_states(b, states.data());
  return b;
}

template <class T>
bool same_bits(const std::vector<T>& a, const std::vector<T>& b) {
  return a.size() == b.size() &&
         (a.empty() || std::memcmp(a.data(), b.data(), a.size() * sizeof(T)) == 0);
}

template <class O>
void check(const char* name) {
  using Family = kernels::family_of<O>;
  const O o = options<O>();
  std::vector<bool> used;
  o.slots([&](const Slot& s) { used.push_back(s.used); });
  // 65537: split across threads, each part ending in a partial vector.
  for (std::size_t n : {std::size_t{17}, std::size_t{1003}, std::size_t{65537}}) {
    for (DType gt : {DType::f32, DType::bf16, DType::f16}) {
      for (Storage st :
           {Storage::fp32, Storage::bf16_copy, Storage::f16_copy, Storage::remainders}) {
        INFO(name << ", n " << n << ", grads " << dtype_name(gt) << ", " << storage_name(st));
        Tensor ref = tensor(n, st, static_cast<int>(used.size())), cpu = ref;
        // RAdam rectifies from its sixth step: steps 1, 2 and 7 take every mode.
        for (std::int64_t step : {1, 2, 7}) {
          const Grads g(gradients(n, 40 + step));
          const auto s = kernels::Kernel<O>::scalars(o, step, 1.0);
          const bool f_ref = kernels::reference::step<Family>(buffers<O>(ref, g, gt, st, used), s);
          const bool f_cpu = kernels::cpu::step<Family>(buffers<O>(cpu, g, gt, st, used), s);
          INFO("step " << step);
          CHECK_FALSE(f_ref);  // element 5 is inf
          CHECK(f_cpu == f_ref);
        }
        CHECK(same_bits(cpu.p, ref.p));
        CHECK(same_bits(cpu.copy, ref.copy));
        CHECK(same_bits(cpu.rem, ref.rem));
        CHECK(same_bits(cpu.hi, ref.hi));
        for (std::size_t k = 0; k < used.size(); ++k)
          CHECK(same_bits(cpu.states[k], ref.states[k]));
      }
    }
  }
}

}  // namespace

TEST_CASE("CPU kernels equal the reference bitwise for every element-wise optimizer",
          "[kernels][lanes]") {
  Optimizers::each([&]<class O>() {
    if constexpr (is_elementwise<O>) check<O>(O::name);
  });
}
