// gpu suite: the functional optimizers on lists of device tensors (the
// multi-tensor CUDA kernels) equal the same lists on the host bitwise, for
// every optimizer; with tensors of awkward sizes, gradient types and
// storages, tensors whose buffers start off a vector boundary (together: the
// vector path from a later head; one alone: the scalar path), more tensors
// than one launch table holds and a tensor of more chunks than one launch
// holds; non-finite gradients are reported; tensors in different memories
// are an error naming them. Skips (exit 77) without a device.
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
};

using Lists = std::vector<std::vector<std::span<float>>>;
using ListStep = std::function<StepResult(std::span<const ParamView>, std::span<const GradView>,
                                          Lists&, const StepOptions&, std::span<void* const>)>;

struct Case {
  std::string name;
  int states;
  float init;
  ListStep step;
};

std::vector<Case> cases(std::int64_t t) {
  return {
      {"Adam amsgrad", 3, 0.0f,
       [t](auto ps, auto gs, Lists& l, const StepOptions& e, std::span<void* const> o) {
         return functional::adam(ps, gs, l[0], l[1], l[2], t,
                                 Adam{.lr = 0.01, .weight_decay = 0.1, .amsgrad = true}, e, o);
       }},
      {"AdamW", 2, 0.0f,
       [t](auto ps, auto gs, Lists& l, const StepOptions& e, std::span<void* const> o) {
         return functional::adamw(ps, gs, l[0], l[1], {}, t, AdamW{.lr = 0.01}, e, o);
       }},
      {"SGD nesterov", 1, 0.5f,
       [t](auto ps, auto gs, Lists& l, const StepOptions& e, std::span<void* const> o) {
         return functional::sgd(ps, gs, l[0], t, SGD{.lr = 0.1, .momentum = 0.9, .nesterov = true},
                                e, o);
       }},
      {"Adagrad", 1, 0.1f,
       [t](auto ps, auto gs, Lists& l, const StepOptions& e, std::span<void* const> o) {
         return functional::adagrad(ps, gs, l[0], t, Adagrad{.initial_accumulator_value = 0.1}, e,
                                    o);
       }},
      {"RMSprop centered momentum", 3, 0.0f,
       [](auto ps, auto gs, Lists& l, const StepOptions& e, std::span<void* const> o) {
         return functional::rmsprop(ps, gs, l[0], l[1], l[2],
                                    RMSprop{.momentum = 0.9, .centered = true}, e, o);
       }},
      {"Lion", 1, 0.0f,
       [](auto ps, auto gs, Lists& l, const StepOptions& e, std::span<void* const> o) {
         return functional::lion(ps, gs, l[0], Lion{.weight_decay = 0.1}, e, o);
       }},
      {"Lamb", 3, 0.0f,
       [t](auto ps, auto gs, Lists& l, const StepOptions& e, std::span<void* const> o) {
         return functional::lamb(ps, gs, l[0], l[1], l[2], t, Lamb{.lr = 0.01}, e, o);
       }},
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
  return c.step(params, grads, states, extra, outs);
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

}  // namespace

int main() {
  if (gpu_test::no_device()) return gpu_test::kSkip;
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
