// Non-finite gradients: the finiteness kernels (CPU against the reference on
// every vector path), functional::grads_finite, and StepOptions::skip_nonfinite
// for every optimizer (the table below covers SHARDOPT_OPTIMIZERS, AdamW
// included): a skipped step writes nothing, a step that is not skipped equals
// the step without the option bitwise.
#include <omp.h>

#include <catch2/catch.hpp>
#include <cmath>
#include <cstdint>
#include <functional>
#include <limits>
#include <span>
#include <string>
#include <vector>

#include "kernels/cpu/runner.hpp"
#include "kernels/finite.hpp"
#include "optim_helpers.hpp"
#include "shardopt/optim.hpp"

using namespace shardopt;
using namespace shardopt::test;
using functional::GradView;
using functional::ParamView;
using functional::StepOptions;
using functional::StepResult;
using kernels::cpu::detail::Isa;

namespace {

constexpr DType kGradTypes[] = {DType::f32, DType::bf16, DType::f16};
constexpr float kInf = std::numeric_limits<float>::infinity();

// Sets gradient i of g (all three types) to x.
void plant(Grads& g, std::size_t i, float x) {
  g.f32[i] = x;
  g.bf16[i] = bf16_from_float(x);
  g.f16[i] = f16_from_float(x);
}

// The answers of the reference and the CPU kernel (on every vector path this
// machine has, at 1 and 3 threads) must agree; returns the reference's.
bool finite_everywhere(const void* g, DType t, std::size_t n, float mul) {
  const bool want = kernels::reference::all_finite(g, t, n, mul);
  const Isa best = kernels::cpu::detail::detect_isa();
  const int saved = omp_get_max_threads();
  for (Isa isa : {Isa::baseline, Isa::avx2, Isa::avx512}) {
    if (isa > best) continue;
    kernels::cpu::detail::isa_limit() = isa;
    for (int threads : {1, 3}) {
      omp_set_num_threads(threads);
      INFO("vector path " << static_cast<int>(isa) << " threads " << threads);
      CHECK(kernels::cpu::all_finite(g, t, n, mul) == want);
    }
  }
  kernels::cpu::detail::isa_limit() = Isa::avx512;
  omp_set_num_threads(saved);
  CHECK(functional::grads_finite(GradView(g, n, t), mul) == want);
  return want;
}

}  // namespace

TEST_CASE("Finiteness check: a non-finite gradient anywhere, in every type and size",
          "[optim][finite]") {
  for (std::size_t n :
       {std::size_t{1}, std::size_t{7}, std::size_t{1000}, std::size_t{65537}, big_size()}) {
    Grads g(uniform(n, n, -1, 1));
    for (DType t : kGradTypes) {
      INFO("n " << n << " type " << dtype_name(t));
      CHECK(finite_everywhere(g.data(t), t, n, 1.0f));
      for (std::size_t at : {std::size_t{0}, n / 2, n - 1}) {
        for (float bad : {std::nanf(""), kInf, -kInf}) {
          INFO("at " << at << " value " << bad);
          const float keep = g.f32[at];
          plant(g, at, bad);
          CHECK_FALSE(finite_everywhere(g.data(t), t, n, 1.0f));
          plant(g, at, keep);
        }
      }
      CHECK(finite_everywhere(g.data(t), t, n, 1.0f));
    }
  }
  // No gradients: finite.
  CHECK(finite_everywhere(nullptr, DType::f32, 0, 1.0f));
}

TEST_CASE("Finiteness check: gradients that overflow after grad_mul", "[optim][finite]") {
  for (std::size_t n : {std::size_t{9}, std::size_t{40000}}) {
    Grads g(uniform(n, 7, -1, 1));
    // 60000 fits every type; times 1e34 it passes float's largest value.
    plant(g, n - 3, 60000.0f);
    for (DType t : kGradTypes) {
      INFO("n " << n << " type " << dtype_name(t));
      CHECK(finite_everywhere(g.data(t), t, n, 1e30f));
      CHECK_FALSE(finite_everywhere(g.data(t), t, n, 1e34f));
      // grad_mul past float's range is inf in float: even a zero gradient
      // is then nan, as the steps compute it.
      CHECK_FALSE(functional::grads_finite(GradView(g.data(t), n, t), 1e39));
    }
  }
  const std::vector<float> zeros(5, 0.0f);
  CHECK_FALSE(functional::grads_finite(zeros, 1e39));
  CHECK(functional::grads_finite(zeros, 1e38));
}

TEST_CASE("grads_finite: bad arguments", "[optim][finite]") {
  const std::vector<float> g(4, 1.0f);
  const std::vector<std::int32_t> ints(4, 1);
  CHECK(rejects([&] { functional::grads_finite(GradView(ints.data(), 4, DType::i32)); },
                ErrorCode::unsupported, "gradients of type i32"));
  CHECK(rejects([&] { functional::grads_finite(GradView(nullptr, 4, DType::f32)); },
                ErrorCode::invalid_argument, "grads is null"));
  CHECK(rejects([&] { functional::grads_finite(g, std::nan("")); }, ErrorCode::invalid_argument,
                "grad_mul is nan"));
}

namespace {

using States = std::vector<std::vector<float>>;

// One optimizer through the functional API with all its state buffers in use.
struct Optimizer {
  const char* name;
  int states;
  std::function<StepResult(ParamView, GradView, States&, const StepOptions&)> step;
};

const std::vector<Optimizer>& optimizers() {
  static const std::vector<Optimizer> all = {
      {"Adam", 3,
       [](ParamView p, GradView g, States& s, const StepOptions& o) {
         return functional::adam(p, g, s[0], s[1], s[2], 2,
                                 Adam{.lr = 0.01, .weight_decay = 0.01, .amsgrad = true}, o);
       }},
      {"AdamW", 2,
       [](ParamView p, GradView g, States& s, const StepOptions& o) {
         return functional::adamw(p, g, s[0], s[1], {}, 2, AdamW{.lr = 0.01}, o);
       }},
      {"SGD", 1,
       [](ParamView p, GradView g, States& s, const StepOptions& o) {
         return functional::sgd(p, g, s[0], 2, SGD{.lr = 0.01, .momentum = 0.9}, o);
       }},
      {"Adagrad", 1,
       [](ParamView p, GradView g, States& s, const StepOptions& o) {
         return functional::adagrad(p, g, s[0], 2, Adagrad{.lr = 0.05, .lr_decay = 0.01}, o);
       }},
      {"RMSprop", 3,
       [](ParamView p, GradView g, States& s, const StepOptions& o) {
         return functional::rmsprop(p, g, s[0], s[1], s[2],
                                    RMSprop{.lr = 0.01, .momentum = 0.9, .centered = true}, o);
       }},
      {"Lion", 1,
       [](ParamView p, GradView g, States& s, const StepOptions& o) {
         return functional::lion(p, g, s[0], Lion{.lr = 1e-3, .weight_decay = 0.1}, o);
       }},
      {"Lamb", 3,
       [](ParamView p, GradView g, States& s, const StepOptions& o) {
         return functional::lamb(p, g, s[0], s[1], s[2], 2, Lamb{.lr = 0.01}, o);
       }},
      {"NAdam", 2,
       [](ParamView p, GradView g, States& s, const StepOptions& o) {
         const std::span<float> states[] = {s[0], s[1]};
         return functional::step(p, g, states, 2, NAdam{.lr = 0.01, .weight_decay = 0.01}, o);
       }},
      // Step 10: past RAdam's first steps, the rectified adaptive step.
      {"RAdam", 2,
       [](ParamView p, GradView g, States& s, const StepOptions& o) {
         const std::span<float> states[] = {s[0], s[1]};
         return functional::step(
             p, g, states, 10,
             RAdam{.lr = 0.01, .weight_decay = 0.01, .decoupled_weight_decay = true}, o);
       }},
  };
  return all;
}

// Every buffer a step may write: fp32 parameters with a low-precision copy,
// or bf16 parameters with remainders; the states.
struct Buffers {
  std::vector<float> p;
  std::vector<std::uint16_t> copy;
  std::vector<bfloat16> hi;
  std::vector<std::uint16_t> rem;
  States s;

  Buffers(const Optimizer& o, std::size_t n, bool remainders) {
    const std::vector<float> master = uniform(n, 11, -1, 1);
    if (remainders) {
      hi.resize(n);
      rem.resize(n);
      functional::encode_param_remainders(master, hi, rem);
    } else {
      p = master;
      copy.assign(n, 0x5555);
    }
    for (int k = 0; k < o.states; ++k) s.push_back(uniform(n, 20 + k, 0.01f, 0.1f));
  }
  ParamView params() {
    return rem.empty() ? ParamView(p)
                       : ParamView(std::span<bfloat16>(hi), std::span<std::uint16_t>(rem));
  }
  StepOptions options(bool skip, double grad_mul, DType copy_type) {
    StepOptions o;
    o.skip_nonfinite = skip;
    o.grad_mul = grad_mul;
    if (rem.empty()) {
      o.param_out = copy.data();
      o.param_out_dtype = copy_type;
    }
    return o;
  }
  bool operator==(const Buffers& b) const {
    if (count_diff(p, b.p) != 0 || copy != b.copy || rem != b.rem || hi.size() != b.hi.size())
      return false;
    for (std::size_t i = 0; i < hi.size(); ++i)
      if (hi[i].bits != b.hi[i].bits) return false;
    for (std::size_t k = 0; k < s.size(); ++k)
      if (count_diff(s[k], b.s[k]) != 0) return false;
    return true;
  }
};

}  // namespace

TEST_CASE("skip_nonfinite: the table holds every optimizer", "[optim][finite]") {
  check_every_optimizer<Optimizers>(optimizers());
}

TEST_CASE("skip_nonfinite: a step with a non-finite gradient writes nothing", "[optim][finite]") {
  for (const Optimizer& o : optimizers()) {
    for (std::size_t n : {std::size_t{1}, std::size_t{1000}, std::size_t{65537}}) {
      for (DType t : kGradTypes) {
        for (bool remainders : {false, true}) {
          // An inf or nan planted first, in the middle, last; and finite
          // gradients that overflow after grad_mul.
          struct Bad {
            std::size_t at;
            float value;
            double grad_mul;
          };
          const std::vector<Bad> bads = {{0, std::nanf(""), 1.0},
                                         {n / 2, kInf, 1.0},
                                         {n - 1, -kInf, 0.5},
                                         {n / 3, 60000.0f, 1e34}};
          for (const Bad& bad : bads) {
            INFO(o.name << " n " << n << " grads " << dtype_name(t) << " remainders " << remainders
                        << " at " << bad.at << " value " << bad.value << " grad_mul "
                        << bad.grad_mul);
            Grads g(uniform(n, 3, -1, 1));
            plant(g, bad.at, bad.value);
            Buffers b(o, n, remainders);
            const Buffers before = b;
            const StepResult r = o.step(b.params(), GradView(g.data(t), n, t), b.s,
                                        b.options(true, bad.grad_mul, DType::bf16));
            CHECK_FALSE(r.grads_finite);
            CHECK_FALSE(r.applied);
            CHECK(b == before);
            // Without the option the step is applied and reports the gradients.
            const StepResult applied = o.step(b.params(), GradView(g.data(t), n, t), b.s,
                                              b.options(false, bad.grad_mul, DType::bf16));
            CHECK_FALSE(applied.grads_finite);
            CHECK(applied.applied);
            CHECK_FALSE(b == before);
          }
        }
      }
    }
  }
}

TEST_CASE("skip_nonfinite: with finite gradients the step is the step without it, bitwise",
          "[optim][finite]") {
  for (const Optimizer& o : optimizers()) {
    for (std::size_t n : {std::size_t{7}, std::size_t{65537}}) {
      for (DType t : kGradTypes) {
        for (bool remainders : {false, true}) {
          INFO(o.name << " n " << n << " grads " << dtype_name(t) << " remainders " << remainders);
          const Grads g(uniform(n, 5, -1, 1));
          const DType copy_type = t == DType::f16 ? DType::f16 : DType::bf16;
          Buffers skip(o, n, remainders), plain(o, n, remainders);
          const Buffers before = skip;
          const StepResult rs = o.step(skip.params(), GradView(g.data(t), n, t), skip.s,
                                       skip.options(true, 0.25, copy_type));
          const StepResult rp = o.step(plain.params(), GradView(g.data(t), n, t), plain.s,
                                       plain.options(false, 0.25, copy_type));
          CHECK(rs.grads_finite);
          CHECK(rs.applied);
          CHECK(rp.grads_finite);
          CHECK(rp.applied);
          CHECK(skip == plain);
          CHECK_FALSE(skip == before);
        }
      }
    }
  }
}

TEST_CASE("skip_nonfinite: bad arguments are still rejected first", "[optim][finite]") {
  // The checks run before the gradients are read: a bad call is an error,
  // not a skipped step.
  std::vector<float> p(4, 1.0f), m(3, 0.0f);
  const std::vector<float> g(4, std::nanf(""));
  StepOptions o;
  o.skip_nonfinite = true;
  CHECK(rejects([&] { functional::lion(p, g, m, Lion{}, o); }, ErrorCode::invalid_argument,
                "exp_avg has 3 elements"));
  m.resize(4);
  const StepResult r = functional::lion(p, g, m, Lion{}, o);
  CHECK_FALSE(r.applied);
  CHECK(count_diff(p, std::vector<float>(4, 1.0f)) == 0);
}
