// Parameter remainders: the encoding round-trips every fp32 bit pattern, each
// optimizer's trajectory with bf16 parameters and remainders is bitwise the
// fp32-master trajectory, the CPU kernels equal the reference kernels with
// remainders, and the functional API rejects bad parameter buffers.
#include <omp.h>

#include <catch2/catch.hpp>
#include <cstdint>
#include <functional>
#include <span>
#include <string>
#include <vector>

#include "kernels/adagrad.hpp"
#include "kernels/adam.hpp"
#include "kernels/lamb.hpp"
#include "kernels/lion.hpp"
#include "kernels/rmsprop.hpp"
#include "kernels/sgd.hpp"
#include "optim_helpers.hpp"
#include "shardopt/optim.hpp"

using namespace shardopt;
using namespace shardopt::test;
using functional::GradView;
using functional::ParamView;
using functional::StepResult;

namespace {

// bf16 parameters and their remainders.
struct Encoded {
  std::vector<bfloat16> hi;
  std::vector<std::uint16_t> rem;

  explicit Encoded(const std::vector<float>& master) : hi(master.size()), rem(master.size()) {
    functional::encode_param_remainders(master, hi, rem);
  }
  std::vector<float> decoded() const {
    std::vector<float> out(hi.size());
    functional::decode_param_remainders(hi, rem, out);
    return out;
  }
  ParamView view() { return ParamView(std::span<bfloat16>(hi), std::span<std::uint16_t>(rem)); }
  // The number of elements that differ from the encoding of `master`.
  std::size_t diff_from(const std::vector<float>& master) const {
    const Encoded want(master);
    std::size_t d = 0;
    for (std::size_t i = 0; i < hi.size(); ++i)
      d += hi[i].bits != want.hi[i].bits || rem[i] != want.rem[i];
    return d;
  }
};

using States = std::vector<std::vector<float>>;

// One optimizer through the functional API, with its state buffers.
struct Case {
  const char* name;
  int states;
  float state_init;
  std::function<StepResult(ParamView, GradView, States&, std::int64_t)> step;
};

const std::vector<Case>& cases() {
  static const std::vector<Case> all = {
      {"Adam", 3, 0.0f,
       [](ParamView p, GradView g, States& s, std::int64_t t) {
         return functional::adam(p, g, s[0], s[1], s[2], t,
                                 Adam{.lr = 0.01, .weight_decay = 0.01, .amsgrad = true});
       }},
      {"AdamW", 2, 0.0f,
       [](ParamView p, GradView g, States& s, std::int64_t t) {
         return functional::adamw(p, g, s[0], s[1], {}, t, AdamW{.lr = 0.01});
       }},
      {"SGD", 1, 0.0f,
       [](ParamView p, GradView g, States& s, std::int64_t t) {
         return functional::sgd(
             p, g, s[0], t,
             SGD{.lr = 0.01, .momentum = 0.9, .weight_decay = 0.01, .nesterov = true});
       }},
      {"Adagrad", 1, 0.1f,
       [](ParamView p, GradView g, States& s, std::int64_t t) {
         return functional::adagrad(p, g, s[0], t,
                                    Adagrad{.lr = 0.05,
                                            .lr_decay = 0.01,
                                            .weight_decay = 0.01,
                                            .initial_accumulator_value = 0.1});
       }},
      {"RMSprop", 3, 0.0f,
       [](ParamView p, GradView g, States& s, std::int64_t) {
         return functional::rmsprop(
             p, g, s[0], s[1], s[2],
             RMSprop{.lr = 0.01, .weight_decay = 0.01, .momentum = 0.9, .centered = true});
       }},
      {"Lion", 1, 0.0f,
       [](ParamView p, GradView g, States& s, std::int64_t) {
         return functional::lion(p, g, s[0], Lion{.lr = 1e-3, .weight_decay = 0.1});
       }},
      {"Lamb", 3, 0.0f,
       [](ParamView p, GradView g, States& s, std::int64_t t) {
         return functional::lamb(p, g, s[0], s[1], s[2], t, Lamb{.lr = 0.01});
       }},
      {"NAdam", 2, 0.0f,
       [](ParamView p, GradView g, States& s, std::int64_t t) {
         const std::span<float> states[] = {s[0], s[1]};
         return functional::step(p, g, states, t,
                                 NAdam{.lr = 0.01, .weight_decay = 0.01, .momentum_decay = 0.004});
       }},
      // Steps 5 on: step 5 is one of RAdam's first (unrectified) steps, the
      // later ones rectified.
      {"RAdam", 2, 0.0f,
       [](ParamView p, GradView g, States& s, std::int64_t t) {
         const std::span<float> states[] = {s[0], s[1]};
         return functional::step(
             p, g, states, t + 4,
             RAdam{.lr = 0.01, .weight_decay = 0.01, .decoupled_weight_decay = true});
       }},
  };
  return all;
}

}  // namespace

TEST_CASE("Parameter remainders: the optimizer table holds every optimizer",
          "[optim][remainders]") {
  check_every_optimizer<Optimizers>(cases());
}

TEST_CASE("Parameter remainders round-trip every fp32 bit pattern", "[optim][remainders]") {
  // All 2^32 patterns: finite values, infinities and every NaN payload.
  std::uint64_t bad = 0, far = 0;
#pragma omp parallel for reduction(+ : bad, far) schedule(static)
  for (std::int64_t top = 0; top < (std::int64_t{1} << 16); ++top) {
    for (std::uint32_t low = 0; low < (1u << 16); ++low) {
      const std::uint32_t u = (static_cast<std::uint32_t>(top) << 16) | low;
      bfloat16 hi;
      std::uint16_t rem;
      kernels::encode_remainder(from_bits(u), hi, rem);
      bad += bits(kernels::decode_remainder(hi, rem)) != u;
      // hi is u rounded to the nearest multiple of 2^16, ties up in magnitude.
      far += static_cast<std::uint32_t>(hi.bits) != ((u + 0x8000u) >> 16);
    }
  }
  CHECK(bad == 0);
  CHECK(far == 0);
}

TEST_CASE("Parameter remainders: every (bf16, remainder) pair is an encoding",
          "[optim][remainders]") {
  // The encoding is a bijection: decoding then encoding gives the pair back.
  const std::uint16_t rems[] = {0, 1, 0x7fff, 0x8000, 0x8001, 0xffff, 0x1234, 0xc000};
  std::uint64_t bad = 0;
  for (std::uint32_t h = 0; h < (1u << 16); ++h) {
    for (std::uint16_t r : rems) {
      const float p = kernels::decode_remainder(bfloat16{static_cast<std::uint16_t>(h)}, r);
      bfloat16 hi;
      std::uint16_t rem;
      kernels::encode_remainder(p, hi, rem);
      bad += hi.bits != h || rem != r;
    }
  }
  CHECK(bad == 0);
}

TEST_CASE("Parameter remainders: the bf16 value is the master rounded to nearest",
          "[optim][remainders]") {
  const std::vector<float> p = uniform(100000, 11, -1000, 1000);
  const Encoded e(p);
  std::size_t far = 0;
  for (std::size_t i = 0; i < p.size(); ++i) {
    const float h = to_float(e.hi[i]);
    // Half a bf16 ulp of |p|: 2^(exponent - 8).
    const int exp = static_cast<int>((bits(p[i]) >> 23) & 0xff) - 127;
    far += std::fabs(static_cast<double>(h) - p[i]) > std::ldexp(1.0, exp - 8);
  }
  CHECK(far == 0);
  // Exact bf16 values have zero remainders; a tie rounds away from zero.
  const Encoded exact({1.0f, -2.5f, 0.0f, -0.0f});
  for (std::uint16_t r : exact.rem) CHECK(r == 0);
  const Encoded tie({from_bits(0x3f808000u), from_bits(0xbf808000u)});
  CHECK(tie.hi[0].bits == 0x3f81);
  CHECK(tie.hi[1].bits == 0xbf81);
  CHECK(tie.rem[0] == 0x8000);
  CHECK(tie.decoded()[1] == from_bits(0xbf808000u));
}

TEST_CASE("Every optimizer with remainders follows the fp32-master trajectory bitwise",
          "[optim][remainders]") {
  for (const Case& c : cases()) {
    for (std::size_t n : {std::size_t{1}, std::size_t{7}, std::size_t{1000}, std::size_t{65537}}) {
      for (DType gt : {DType::bf16, DType::f16, DType::f32}) {
        std::vector<float> master = uniform(n, 3 + n, -1, 1);
        Encoded enc(master);
        States s32(c.states, std::vector<float>(n, c.state_init)), srem = s32;
        INFO(c.name << " n " << n << " grads " << dtype_name(gt));
        for (std::int64_t t = 1; t <= 4; ++t) {
          INFO("step " << t);
          const Grads g(uniform(n, 100 * t + n, -1, 1));
          const StepResult a = c.step(master, GradView(g.data(gt), n, gt), s32, t);
          const StepResult b = c.step(enc.view(), GradView(g.data(gt), n, gt), srem, t);
          CHECK(a.grads_finite == b.grads_finite);
          CHECK(count_diff(enc.decoded(), master) == 0);
          CHECK(enc.diff_from(master) == 0);
          for (int k = 0; k < c.states; ++k) CHECK(count_diff(srem[k], s32[k]) == 0);
        }
      }
    }
  }
}

TEST_CASE("Remainders from a bf16 model: zero remainders start at the bf16 values",
          "[optim][remainders]") {
  const std::size_t n = 333;
  std::vector<bfloat16> model(n);
  const std::vector<float> init = uniform(n, 9, -1, 1);
  for (std::size_t i = 0; i < n; ++i) model[i] = bf16_from_float(init[i]);
  std::vector<std::uint16_t> rem(n, 0);
  std::vector<float> master(n);
  for (std::size_t i = 0; i < n; ++i) master[i] = to_float(model[i]);
  std::vector<float> m32(n), v32(n), m(n), v(n);
  const Grads g(uniform(n, 10, -1, 1));
  functional::adamw(master, g.bf16, m32, v32, {}, 1, AdamW{});
  functional::adamw({std::span(model), std::span(rem)}, g.bf16, m, v, {}, 1, AdamW{});
  std::vector<float> decoded(n);
  functional::decode_param_remainders(model, rem, decoded);
  CHECK(count_diff(decoded, master) == 0);
}

namespace {

// The kernels of one optimizer with remainders, on the reference or the CPU.
struct KernelState {
  Encoded enc;
  States s;
};

void kernel_step(const std::string& opt, bool cpu, KernelState& k, const Grads& g, DType gt,
                 std::int64_t t) {
  const std::size_t n = k.enc.hi.size();
  auto params = [&](auto& b) {
    b.param = nullptr;
    b.param_out = k.enc.hi.data();
    b.remainder = k.enc.rem.data();
    b.n = n;
    if constexpr (requires { b.grad; }) {
      b.grad = g.data(gt);
      b.grad_type = gt;
    }
  };
  if (opt == "Adam") {
    kernels::AdamBuffers b;
    params(b);
    b.exp_avg = k.s[0].data();
    b.exp_avg_sq = k.s[1].data();
    b.max_exp_avg_sq = k.s[2].data();
    const auto s =
        kernels::make_adam_scalars(0.01, 0.9, 0.999, 1e-8, 0.01, true, true, false, t, 0.5);
    cpu ? kernels::cpu::step<Adam>(b, s) : kernels::reference::step<Adam>(b, s);
  } else if (opt == "SGD") {
    kernels::SgdBuffers b;
    params(b);
    b.momentum_buffer = k.s[0].data();
    const auto s = kernels::make_sgd_scalars(0.01, 0.9, 0.0, 0.01, true, false, t, 1.0);
    cpu ? kernels::cpu::step<SGD>(b, s) : kernels::reference::step<SGD>(b, s);
  } else if (opt == "Adagrad") {
    kernels::AdagradBuffers b;
    params(b);
    b.sum = k.s[0].data();
    const auto s = kernels::make_adagrad_scalars(0.05, 0.01, 0.01, 1e-10, true, t, 1.0);
    cpu ? kernels::cpu::step<Adagrad>(b, s) : kernels::reference::step<Adagrad>(b, s);
  } else if (opt == "RMSprop") {
    kernels::RmspropBuffers b;
    params(b);
    b.square_avg = k.s[0].data();
    b.grad_avg = k.s[1].data();
    b.momentum_buffer = k.s[2].data();
    const auto s = kernels::make_rmsprop_scalars(0.01, 0.99, 1e-8, 0.01, 0.9, true, false, 1.0);
    cpu ? kernels::cpu::step<RMSprop>(b, s) : kernels::reference::step<RMSprop>(b, s);
  } else if (opt == "Lion") {
    kernels::LionBuffers b;
    params(b);
    b.exp_avg = k.s[0].data();
    const auto s = kernels::make_lion_scalars(1e-3, 0.9, 0.99, 0.1, false, 1.0);
    cpu ? kernels::cpu::step<Lion>(b, s) : kernels::reference::step<Lion>(b, s);
  } else {  // LAMB: both passes, the step from the norms
    kernels::LambBuffers b;
    b.param_bf16 = k.enc.hi.data();
    b.remainder = k.enc.rem.data();
    b.grad = g.data(gt);
    b.grad_type = gt;
    b.exp_avg = k.s[0].data();
    b.exp_avg_sq = k.s[1].data();
    b.update = k.s[2].data();
    b.n = n;
    const auto s = kernels::make_lamb_scalars(0.9, 0.999, 1e-6, 0.01, false, t, 1.0);
    const kernels::LambNorms norms =
        cpu ? kernels::cpu::lamb_direction(b, s) : kernels::reference::lamb_direction(b, s);
    const float neg_step = static_cast<float>(-0.01 * std::sqrt(norms.param_sq / norms.update_sq));
    kernels::LambApplyBuffers a;
    params(a);
    a.update = k.s[2].data();
    cpu ? kernels::cpu::lamb_apply(a, neg_step) : kernels::reference::lamb_apply(a, neg_step);
  }
}

}  // namespace

TEST_CASE("CPU kernels with remainders equal the reference kernels bitwise",
          "[optim][remainders]") {
  for (const char* opt : {"Adam", "SGD", "Adagrad", "RMSprop", "Lion", "Lamb"}) {
    for (std::size_t n : {std::size_t{7}, std::size_t{65537}, big_size()}) {
      for (DType gt : {DType::bf16, DType::f16}) {
        INFO(opt << " n " << n << " grads " << dtype_name(gt));
        const std::vector<float> master = uniform(n, 21 + n, -1, 1);
        KernelState ref{Encoded(master), States(3, uniform(n, 22, 0, 0.1f))};
        KernelState cpu = ref;
        for (std::int64_t t = 1; t <= 2; ++t) {
          const Grads g(uniform(n, 30 + t, -1, 1));
          kernel_step(opt, false, ref, g, gt, t);
          kernel_step(opt, true, cpu, g, gt, t);
        }
        std::size_t d = 0;
        for (std::size_t i = 0; i < n; ++i)
          d += ref.enc.hi[i].bits != cpu.enc.hi[i].bits || ref.enc.rem[i] != cpu.enc.rem[i];
        CHECK(d == 0);
        for (int k = 0; k < 3; ++k) CHECK(count_diff(ref.s[k], cpu.s[k]) == 0);
        // The step moved the parameters.
        CHECK(count_diff(ref.enc.decoded(), master) > 0);
      }
    }
  }
}

TEST_CASE("Bad parameter buffers with remainders are rejected", "[optim][remainders]") {
  const std::size_t n = 8;
  std::vector<bfloat16> hi(n);
  std::vector<float16> h16(n);
  std::vector<float> p32(n), m(n), v(n);
  std::vector<std::uint16_t> rem(n), short_rem(n - 1);
  std::vector<bfloat16> out(n);
  const Grads g(uniform(n, 1, -1, 1));
  const std::span<std::uint16_t> r(rem);
  for (const Case& c : cases()) {
    States s(c.states, std::vector<float>(n, c.state_init));
    auto step = [&](ParamView p) { return c.step(p, g.bf16, s, 1); };
    INFO(c.name);
    CHECK(rejects([&] { step(ParamView(std::span<bfloat16>(hi), std::span(short_rem))); },
                  ErrorCode::invalid_argument, "remainders has 7 elements, params have 8"));
    CHECK(rejects([&] { step(ParamView(h16.data(), n, DType::f16, r)); }, ErrorCode::unsupported,
                  "parameter remainders need bf16 parameters, not f16"));
    CHECK(rejects([&] { step(ParamView(hi.data(), n, DType::bf16, {})); }, ErrorCode::unsupported,
                  "bf16 parameters need their remainders"));
    CHECK(rejects([&] { step(ParamView(p32.data(), n, DType::f32, r)); },
                  ErrorCode::invalid_argument, "remainders were given with fp32 parameters"));
    CHECK(rejects(
        [&] {
          step(ParamView(hi.data(), n, DType::bf16,
                         std::span<std::uint16_t>(static_cast<std::uint16_t*>(nullptr), n)));
        },
        ErrorCode::invalid_argument, "remainders is null"));
    CHECK(rejects([&] { step(ParamView(h16.data(), n, DType::f64, {})); }, ErrorCode::unsupported,
                  "parameters of type f64 are not supported"));
  }
  std::vector<float> mm(n), vv(n);
  CHECK(rejects(
      [&] {
        functional::adamw(ParamView(std::span<bfloat16>(hi), r), g.bf16, mm, vv, {}, 1, AdamW{},
                          {.param_out = out.data()});
      },
      ErrorCode::invalid_argument, "StepOptions::param_out was given with parameter remainders"));
  CHECK(rejects([&] { functional::encode_param_remainders(p32, hi, short_rem); },
                ErrorCode::invalid_argument, "sizes differ"));
  CHECK(rejects([&] { functional::decode_param_remainders(hi, short_rem, p32); },
                ErrorCode::invalid_argument, "sizes differ"));
}
