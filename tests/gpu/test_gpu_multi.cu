// gpu suite: the functional optimizers on lists of device tensors (the
// multi-tensor CUDA kernels) equal the same lists on the host bitwise, for
// every optimizer; with tensors of awkward sizes, gradient types and
// storages, tensors whose buffers start off a vector boundary (together: the
// vector path from a later head; one alone: the scalar path), more tensors
// than one launch table holds and a tensor of more chunks than one launch
// holds; non-finite gradients are reported; tensors in different memories
// are an error naming them. And non-finite gradients (inf, -inf, NaN, or
// finite ones past the float range after grad_mul) of every type, through
// the single-tensor and the list steps, with and without skip_nonfinite:
// the device call returns the host call's StepResult and leaves the buffers
// as it does (a skipped step writes nothing). The noop flag
// (StepOptions::noop_flag, flag_nonfinite): decided on the device. Skips
// (exit 77) without a device.
#include <cuda_runtime.h>

#include <cstdio>
#include <cstring>
#include <functional>
#include <limits>
#include <memory>
#include <random>
#include <span>
#include <string>
#include <vector>

#include "gpu_test.hpp"
#include "shardopt/shardopt.hpp"

using namespace shardopt;
using functional::GradView;
using functional::ParamView;
using functional::StepOptions;
using functional::StepResult;

using gpu_test::check;
using gpu_test::Mirror;
using gpu_test::uniform;

namespace {

enum class Storage { fp32, fp32_copy, remainders };

// How a tensor's device buffers sit: all at the start of their allocations,
// all one element in (aligned from element 3 on), or the gradients alone one
// element in (no common alignment: scalar steps).
enum class Layout { aligned, shifted, mixed };

struct Tensor {
  std::size_t n;
  Storage storage;
  DType grad_type;
  Mirror<float> p;
  Mirror<bfloat16> hi;
  Mirror<std::uint16_t> rem;
  Mirror<float> g32;
  Mirror<std::uint16_t> g16;
  Mirror<float> s0, s1, s2;
  Mirror<std::uint16_t> copy;

  static std::vector<bfloat16> encode_hi(const std::vector<float>& m) {
    std::vector<bfloat16> hi(m.size());
    std::vector<std::uint16_t> rem(m.size());
    functional::encode_param_remainders(m, hi, rem);
    return hi;
  }
  static std::vector<std::uint16_t> encode_rem(const std::vector<float>& m) {
    std::vector<bfloat16> hi(m.size());
    std::vector<std::uint16_t> rem(m.size());
    functional::encode_param_remainders(m, hi, rem);
    return rem;
  }

  Tensor(std::size_t size, Storage st, DType gt, Layout layout, float init,
         const std::vector<float>& master, const std::vector<float>& grad)
      : n(size),
        storage(st),
        grad_type(gt),
        p(master, layout == Layout::shifted),
        hi(encode_hi(master), layout == Layout::shifted),
        rem(encode_rem(master), layout == Layout::shifted),
        g32(grad, layout != Layout::aligned),
        g16(gpu_test::to_16(grad, gt), layout != Layout::aligned),
        s0(std::vector<float>(size, init), layout == Layout::shifted),
        s1(std::vector<float>(size, init), layout == Layout::shifted),
        s2(std::vector<float>(size, init), layout == Layout::shifted),
        copy(std::vector<std::uint16_t>(size, 0), layout == Layout::shifted) {}

  ParamView params(bool dev) {
    if (storage == Storage::remainders)
      return ParamView(std::span<bfloat16>(hi.at(dev), n),
                       std::span<std::uint16_t>(rem.at(dev), n));
    return ParamView(p.at(dev), n);
  }
  GradView grads(bool dev) {
    return grad_type == DType::f32 ? GradView(g32.at(dev), n, DType::f32)
                                   : GradView(g16.at(dev), n, grad_type);
  }
  std::span<float> state(int k, bool dev) {
    Mirror<float>& s = k == 0 ? s0 : k == 1 ? s1 : s2;
    return {s.at(dev), n};
  }
  void* param_out(bool dev) { return storage == Storage::fp32_copy ? copy.at(dev) : nullptr; }
  // The device buffers equal the host ones bitwise.
  bool same() const {
    return p.same() && hi.same() && rem.same() && s0.same() && s1.same() && s2.same() &&
           copy.same();
  }
  // The device buffers hold the host ones' values, a NaN equal to any NaN
  // (gpu_test::same_values): after non-finite gradients.
  bool same_values(DType copy_type) const {
    return p.same_values(DType::f32) && gpu_test::same_master(hi, rem) &&
           s0.same_values(DType::f32) && s1.same_values(DType::f32) && s2.same_values(DType::f32) &&
           copy.same_values(copy_type);
  }
  // The bytes of every host buffer but the gradients, to tell whether a step
  // wrote any.
  std::vector<unsigned char> host_bytes() const {
    std::vector<unsigned char> b;
    const auto add = [&b](const auto& m) {
      const auto* first = reinterpret_cast<const unsigned char*>(m.host.data());
      b.insert(b.end(), first, first + m.host.size() * sizeof(m.host[0]));
    };
    add(p);
    add(hi);
    add(rem);
    add(s0);
    add(s1);
    add(s2);
    add(copy);
    return b;
  }
};

using Lists = std::vector<std::vector<std::span<float>>>;
using ListStep = std::function<StepResult(std::span<const ParamView>, std::span<const GradView>,
                                          Lists&, const StepOptions&, std::span<void* const>)>;
using SingleStep = std::function<StepResult(ParamView, GradView, std::span<float>, std::span<float>,
                                            std::span<float>, const StepOptions&)>;

// An optimizer with its hyper-parameters, as the list step and as the
// single-tensor step, with up to three state arrays (lists).
struct Case {
  std::string name;
  int states;
  float init;
  ListStep list;
  SingleStep single;
};

// A case from one call f(params, grads, state0, state1, state2, extra,
// params_out...) that serves both forms.
template <class F>
Case make_case(std::string name, int states, float init, F f) {
  using StateList = std::span<const std::span<float>>;
  return {std::move(name), states, init,
          [f](std::span<const ParamView> ps, std::span<const GradView> gs, Lists& l,
              const StepOptions& e, std::span<void* const> o) {
            return f(ps, gs, StateList(l[0]), StateList(l[1]), StateList(l[2]), e, o);
          },
          [f](ParamView p, GradView g, std::span<float> a, std::span<float> b, std::span<float> c,
              const StepOptions& e) { return f(p, g, a, b, c, e); }};
}

std::vector<Case> cases(std::int64_t t) {
  return {
      make_case("Adam amsgrad", 3, 0.0f,
                [t](auto ps, auto gs, auto a, auto b, auto c, const StepOptions& e, auto... o) {
                  return functional::adam(ps, gs, a, b, c, t,
                                          Adam{.lr = 0.01, .weight_decay = 0.1, .amsgrad = true}, e,
                                          o...);
                }),
      make_case("AdamW", 2, 0.0f,
                [t](auto ps, auto gs, auto a, auto b, auto, const StepOptions& e, auto... o) {
                  return functional::adamw(ps, gs, a, b, {}, t, AdamW{.lr = 0.01}, e, o...);
                }),
      make_case("SGD nesterov", 1, 0.5f,
                [t](auto ps, auto gs, auto a, auto, auto, const StepOptions& e, auto... o) {
                  return functional::sgd(
                      ps, gs, a, t, SGD{.lr = 0.1, .momentum = 0.9, .nesterov = true}, e, o...);
                }),
      make_case("Adagrad", 1, 0.1f,
                [t](auto ps, auto gs, auto a, auto, auto, const StepOptions& e, auto... o) {
                  return functional::adagrad(ps, gs, a, t,
                                             Adagrad{.initial_accumulator_value = 0.1}, e, o...);
                }),
      make_case("RMSprop centered momentum", 3, 0.0f,
                [](auto ps, auto gs, auto a, auto b, auto c, const StepOptions& e, auto... o) {
                  return functional::rmsprop(ps, gs, a, b, c,
                                             RMSprop{.momentum = 0.9, .centered = true}, e, o...);
                }),
      make_case("Lion", 1, 0.0f,
                [](auto ps, auto gs, auto a, auto, auto, const StepOptions& e, auto... o) {
                  return functional::lion(ps, gs, a, Lion{.weight_decay = 0.1}, e, o...);
                }),
      make_case("Lamb", 3, 0.0f,
                [t](auto ps, auto gs, auto a, auto b, auto c, const StepOptions& e, auto... o) {
                  return functional::lamb(ps, gs, a, b, c, t, Lamb{.lr = 0.01}, e, o...);
                }),
  };
}

struct Spec {
  std::size_t n;
  Storage storage;
  DType grad_type;
  Layout layout;
};

StepResult run(const Case& c, std::vector<Tensor*>& tensors, bool dev, const StepOptions& extra) {
  std::vector<ParamView> params;
  std::vector<GradView> grads;
  Lists states(3);
  std::vector<void*> outs;
  for (Tensor* t : tensors) {
    params.push_back(t->params(dev));
    grads.push_back(t->grads(dev));
    for (int k = 0; k < c.states; ++k) states[k].push_back(t->state(k, dev));
    outs.push_back(t->param_out(dev));
  }
  return c.list(params, grads, states, extra, outs);
}

// The single-tensor step of case c on t, on the host or on the device.
StepResult run_single(const Case& c, Tensor& t, bool dev, StepOptions extra) {
  extra.param_out = t.param_out(dev);
  const auto state = [&](int k) { return k < c.states ? t.state(k, dev) : std::span<float>(); };
  return c.single(t.params(dev), t.grads(dev), state(0), state(1), state(2), extra);
}

// Three steps of every case on the list, on the host and on the device;
// the device buffers must end as the host ones, bitwise (a NaN equal to any
// NaN with an inf gradient, which makes NaNs).
void compare(const std::string& what, const std::vector<Spec>& specs, DType copy_type,
             std::size_t inf_at = SIZE_MAX) {
  std::mt19937 rng(7);
  const std::vector<Case> first = cases(1);
  for (std::size_t i = 0; i < first.size(); ++i) {
    std::vector<std::unique_ptr<Tensor>> owned;
    std::vector<Tensor*> tensors;
    for (const Spec& s : specs) {
      std::vector<float> grad = uniform(s.n, rng, -1, 1);
      if (tensors.size() == inf_at) grad.at(s.n / 2) = std::numeric_limits<float>::infinity();
      owned.push_back(std::make_unique<Tensor>(s.n, s.storage, s.grad_type, s.layout, first[i].init,
                                               uniform(s.n, rng, -1, 1), grad));
      tensors.push_back(owned.back().get());
    }
    StepOptions extra;
    extra.grad_mul = 0.5;
    extra.param_out_dtype = copy_type;
    bool agree = true;
    for (std::int64_t t = 1; t <= 3; ++t) {
      const Case c = cases(t)[i];
      const StepResult host = run(c, tensors, false, extra);
      const StepResult dev = run(c, tensors, true, extra);
      agree = agree && host.grads_finite == dev.grads_finite;
      if (inf_at != SIZE_MAX) agree = agree && !dev.grads_finite;
    }
    for (Tensor* t : tensors)
      agree = agree && (inf_at == SIZE_MAX ? t->same() : t->same_values(copy_type));
    check(agree, first[i].name + ": " + what);
  }
}

// A gradient value, and the grad_mul of the step that reads it.
struct BadValue {
  const char* name;
  float value;  // stored at the chosen element; NaN: none (all finite)
  double grad_mul;
  bool finite;  // whether the gradients are finite after grad_mul
};

// Values of gradients of type t: inf, -inf, NaN, one finite value that
// grad_mul takes past the float range, and none (every gradient finite).
std::vector<BadValue> bad_values(DType t) {
  constexpr float kInf = std::numeric_limits<float>::infinity();
  constexpr float kNan = std::numeric_limits<float>::quiet_NaN();
  // f32 and bf16 hold 3e38, which times 4 is past 3.4e38; f16 holds at most
  // 65504, which times 1e35 is.
  const float big = t == DType::f16 ? 6e4f : 3e38f;
  const double big_mul = t == DType::f16 ? 1e35 : 4.0;
  return {{"inf", kInf, 1.0, false},
          {"-inf", -kInf, 1.0, false},
          {"nan", kNan, 1.0, false},
          {"finite, past the float range after grad_mul", big, big_mul, false},
          {"all finite", kNan, 1.0, true}};
}

// Non-finite gradients on the device, each optimizer, in both forms: the
// single-tensor step on one tensor of 65537 elements and the list step on
// three tensors (1000, 65537 and 7 elements), for f32, bf16 and f16
// gradients holding each bad value at the first, a middle or the last
// element (of the first, second or third tensor of a list). The same call
// on host copies of the buffers is the reference: the device call must
// return its StepResult (grads_finite, applied), and leave the buffers as it
// leaves them: applied, the same values (NaNs of any payload alike); with
// StepOptions::skip_nonfinite and a non-finite gradient, nothing written,
// bitwise, on either side.
void nonfinite() {
  const std::size_t single_n = 65537;
  const std::vector<std::size_t> list_n = {1000, 65537, 7};
  int combination = 0;
  for (DType gt : {DType::f32, DType::bf16, DType::f16}) {
    for (const BadValue& bad : bad_values(gt)) {
      for (int place = 0; place < (bad.finite ? 1 : 3); ++place) {
        for (bool skip : {false, true}) {
          for (bool list : {false, true}) {
            const std::vector<Case> all = cases(1);
            for (const Case& c : all) {
              ++combination;
              const DType copy_type = place % 2 ? DType::f16 : DType::bf16;
              std::mt19937 rng(static_cast<std::uint32_t>(combination));
              std::vector<std::unique_ptr<Tensor>> owned;
              std::vector<Tensor*> tensors;
              const std::vector<std::size_t> sizes =
                  list ? list_n : std::vector<std::size_t>{single_n};
              for (std::size_t k = 0; k < sizes.size(); ++k) {
                const std::size_t n = sizes[k];
                std::vector<float> grad = uniform(n, rng, -1, 1);
                const std::size_t bad_tensor = list ? static_cast<std::size_t>(place) : 0;
                if (!bad.finite && k == bad_tensor)
                  grad[place == 0 ? 0 : place == 1 ? n / 2 : n - 1] = bad.value;
                const auto st = static_cast<Storage>((combination + static_cast<int>(k)) % 3);
                const auto layout =
                    static_cast<Layout>((combination / 3 + static_cast<int>(k)) % 3);
                owned.push_back(std::make_unique<Tensor>(n, st, gt, layout, c.init,
                                                         uniform(n, rng, -1, 1), grad));
                tensors.push_back(owned.back().get());
              }
              std::vector<std::vector<unsigned char>> before;
              for (const Tensor* t : tensors) before.push_back(t->host_bytes());

              StepOptions extra;
              extra.grad_mul = bad.grad_mul;
              extra.skip_nonfinite = skip;
              extra.param_out_dtype = copy_type;
              const auto step = [&](bool dev) {
                return list ? run(c, tensors, dev, extra) : run_single(c, *tensors[0], dev, extra);
              };
              const StepResult host = step(false);
              const StepResult dev = step(true);

              const std::string where = c.name + (list ? ", list" : ", single tensor") +
                                        ", grads " + dtype_name(gt) + ", " + bad.name +
                                        (bad.finite ? "" : " at place " + std::to_string(place)) +
                                        (skip ? ", skip_nonfinite" : "");
              const bool skipped = skip && !bad.finite;
              check(host.grads_finite == bad.finite && host.applied == !skipped,
                    where + ": the host step returns grads_finite " + std::to_string(bad.finite) +
                        ", applied " + std::to_string(!skipped) + "; it returned " +
                        std::to_string(host.grads_finite) + ", " + std::to_string(host.applied));
              check(dev.grads_finite == host.grads_finite && dev.applied == host.applied,
                    where + ": the device step returns grads_finite " +
                        std::to_string(dev.grads_finite) + ", applied " +
                        std::to_string(dev.applied) + "; the host step " +
                        std::to_string(host.grads_finite) + ", " + std::to_string(host.applied));
              bool buffers = true;
              for (std::size_t k = 0; k < tensors.size(); ++k) {
                if (skipped) {
                  buffers = buffers && tensors[k]->host_bytes() == before[k] && tensors[k]->same();
                } else {
                  buffers = buffers && tensors[k]->same_values(copy_type);
                }
              }
              check(buffers, where + (skipped ? ": a buffer was written"
                                              : ": the device buffers differ from the host's"));
            }
          }
        }
      }
    }
  }
}

}  // namespace

// The noop flag: flag_nonfinite() raises it on the device, and an Adam list
// step given it (enqueued, no result read) equals the host step bitwise
// while the flag is down and writes nothing once a NaN has raised it.
void noop_flag() {
  std::mt19937 r(5);
  const std::vector<std::size_t> sizes = {3, 4097, 300001};
  std::vector<std::unique_ptr<Mirror<float>>> p, g, m, v;
  for (std::size_t n : sizes) {
    p.push_back(std::make_unique<Mirror<float>>(uniform(n, r, -1, 1)));
    g.push_back(std::make_unique<Mirror<float>>(uniform(n, r, -1, 1)));
    m.push_back(std::make_unique<Mirror<float>>(uniform(n, r, -0.1f, 0.1f)));
    v.push_back(std::make_unique<Mirror<float>>(uniform(n, r, 0, 0.1f)));
  }
  std::uint32_t* flag = nullptr;
  CUDA_CHECK(cudaMalloc(&flag, 4));
  const auto step = [&](bool device, const StepOptions& so) {
    std::vector<ParamView> ps;
    std::vector<GradView> gs;
    std::vector<std::span<float>> ms, vs;
    for (std::size_t i = 0; i < sizes.size(); ++i) {
      ps.emplace_back(p[i]->at(device), sizes[i]);
      gs.emplace_back(g[i]->at(device), sizes[i], DType::f32);
      ms.emplace_back(m[i]->at(device), sizes[i]);
      vs.emplace_back(v[i]->at(device), sizes[i]);
    }
    const std::vector<std::span<const std::span<float>>> states = {ms, vs, {}};
    return functional::step(std::span<const ParamView>(ps), std::span<const GradView>(gs),
                            std::span<const std::span<const std::span<float>>>(states), 2,
                            Adam{.lr = 0.01}, so);
  };
  const auto raise = [&] {
    CUDA_CHECK(cudaMemset(flag, 0, 4));
    for (std::size_t i = 0; i < sizes.size(); ++i)
      functional::flag_nonfinite(GradView(g[i]->dev, sizes[i], DType::f32), flag, 0.5);
  };
  const auto all_same = [&] {
    bool ok = true;
    for (std::size_t i = 0; i < sizes.size(); ++i)
      ok = ok && p[i]->same() && m[i]->same() && v[i]->same();
    return ok;
  };
  raise();
  step(true, {.grad_mul = 0.5, .noop_flag = flag});
  step(false, {.grad_mul = 0.5});
  CUDA_CHECK(cudaDeviceSynchronize());
  check(all_same(), "noop flag down: the enqueued list step equals the host step bitwise");
  g[1]->host[4000] = std::numeric_limits<float>::quiet_NaN();
  g[1]->upload();
  raise();
  step(true, {.grad_mul = 0.5, .noop_flag = flag});
  std::uint32_t raised = 0;
  CUDA_CHECK(cudaMemcpy(&raised, flag, 4, cudaMemcpyDeviceToHost));
  check(raised == 1 && all_same(), "a NaN raises the noop flag, and the step writes nothing");
  CUDA_CHECK(cudaFree(flag));
}

int main() {
  if (gpu_test::no_device()) return gpu_test::kSkip;
  noop_flag();
  // Awkward sizes, every gradient type and storage, each layout.
  const std::vector<std::size_t> sizes = {0, 1, 7, 1000, 65537, 200003};
  std::vector<Spec> mixed;
  int k = 0;
  for (std::size_t n : sizes)
    for (Layout layout : {Layout::aligned, Layout::shifted, Layout::mixed}) {
      const Storage st = static_cast<Storage>(k % 3);
      const DType gt = k % 4 == 0 ? DType::f32 : k % 4 == 1 ? DType::bf16 : DType::f16;
      mixed.push_back({n, st, gt, layout});
      ++k;
    }
  compare("mixed list, bf16 copies", mixed, DType::bf16);
  compare("mixed list, f16 copies", mixed, DType::f16);
  // More tensors than one launch table holds (a table holds a few dozen).
  std::vector<Spec> many;
  std::mt19937 rng(11);
  for (int i = 0; i < 150; ++i)
    many.push_back({std::uniform_int_distribution<std::size_t>(0, 3000)(rng),
                    i % 5 == 0 ? Storage::fp32_copy : Storage::fp32,
                    i % 3 == 0 ? DType::bf16 : DType::f32,
                    i % 7 == 0 ? Layout::mixed
                    : i % 2    ? Layout::shifted
                               : Layout::aligned});
  compare("150 tensors", many, DType::bf16);
  // A tensor of more chunks than one launch holds (65536 elements a chunk,
  // a few hundred chunks a launch).
  compare("300 chunks",
          {{std::size_t{300} << 16, Storage::fp32, DType::f32, Layout::shifted},
           {5, Storage::fp32, DType::bf16, Layout::aligned}},
          DType::bf16);
  // Non-finite gradients in one tensor: reported, and the step applied as on the host.
  compare("an inf gradient in tensor 11 (1000 elements, remainders, f16 gradients)", mixed,
          DType::bf16, 11);
  // Non-finite gradients in every gradient type, in both forms, with and
  // without skip_nonfinite: the host call's result and buffers.
  nonfinite();

  // Tensors in different memories: an error naming them, nothing changed.
  {
    std::mt19937 r(3);
    Tensor a(100, Storage::fp32, DType::f32, Layout::aligned, 0.0f, uniform(100, r, -1, 1),
             uniform(100, r, -1, 1));
    Tensor b(100, Storage::fp32, DType::f32, Layout::aligned, 0.0f, uniform(100, r, -1, 1),
             uniform(100, r, -1, 1));
    const std::vector<ParamView> ps = {a.params(true), b.params(false)};
    const std::vector<GradView> gs = {a.grads(true), b.grads(false)};
    const std::vector<std::span<float>> m = {a.state(0, true), b.state(0, false)};
    bool named = false;
    try {
      functional::lion(ps, gs, m, Lion{});
    } catch (const Error& e) {
      named = e.code() == ErrorCode::wrong_device &&
              std::string(e.message()).find("tensor 1 is in host") != std::string::npos &&
              std::string(e.message()).find("but tensor 0 is in") != std::string::npos;
      if (!named) std::printf("message: %s\n", e.what());
    }
    check(named, "tensors in different memories: WrongDevice naming them");
    check(a.same() && b.same(), "tensors in different memories: nothing changed");
  }
  return gpu_test::finish("gpu multi-tensor");
}
