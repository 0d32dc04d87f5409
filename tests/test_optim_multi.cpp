// The functional optimizers on lists of tensors (host buffers): for every
// optimizer, lists of tensors of awkward sizes, gradient types and storages
// (fp32, mixed precision with a bf16 or f16 copy, parameter remainders) step
// bitwise as the single-tensor step on each tensor in turn; and every error,
// naming the tensor, leaves every buffer as it was.
#include <catch2/catch.hpp>
#include <cstdint>
#include <cstring>
#include <functional>
#include <limits>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "optim_helpers.hpp"
#include "shardopt/optim.hpp"

using namespace shardopt;
using namespace shardopt::test;
using functional::GradView;
using functional::ParamView;
using functional::StepOptions;
using functional::StepResult;

namespace {

// Storage of a tensor's parameters.
enum class Storage { fp32, fp32_copy, remainders };

// One tensor's buffers: parameters, gradients, up to 3 states, a copy.
struct Tensor {
  Storage storage;
  DType grad_type;
  std::vector<float> p;
  std::vector<bfloat16> hi;
  std::vector<std::uint16_t> rem;
  Grads g;
  std::vector<std::vector<float>> states;
  std::vector<std::uint16_t> copy;

  Tensor(std::size_t n, Storage st, DType gt, std::uint64_t seed, float state_init)
      : storage(st), grad_type(gt), g(uniform(n, seed + 1, -1, 1)) {
    const std::vector<float> master = uniform(n, seed, -1, 1);
    if (st == Storage::remainders) {
      hi.resize(n);
      rem.resize(n);
      functional::encode_param_remainders(master, hi, rem);
    } else {
      p = master;
    }
    states.assign(3, std::vector<float>(n, state_init));
    if (st == Storage::fp32_copy) copy.assign(n, 0);
  }
  std::size_t size() const { return g.f32.size(); }
  ParamView params() {
    if (storage == Storage::remainders)
      return ParamView(std::span<bfloat16>(hi), std::span<std::uint16_t>(rem));
    return ParamView(p.data(), p.size());
  }
  GradView grads() const { return GradView(g.data(grad_type), size(), grad_type); }
  void* param_out() { return storage == Storage::fp32_copy ? copy.data() : nullptr; }
  bool same(const Tensor& o) const {
    bool ok = count_diff(p, o.p) == 0 && rem == o.rem && copy == o.copy;
    for (std::size_t i = 0; i < hi.size(); ++i) ok = ok && hi[i].bits == o.hi[i].bits;
    for (std::size_t k = 0; k < states.size(); ++k)
      ok = ok && count_diff(states[k], o.states[k]) == 0;
    return ok;
  }
};

using Lists = std::vector<std::vector<std::span<float>>>;

// One optimizer with its options, through the single-tensor and list APIs.
// `states` of the three state buffers are used; the others are passed empty.
struct Case {
  std::string name;
  int states;
  float state_init;
  std::function<StepResult(ParamView, GradView, std::vector<std::span<float>>&, std::int64_t,
                           const StepOptions&)>
      single;
  std::function<StepResult(std::span<const ParamView>, std::span<const GradView>, Lists&,
                           std::int64_t, const StepOptions&, std::span<void* const>)>
      list;
};

std::vector<Case> cases() {
  std::vector<Case> all;
  const auto add_adam = [&](std::string name, Adam o) {
    all.push_back({name, o.amsgrad ? 3 : 2, 0.0f,
                   [o](ParamView p, GradView g, auto& s, std::int64_t t, const StepOptions& e) {
                     return functional::adam(p, g, s[0], s[1], s[2], t, o, e);
                   },
                   [o](auto ps, auto gs, Lists& l, std::int64_t t, const StepOptions& e,
                       std::span<void* const> outs) {
                     return functional::adam(ps, gs, l[0], l[1], l[2], t, o, e, outs);
                   }});
  };
  add_adam("Adam", Adam{.lr = 0.01});
  add_adam("Adam amsgrad l2", Adam{.lr = 0.01, .weight_decay = 0.1, .amsgrad = true});
  all.push_back({"AdamW maximize", 2, 0.0f,
                 [](ParamView p, GradView g, auto& s, std::int64_t t, const StepOptions& e) {
                   return functional::adamw(p, g, s[0], s[1], s[2], t,
                                            AdamW{.lr = 0.01, .maximize = true}, e);
                 },
                 [](auto ps, auto gs, Lists& l, std::int64_t t, const StepOptions& e,
                    std::span<void* const> outs) {
                   return functional::adamw(ps, gs, l[0], l[1], l[2], t,
                                            AdamW{.lr = 0.01, .maximize = true}, e, outs);
                 }});
  const auto add_sgd = [&](std::string name, SGD o) {
    all.push_back({name, o.momentum != 0.0 ? 1 : 0, 0.5f,
                   [o](ParamView p, GradView g, auto& s, std::int64_t t, const StepOptions& e) {
                     return functional::sgd(p, g, s[0], t, o, e);
                   },
                   [o](auto ps, auto gs, Lists& l, std::int64_t t, const StepOptions& e,
                       std::span<void* const> outs) {
                     return functional::sgd(ps, gs, l[0], t, o, e, outs);
                   }});
  };
  add_sgd("SGD", SGD{.lr = 0.1});
  add_sgd("SGD nesterov", SGD{.lr = 0.1, .momentum = 0.9, .weight_decay = 0.01, .nesterov = true});
  add_sgd("SGD dampening", SGD{.lr = 0.1, .momentum = 0.5, .dampening = 0.2});
  all.push_back(
      {"Adagrad", 1, 0.1f,
       [](ParamView p, GradView g, auto& s, std::int64_t t, const StepOptions& e) {
         return functional::adagrad(p, g, s[0], t,
                                    Adagrad{.lr_decay = 0.01, .initial_accumulator_value = 0.1}, e);
       },
       [](auto ps, auto gs, Lists& l, std::int64_t t, const StepOptions& e,
          std::span<void* const> outs) {
         return functional::adagrad(
             ps, gs, l[0], t, Adagrad{.lr_decay = 0.01, .initial_accumulator_value = 0.1}, e, outs);
       }});
  const auto add_rmsprop = [&](std::string name, RMSprop o) {
    all.push_back({name, o.centered || o.momentum != 0.0 ? 3 : 1, 0.0f,
                   [o](ParamView p, GradView g, auto& s, std::int64_t, const StepOptions& e) {
                     return functional::rmsprop(p, g, s[0], o.centered ? s[1] : std::span<float>{},
                                                o.momentum != 0.0 ? s[2] : std::span<float>{}, o,
                                                e);
                   },
                   [o](auto ps, auto gs, Lists& l, std::int64_t, const StepOptions& e,
                       std::span<void* const> outs) {
                     const std::vector<std::span<float>> none;
                     return functional::rmsprop(ps, gs, l[0], o.centered ? l[1] : none,
                                                o.momentum != 0.0 ? l[2] : none, o, e, outs);
                   }});
  };
  add_rmsprop("RMSprop", RMSprop{});
  add_rmsprop("RMSprop centered momentum",
              RMSprop{.weight_decay = 0.01, .momentum = 0.9, .centered = true});
  all.push_back({"Lion", 1, 0.0f,
                 [](ParamView p, GradView g, auto& s, std::int64_t, const StepOptions& e) {
                   return functional::lion(p, g, s[0], Lion{.weight_decay = 0.1}, e);
                 },
                 [](auto ps, auto gs, Lists& l, std::int64_t, const StepOptions& e,
                    std::span<void* const> outs) {
                   return functional::lion(ps, gs, l[0], Lion{.weight_decay = 0.1}, e, outs);
                 }});
  all.push_back({"Lamb", 3, 0.0f,
                 [](ParamView p, GradView g, auto& s, std::int64_t t, const StepOptions& e) {
                   return functional::lamb(p, g, s[0], s[1], s[2], t, Lamb{.lr = 0.01}, e);
                 },
                 [](auto ps, auto gs, Lists& l, std::int64_t t, const StepOptions& e,
                    std::span<void* const> outs) {
                   return functional::lamb(ps, gs, l[0], l[1], l[2], t, Lamb{.lr = 0.01}, e, outs);
                 }});
  // The optimizers served by the generic step alone, with their slots in
  // order.
  const auto add_generic = [&](std::string name, auto o) {
    constexpr std::size_t k = slot_count<decltype(o)>();
    all.push_back({name, k, 0.0f,
                   [o](ParamView p, GradView g, auto& s, std::int64_t t, const StepOptions& e) {
                     return functional::step(p, g, std::span<const std::span<float>>(s).first(k), t,
                                             o, e);
                   },
                   [o](auto ps, auto gs, Lists& l, std::int64_t t, const StepOptions& e,
                       std::span<void* const> outs) {
                     const std::vector<std::span<const std::span<float>>> lists(
                         l.begin(), l.begin() + slot_count<decltype(o)>());
                     return functional::step(ps, gs, lists, t, o, e, outs);
                   }});
  };
  add_generic("NAdam", NAdam{.lr = 0.01, .weight_decay = 0.01});
  add_generic("RAdam decoupled",
              RAdam{.lr = 0.01, .weight_decay = 0.01, .decoupled_weight_decay = true});
  // And through their named steps (two states each).
  const auto add_named = [&](std::string name, auto o, auto named) {
    all.push_back({name, 2, 0.0f,
                   [o, named](ParamView p, GradView g, auto& s, std::int64_t t,
                              const StepOptions& e) { return named(p, g, s[0], s[1], t, o, e); },
                   [o, named](auto ps, auto gs, Lists& l, std::int64_t t, const StepOptions& e,
                              std::span<void* const> outs) {
                     return named(ps, gs, l[0], l[1], t, o, e, outs);
                   }});
  };
  add_named("NAdam named", NAdam{.lr = 0.01},
            [](auto&&... a) { return functional::nadam(std::forward<decltype(a)>(a)...); });
  add_named("RAdam named", RAdam{.lr = 0.01},
            [](auto&&... a) { return functional::radam(std::forward<decltype(a)>(a)...); });
  return all;
}

struct Spec {
  std::size_t n;
  Storage storage;
  DType grad_type;
};

std::vector<Tensor> make(const std::vector<Spec>& specs, float state_init) {
  std::vector<Tensor> out;
  for (std::size_t i = 0; i < specs.size(); ++i)
    out.emplace_back(specs[i].n, specs[i].storage, specs[i].grad_type, 1000 + 17 * i, state_init);
  return out;
}

// The list call's arguments over `tensors`; with empty_unused, the unused
// state lists hold one empty span per tensor instead of being empty.
struct ListArgs {
  std::vector<ParamView> params;
  std::vector<GradView> grads;
  Lists states = Lists(3);
  std::vector<void*> outs;

  ListArgs(std::vector<Tensor>& tensors, int used, bool with_outs, bool empty_unused) {
    for (Tensor& t : tensors) {
      params.push_back(t.params());
      grads.push_back(t.grads());
      for (int k = 0; k < 3; ++k) {
        if (k < used)
          states[k].push_back(t.states[k]);
        else if (empty_unused)
          states[k].push_back({});
      }
      if (with_outs) outs.push_back(t.param_out());
    }
  }
};

// Runs `steps` steps of c on tensors through the list API and on a copy
// through the single API, and checks that they agree bitwise.
void compare(const Case& c, const std::vector<Spec>& specs, DType copy_type, bool empty_unused) {
  std::vector<Tensor> one = make(specs, c.state_init), many = make(specs, c.state_init);
  bool with_outs = false;
  for (const Spec& s : specs) with_outs = with_outs || s.storage == Storage::fp32_copy;
  StepOptions extra;
  extra.grad_mul = 0.5;
  extra.param_out_dtype = copy_type;
  for (std::int64_t t = 1; t <= 3; ++t) {
    bool want = true;
    for (Tensor& x : one) {
      std::vector<std::span<float>> st(3);
      for (int k = 0; k < c.states; ++k) st[k] = x.states[k];
      StepOptions e = extra;
      e.param_out = x.param_out();
      want = c.single(x.params(), x.grads(), st, t, e).grads_finite && want;
    }
    ListArgs args(many, c.states, with_outs, empty_unused);
    const StepResult got = c.list(args.params, args.grads, args.states, t, extra, args.outs);
    CHECK(got.grads_finite == want);
  }
  for (std::size_t i = 0; i < specs.size(); ++i) {
    INFO(c.name << ": tensor " << i << " of " << specs[i].n << " elements");
    CHECK(many[i].same(one[i]));
  }
}

}  // namespace

TEST_CASE("List steps: the case table covers every optimizer", "[optim][multi]") {
  check_every_optimizer<Optimizers>(cases());
}

TEST_CASE("The named NAdam and RAdam steps are the generic step, bitwise", "[optim][multi]") {
  const auto check = [](auto o, auto named) {
    const std::size_t n = 1031;
    Tensor a(n, Storage::fp32, DType::f32, 7, 0.0f), b(n, Storage::fp32, DType::f32, 7, 0.0f);
    for (std::int64_t t = 1; t <= 5; ++t) {
      const std::span<float> states[] = {b.states[0], b.states[1]};
      named(a.params(), a.grads(), a.states[0], a.states[1], t, o);
      functional::step(b.params(), b.grads(), states, t, o);
    }
    CHECK(a.same(b));
    CHECK(a.p != uniform(n, 7, -1, 1));  // the steps moved the parameters
  };
  check(NAdam{.lr = 0.01, .weight_decay = 0.01},
        [](auto&&... a) { return functional::nadam(a...); });
  check(RAdam{.lr = 0.01, .decoupled_weight_decay = true},
        [](auto&&... a) { return functional::radam(a...); });
}

TEST_CASE("List steps equal single steps tensor by tensor, bitwise", "[optim][multi]") {
  const std::vector<Spec> fp32 = {{0, Storage::fp32, DType::f32},
                                  {1, Storage::fp32, DType::f32},
                                  {7, Storage::fp32, DType::f32},
                                  {1000, Storage::fp32, DType::f32},
                                  {65537, Storage::fp32, DType::f32}};
  const std::vector<Spec> mixed = {
      {1000, Storage::fp32_copy, DType::bf16}, {0, Storage::fp32, DType::f32},
      {7, Storage::remainders, DType::f16},    {65537, Storage::remainders, DType::bf16},
      {1, Storage::fp32_copy, DType::f16},     {1000, Storage::fp32, DType::bf16},
      {7, Storage::fp32_copy, DType::f32}};
  const std::vector<Spec> bf16_model = {{65537, Storage::fp32_copy, DType::bf16},
                                        {7, Storage::fp32_copy, DType::bf16},
                                        {1, Storage::fp32_copy, DType::bf16}};
  for (const Case& c : cases()) {
    SECTION(c.name) {
      compare(c, fp32, DType::bf16, false);
      compare(c, mixed, DType::bf16, false);
      compare(c, mixed, DType::f16, true);
      compare(c, bf16_model, DType::f16, false);
      compare(c, {}, DType::bf16, false);
    }
  }
}

TEST_CASE("List steps report non-finite gradients of any tensor and step all the same",
          "[optim][multi]") {
  const std::vector<Spec> specs = {{7, Storage::fp32, DType::f32},
                                   {1000, Storage::fp32_copy, DType::bf16},
                                   {5, Storage::remainders, DType::f16}};
  for (const Case& c : cases()) {
    INFO(c.name);
    std::vector<Tensor> one = make(specs, c.state_init), many = make(specs, c.state_init);
    for (std::vector<Tensor>* ts : {&one, &many}) {
      Tensor& t = (*ts)[1];
      t.g.bf16[3] = bf16_from_float(std::numeric_limits<float>::infinity());
    }
    StepOptions extra;
    for (Tensor& x : one) {
      std::vector<std::span<float>> st(3);
      for (int k = 0; k < c.states; ++k) st[k] = x.states[k];
      StepOptions e = extra;
      e.param_out = x.param_out();
      c.single(x.params(), x.grads(), st, 1, e);
    }
    ListArgs args(many, c.states, true, false);
    CHECK_FALSE(c.list(args.params, args.grads, args.states, 1, extra, args.outs).grads_finite);
    for (std::size_t i = 0; i < specs.size(); ++i) CHECK(many[i].same(one[i]));
  }
}

TEST_CASE("List steps with skip_nonfinite skip the whole list on one non-finite gradient",
          "[optim][multi]") {
  const std::vector<Spec> specs = {{7, Storage::fp32, DType::f32},
                                   {1000, Storage::fp32_copy, DType::bf16},
                                   {5, Storage::remainders, DType::f16}};
  StepOptions skip;
  skip.skip_nonfinite = true;
  for (const Case& c : cases()) {
    INFO(c.name);
    for (std::size_t bad = 0; bad < specs.size(); ++bad) {
      std::vector<Tensor> ts = make(specs, c.state_init), before = make(specs, c.state_init);
      for (std::vector<Tensor>* x : {&ts, &before}) {
        Tensor& t = (*x)[bad];
        t.g.f32.back() = std::numeric_limits<float>::quiet_NaN();
        t.g.bf16.back() = bf16_from_float(std::numeric_limits<float>::quiet_NaN());
        t.g.f16.back() = f16_from_float(-std::numeric_limits<float>::infinity());
      }
      ListArgs args(ts, c.states, true, false);
      const StepResult r = c.list(args.params, args.grads, args.states, 1, skip, args.outs);
      INFO("non-finite gradient in tensor " << bad);
      CHECK_FALSE(r.grads_finite);
      CHECK_FALSE(r.applied);
      for (std::size_t i = 0; i < specs.size(); ++i) CHECK(ts[i].same(before[i]));
    }
    // Finite gradients: the step is applied, bitwise as without the option.
    std::vector<Tensor> with = make(specs, c.state_init), without = make(specs, c.state_init);
    ListArgs a(with, c.states, true, false), b(without, c.states, true, false);
    const StepResult r = c.list(a.params, a.grads, a.states, 1, skip, a.outs);
    CHECK(r.applied);
    CHECK(r.grads_finite);
    c.list(b.params, b.grads, b.states, 1, StepOptions{}, b.outs);
    for (std::size_t i = 0; i < specs.size(); ++i) CHECK(with[i].same(without[i]));
  }
}

TEST_CASE("List steps: every error names the tensor and changes nothing", "[optim][multi]") {
  const std::vector<Spec> specs = {{7, Storage::fp32, DType::f32},
                                   {5, Storage::fp32_copy, DType::bf16},
                                   {6, Storage::remainders, DType::f16}};
  std::vector<Tensor> ts = make(specs, 0.0f);
  const std::vector<Tensor> before = make(specs, 0.0f);
  const auto unchanged = [&] {
    for (std::size_t i = 0; i < ts.size(); ++i)
      if (!ts[i].same(before[i])) return false;
    return true;
  };
  const Adam adam_o{.lr = 0.01};
  const auto adam = [&](ListArgs& a, const StepOptions& e = {}) {
    functional::adam(a.params, a.grads, a.states[0], a.states[1], a.states[2], 1, adam_o, e,
                     a.outs);
  };
  const auto args = [&] { return ListArgs(ts, 2, true, false); };
  const ErrorCode bad = ErrorCode::invalid_argument;

  {  // lists of different lengths
    ListArgs a = args();
    a.grads.pop_back();
    CHECK(rejects([&] { adam(a); }, bad, "Adam: grads has 2 entries but params has 3 tensors"));
    a = args();
    a.states[1].pop_back();
    CHECK(rejects([&] { adam(a); }, bad, "exp_avg_sqs has 2 entries"));
    a = args();
    a.outs.pop_back();
    CHECK(rejects([&] { adam(a); }, bad, "params_out has 2 entries"));
  }
  {  // a tensor's buffers, as the single step checks them, with its index
    ListArgs a = args();
    a.states[0][2] = a.states[0][2].subspan(1);
    CHECK(rejects([&] { adam(a); }, bad, "Adam: tensor 2: exp_avg has 5 elements, params have 6"));
    a = args();
    a.states[1][0] = std::span<float>(static_cast<float*>(nullptr), 7);
    CHECK(rejects([&] { adam(a); }, bad, "Adam: tensor 0: exp_avg_sq is null"));
    a = args();
    a.grads[1] = GradView(ts[1].g.f32.data(), 4, DType::f32);
    CHECK(rejects([&] { adam(a); }, bad, "Adam: tensor 1: grads has 4 elements"));
    a = args();
    a.grads[2] = GradView(ts[2].g.f32.data(), 6, DType::f64);
    CHECK(
        rejects([&] { adam(a); }, ErrorCode::unsupported, "Adam: tensor 2: gradients of type f64"));
    a = args();
    a.outs[2] = ts[1].copy.data();  // a copy beside remainders
    CHECK(rejects([&] { adam(a); }, bad,
                  "Adam: tensor 2: StepOptions::param_out was given with parameter remainders"));
    a = args();
    a.states[2] = {ts[0].states[2], {}, {}};  // amsgrad is off
    CHECK(rejects([&] { adam(a); }, bad,
                  "Adam: tensor 0: max_exp_avg_sq (amsgrad) was given but amsgrad is off"));
    a = args();
    a.params[1] = ParamView(ts[1].p.data(), 5, DType::bf16, {});
    CHECK(rejects([&] { adam(a); }, ErrorCode::unsupported,
                  "Adam: tensor 1: bf16 parameters need their remainders"));
  }
  {  // the list's own options
    ListArgs a = args();
    StepOptions e;
    e.param_out = ts[1].copy.data();
    CHECK(
        rejects([&] { adam(a, e); }, bad, "StepOptions::param_out was given to a step on a list"));
    e = {};
    e.grad_mul = std::numeric_limits<double>::infinity();
    CHECK(rejects([&] { adam(a, e); }, bad, "StepOptions::grad_mul"));
    CHECK(rejects(
        [&] {
          functional::adam(a.params, a.grads, a.states[0], a.states[1], a.states[2], 0, adam_o, {},
                           a.outs);
        },
        bad, "step 0 is not a step count"));
    CHECK(rejects(
        [&] {
          functional::adam(a.params, a.grads, a.states[0], a.states[1], a.states[2], 1,
                           Adam{.lr = -1}, {}, a.outs);
        },
        bad, "Adam: invalid learning rate (lr): -1"));
    // amsgrad needs one max_exp_avg_sq per tensor.
    CHECK(rejects(
        [&] {
          functional::adam(a.params, a.grads, a.states[0], a.states[1], {}, 1,
                           Adam{.amsgrad = true}, {}, a.outs);
        },
        bad, "max_exp_avg_sqs has 0 entries"));
  }
  {  // the other optimizers' state lists
    ListArgs a = ListArgs(ts, 1, true, false);
    CHECK(rejects([&] { functional::sgd(a.params, a.grads, a.states[0], 1, SGD{}, {}, a.outs); },
                  bad, "SGD: tensor 0: momentum_buffer was given but momentum is 0"));
    CHECK(rejects(
        [&] { functional::sgd(a.params, a.grads, {}, 1, SGD{.momentum = 0.9}, {}, a.outs); }, bad,
        "SGD: momentum_buffers has 0 entries"));
    CHECK(rejects(
        [&] { functional::sgd(a.params, a.grads, a.states[0], 1, SGD{.lr = -0.5}, {}, a.outs); },
        bad, "SGD: invalid learning rate"));
    CHECK(rejects(
        [&] {
          functional::rmsprop(a.params, a.grads, a.states[0], a.states[0], {},
                              RMSprop{.centered = false}, {}, a.outs);
        },
        bad, "RMSprop: tensor 0: grad_avg (centered) was given but centered is off"));
    CHECK(rejects([&] { functional::adagrad(a.params, a.grads, {}, 1, Adagrad{}, {}, a.outs); },
                  bad, "Adagrad: state_sums has 0 entries"));
    CHECK(rejects([&] { functional::lion(a.params, a.grads, {}, Lion{}, {}, a.outs); }, bad,
                  "Lion: exp_avgs has 0 entries"));
    ListArgs l = ListArgs(ts, 3, true, false);
    l.states[2][1] = l.states[2][1].subspan(0, 2);
    CHECK(rejects(
        [&] {
          functional::lamb(l.params, l.grads, l.states[0], l.states[1], l.states[2], 1, Lamb{}, {},
                           l.outs);
        },
        bad, "Lamb: tensor 1: update has 2 elements, params have 5"));
  }
  CHECK(unchanged());
}
