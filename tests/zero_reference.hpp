// Helpers of the ZeRO engine tests, the data side: the model's precisions,
// element access in every stored type, layouts, gradients that every rank
// can regenerate for every other rank, one rank's model buffers, and the
// single-process reference (the functional optimizers on the summed
// gradients). zero_helpers.hpp adds the comparisons and the runner.
//
// Exact data: every gradient is a small integer times 2^-4, so the sum over
// up to 4 ranks (and a few micro-batches) is exact in f32, bf16 and f16, in
// any order. The reduced gradients the engine sees are then the reference's
// bit for bit, and the engine, which calls the same kernels with
// grad_mul = 1/N, must give the reference's parameters bit for bit.
#pragma once

#include <mpi.h>

#include <algorithm>
#include <catch2/catch.hpp>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <span>
#include <sstream>
#include <string>
#include <type_traits>
#include <utility>
#include <variant>
#include <vector>

#include "mpi_test.hpp"
#if SHARDOPT_TEST_DEVICE
#include "simdevice/sim_device.hpp"
#endif
#include "shardopt/half.hpp"
#include "shardopt/optim.hpp"
#include "shardopt/types.hpp"
#include "shardopt/zero.hpp"

namespace shardopt::test::zero {

// ------------------------------------------------------------- precision

// How the model stores its parameters, and where the fp32 master lives.
enum class Precision {
  f32,       // fp32 parameters, which are the master weights
  bf16,      // bf16 parameters, fp32 master
  f16,       // f16 parameters, fp32 master
  bf16_rem,  // bf16 parameters with remainders (ZeroOptions::param_remainders)
};

inline const std::vector<Precision>& all_precisions() {
  static const std::vector<Precision> p = {Precision::f32, Precision::bf16, Precision::f16,
                                           Precision::bf16_rem};
  return p;
}

inline DType param_dtype(Precision p) {
  switch (p) {
    case Precision::f32:
      return DType::f32;
    case Precision::f16:
      return DType::f16;
    case Precision::bf16:
    case Precision::bf16_rem:
      return DType::bf16;
  }
  return DType::f32;
}

inline const char* precision_name(Precision p) {
  switch (p) {
    case Precision::f32:
      return "f32";
    case Precision::bf16:
      return "bf16+fp32 master";
    case Precision::f16:
      return "f16+fp32 master";
    case Precision::bf16_rem:
      return "bf16+remainders";
  }
  return "?";
}

// ------------------------------------------------------ element access

inline float round_to(DType t, float v) {
  if (t == DType::bf16) return to_float(bf16_from_float(v));
  if (t == DType::f16) return to_float(f16_from_float(v));
  return v;
}

inline float load(DType t, const void* base, std::size_t j) {
  if (t == DType::f32) {
    float v;
    std::memcpy(&v, static_cast<const char*>(base) + 4 * j, 4);
    return v;
  }
  std::uint16_t b;
  std::memcpy(&b, static_cast<const char*>(base) + 2 * j, 2);
  return t == DType::bf16 ? to_float(bfloat16{b}) : to_float(float16{b});
}

inline void store(DType t, void* base, std::size_t j, float v) {
  if (t == DType::f32) {
    std::memcpy(static_cast<char*>(base) + 4 * j, &v, 4);
    return;
  }
  const std::uint16_t b = t == DType::bf16 ? bf16_from_float(v).bits : f16_from_float(v).bits;
  std::memcpy(static_cast<char*>(base) + 2 * j, &b, 2);
}

// The stored bits of element j: 32 for f32, 16 for bf16 and f16.
inline std::uint32_t load_bits(DType t, const void* base, std::size_t j) {
  if (t == DType::f32) {
    std::uint32_t u;
    std::memcpy(&u, static_cast<const char*>(base) + 4 * j, 4);
    return u;
  }
  std::uint16_t b;
  std::memcpy(&b, static_cast<const char*>(base) + 2 * j, 2);
  return b;
}

inline std::uint32_t float_bits(float x) {
  std::uint32_t u;
  std::memcpy(&u, &x, 4);
  return u;
}

// The distance between v and the next 16-bit value of type t (0 for f32):
// what a parameter copy may differ by when its master is within tolerance.
inline float ulp16(DType t, float v) {
  if (t == DType::f32) return 0.0f;
  const float a = std::max(std::fabs(v), t == DType::f16 ? 0x1p-14f : 0x1p-126f);
  int e = 0;
  std::frexp(a, &e);
  return std::ldexp(1.0f, e - (t == DType::bf16 ? 8 : 11));
}

// --------------------------------------------------------------- layout

// The parameters every rank registers (names, sizes, groups).
struct Layout {
  std::vector<std::string> names;
  std::vector<std::size_t> sizes;
  std::vector<int> groups;  // empty: every parameter in group 0

  std::size_t size() const { return sizes.size(); }
  int group(std::size_t i) const { return groups.empty() ? 0 : groups[i]; }
  std::size_t total() const {
    std::size_t t = 0;
    for (std::size_t s : sizes) t += s;
    return t;
  }
  std::size_t largest() const {
    std::size_t m = 0;
    for (std::size_t s : sizes) m = std::max(m, s);
    return m;
  }
};

inline Layout make_layout(const std::vector<std::size_t>& sizes, std::vector<int> groups = {}) {
  Layout l;
  for (std::size_t i = 0; i < sizes.size(); ++i) {
    l.names.push_back("layer" + std::to_string(i) + (i % 2 == 0 ? ".weight" : ".bias"));
  }
  l.sizes = sizes;
  l.groups = std::move(groups);
  return l;
}

// ------------------------------------------------------------------ data

enum class GradKind {
  exact,   // small integers times 2^-4: sums are exact in every type and order
  random,  // uniform in [-1, 1), rounded to the gradient type
};

inline float unit_from_hash(std::uint64_t h) {
  return static_cast<float>(h >> 40) * 0x1p-23f - 1.0f;  // 24 bits: exact, in [-1, 1)
}

// Rank `rank`'s gradient of element j of parameter `param` in micro-batch
// `batch`, before rounding to the gradient type.
inline float grad_value(GradKind kind, std::uint64_t key, std::int64_t batch, int rank,
                        std::size_t param, std::size_t j) {
  const std::uint64_t h =
      mix64(data_key(key, static_cast<std::uint64_t>(batch), static_cast<std::uint64_t>(rank)) ^
            mix64((static_cast<std::uint64_t>(param) << 32) ^ j));
  if (kind == GradKind::exact) return static_cast<float>(static_cast<int>(h % 17) - 8) * 0.0625f;
  return unit_from_hash(h);
}

// What rank `rank` stores in its gradient buffer (times a loss scale).
inline float stored_grad(DType t, GradKind kind, std::uint64_t key, std::int64_t batch, int rank,
                         std::size_t param, std::size_t j, float scale = 1.0f) {
  return round_to(t, grad_value(kind, key, batch, rank, param, j) * scale);
}

// The initial value of element j of parameter i, representable in t.
inline float initial_param(DType t, std::uint64_t key, std::size_t i, std::size_t j) {
  return round_to(t, unit_from_hash(mix64(data_key(key ^ 0x9a7a, i, j))));
}

using Grads = std::vector<std::vector<float>>;

// The sum over `ranks` ranks of their gradients (of type t) of micro-batch
// `batch`, as a reduction in type `combine` computes it adding the ranks in
// order (rounded to `combine` after each addition; t unless the reduction
// is in fp32). Exact data: the sum itself, in any order.
inline Grads reduced_grads(const Layout& layout, DType t, GradKind kind, std::uint64_t key,
                           std::int64_t batch, int ranks, float scale = 1.0f,
                           std::optional<DType> combine = std::nullopt) {
  const DType c = combine.value_or(t);
  Grads g(layout.size());
  for (std::size_t i = 0; i < layout.size(); ++i) {
    g[i].resize(layout.sizes[i]);
    for (std::size_t j = 0; j < layout.sizes[i]; ++j) {
      float s = stored_grad(t, kind, key, batch, 0, i, j, scale);
      for (int r = 1; r < ranks; ++r)
        s = round_to(c, s + stored_grad(t, kind, key, batch, r, i, j, scale));
      g[i][j] = s;
    }
  }
  return g;
}

inline void add_into(Grads& acc, const Grads& g) {
  if (acc.empty()) {
    acc = g;
    return;
  }
  for (std::size_t i = 0; i < acc.size(); ++i)
    for (std::size_t j = 0; j < acc[i].size(); ++j) acc[i][j] += g[i][j];
}

// Writes this rank's gradient of parameter i into `buf` (numel elements of
// t), replacing or adding to what is there (the sum rounded to t).
inline void fill_grad(void* buf, DType t, std::size_t numel, GradKind kind, std::uint64_t key,
                      std::int64_t batch, int rank, std::size_t i, bool add, float scale = 1.0f) {
  for (std::size_t j = 0; j < numel; ++j) {
    const float g = stored_grad(t, kind, key, batch, rank, i, j, scale);
    store(t, buf, j, add ? load(t, buf, j) + g : g);
  }
}

// ----------------------------------------------------------------- model

// One rank's parameter and gradient buffers: one allocation per parameter,
// or one for all of them (consecutive, in registration order). Gradients
// are left to the optimizer (Param::grad null) when `owned_grads`.
class Model {
 public:
  Model(const Layout& layout, DType dtype, bool contiguous, bool owned_grads, std::uint64_t key)
      : layout_(layout), dtype_(dtype), owned_(owned_grads) {
    const std::size_t es = dtype_size(dtype);
    const std::size_t n = layout.size();
    pptr_.resize(n, nullptr);
    gptr_.resize(n, nullptr);
    if (contiguous) {
      pbuf_.emplace_back(layout.total() * es);
      gbuf_.emplace_back(layout.total() * es);
      std::size_t off = 0;
      for (std::size_t i = 0; i < n; ++i) {
        pptr_[i] = pbuf_[0].data() + off * es;
        gptr_[i] = gbuf_[0].data() + off * es;
        off += layout.sizes[i];
      }
    } else {
      for (std::size_t i = 0; i < n; ++i) {
        pbuf_.emplace_back(layout.sizes[i] * es);
        gbuf_.emplace_back(layout.sizes[i] * es);
        pptr_[i] = pbuf_.back().data();
        gptr_[i] = gbuf_.back().data();
      }
    }
    for (std::size_t i = 0; i < n; ++i)
      for (std::size_t j = 0; j < layout.sizes[i]; ++j)
        store(dtype, pptr_[i], j, initial_param(dtype, key, i, j));
#if SHARDOPT_TEST_DEVICE
    // The optimizer gets device copies (one allocation each, or one for all
    // when contiguous); the host buffers mirror them for the test.
    dptr_.resize(n, nullptr);
    dgrad_.resize(n, nullptr);
    const auto alloc = [&](std::size_t bytes) {
      void* d = shardopt::sim::runtime().allocate(bytes == 0 ? 1 : bytes, "a test buffer");
      dbuf_.push_back(d);
      return static_cast<std::byte*>(d);
    };
    if (contiguous) {
      std::byte* p = alloc(layout.total() * es);
      std::byte* g = alloc(layout.total() * es);
      for (std::size_t i = 0; i < n; ++i) {
        dptr_[i] = p + (pptr_[i] - pptr_[0]);
        dgrad_[i] = g + (gptr_[i] - gptr_[0]);
      }
    } else {
      for (std::size_t i = 0; i < n; ++i) {
        dptr_[i] = alloc(layout.sizes[i] * es);
        dgrad_[i] = alloc(layout.sizes[i] * es);
      }
    }
    for (std::size_t i = 0; i < n; ++i) upload(dptr_[i], pptr_[i], layout.sizes[i] * es);
#endif
  }
  Model(const Model&) = delete;
  Model& operator=(const Model&) = delete;
#if SHARDOPT_TEST_DEVICE
  ~Model() {
    for (void* d : dbuf_) shardopt::sim::runtime().release(d);
  }
  static constexpr bool on_device = true;
  // Host -> device, in order on the default stream (the optimizer's).
  static void upload(void* dst, const void* src, std::size_t bytes) {
    shardopt::sim::runtime().copy(dst, src, bytes, nullptr);
  }
  // Any memory -> host memory, complete on return.
  static void download(void* dst, const void* src, std::size_t bytes) {
    shardopt::sim::runtime().copy(dst, src, bytes, nullptr);
  }
  // The device parameters into the host mirror.
  void pull() {
    const std::size_t es = dtype_size(dtype_);
    for (std::size_t i = 0; i < layout_.size(); ++i)
      shardopt::sim::runtime().copy(pptr_[i], dptr_[i], layout_.sizes[i] * es, nullptr);
  }
  // The host mirror of gradient i (the test writes it, then uploads).
  void* grad_host(std::size_t i) { return gptr_[i]; }
  // The host mirror of the parameters (changed by the test) to the device.
  void push() {
    const std::size_t es = dtype_size(dtype_);
    for (std::size_t i = 0; i < layout_.size(); ++i)
      upload(dptr_[i], pptr_[i], layout_.sizes[i] * es);
  }
#else
  static constexpr bool on_device = false;
  static void upload(void*, const void*, std::size_t) {}
  static void download(void* dst, const void* src, std::size_t bytes) {
    if (bytes > 0) std::memcpy(dst, src, bytes);
  }
  void pull() {}
  void* grad_host(std::size_t i) { return gptr_[i]; }
  void push() {}
#endif

  const Layout& layout() const { return layout_; }
  DType dtype() const { return dtype_; }
  bool owned_grads() const { return owned_; }

  std::vector<Param> params() {
    std::vector<Param> p;
    for (std::size_t i = 0; i < layout_.size(); ++i) {
      p.push_back(Param{.name = layout_.names[i],
                        .data = on_device ? dptr_[i] : pptr_[i],
                        .numel = layout_.sizes[i],
                        .dtype = dtype_,
                        .grad = owned_ ? nullptr : (on_device ? dgrad_[i] : gptr_[i]),
                        .group = layout_.group(i)});
    }
    return p;
  }
  void* param_data(std::size_t i) { return pptr_[i]; }
  // The registered gradient buffer (on the device in a device run); null
  // when the optimizer owns it.
  void* grad_data(std::size_t i) { return owned_ ? nullptr : (on_device ? dgrad_[i] : gptr_[i]); }
  float param(std::size_t i, std::size_t j) const { return load(dtype_, pptr_[i], j); }
  std::uint32_t param_bits(std::size_t i, std::size_t j) const {
    return load_bits(dtype_, pptr_[i], j);
  }
  std::vector<std::uint32_t> all_bits(std::size_t i) const {
    std::vector<std::uint32_t> b(layout_.sizes[i]);
    for (std::size_t j = 0; j < b.size(); ++j) b[j] = param_bits(i, j);
    return b;
  }

 private:
  Layout layout_;
  DType dtype_;
  bool owned_;
  std::vector<std::vector<std::byte>> pbuf_, gbuf_;
  std::vector<std::byte*> pptr_, gptr_;
  std::vector<std::byte*> dptr_, dgrad_;  // device runs: the optimizer's buffers
  std::vector<void*> dbuf_;
};

// ---------------------------------------------------- optimizer configs

inline const char* kind_name(const OptimizerConfig& c) {
  return std::visit(
      [](const auto& o) -> const char* {
        using O = std::remove_cvref_t<decltype(o)>;
        if constexpr (is_optimizer<O>)
          return O::name;
        else
          return "custom";
      },
      c);
}

// "Adam(lr=0.01 betas=(0.9, 0.999) ... maximize=0)": every hyper-parameter.
inline std::string describe(const OptimizerConfig& c) {
  std::ostringstream s;
  s << kind_name(c) << "(";
  std::visit(
      [&](const auto& o) {
        using O = std::remove_cvref_t<decltype(o)>;
        if constexpr (is_optimizer<O>) {
          const char* sep = "";
          O::fields([&](const char* name, auto member, const char*, Check) {
            const auto& v = o.*member;
            s << sep << name << "=";
            if constexpr (requires { v.first; })
              s << "(" << v.first << ", " << v.second << ")";
            else
              s << v;
            sep = " ";
          });
        } else {
          s << o.name;
        }
      },
      c);
  s << ")";
  return s.str();
}

// The optimizer's per-element fp32 states, as state_names() lists them
// after "master": the slots its options use.
inline std::vector<std::string> optimizer_state_names(const OptimizerConfig& c) {
  return std::visit(
      [](const auto& o) {
        using O = std::remove_cvref_t<decltype(o)>;
        std::vector<std::string> v;
        if constexpr (is_optimizer<O>)
          o.slots([&v](const Slot& slot) {
            if (slot.used) v.push_back(slot.name);
          });
        else
          v = o.state_names;
        return v;
      },
      c);
}

// The value a state starts at before step 1 (Adagrad's sum), 0 for the others.
inline float initial_state(const OptimizerConfig& c, const std::string& name) {
  double value = 0.0;
  std::visit(
      [&](const auto& o) {
        if constexpr (is_optimizer<std::remove_cvref_t<decltype(o)>>)
          o.slots([&](const Slot& slot) {
            if (name == slot.name) value = slot.initial;
          });
      },
      c);
  return static_cast<float>(value);
}

// The learning rate of a config (for tolerances that scale with it).
inline double lr_of(const OptimizerConfig& c) {
  return std::visit([](const auto& o) { return o.lr; }, c);
}

// --------------------------------------------------------------- reference

// The single-process run: every tensor stepped by the functional optimizer
// of its group on the summed gradients, with the engine's storage of the
// parameters (fp32; fp32 master and a 16-bit param_out; bf16 with
// remainders).
class Reference {
 public:
  Reference(const Model& init, Precision p, std::vector<OptimizerConfig> groups)
      : layout_(init.layout()), precision_(p), dtype_(param_dtype(p)), groups_(std::move(groups)) {
    for (std::size_t i = 0; i < layout_.size(); ++i) {
      Tensor t;
      const std::size_t n = layout_.sizes[i];
      t.master.resize(n);
      for (std::size_t j = 0; j < n; ++j) t.master[j] = init.param(i, j);
      if (dtype_ != DType::f32) {
        t.half.resize(n);
        for (std::size_t j = 0; j < n; ++j)
          t.half[j] = static_cast<std::uint16_t>(init.param_bits(i, j));
      }
      if (p == Precision::bf16_rem)
        t.rem.assign(n, 0);  // a bf16 model: the master is the bf16 value
      const OptimizerConfig& cfg = groups_[static_cast<std::size_t>(layout_.group(i))];
      for (const std::string& name : optimizer_state_names(cfg))
        t.states[name].assign(n, initial_state(cfg, name));
      if (std::holds_alternative<Lamb>(cfg)) t.update.resize(n);
      tensors_.push_back(std::move(t));
    }
  }

  std::vector<OptimizerConfig>& groups() { return groups_; }
  std::int64_t steps() const { return steps_; }
  const Layout& layout() const { return layout_; }

  // One step of every tensor on the reduced gradients, with grad_mul.
  void step(const Grads& grads, double grad_mul) {
    ++steps_;
    for (std::size_t i = 0; i < layout_.size(); ++i) {
      const std::size_t n = layout_.sizes[i];
      if (n == 0) continue;
      Tensor& t = tensors_[i];
      const int group = layout_.group(i);
      const OptimizerConfig& cfg = groups_[static_cast<std::size_t>(group)];
      functional::StepOptions so;
      so.grad_mul = grad_mul;
      functional::ParamView pv;
      if (precision_ == Precision::bf16_rem) {
        pv = functional::ParamView(t.half.data(), n, DType::bf16, std::span<std::uint16_t>(t.rem));
      } else {
        pv = functional::ParamView(t.master.data(), n);
        if (dtype_ != DType::f32) {
          so.param_out = t.half.data();
          so.param_out_dtype = dtype_;
        }
      }
      const functional::GradView gv(grads[i].data(), n, DType::f32);
      auto st = [&](const char* name) -> std::span<float> {
        auto it = t.states.find(name);
        return it == t.states.end() ? std::span<float>() : std::span<float>(it->second);
      };
      std::visit(
          [&](const auto& o) {
            using O = std::remove_cvref_t<decltype(o)>;
            if constexpr (is_elementwise<O>) {
              std::vector<std::span<float>> states;
              o.slots([&](const Slot& slot) { states.push_back(st(slot.name)); });
              functional::step(pv, gv, states, steps_, o, so);
            } else if constexpr (std::is_same_v<O, Lamb>) {
              functional::lamb(pv, gv, st("exp_avg"), st("exp_avg_sq"), t.update, steps_, o, so);
            } else {
              custom_step(t, i, o, grads[i], grad_mul, group);
            }
          },
          cfg);
    }
  }

  // The fp32 master weights of parameter i (decoded, with remainders).
  std::vector<float> master(std::size_t i) const {
    const Tensor& t = tensors_[i];
    if (precision_ != Precision::bf16_rem) return t.master;
    std::vector<float> m(t.half.size());
    std::vector<bfloat16> h(t.half.size());
    for (std::size_t j = 0; j < h.size(); ++j) h[j] = bfloat16{t.half[j]};
    functional::decode_param_remainders(h, t.rem, m);
    return m;
  }
  // The bits the model's parameter buffer must hold.
  std::vector<std::uint32_t> param_bits(std::size_t i) const {
    const Tensor& t = tensors_[i];
    std::vector<std::uint32_t> b(layout_.sizes[i]);
    for (std::size_t j = 0; j < b.size(); ++j) {
      b[j] = dtype_ == DType::f32 ? float_bits(t.master[j]) : t.half[j];
    }
    return b;
  }
  const std::vector<float>& state(const std::string& name, std::size_t i) const {
    static const std::vector<float> none;
    auto it = tensors_[i].states.find(name);
    return it == tensors_[i].states.end() ? none : it->second;
  }

 private:
  struct Tensor {
    std::vector<float> master;        // unused with remainders
    std::vector<std::uint16_t> half;  // 16-bit parameters
    std::vector<std::uint16_t> rem;
    std::map<std::string, std::vector<float>> states;
    std::vector<float> update;  // LAMB's scratch
  };

  // A custom optimizer gets the gradients times grad_mul (in float) and the
  // fp32 master; the 16-bit copy is the master rounded to nearest even.
  void custom_step(Tensor& t, std::size_t i, const CustomOptimizer& o, const std::vector<float>& g,
                   double grad_mul, int group) {
    const std::size_t n = g.size();
    std::vector<float> master = this->master(i);
    std::vector<float> scaled(n);
    const float gm = static_cast<float>(grad_mul);
    for (std::size_t j = 0; j < n; ++j) scaled[j] = g[j] * gm;
    std::vector<std::span<float>> states;
    for (const std::string& name : o.state_names) states.emplace_back(t.states[name]);
    const CustomStep cs{
        .params = master, .grads = scaled, .states = states, .step = steps_, .group = group};
    o.update(cs, o.lr);
    if (precision_ == Precision::bf16_rem) {
      std::vector<bfloat16> h(n);
      functional::encode_param_remainders(master, h, t.rem);
      for (std::size_t j = 0; j < n; ++j) t.half[j] = h[j].bits;
      return;
    }
    t.master = master;
    for (std::size_t j = 0; j < t.half.size(); ++j) {
      t.half[j] =
          dtype_ == DType::bf16 ? bf16_from_float(master[j]).bits : f16_from_float(master[j]).bits;
    }
  }

  Layout layout_;
  Precision precision_;
  DType dtype_;
  std::vector<OptimizerConfig> groups_;
  std::vector<Tensor> tensors_;
  std::int64_t steps_ = 0;
};

}  // namespace shardopt::test::zero
