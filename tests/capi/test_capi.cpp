// The C API (shardopt/shardopt.h) against the C++ API, side by side in one
// process: the same parameters, gradients and calls through both, and the
// results must agree bitwise.
//
//  - The ZeRO optimizer: every optimizer key with non-default
//    hyper-parameters (written into spec strings from the C++ options, so
//    every hyper-parameter of every optimizer goes through the parser) and
//    two groups; stages 0, 1 and 2; fp32 and bf16 parameters; the loss
//    scaler with an overflowing step; clip_grad_norm; grad_ready with the
//    registered, owned and copied gradients; micro-batches through
//    reduce_gradients; summed and predivided reductions, reduce_in_fp32,
//    parameter remainders and streamed gradients. After every step the
//    parameters and the step's report; at the end the step counts, every
//    gathered state, the memory report and check_sync.
//  - Hyper-parameters: shardopt_get_hparam against param_group() for every
//    field, shardopt_set_hparams and shardopt_set_lr against changes made
//    to param_group(), and the spec's defaults.
//  - The collectives: every dtype, op, count and in-place form, blocking and
//    non-blocking (wait and test), against the C++ Communicator's results
//    (bitwise, guard elements included) and the long-double reference of
//    test_comm_data.hpp.
//  - Checkpoints: saved through one API and loaded through the other, byte
//    for byte the same files, metadata both ways, exports, bad files.
//  - The functional steps of every optimizer against shardopt::functional.
//  - The last error is per thread.
#include <shardopt/shardopt.h>

#include <algorithm>
#include <catch2/catch.hpp>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <limits>
#include <map>
#include <memory>
#include <optional>
#include <sstream>
#include <string>
#include <thread>
#include <type_traits>
#include <variant>
#include <vector>

#include "ckpt_helpers.hpp"
#include "mpi_test.hpp"
#include "shardopt/half.hpp"
#include "shardopt/optim.hpp"
#include "shardopt/zero.hpp"
#include "test_comm_data.hpp"

using namespace shardopt;
using namespace shardopt::test;

namespace {

// ------------------------------------------------------------------ helpers

// Whether a C call succeeded; if not, what it said goes into the report.
bool c_ok(shardopt_status_t st, const char* call) {
  if (st == SHARDOPT_SUCCESS) return true;
  UNSCOPED_INFO("rank " << world_rank() << ": " << call << " returned " << shardopt_status_name(st)
                        << ": " << shardopt_last_error() << " (hint: " << shardopt_last_error_hint()
                        << ")");
  return false;
}
#define C_OK(call) c_ok((call), #call)

shardopt_dtype_t c_dtype(DType t) { return static_cast<shardopt_dtype_t>(static_cast<int>(t)); }
shardopt_op_t c_op(ReduceOp op) { return static_cast<shardopt_op_t>(static_cast<int>(op)); }

// A C communicator over MPI_COMM_WORLD, destroyed (collectively) at the end.
struct CComm {
  shardopt_comm_t h = nullptr;
  CComm() { C_OK(shardopt_comm_create(MPI_COMM_WORLD, nullptr, &h)); }
  ~CComm() {
    if (h != nullptr) shardopt_comm_destroy(&h);
  }
  CComm(const CComm&) = delete;
  CComm& operator=(const CComm&) = delete;
};

struct COpt {
  shardopt_optimizer_t h = nullptr;
  ~COpt() {
    if (h != nullptr) shardopt_optimizer_destroy(&h);
  }
  COpt() = default;
  COpt(const COpt&) = delete;
  COpt& operator=(const COpt&) = delete;
};

// "" or where two byte ranges first differ.
std::string compare_bytes(const void* got, const void* want, std::size_t bytes,
                          std::size_t elem = 4) {
  const auto* g = static_cast<const unsigned char*>(got);
  const auto* w = static_cast<const unsigned char*>(want);
  if (bytes == 0 || std::memcmp(g, w, bytes) == 0) return "";
  std::size_t first = 0;
  while (g[first] == w[first]) ++first;
  std::ostringstream s;
  s << "differ from byte " << first << " (element " << first / elem << " of " << bytes / elem
    << ")";
  return s.str();
}

// Bitwise, NaN included.
bool same_double(double a, double b) { return std::memcmp(&a, &b, sizeof a) == 0; }

// A random number in [-1, 1) from a key and an index.
float uniform(std::uint64_t key, std::size_t j) {
  return static_cast<float>(static_cast<double>(mix64(key + j) >> 11) * 0x1p-52 - 1.0);
}

// Writes v into element j of a buffer of dtype t (f32 or bf16).
void store(std::vector<std::byte>& buf, DType t, std::size_t j, float v) {
  if (t == DType::f32) {
    std::memcpy(buf.data() + 4 * j, &v, 4);
  } else {
    const bfloat16 h = bf16_from_float(v);
    std::memcpy(buf.data() + 2 * j, &h, 2);
  }
}

// --------------------------------------------------- optimizers as specs

// "1e-3" and friends, exactly: "%.17g" reads back as the same double.
std::string num(double v) {
  char b[64];
  std::snprintf(b, sizeof b, "%.17g", v);
  return b;
}

// "name=value ..." for every hyper-parameter of the options; flags as
// "true"/"false", or as "1"/"0" with numeric_flags.
std::string pairs_of(const OptimizerConfig& cfg, bool numeric_flags = false) {
  return std::visit(
      [&](const auto& o) {
        using O = std::remove_cvref_t<decltype(o)>;
        std::string s;
        if constexpr (is_optimizer<O>) {
          O::fields([&](const char* name, auto member, const char*, Check) {
            const auto& v = o.*member;
            using V = std::remove_cvref_t<decltype(v)>;
            if (!s.empty()) s += ' ';
            s += name;
            s += '=';
            if constexpr (std::is_same_v<V, bool>)
              s += numeric_flags ? (v ? "1" : "0") : (v ? "true" : "false");
            else if constexpr (std::is_same_v<V, double>)
              s += num(v);
            else
              s += num(v.first) + "," + num(v.second);
          });
        }
        return s;
      },
      cfg);
}

std::string key_of(const OptimizerConfig& cfg) {
  return std::visit(
      [](const auto& o) -> std::string {
        using O = std::remove_cvref_t<decltype(o)>;
        if constexpr (is_optimizer<O>)
          return O::key;
        else
          return "custom";
      },
      cfg);
}

std::string spec_of(const OptimizerConfig& cfg) { return key_of(cfg) + " " + pairs_of(cfg); }

// "" if shardopt_get_hparam gives every hyper-parameter of `cfg` for group g
// of the C optimizer (pairs as "name", "name.0" and "name.1"; flags as 0/1).
std::string compare_hparams(shardopt_optimizer_t opt, int g, const OptimizerConfig& cfg) {
  std::string diff;
  auto expect = [&](const std::string& name, double want) {
    double got = std::nan("");
    if (shardopt_get_hparam(opt, g, name.c_str(), &got) != SHARDOPT_SUCCESS) {
      if (diff.empty()) diff = "group " + std::to_string(g) + ": " + shardopt_last_error();
      return;
    }
    if (!same_double(got, want) && diff.empty())
      diff = "group " + std::to_string(g) + ": " + name + " is " + num(got) + ", expected " +
             num(want);
  };
  std::visit(
      [&](const auto& o) {
        using O = std::remove_cvref_t<decltype(o)>;
        if constexpr (is_optimizer<O>) {
          O::fields([&](const char* name, auto member, const char*, Check) {
            const auto& v = o.*member;
            using V = std::remove_cvref_t<decltype(v)>;
            if constexpr (std::is_same_v<V, bool>) {
              expect(name, v ? 1.0 : 0.0);
            } else if constexpr (std::is_same_v<V, double>) {
              expect(name, v);
            } else {
              expect(name, v.first);
              expect(std::string(name) + ".0", v.first);
              expect(std::string(name) + ".1", v.second);
            }
          });
        }
      },
      cfg);
  return diff;
}

// Two groups of every optimizer, with hyper-parameters away from the
// defaults (the options that decide which state slots exist are the same
// in both groups).
std::vector<std::vector<OptimizerConfig>> all_group_pairs() {
  return {
      {SGD{.lr = 0.05, .momentum = 0.9, .dampening = 0.0, .weight_decay = 0.01, .nesterov = true},
       SGD{.lr = 0.02, .momentum = 0.5, .dampening = 0.1, .maximize = true}},
      {Adam{.lr = 0.002, .betas = {0.8, 0.99}, .eps = 1e-6, .weight_decay = 0.01, .amsgrad = true},
       Adam{.lr = 0.001, .betas = {0.85, 0.95}, .amsgrad = true, .maximize = true}},
      {AdamW{.lr = 0.003, .betas = {0.9, 0.95}, .eps = 1e-7, .weight_decay = 0.05},
       AdamW{.lr = 0.001, .weight_decay = 0.0, .maximize = true}},
      {Adagrad{.lr = 0.05,
               .lr_decay = 0.01,
               .weight_decay = 0.001,
               .initial_accumulator_value = 0.1,
               .eps = 1e-9},
       Adagrad{.lr = 0.02, .initial_accumulator_value = 0.1, .maximize = true}},
      {RMSprop{.lr = 0.005,
               .alpha = 0.95,
               .eps = 1e-7,
               .weight_decay = 0.01,
               .momentum = 0.8,
               .centered = true},
       RMSprop{.lr = 0.001, .momentum = 0.3, .centered = true}},
      {Lion{.lr = 3e-4, .betas = {0.95, 0.98}, .weight_decay = 0.1},
       Lion{.lr = 1e-4, .maximize = true}},
      {Lamb{.lr = 0.002, .betas = {0.85, 0.995}, .eps = 1e-5, .weight_decay = 0.02},
       Lamb{.lr = 0.001, .weight_decay = 0.0}},
      {NAdam{.lr = 0.003,
             .betas = {0.88, 0.997},
             .eps = 1e-7,
             .weight_decay = 0.01,
             .momentum_decay = 0.005,
             .decoupled_weight_decay = true},
       NAdam{.lr = 0.001, .momentum_decay = 0.004}},
      {RAdam{.lr = 0.002,
             .betas = {0.9, 0.99},
             .eps = 1e-6,
             .weight_decay = 0.05,
             .decoupled_weight_decay = true},
       RAdam{.lr = 0.001, .maximize = true}},
  };
}

// --------------------------------------------------------- the optimizer

// Awkward sizes: empty, one element, a prime, one larger than a bucket.
constexpr std::size_t kSizes[] = {0, 1, 7, 1000, 4097};
constexpr std::size_t kParams = std::size(kSizes);
constexpr int kSteps = 4;

// What differs between runs besides the optimizer.
struct Variant {
  int stage = 1;
  DType dtype = DType::f32;
  bool loss_scaler = false;     // with an overflowing gradient in step 1
  bool remainders = false;      // bf16: parameter remainders
  bool reduce_in_fp32 = false;  // bf16
  bool reduce_sum = false;
  double predivide = 1.0;
  bool stream_grads = false;  // stage 2: every gradient owned and streamed
};

std::string describe(const Variant& v) {
  std::ostringstream s;
  s << "stage " << v.stage << ", " << dtype_name(v.dtype);
  if (v.loss_scaler) s << ", loss scaler";
  if (v.remainders) s << ", parameter remainders";
  if (v.reduce_in_fp32) s << ", reduce_in_fp32";
  if (v.reduce_sum) s << ", summed";
  if (v.predivide != 1.0) s << ", predivide " << v.predivide;
  if (v.stream_grads) s << ", streamed gradients";
  return s.str();
}

// Each stage once in fp32 and once in bf16, each with other options on.
std::vector<Variant> all_variants() {
  return {
      {.stage = 0, .dtype = DType::f32, .reduce_sum = true},
      {.stage = 1, .dtype = DType::f32, .predivide = 2.0},
      {.stage = 2, .dtype = DType::f32, .stream_grads = true},
      {.stage = 0, .dtype = DType::bf16, .loss_scaler = true, .reduce_in_fp32 = true},
      {.stage = 1, .dtype = DType::bf16, .loss_scaler = true, .remainders = true},
      {.stage = 2, .dtype = DType::bf16, .loss_scaler = true},
  };
}

// One side's buffers: parameters, and gradient buffers for the registered
// ones (even indices; odd ones are owned by the optimizer, and every one is
// with streamed gradients).
struct Model {
  DType dtype;
  std::size_t esize;
  std::vector<std::vector<std::byte>> data, grad;
  std::vector<bool> registered;
  Model(DType t, bool all_owned) : dtype(t), esize(dtype_size(t)) {
    for (std::size_t i = 0; i < kParams; ++i) {
      data.emplace_back(std::max<std::size_t>(kSizes[i], 1) * esize);
      grad.emplace_back(std::max<std::size_t>(kSizes[i], 1) * esize);
      registered.push_back(!all_owned && i % 2 == 0);
      for (std::size_t j = 0; j < kSizes[i]; ++j)
        store(data[i], t, j, uniform(data_key(0xda7a, i), j));
    }
  }
  void* grad_ptr(std::size_t i) { return registered[i] ? grad[i].data() : nullptr; }
  std::string name(std::size_t i) const { return "layer" + std::to_string(i) + ".weight"; }
};

// This rank's gradient of parameter i at a step and micro-batch, times the
// loss scale, as the model's dtype; an inf planted where asked.
std::vector<std::byte> gradient(DType t, std::size_t i, int step, int micro, double scale,
                                bool plant_inf) {
  const std::size_t n = kSizes[i];
  std::vector<std::byte> g(std::max<std::size_t>(n, 1) * dtype_size(t));
  const std::uint64_t key =
      data_key(0x96ad + static_cast<std::uint64_t>(micro),
               static_cast<std::uint64_t>(step) * 16 + i, static_cast<std::uint64_t>(world_rank()));
  for (std::size_t j = 0; j < n; ++j) store(g, t, j, static_cast<float>(uniform(key, j) * scale));
  if (plant_inf && n > 5) store(g, t, 5, std::numeric_limits<float>::infinity());
  return g;
}

ZeroOptions cpp_options(const Variant& v) {
  ZeroOptions o;
  o.stage = v.stage;
  o.bucket_mb = 0.002;
  o.reduction = v.reduce_sum ? GradReduction::sum : GradReduction::avg;
  o.predivide_factor = v.predivide;
  o.reduce_in_fp32 = v.reduce_in_fp32;
  o.param_remainders = v.remainders;
  o.stream_grads = v.stream_grads;
  o.check_sync_every = -1;
  if (v.loss_scaler)
    o.loss_scaler = LossScaler{.init_scale = 1024.0, .growth_interval = 2, .hysteresis = 1};
  return o;
}

shardopt_zero_options_t c_options(const Variant& v) {
  shardopt_zero_options_t o;
  C_OK(shardopt_zero_options_init(&o));
  o.stage = v.stage;
  o.bucket_mb = 0.002;
  o.reduce_sum = v.reduce_sum ? 1 : 0;
  o.predivide_factor = v.predivide;
  o.reduce_in_fp32 = v.reduce_in_fp32 ? 1 : 0;
  o.param_remainders = v.remainders ? 1 : 0;
  o.stream_grads = v.stream_grads ? 1 : 0;
  o.check_sync_every = -1;
  if (v.loss_scaler) {
    o.loss_scaler = 1;
    o.init_scale = 1024.0;
    o.growth_interval = 2;
    o.hysteresis = 1;
  }
  return o;
}

std::vector<Param> cpp_params(Model& m) {
  std::vector<Param> p;
  for (std::size_t i = 0; i < kParams; ++i)
    p.push_back(Param{.name = m.name(i),
                      .data = m.data[i].data(),
                      .numel = kSizes[i],
                      .dtype = m.dtype,
                      .grad = m.grad_ptr(i),
                      .group = static_cast<int>(i % 2)});
  return p;
}

// The C parameters point into `names`, which must outlive the call.
std::vector<shardopt_param_t> c_params(Model& m, std::vector<std::string>& names) {
  names.clear();
  for (std::size_t i = 0; i < kParams; ++i) names.push_back(m.name(i));
  std::vector<shardopt_param_t> p;
  for (std::size_t i = 0; i < kParams; ++i)
    p.push_back(shardopt_param_t{.name = names[i].c_str(),
                                 .data = m.data[i].data(),
                                 .count = kSizes[i],
                                 .dtype = c_dtype(m.dtype),
                                 .grad = m.grad_ptr(i),
                                 .group = static_cast<int>(i % 2),
                                 .shape = nullptr,
                                 .ndim = 0,
                                 .unit = 0});
  return p;
}

// Collective: the C optimizer of groups' specs, or its error.
shardopt_status_t create_c(shardopt_comm_t comm, Model& m,
                           const std::vector<OptimizerConfig>& groups,
                           const shardopt_zero_options_t& o, COpt& out) {
  std::vector<std::string> names;
  std::vector<shardopt_param_t> p = c_params(m, names);
  std::vector<std::string> specs;
  for (const auto& g : groups) specs.push_back(spec_of(g));
  std::vector<const char*> spec_ptrs;
  for (const auto& s : specs) spec_ptrs.push_back(s.c_str());
  return shardopt_optimizer_create(comm, p.data(), p.size(), spec_ptrs.data(),
                                   static_cast<int>(spec_ptrs.size()), &o, &out.h);
}

// Both sides of one run, and the first difference this rank saw.
struct SideBySide {
  Variant v;
  Model cm, pm;  // the C side's buffers and the C++ side's
  COpt c;
  std::unique_ptr<ZeroRedundancyOptimizer> cpp;
  std::string diff;

  SideBySide(const Variant& variant)
      : v(variant), cm(v.dtype, v.stream_grads), pm(v.dtype, v.stream_grads) {}

  void note(const std::string& what) {
    if (diff.empty()) diff = "rank " + std::to_string(world_rank()) + ": " + what;
  }

  // Where parameter i's gradient goes on each side: the registered or
  // owned buffer (null when streamed).
  void* c_grad(std::size_t i) {
    void* g = nullptr;
    if (!C_OK(shardopt_param_grad(c.h, i, &g))) note("shardopt_param_grad failed");
    return g;
  }

  // Delivers gradient g of parameter i to both sides: copied by grad_ready,
  // or written into the gradient buffer and marked ready (mark), or only
  // written (no mark: step() takes it).
  void deliver(std::size_t i, const std::vector<std::byte>& g, bool copy, bool mark) {
    const std::size_t bytes = kSizes[i] * cm.esize;
    void* cg = c_grad(i);
    void* pg = cpp->grad(i);
    if ((cg == nullptr) != (pg == nullptr)) note("param_grad and grad() disagree on a buffer");
    if (cg == nullptr) copy = mark = true;  // streamed: only grad_ready(i, grad) can take it
    if (copy) {
      if (!C_OK(shardopt_grad_ready(c.h, i, g.data()))) note("shardopt_grad_ready(copy) failed");
      cpp->grad_ready(i, g.data());
      return;
    }
    if (bytes > 0) {
      std::memcpy(cg, g.data(), bytes);
      std::memcpy(pg, g.data(), bytes);
    }
    if (mark) {
      if (!C_OK(shardopt_grad_ready(c.h, i, nullptr))) note("shardopt_grad_ready failed");
      cpp->grad_ready(i);
    }
  }

  void compare_params(const char* when) {
    for (std::size_t i = 0; i < kParams; ++i) {
      const std::string d =
          compare_bytes(cm.data[i].data(), pm.data[i].data(), kSizes[i] * cm.esize, cm.esize);
      if (!d.empty()) note(std::string(when) + ": parameter " + std::to_string(i) + " " + d);
    }
  }

  void compare_info(const shardopt_step_info_t& a, const StepInfo& b, int step) {
    const std::string at = "step " + std::to_string(step) + ": ";
    if ((a.applied != 0) != b.applied) note(at + "applied differs");
    if ((a.grads_finite != 0) != b.grads_finite) note(at + "grads_finite differs");
    if ((a.pending != 0) != b.pending) note(at + "pending differs");
    if (!same_double(a.grad_norm, b.grad_norm))
      note(at + "grad_norm " + num(a.grad_norm) + ", C++ " + num(b.grad_norm));
    if (!same_double(a.loss_scale, b.loss_scale))
      note(at + "loss_scale " + num(a.loss_scale) + ", C++ " + num(b.loss_scale));
    if (a.step != b.step) note(at + "step " + std::to_string(a.step));
    if (a.reduce_bytes != b.reduce_bytes || a.gather_bytes != b.gather_bytes)
      note(at + "bytes moved differ");
    if (!(a.reduce_seconds >= 0 && a.update_seconds >= 0 && a.gather_seconds >= 0))
      note(at + "negative timings");
  }

  // One step on both sides: mode 0 writes the gradients into the buffers
  // and marks them ready in reverse order, 1 passes copies (an inf planted
  // on rank 0 with the loss scaler), 2 marks nothing and clips the norm,
  // 3 runs two micro-batches (stage 2: reduce_gradients between them;
  // stages 0 and 1: reduce_gradients once before step).
  void step(int s) {
    double c_scale = 0.0;
    if (!C_OK(shardopt_loss_scale(c.h, &c_scale))) note("shardopt_loss_scale failed");
    const double scale = cpp->loss_scale();
    if (!same_double(c_scale, scale)) note("loss scales differ before step " + std::to_string(s));
    if (!C_OK(shardopt_zero_grad(c.h))) note("shardopt_zero_grad failed");
    cpp->zero_grad();
    const int mode = s % 4;
    if (mode == 3) {
      if (v.stage == 2) {
        for (std::size_t i = 0; i < kParams; ++i)
          deliver(i, gradient(v.dtype, i, s, 1, scale, false), false, true);
        if (!C_OK(shardopt_reduce_gradients(c.h))) note("shardopt_reduce_gradients failed");
        cpp->reduce_gradients();
      }
      for (std::size_t k = kParams; k-- > 0;)
        deliver(k, gradient(v.dtype, k, s, 0, scale, false), k == 1, true);
      if (v.stage < 2) {
        if (!C_OK(shardopt_reduce_gradients(c.h))) note("shardopt_reduce_gradients failed");
        cpp->reduce_gradients();
      }
    } else {
      const bool inf = v.loss_scaler && mode == 1 && world_rank() == 0;
      for (std::size_t k = kParams; k-- > 0;)
        deliver(k, gradient(v.dtype, k, s, 0, scale, inf && k == 3), mode == 1, mode != 2);
    }
    if (mode == 2) {
      double c_norm = -5.0;
      if (!C_OK(shardopt_clip_grad_norm(c.h, 0.5, &c_norm))) note("clip_grad_norm failed");
      const double norm = cpp->clip_grad_norm(0.5);
      if (!same_double(c_norm, norm)) note("clip_grad_norm: " + num(c_norm) + ", C++ " + num(norm));
    }
    shardopt_step_info_t ci;
    std::memset(&ci, 0x5a, sizeof ci);
    if (!C_OK(shardopt_step(c.h, &ci))) note("shardopt_step failed");
    const StepInfo pi = cpp->step();
    compare_info(ci, pi, s);
    compare_params(("after step " + std::to_string(s)).c_str());
  }

  void compare_final() {
    std::int64_t steps = -1, skipped = -1;
    if (C_OK(shardopt_steps(c.h, &steps, &skipped)) &&
        (steps != cpp->steps() || skipped != cpp->skipped_steps()))
      note("steps " + std::to_string(steps) + " skipped " + std::to_string(skipped));
    if (v.loss_scaler && skipped != 1) note("the overflowing step was not skipped");
    std::size_t n = 0;
    if (C_OK(shardopt_num_params(c.h, &n)) && n != cpp->num_params()) note("num_params");
    for (std::size_t i = 0; i < kParams; ++i) {
      std::size_t count = 0;
      shardopt_dtype_t t = SHARDOPT_I64;
      if (C_OK(shardopt_param_info(c.h, i, &count, &t)) &&
          (count != kSizes[i] || t != c_dtype(v.dtype)))
        note("param_info " + std::to_string(i));
    }
    // Every state of every parameter, gathered through both (collective).
    for (const std::string& name : cpp->state_names()) {
      for (std::size_t i = 0; i < kParams; ++i) {
        const std::vector<float> want = cpp->gather_state(name, i);
        std::vector<float> got(std::max<std::size_t>(kSizes[i], 1), -7.0f);
        if (!C_OK(shardopt_gather_state(c.h, name.c_str(), i, got.data(), kSizes[i]))) {
          note("gather_state " + name + " failed");
          continue;
        }
        const std::string d = compare_bytes(got.data(), want.data(), want.size() * 4);
        if (want.size() != kSizes[i] || !d.empty())
          note("state " + name + " of parameter " + std::to_string(i) + " " + d);
      }
    }
    shardopt_memory_report_t cr;
    std::memset(&cr, 0x5a, sizeof cr);
    const MemoryReport pr = cpp->memory_report();
    if (C_OK(shardopt_memory_report(c.h, &cr))) {
      const std::size_t got[] = {cr.master_params, cr.optimizer_state, cr.grad_shard,
                                 cr.reduced_grads, cr.owned_grads,     cr.buckets,
                                 cr.user_params,   cr.user_grads,      cr.device_bytes,
                                 cr.host_bytes,    cr.allocated};
      const std::size_t want[] = {pr.master_params, pr.optimizer_state, pr.grad_shard,
                                  pr.reduced_grads, pr.owned_grads,     pr.buckets,
                                  pr.user_params,   pr.user_grads,      pr.device_bytes,
                                  pr.host_bytes,    pr.allocated()};
      for (std::size_t k = 0; k < std::size(got); ++k)
        if (got[k] != want[k]) note("memory_report field " + std::to_string(k) + " differs");
    }
    int in_sync = -1;
    char message[256] = "untouched";
    if (C_OK(shardopt_check_sync(c.h, &in_sync, message, sizeof message)) && in_sync != 1)
      note(std::string("check_sync: ") + message);
    if (!cpp->check_sync().in_sync) note("the C++ side is out of sync");
  }
};

// Collective: runs groups under v through both APIs. When the C++
// constructor refuses the combination, the C API must refuse it with the
// same code.
void run_side_by_side(shardopt_comm_t comm, const std::vector<OptimizerConfig>& groups,
                      const Variant& v) {
  INFO(world_size() << " ranks, " << spec_of(groups[0]) << " | " << spec_of(groups[1]) << ", "
                    << describe(v));
  SideBySide r(v);
  const shardopt_zero_options_t co = c_options(v);
  const shardopt_status_t st = create_c(comm, r.cm, groups, co, r.c);
  std::string cpp_error;
  int cpp_code = SHARDOPT_SUCCESS;
  try {
    r.cpp = std::make_unique<ZeroRedundancyOptimizer>(world(), cpp_params(r.pm), groups,
                                                      cpp_options(v));
  } catch (const Error& e) {
    cpp_error = e.what();
    cpp_code = e.status();
  }
  if (st != SHARDOPT_SUCCESS || cpp_code != SHARDOPT_SUCCESS) {
    INFO("C: " << shardopt_status_name(st) << " " << shardopt_last_error()
               << "; C++: " << cpp_error);
    CHECK(all_ranks_true(st == cpp_code && st != SHARDOPT_SUCCESS));
    return;
  }
  r.compare_params("after creation");
  for (int s = 0; s < kSteps; ++s) r.step(s);
  r.compare_final();
  INFO(r.diff);
  CHECK(all_ranks_true(r.diff.empty()));
}

// -------------------------------------------------------- functional steps

template <class O>
std::vector<std::string> slot_names(const O& o) {
  std::vector<std::string> n;
  o.slots([&](const Slot& s) { n.push_back(s.used ? s.name : ""); });
  return n;
}

// One functional step of `o` through both APIs on copies of the same
// buffers: fp32 parameters (with a bf16 copy) or bf16 with remainders,
// gradients of grad_type; "" or the first difference.
template <class O>
std::string functional_case(const O& o, DType grad_type, bool remainders, bool skip,
                            std::uint64_t key) {
  constexpr std::size_t n = 1003;
  const std::vector<std::string> slots = slot_names(o);
  const bool lamb = std::is_same_v<O, Lamb>;
  const int num_states = static_cast<int>(slots.size()) + (lamb ? 1 : 0);
  std::vector<float> p0(n);
  for (std::size_t j = 0; j < n; ++j) p0[j] = uniform(key, j);
  std::vector<std::byte> g(n * dtype_size(grad_type));
  for (std::size_t j = 0; j < n; ++j) {
    const float x = uniform(key + 1, j + n);
    if (grad_type == DType::f32) {
      std::memcpy(g.data() + 4 * j, &x, 4);
    } else if (grad_type == DType::bf16) {
      const bfloat16 h = bf16_from_float(x);
      std::memcpy(g.data() + 2 * j, &h, 2);
    } else {
      const float16 h = f16_from_float(x);
      std::memcpy(g.data() + 2 * j, &h, 2);
    }
  }
  // Per side: parameters (fp32, or bf16 and remainders), states, a copy.
  struct Side {
    std::vector<float> p;
    std::vector<bfloat16> pb;
    std::vector<std::uint16_t> rem;
    std::vector<std::vector<float>> states;
    std::vector<bfloat16> out;
  };
  Side a, b;
  for (Side* s : {&a, &b}) {
    s->p = p0;
    if (remainders) {
      s->pb.resize(n);
      s->rem.resize(n);
      functional::encode_param_remainders(p0, s->pb, s->rem);
    }
    for (int k = 0; k < num_states; ++k) {
      const bool used = k >= static_cast<int>(slots.size()) || !slots[k].empty();
      double init = 0.0;
      if constexpr (std::is_same_v<O, Adagrad>) init = o.initial_accumulator_value;
      s->states.emplace_back(used ? n : 0, static_cast<float>(init));
    }
    s->out.assign(n, bfloat16{0});
  }
  // With skip_nonfinite, step 2's gradients hold an inf: both skip it.
  std::vector<std::byte> g_inf = g;
  {
    const float inf = std::numeric_limits<float>::infinity();
    if (grad_type == DType::f32) {
      std::memcpy(g_inf.data() + 4 * 10, &inf, 4);
    } else {
      const std::uint16_t bits =
          grad_type == DType::bf16 ? bf16_from_float(inf).bits : f16_from_float(inf).bits;
      std::memcpy(g_inf.data() + 2 * 10, &bits, 2);
    }
  }
  for (std::int64_t step = 1; step <= 3; ++step) {
    const void* grads = skip && step == 2 ? g_inf.data() : g.data();
    // The C API.
    std::vector<float*> st;
    for (auto& v : a.states) st.push_back(v.empty() ? nullptr : v.data());
    shardopt_step_options_t so;
    C_OK(shardopt_step_options_init(&so));
    so.grad_mul = 0.5;
    so.skip_nonfinite = skip ? 1 : 0;
    if (remainders) {
      so.remainders = a.rem.data();
    } else {
      so.param_out = a.out.data();
      so.param_out_dtype = SHARDOPT_BF16;
    }
    const std::string spec = spec_of(o);
    int applied = -1, finite = -1;
    void* params = remainders ? static_cast<void*>(a.pb.data()) : a.p.data();
    const bool c_done = C_OK(shardopt_functional_step(
        spec.c_str(), params, remainders ? SHARDOPT_BF16 : SHARDOPT_F32, grads, c_dtype(grad_type),
        n, st.data(), num_states, step, &so, &applied, &finite));
    // The C++ API.
    functional::StepOptions xo;
    xo.grad_mul = 0.5;
    xo.skip_nonfinite = skip;
    if (!remainders) xo.param_out = b.out.data();
    functional::ParamView pv = remainders
                                   ? functional::ParamView(b.pb.data(), n, DType::bf16, b.rem)
                                   : functional::ParamView(b.p.data(), n);
    functional::GradView gv(grads, n, grad_type);
    functional::StepResult res;
    if constexpr (lamb) {
      res = functional::lamb(pv, gv, b.states[0], b.states[1], b.states[2], step, o, xo);
    } else {
      std::vector<std::span<float>> spans;
      for (auto& v : b.states) spans.emplace_back(v);
      res = functional::step<O>(pv, gv, std::span<const std::span<float>>(spans), step, o, xo);
    }
    if (!c_done)
      return "step " + std::to_string(step) + ": the C step failed: " + shardopt_last_error();
    if ((applied != 0) != res.applied || (finite != 0) != res.grads_finite ||
        res.applied != !(skip && step == 2))
      return "step " + std::to_string(step) + ": applied " + std::to_string(applied) +
             ", grads_finite " + std::to_string(finite) + "; C++: " + std::to_string(res.applied) +
             ", " + std::to_string(res.grads_finite);
    std::string d = remainders ? compare_bytes(a.pb.data(), b.pb.data(), 2 * n, 2) +
                                     compare_bytes(a.rem.data(), b.rem.data(), 2 * n, 2)
                               : compare_bytes(a.p.data(), b.p.data(), 4 * n) +
                                     compare_bytes(a.out.data(), b.out.data(), 2 * n, 2);
    for (int k = 0; k < num_states && d.empty() && !(lamb && k == 2); ++k)
      d = compare_bytes(a.states[k].data(), b.states[k].data(), a.states[k].size() * 4);
    if (!d.empty()) return "step " + std::to_string(step) + ": " + d;
  }
  // The parameters moved (a step that did nothing would pass the above).
  if (!remainders && std::memcmp(a.p.data(), p0.data(), 4 * n) == 0)
    return "the parameters did not change";
  return "";
}

// ---------------------------------------------------------- checkpoints

// A scratch folder every rank sees (the checkpoint tests').
using zero::TempDir;

std::string read_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
}

}  // namespace

// ==================================================================== tests

TEST_CASE("the C optimizer equals the C++ optimizer bitwise", "[capi][zero]") {
  CComm comm;
  REQUIRE(all_ranks_true(comm.h != nullptr));
  for (const auto& groups : all_group_pairs())
    for (const Variant& v : all_variants()) run_side_by_side(comm.h, groups, v);
}

TEST_CASE("the C API at stage 3 gives stage 2's parameters bitwise, a unit at a time",
          "[capi][zero][stage3]") {
  CComm comm;
  REQUIRE(all_ranks_true(comm.h != nullptr));
  const int rank = world_rank();
  // Units by label from 1 (0: a unit of its own): {p0, p1}, {p2}, {p3, p4}.
  const std::vector<std::size_t> sizes = {300, 40, 1000, 7, 513};
  const std::vector<int> labels = {1, 1, 0, 2, 2};
  const std::vector<std::size_t> unit_of = {0, 0, 1, 2, 2};
  for (DType t : {DType::f32, DType::bf16}) {
    INFO(dtype_name(t));
    const std::size_t es = dtype_size(t);
    struct Side {
      std::vector<std::vector<std::byte>> p, g;
      COpt opt;
    } two, three;
    std::vector<std::string> names;
    for (std::size_t i = 0; i < sizes.size(); ++i) {
      std::string name = "w";
      name += std::to_string(i);
      names.push_back(name);
    }
    for (Side* side : {&two, &three}) {
      std::vector<shardopt_param_t> ps;
      for (std::size_t i = 0; i < sizes.size(); ++i) {
        side->p.emplace_back(sizes[i] * es);
        side->g.emplace_back(sizes[i] * es);
        for (std::size_t j = 0; j < sizes[i]; ++j)
          store(side->p[i], t, j, std::sin(0.3f * float(i) + 0.01f * float(j)));
        ps.push_back(shardopt_param_t{.name = names[i].c_str(),
                                      .data = side->p[i].data(),
                                      .count = sizes[i],
                                      .dtype = c_dtype(t),
                                      .grad = side->g[i].data(),
                                      .group = 0,
                                      .shape = nullptr,
                                      .ndim = 0,
                                      .unit = labels[i]});
      }
      shardopt_zero_options_t o;
      C_OK(shardopt_zero_options_init(&o));
      CHECK((o.prefetch == 1 && o.reshard_after_forward == 1 && o.persist_below_bytes == 65536 &&
             o.gather_limit_bytes == 0));
      o.stage = side == &two ? 2 : 3;
      o.bucket_mb = 0.002;
      o.persist_below_bytes = 0;
      const char* spec = "adamw lr=0.01";
      REQUIRE(all_ranks_true(C_OK(
          shardopt_optimizer_create(comm.h, ps.data(), ps.size(), &spec, 1, &o, &side->opt.h))));
    }
    std::size_t units = 0;
    C_OK(shardopt_num_units(three.opt.h, &units));
    REQUIRE(units == 3);
    // The gradients from the parameters as each stage sees them: stage 3's
    // through shardopt_param_data inside gather and release.
    const auto grads_of = [&](Side& side, std::size_t i, const void* values) {
      for (std::size_t j = 0; j < sizes[i]; ++j) {
        float x;
        if (t == DType::f32) {
          std::memcpy(&x, static_cast<const std::byte*>(values) + 4 * j, 4);
        } else {
          bfloat16 h;
          std::memcpy(&h, static_cast<const std::byte*>(values) + 2 * j, 2);
          x = to_float(h);
        }
        store(side.g[i], t, j, 0.1f * std::cos(3.0f * x + float(rank)));
      }
    };
    bool ok = true;
    for (int step = 0; step < 3; ++step) {
      for (std::size_t u = 0; u < units; ++u) {
        ok = C_OK(shardopt_gather_unit(three.opt.h, u)) && ok;
        for (std::size_t i = 0; i < sizes.size(); ++i) {
          if (unit_of[i] != u) continue;
          const void* d = nullptr;
          ok = C_OK(shardopt_param_data(three.opt.h, i, &d)) && d != nullptr && ok;
          if (d != nullptr) grads_of(three, i, d);
          grads_of(two, i, two.p[i].data());
        }
        ok = C_OK(shardopt_release_unit(three.opt.h, u)) && ok;
      }
      shardopt_step_info_t info2, info3;
      ok = C_OK(shardopt_step(two.opt.h, &info2)) && C_OK(shardopt_step(three.opt.h, &info3)) && ok;
      CHECK(info3.gathers == 3);
      CHECK(info2.gathers == 0);
    }
    bool same = true;
    for (std::size_t u = 0; u < units; ++u) {
      ok = C_OK(shardopt_gather_unit(three.opt.h, u)) && ok;
      for (std::size_t i = 0; i < sizes.size(); ++i) {
        const void* d = nullptr;
        ok = C_OK(shardopt_param_data(three.opt.h, i, &d)) && ok;
        same = same && (unit_of[i] == u) == (d != nullptr);
        if (unit_of[i] == u) same = same && std::memcmp(d, two.p[i].data(), sizes[i] * es) == 0;
      }
      ok = C_OK(shardopt_release_unit(three.opt.h, u)) && ok;
    }
    CHECK(all_ranks_true(ok && same));
    shardopt_memory_report_t m;
    C_OK(shardopt_memory_report(three.opt.h, &m));
    CHECK(
        (m.param_shard > 0 && m.gather_pool > 0 && m.persistent_params == 0 && m.user_params == 0));
    // Ranks that name different units: an error on every rank, in C's words.
    if (world_size() > 1) {
      const shardopt_status_t st = shardopt_gather_unit(three.opt.h, rank == 0 ? 0 : 1);
      const std::string what = shardopt_last_error();
      INFO(what);
      CHECK(all_ranks_true(st == SHARDOPT_ERR_INVALID_STATE &&
                           what.find("shardopt_gather_unit(): the ranks name different units "
                                     "at the same point (rank 0: unit 0 ('w0'...), rank 1: unit "
                                     "1 ('w2')") != std::string::npos));
    }
  }
}

TEST_CASE("hyper-parameters through the C API are param_group()'s", "[capi][hparams]") {
  CComm comm;
  REQUIRE(all_ranks_true(comm.h != nullptr));
  for (const auto& groups : all_group_pairs()) {
    INFO(world_size() << " ranks, " << spec_of(groups[0]) << " | " << spec_of(groups[1]));
    const Variant v{.stage = 1, .dtype = DType::f32};
    SideBySide r(v);
    const shardopt_status_t st = create_c(comm.h, r.cm, groups, c_options(v), r.c);
    r.cpp = std::make_unique<ZeroRedundancyOptimizer>(world(), cpp_params(r.pm), groups,
                                                      cpp_options(v));
    const bool made = all_ranks_true(c_ok(st, "shardopt_optimizer_create"));
    CHECK(made);
    if (!made) continue;
    // Every field of every group, as the spec set it.
    for (int g = 0; g < 2; ++g) {
      const std::string d = compare_hparams(r.c.h, g, r.cpp->param_group(g));
      if (!d.empty()) r.note("after creation: " + d);
    }
    r.step(0);
    // Group 1 takes group 0's values (flags as 1/0), group 0 a new rate.
    const std::string pairs = pairs_of(groups[0], true);
    if (!C_OK(shardopt_set_hparams(r.c.h, 1, pairs.c_str()))) r.note("set_hparams: " + pairs);
    r.cpp->param_group(1) = groups[0];
    const double lr = std::visit([](const auto& o) { return o.lr; }, groups[0]) * 0.25;
    if (!C_OK(shardopt_set_lr(r.c.h, lr, 0))) r.note("set_lr failed");
    r.cpp->set_lr(lr, 0);
    for (int g = 0; g < 2; ++g) {
      const std::string d = compare_hparams(r.c.h, g, r.cpp->param_group(g));
      if (!d.empty()) r.note("after set_hparams: " + d);
    }
    // A bad change leaves everything as it was.
    CHECK(shardopt_set_hparams(r.c.h, -1, "lr=0.5 no_such_field=1") ==
          SHARDOPT_ERR_INVALID_ARGUMENT);
    CHECK(shardopt_set_hparams(r.c.h, 0, "lr=0.5 lr=nope") == SHARDOPT_ERR_INVALID_ARGUMENT);
    for (int g = 0; g < 2; ++g) {
      const std::string d = compare_hparams(r.c.h, g, r.cpp->param_group(g));
      if (!d.empty()) r.note("after a refused set_hparams: " + d);
    }
    // Every group at once.
    if (!C_OK(shardopt_set_hparams(r.c.h, -1, "lr=0.0007"))) r.note("set_hparams(-1)");
    r.cpp->set_lr(0.0007);
    for (int s = 1; s < 3; ++s) r.step(s);
    INFO(r.diff);
    CHECK(all_ranks_true(r.diff.empty()));
  }
}

TEST_CASE("a spec's unset hyper-parameters take the C++ defaults", "[capi][hparams]") {
  CComm comm;
  REQUIRE(all_ranks_true(comm.h != nullptr));
  std::vector<std::pair<std::string, OptimizerConfig>> cases = {
      {"sgd", SGD{}},
      {"adam", Adam{}},
      {"adamw", AdamW{}},
      {"adagrad", Adagrad{}},
      {"rmsprop", RMSprop{}},
      {"lion", Lion{}},
      {"lamb", Lamb{}},
      {"nadam", NAdam{}},
      {"radam", RAdam{}},
      // Spaces, exponents, flags as 1/0 and true/false, pairs.
      {"  adamw   lr=1e-2  betas=0.8,0.9   amsgrad=1 ",
       AdamW{.lr = 1e-2, .betas = {0.8, 0.9}, .amsgrad = true}},
      {"sgd lr=.5 momentum=9E-1 nesterov=true maximize=0",
       SGD{.lr = 0.5, .momentum = 0.9, .nesterov = true}},
      {"rmsprop centered=false momentum=0 lr=1", RMSprop{.lr = 1.0}},
  };
  for (const auto& [spec, want] : cases) {
    INFO("spec \"" << spec << "\"");
    Model m(DType::f32, false);
    std::vector<std::string> names;
    std::vector<shardopt_param_t> p = c_params(m, names);
    const char* groups[2] = {spec.c_str(), spec.c_str()};
    COpt opt;
    const bool made =
        C_OK(shardopt_optimizer_create(comm.h, p.data(), p.size(), groups, 2, nullptr, &opt.h));
    std::string d =
        made ? compare_hparams(opt.h, 0, want) + compare_hparams(opt.h, 1, want) : "not created";
    INFO(d);
    CHECK(all_ranks_true(made && d.empty()));
  }
}

TEST_CASE("the C node layout is the C++ Communicator's", "[capi][comm]") {
  CComm comm;
  REQUIRE(all_ranks_true(comm.h != nullptr));
  int node = -1, nodes = -1, local_rank = -1, local_ranks = -1;
  C_OK(shardopt_comm_node(comm.h, &node, &nodes, &local_rank, &local_ranks));
  const NodeLayout& cpp = world().nodes();
  CHECK(all_ranks_true(node == cpp.node && nodes == cpp.nodes && local_rank == cpp.local_rank &&
                       local_ranks == cpp.local_ranks));
}

TEST_CASE("the C collectives equal the C++ Communicator's bitwise", "[capi][comm]") {
  CComm comm;
  REQUIRE(all_ranks_true(comm.h != nullptr));
  const int rank = world_rank(), n = world_size();
  const std::size_t counts[] = {0, 1, 7, 1000};
  int trial_no = 0;
  for (DType t : kAllDTypes) {
    for (Coll coll : {Coll::allreduce, Coll::reduce_scatter, Coll::allgather, Coll::broadcast}) {
      const std::vector<ReduceOp> ops = coll == Coll::allreduce || coll == Coll::reduce_scatter
                                            ? ops_for(t)
                                            : std::vector<ReduceOp>{ReduceOp::sum};
      for (ReduceOp op : ops)
        for (std::size_t count : counts)
          for (Form form : forms_for(coll)) {
            ++trial_no;
            const Spec s{.coll = coll,
                         .dtype = t,
                         .op = op,
                         .count = count,
                         .form = form,
                         .fill = trial_no % 2 ? Fill::random : Fill::exact,
                         .root = trial_no % n};
            // Blocking, or non-blocking completed by wait or by test.
            const int how = trial_no % 3;
            auto via_c = make_trial(s, rank, n);
            auto via_cpp = make_trial(s, rank, n);
            // The C call's buffers: the trial's own (the guarded regions,
            // past their guards), placed as the form says.
            std::vector<std::pair<std::byte*, std::size_t>> regions = via_c->regions();
            const std::size_t esize = dtype_size(t);
            const std::size_t guard = 8 * esize;
            std::byte* first = regions[0].first + guard;
            std::byte* second = regions.size() > 1 ? regions[1].first + guard : nullptr;
            const std::size_t own = static_cast<std::size_t>(rank) * count * esize;
            const void* send = first;
            void* recv = first;
            if (coll == Coll::allreduce && form == Form::out_of_place) recv = second;
            if (coll == Coll::reduce_scatter && form == Form::out_of_place) recv = second;
            if (coll == Coll::reduce_scatter && form == Form::in_place_own_block)
              recv = first + own;
            if (coll == Coll::allgather && form == Form::out_of_place) recv = second;
            if (coll == Coll::allgather && form == Form::in_place) send = first + own;
            shardopt_request_t req = nullptr;
            shardopt_status_t st = SHARDOPT_SUCCESS;
            const bool blocking = how == 0;
            switch (coll) {
              case Coll::allreduce:
                st = blocking ? shardopt_allreduce(comm.h, send, recv, count, c_dtype(t), c_op(op))
                              : shardopt_iallreduce(comm.h, send, recv, count, c_dtype(t), c_op(op),
                                                    &req);
                break;
              case Coll::reduce_scatter:
                st = blocking
                         ? shardopt_reduce_scatter(comm.h, send, recv, count, c_dtype(t), c_op(op))
                         : shardopt_ireduce_scatter(comm.h, send, recv, count, c_dtype(t), c_op(op),
                                                    &req);
                break;
              case Coll::allgather:
                st = blocking ? shardopt_allgather(comm.h, send, recv, count, c_dtype(t))
                              : shardopt_iallgather(comm.h, send, recv, count, c_dtype(t), &req);
                break;
              case Coll::broadcast:
                st = blocking ? shardopt_broadcast(comm.h, recv, count, c_dtype(t), s.root)
                              : shardopt_ibroadcast(comm.h, recv, count, c_dtype(t), s.root, &req);
                break;
            }
            bool ok = c_ok(st, "the collective");
            if (ok && !blocking) {
              ok = req != nullptr;
              if (how == 1) {
                ok = ok && c_ok(shardopt_wait(&req), "shardopt_wait");
              } else {
                int done = 0;
                while (ok && !done) ok = c_ok(shardopt_test(&req, &done), "shardopt_test");
              }
              ok = ok && req == nullptr;
            }
            if (blocking) {
              via_cpp->run(world());
            } else {
              via_cpp->start(world()).wait();
            }
            std::string d = ok ? via_c->verify() : "the C call failed";
            const auto cpp_regions = via_cpp->regions();
            for (std::size_t k = 0; k < regions.size() && d.empty(); ++k)
              d = compare_bytes(regions[k].first, cpp_regions[k].first, regions[k].second, esize);
            INFO(describe(s) << (blocking   ? ", blocking"
                                 : how == 1 ? ", wait"
                                            : ", test")
                             << ", " << n << " ranks: " << d);
            CHECK(all_ranks_true(d.empty()));
          }
    }
  }
  // avg is for floating types: refused on every rank, and the
  // communicator still works.
  std::int64_t x = rank, y = 0;
  CHECK(all_ranks_true(shardopt_allreduce(comm.h, &x, &y, 1, SHARDOPT_I64, SHARDOPT_AVG) ==
                       SHARDOPT_ERR_UNSUPPORTED));
  CHECK(all_ranks_true(C_OK(shardopt_allreduce(comm.h, &x, &y, 1, SHARDOPT_I64, SHARDOPT_SUM)) &&
                       y == static_cast<std::int64_t>(n) * (n - 1) / 2));
  // A communicator with argument checks and small chunks gives the same.
  shardopt_comm_options_t o;
  C_OK(shardopt_comm_options_init(&o));
  o.check_arguments = 1;
  o.max_chunk_elements = 3;
  shardopt_comm_t small = nullptr;
  std::vector<double> in(1000), out(1000), want(1000);
  for (std::size_t j = 0; j < in.size(); ++j) in[j] = uniform(data_key(77, rank), j);
  bool ok =
      C_OK(shardopt_comm_create(MPI_COMM_WORLD, &o, &small)) &&
      C_OK(shardopt_allreduce(small, in.data(), out.data(), in.size(), SHARDOPT_F64, SHARDOPT_SUM));
  world().allreduce(in.data(), want.data(), in.size(), DType::f64, ReduceOp::sum);
  ok = ok && compare_bytes(out.data(), want.data(), 8000, 8).empty();
  if (small != nullptr) ok = C_OK(shardopt_comm_destroy(&small)) && ok;
  CHECK(all_ranks_true(ok));
}

TEST_CASE("checkpoints cross between the C and the C++ API", "[capi][ckpt]") {
  CComm comm;
  TempDir dir;
  REQUIRE(all_ranks_true(comm.h != nullptr && !dir.path().empty()));
  const std::vector<OptimizerConfig> groups = all_group_pairs()[2];  // AdamW
  for (const Variant& v : {Variant{.stage = 1, .dtype = DType::f32},
                           Variant{.stage = 2, .dtype = DType::bf16, .loss_scaler = true}}) {
    INFO(world_size() << " ranks, " << describe(v));
    SideBySide r(v);
    const bool made = all_ranks_true(C_OK(create_c(comm.h, r.cm, groups, c_options(v), r.c)));
    r.cpp = std::make_unique<ZeroRedundancyOptimizer>(world(), cpp_params(r.pm), groups,
                                                      cpp_options(v));
    CHECK(made);
    if (!made) continue;
    r.step(0);
    r.step(1);
    const std::int64_t saved_step = r.cpp->steps();
    // The same state saved through both: the same bytes.
    const std::string c_file = dir.file("c.safetensors"), cpp_file = dir.file("cpp.safetensors");
    const char* keys[2] = {"epoch", "note"};
    const char* values[2] = {"3", "written through the C API"};
    if (!C_OK(shardopt_save(r.c.h, c_file.c_str(), 1, keys, values, 2))) r.note("save failed");
    r.cpp->save(cpp_file,
                SaveOptions{.metadata = {{"epoch", "3"}, {"note", "written through the C API"}}});
    MPI_Barrier(MPI_COMM_WORLD);
    if (read_file(c_file) != read_file(cpp_file) || read_file(c_file).empty())
      r.note("the two checkpoints differ");
    // Exports, in both forms.
    for (int fp32 = 0; fp32 <= 1; ++fp32) {
      const std::string ce = dir.file("c-export.safetensors"),
                        pe = dir.file("cpp-export.safetensors");
      if (!C_OK(shardopt_export(r.c.h, ce.c_str(), fp32))) r.note("export failed");
      r.cpp->export_params(pe, ExportOptions{.fp32 = fp32 == 1});
      MPI_Barrier(MPI_COMM_WORLD);
      if (read_file(ce) != read_file(pe) || read_file(ce).empty())
        r.note("the exports differ (fp32 " + std::to_string(fp32) + ")");
    }
    // Both move on, then each loads the other's file: back to the saved
    // state, and the load reports agree.
    r.step(2);
    shardopt_load_report_t cr;
    std::memset(&cr, 0x5a, sizeof cr);
    if (!C_OK(shardopt_load(r.c.h, cpp_file.c_str(), 1, 1, &cr))) r.note("load failed");
    const LoadReport pr = r.cpp->load(c_file);
    if (cr.step != pr.step || cr.saved_ranks != pr.saved_ranks ||
        (cr.hyper_parameters != 0) != pr.hyper_parameters || cr.loaded != pr.loaded.size() ||
        cr.missing != pr.missing.size() || cr.unexpected != pr.unexpected.size() ||
        cr.mismatched != pr.mismatched.size() || cr.step != saved_step ||
        cr.saved_ranks != world_size())
      r.note("the load reports differ: " + pr.summary());
    // Metadata both ways.
    if (pr.metadata !=
        std::map<std::string, std::string>{{"epoch", "3"}, {"note", "written through the C API"}})
      r.note("the C++ load did not return the C save's metadata");
    char value[64] = "";
    if (!C_OK(shardopt_load_metadata(r.c.h, "note", value, sizeof value)) ||
        std::string(value) != "written through the C API")
      r.note(std::string("load_metadata: ") + value);
    r.compare_params("after the cross loads");
    r.step(3);
    r.compare_final();
    // A truncated file, garbage and a missing one: the same error on every
    // rank through both (naming the file, but for the truncated one, whose
    // message names the tensor past its end), and the optimizers unchanged.
    const std::string truncated = dir.file("truncated.safetensors");
    if (world_rank() == 0) {
      const std::string bytes = read_file(c_file);
      std::ofstream(truncated, std::ios::binary) << bytes.substr(0, bytes.size() / 2);
      std::ofstream(dir.file("garbage.safetensors"), std::ios::binary) << "not a checkpoint at all";
    }
    MPI_Barrier(MPI_COMM_WORLD);
    for (const std::string& bad :
         {truncated, dir.file("garbage.safetensors"), dir.file("missing.safetensors")}) {
      const shardopt_status_t st = shardopt_load(r.c.h, bad.c_str(), 1, 1, nullptr);
      int cpp_code = SHARDOPT_SUCCESS;
      try {
        r.cpp->load(bad);
      } catch (const Error& e) {
        cpp_code = e.status();
      }
      INFO(bad << ": C " << shardopt_status_name(st) << " (" << shardopt_last_error() << "), C++ "
               << shardopt_status_name(static_cast<shardopt_status_t>(cpp_code)));
      CHECK(all_ranks_true(
          st == cpp_code && (st == SHARDOPT_ERR_CHECKPOINT || st == SHARDOPT_ERR_IO) &&
          (bad == truncated ||
           std::string(shardopt_last_error()).find(bad.substr(bad.rfind('/') + 1)) !=
               std::string::npos) &&
          shardopt_last_error_hint()[0] != '\0'));
    }
    r.step(4);
    INFO(r.diff);
    CHECK(all_ranks_true(r.diff.empty()));
  }
}

TEST_CASE("the C functional steps equal shardopt::functional's", "[capi][functional]") {
  std::string diff;
  std::uint64_t key = data_key(0xf0c);
  for (const auto& groups : all_group_pairs()) {
    for (const OptimizerConfig& cfg : groups) {
      std::visit(
          [&](const auto& o) {
            using O = std::remove_cvref_t<decltype(o)>;
            if constexpr (is_optimizer<O>) {
              // The slots' names and count.
              int num = -1;
              char name[64];
              const std::vector<std::string> slots = slot_names(o);
              const bool lamb = std::is_same_v<O, Lamb>;
              int k = 0;
              o.slots([&](const Slot& s) {
                if (!c_ok(shardopt_functional_slots(spec_of(o).c_str(), &num, k, name, sizeof name),
                          "shardopt_functional_slots") ||
                    std::string(name) != s.name)
                  diff = std::string(O::key) + ": slot " + std::to_string(k) + " is '" + name +
                         "', expected " + s.name;
                ++k;
              });
              if (num != static_cast<int>(slots.size()) + (lamb ? 1 : 0))
                diff = std::string(O::key) + ": " + std::to_string(num) + " state buffers";
              for (DType gt : {DType::f32, DType::bf16, DType::f16})
                for (bool rem : {false, true})
                  for (bool skip : {false, true}) {
                    const std::string d = functional_case(o, gt, rem, skip, ++key);
                    if (!d.empty() && diff.empty())
                      diff = spec_of(o) + ", gradients " + dtype_name(gt) +
                             (rem ? ", bf16 with remainders" : "") +
                             (skip ? ", skip_nonfinite" : "") + ": " + d;
                  }
            }
          },
          cfg);
    }
  }
  INFO(diff);
  CHECK(all_ranks_true(diff.empty()));
}

TEST_CASE("the C API's last error belongs to the thread", "[capi][errors]") {
  int count = 0;
  REQUIRE(shardopt_device_count(&count) == SHARDOPT_SUCCESS);
  shardopt_clear_error();
  CHECK(shardopt_comm_rank(nullptr, &count) == SHARDOPT_ERR_INVALID_ARGUMENT);
  const std::string mine = shardopt_last_error();
  std::string theirs_before, theirs_after;
  shardopt_status_t theirs_status = SHARDOPT_SUCCESS;
  std::thread other([&] {
    theirs_before = shardopt_last_error();
    theirs_status = shardopt_set_lr(nullptr, 0.1, 0);
    theirs_after = shardopt_last_error();
  });
  other.join();
  CHECK(theirs_before.empty());
  CHECK(theirs_status == SHARDOPT_ERR_INVALID_ARGUMENT);
  CHECK(!theirs_after.empty());
  CHECK(theirs_after != mine);
  CHECK(shardopt_last_error() == mine);
  CHECK(shardopt_last_status() == SHARDOPT_ERR_INVALID_ARGUMENT);
  CHECK(all_ranks_true(true));
}
