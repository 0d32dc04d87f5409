// Helpers of the optimizer tests: random inputs in every gradient type,
// bitwise comparison, and error matching.
#pragma once

#include <algorithm>
#include <catch2/catch.hpp>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <initializer_list>
#include <random>
#include <string>
#include <vector>

#include "shardopt/error.hpp"
#include "shardopt/half.hpp"
#include "shardopt/types.hpp"

namespace shardopt::test {

inline std::uint32_t bits(float x) {
  std::uint32_t u;
  std::memcpy(&u, &x, 4);
  return u;
}

inline float from_bits(std::uint32_t u) {
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

// The number of elements whose bits differ.
inline std::size_t count_diff(const std::vector<float>& a, const std::vector<float>& b) {
  if (a.size() != b.size()) return std::max(a.size(), b.size());
  std::size_t d = 0;
  for (std::size_t i = 0; i < a.size(); ++i) d += bits(a[i]) != bits(b[i]);
  return d;
}

// Checks that two runs of a step from the same tensor agree bitwise: a, the
// reference kernel's, whose step reported fa, and c, the CPU kernel's (fc).
// Compared: the finiteness reported, the fp32 buffers `fields` (parameters,
// states) and the 16-bit parameter copy `out`.
template <class Tensor>
void check_same_run(bool fa, bool fc, const Tensor& a, const Tensor& c,
                    std::initializer_list<std::vector<float> Tensor::*> fields) {
  CHECK(fa == fc);
  std::size_t k = 0;
  for (auto field : fields) {
    INFO("fp32 buffer " << k << " of those listed (0: the parameters)");
    CHECK(count_diff(a.*field, c.*field) == 0);
    ++k;
  }
  CHECK(a.out == c.out);
}

// n values uniform in [lo, hi).
inline std::vector<float> uniform(std::size_t n, std::uint64_t seed, float lo, float hi) {
  std::mt19937_64 rng(seed);
  std::uniform_real_distribution<float> u(lo, hi);
  std::vector<float> v(n);
  for (float& x : v) x = u(rng);
  return v;
}

// One gradient in the three stored types.
struct Grads {
  std::vector<float> f32;
  std::vector<bfloat16> bf16;
  std::vector<float16> f16;

  explicit Grads(std::vector<float> g) : f32(std::move(g)) {
    for (float x : f32) {
      bf16.push_back(bf16_from_float(x));
      f16.push_back(f16_from_float(x));
    }
  }
  const void* data(DType t) const {
    return t == DType::bf16  ? static_cast<const void*>(bf16.data())
           : t == DType::f16 ? static_cast<const void*>(f16.data())
                             : static_cast<const void*>(f32.data());
  }
};

// True if f throws a shardopt::Error with `code`, a message containing
// `needle` and a hint. A mismatch is described in the next assertion's
// report (UNSCOPED_INFO: a scoped INFO would end with the catch block,
// before the caller's CHECK).
inline bool rejects(const std::function<void()>& f, ErrorCode code, const std::string& needle) {
  try {
    f();
  } catch (const Error& e) {
    const bool ok =
        e.code() == code && e.message().find(needle) != std::string::npos && !e.hint().empty();
    if (!ok) {
      UNSCOPED_INFO("threw " << error_code_name(e.code()) << " \"" << e.what() << "\"; expected "
                             << error_code_name(code) << " with \"" << needle
                             << "\" in the message, and a hint");
    }
    return ok;
  }
  UNSCOPED_INFO("no exception; expected " << error_code_name(code) << " with \"" << needle << "\"");
  return false;
}

// Checks that a table of per-optimizer cases (anything with a `name` whose
// first word is the optimizer's name) has a case for each optimizer of List
// (shardopt::Optimizers: SHARDOPT_OPTIMIZERS), and only cases of those, so
// that an optimizer added to the library is not left out of the table's tests.
template <class List, class Table>
void check_every_optimizer(const Table& table) {
  std::size_t matched = 0;
  List::each([&]<class O>() {
    INFO(O::name);
    std::size_t found = 0;
    for (const auto& c : table) {
      const std::string name(c.name);
      found += name.substr(0, name.find(' ')) == O::name;
    }
    CHECK(found >= 1);
    matched += found;
  });
  CHECK(matched == table.size());
}

// A size big enough for threads: 2^20 + 3, or 2^17 + 3 in the sanitizer run
// (SHARDOPT_TEST_SANITIZE set), where the instrumented kernels are ten times
// slower; both are split across threads and leave every thread a partial
// vector.
inline std::size_t big_size() {
  const char* s = std::getenv("SHARDOPT_TEST_SANITIZE");
  return (std::size_t{1} << (s != nullptr && *s != '\0' ? 17 : 20)) + 3;
}

// Sizes around the SIMD and thread-split edges, and big_size().
inline const std::vector<std::size_t>& awkward_sizes() {
  static const std::vector<std::size_t> sizes = {0, 1, 7, 15, 16, 17, 1000, 65537, big_size()};
  return sizes;
}

// The largest |a[i] - b[i]|, in double, of a kernel's result against a
// float64 formula's.
inline double max_abs_diff(const std::vector<float>& a, const std::vector<double>& b) {
  double worst = 0;
  for (std::size_t i = 0; i < a.size(); ++i) worst = std::max(worst, std::fabs(a[i] - b[i]));
  return worst;
}

// A kernel's buffers with the fields every optimizer has set: parameters
// `p`, gradient `g` in type `gt`, and, for out 1 (bf16) or 2 (f16), the
// 16-bit parameter copy in *copy (none for out 0; buffers without a copy,
// as LAMB's first pass, have no such fields). The caller sets the states.
template <class Buffers>
Buffers kernel_buffers(std::vector<float>& p, const Grads& g, DType gt, int out = 0,
                       std::vector<std::uint16_t>* copy = nullptr) {
  Buffers b;
  b.param = p.data();
  b.grad = g.data(gt);
  b.grad_type = gt;
  if constexpr (requires { b.param_out; }) {
    b.param_out = out != 0 ? copy->data() : nullptr;
    b.param_out_type = out == 2 ? DType::f16 : DType::bf16;
  }
  b.n = p.size();
  return b;
}

// The buffers of a step over the single element p, for steps computed by
// hand: its gradient g in f32 and its states in slot order (each_state); a
// slot given nullptr, or past the list, is unused.
template <class Buffers>
Buffers one_element(float& p, const float& g, std::initializer_list<float*> states) {
  Buffers b;
  b.param = &p;
  b.grad = &g;
  b.n = 1;
  auto next = states.begin();
  b.each_state([&](float*& slot) { slot = next != states.end() ? *next++ : nullptr; });
  return b;
}

// A tensor of an optimizer with one state (SGD's momentum, Adagrad's sum,
// Lion's exp_avg): its parameters, the state and a 16-bit parameter copy.
struct OneState {
  std::vector<float> p, state;
  std::vector<std::uint16_t> out;
};

// kernel_buffers of st, its state in the buffers' one slot, or none when
// `state` is false (SGD without momentum).
template <class Buffers>
Buffers one_state_buffers(OneState& st, const Grads& g, DType gt, int out, bool state = true) {
  auto b = kernel_buffers<Buffers>(st.p, g, gt, out, &st.out);
  b.each_state([&](float*& slot) { slot = state ? st.state.data() : nullptr; });
  return b;
}

}  // namespace shardopt::test
