// shardopt apps: the optimizer steps that the optimizer benchmarks time
// (shardopt-bench-optim on the host, shardopt-bench-optim-gpu on a CUDA
// device): the arrays of one step, one functional call per optimizer, the
// precisions, the bytes a step moves per parameter, and the random values
// the arrays are filled with. The functional API takes host or device
// buffers alike, so the same calls serve both programs.
#pragma once

#include <algorithm>
#include <array>
#include <cstddef>
#include <cstdint>
#include <iterator>
#include <span>
#include <string>
#include <string_view>
#include <type_traits>
#include <vector>

#include "cli.hpp"
#include "shardopt/half.hpp"
#include "shardopt/optim.hpp"
#include "shardopt/types.hpp"

namespace bench {

namespace functional = shardopt::functional;
using shardopt::DType;

// ---------------------------------------------------------------------------
// The arrays of one step

// The most fp32 state arrays (besides the parameters) an optimizer keeps.
constexpr int kMaxStates = 3;

// One step's arrays over n parameters, as the optimizer entries see them:
// all host memory or all memory of one CUDA device.
struct Streams {
  std::size_t n = 0;
  float* param = nullptr;  // fp32 (master) parameters: read, written
  // Instead of `param`: bf16 parameters and their 16-bit remainders (the fp32
  // master exactly, see functional::ParamView), both read and written.
  shardopt::bfloat16* param_bf16 = nullptr;
  std::uint16_t* remainders = nullptr;
  std::array<float*, kMaxStates> state{};  // fp32 optimizer state: read, written
  const void* grad = nullptr;              // gradients of grad_type: read
  DType grad_type = DType::f32;
  void* copy = nullptr;  // low-precision copy of the new params: written
  DType copy_type = DType::bf16;
  float* scratch = nullptr;  // two-pass steps: the direction, written then read
  void* stream = nullptr;    // device buffers: the cudaStream_t the step runs on

  functional::ParamView params() const {
    if (remainders != nullptr) return {std::span(param_bf16, n), std::span(remainders, n)};
    return {param, n};
  }
  std::span<float> state_span(int i) const { return {state[static_cast<std::size_t>(i)], n}; }
  std::span<float> scratch_span() const { return {scratch, n}; }
  functional::GradView grads() const { return {grad, n, grad_type}; }
  functional::StepOptions step_options() const {
    functional::StepOptions o;
    o.param_out = copy;
    o.param_out_dtype = copy_type;
    o.stream = stream;
    return o;
  }
};

// ---------------------------------------------------------------------------
// The optimizers: one entry each, from the optimizers' descriptors
// (shardopt/optimizers.hpp).
//
// `states` names the fp32 arrays the step reads and writes besides the
// parameters (one element per parameter each: the state slots its options
// use); with the precision it gives the bytes per parameter and the streams
// of the memory-only limit kernel. `step` runs one step with torch's default
// hyper-parameters (SGD with momentum 0.9, so that it keeps its state); `t`
// counts steps from 1. A step with a `scratch` array (LAMB) runs in two
// passes: the first reads p, g and the states and writes the states and the
// scratch direction; the second reads p and the direction and writes p (and
// the copy).

struct OptimizerEntry {
  const char* name;
  std::vector<const char*> states;
  void (*step)(const Streams& s, std::int64_t t);
  const char* scratch = nullptr;
};

// The options an optimizer is benchmarked with.
template <class O>
O bench_options() {
  O o{};
  if constexpr (std::is_same_v<O, shardopt::SGD>) o.momentum = 0.9;
  return o;
}

template <class O>
void step_of(const Streams& s, std::int64_t t) {
  const O o = bench_options<O>();
  if constexpr (shardopt::is_elementwise<O>) {
    std::array<std::span<float>, kMaxStates> states{};
    int used = 0, k = 0;
    o.slots([&](const shardopt::Slot& slot) {
      if (slot.used) states[std::size_t(k)] = s.state_span(used++);
      ++k;
    });
    functional::step(s.params(), s.grads(), std::span(states).first(std::size_t(k)), t, o,
                     s.step_options());
  } else {
    functional::lamb(s.params(), s.grads(), s.state_span(0), s.state_span(1), s.scratch_span(), t,
                     o, s.step_options());
  }
}

inline const std::vector<OptimizerEntry>& optimizers() {
  static const std::vector<OptimizerEntry> entries = [] {
    std::vector<OptimizerEntry> v;
    shardopt::Optimizers::each([&]<class O>() {
      OptimizerEntry e{O::key, {}, &step_of<O>};
      bench_options<O>().slots([&](const shardopt::Slot& slot) {
        if (slot.used) e.states.push_back(slot.name);
      });
      if constexpr (!shardopt::is_elementwise<O>) e.scratch = "update";
      v.push_back(e);
    });
    return v;
  }();
  return entries;
}

// ---------------------------------------------------------------------------
// Precisions

struct Precision {
  const char* name;
  DType grad;
  bool copy;  // writes a low-precision copy of the new parameters
  DType copy_type;
  bool remainders;  // bf16 parameters with remainders instead of fp32 ones
  bool by_default;  // run when -p is not given
  const char* description;
};

// Every precision the benchmarks know; a program offers those its
// memory-only kernel handles (bench::precisions(), bench_optim/harness.hpp).
inline constexpr Precision kPrecisions[] = {
    {"fp32", DType::f32, false, DType::bf16, false, true, "f32 grads, no copy"},
    {"bf16", DType::bf16, true, DType::bf16, false, true,
     "bf16 grads, fp32 master + states, bf16 copy out"},
    {"f16", DType::f16, true, DType::f16, false, true,
     "f16 grads, fp32 master + states, f16 copy out"},
    {"bf16-rem", DType::bf16, false, DType::bf16, true, true,
     "bf16 grads, bf16 params with remainders (no fp32 master)"},
    {"fp32-bf16", DType::f32, true, DType::bf16, false, false,
     "f32 grads, fp32 master + states, bf16 copy out"},
};

// Bytes moved per parameter, every read and write counted once (per pass).
// bf16 parameters with remainders are 2 + 2 bytes, as many as fp32 ones.
inline std::size_t bytes_per_param(const OptimizerEntry& o, const Precision& p) {
  const std::size_t g = shardopt::dtype_size(p.grad);
  const std::size_t c = p.copy ? shardopt::dtype_size(p.copy_type) : 0;
  const std::size_t k = o.states.size();
  if (o.scratch != nullptr) return (4 + g + 4 * k) + (4 * k + 4) + (4 + 4) + (4 + c);
  return 4 * 2 * (1 + k) + g + c;
}

// "r p4 g2 m4 v4 + w p4 m4 v4 c2 = 28"; two passes separated by ';'. With
// remainders the parameters read "p2 rem2".
inline std::string bytes_formula(const OptimizerEntry& o, const Precision& p) {
  const std::string params = p.remainders ? "p2 rem2" : "p4";
  std::string f = "r " + params + " g" + std::to_string(shardopt::dtype_size(p.grad));
  for (const char* s : o.states) f += std::string(" ") + s + "4";
  f += o.scratch != nullptr ? " + w" : " + w " + params;
  for (const char* s : o.states) f += std::string(" ") + s + "4";
  if (o.scratch != nullptr) {
    f += std::string(" ") + o.scratch + "4; r " + params + " " + o.scratch + "4 + w " + params;
  }
  if (p.copy) f += " c" + std::to_string(shardopt::dtype_size(p.copy_type));
  return f + " = " + std::to_string(bytes_per_param(o, p));
}

// ---------------------------------------------------------------------------
// Choosing from a table

// The names of the entries of `table` (each with a `name`), space-separated,
// for usage texts and messages.
template <class Table>
std::string names_of(const Table& table) {
  std::string names;
  for (const auto& e : table) names += std::string(names.empty() ? "" : " ") + e.name;
  return names;
}

// The entries of `table` (each with a `name`) named in the comma-separated
// `value`, "all" for every one: each once, in table order. Throws
// cli::UsageError naming `label` and the accepted names otherwise.
template <class Table>
auto choose(const std::string& label, std::string_view value, const Table& table) {
  using Entry = std::remove_cvref_t<decltype(*std::begin(table))>;
  const std::string accepted = "all " + names_of(table);
  std::vector<const Entry*> named;
  for (std::string_view item : cli::split(value)) {
    bool found = item == "all";
    for (const Entry& e : table) {
      if (item == "all" || item == e.name) {
        named.push_back(&e);
        found = true;
      }
    }
    if (!found) cli::bad_value(label, item, accepted);
  }
  std::vector<const Entry*> chosen;
  for (const Entry& e : table) {
    if (std::find(named.begin(), named.end(), &e) != named.end()) chosen.push_back(&e);
  }
  return chosen;
}

// ---------------------------------------------------------------------------
// Random values, the same on the host and on a device

SHARDOPT_HOST_DEVICE inline std::uint64_t mix64(std::uint64_t z) {
  z += 0x9e3779b97f4a7c15ULL;
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
  return z ^ (z >> 31);
}

// Uniform in [lo, hi), a function of (key, i).
SHARDOPT_HOST_DEVICE inline float uniform(std::uint64_t key, std::size_t i, float lo, float hi) {
  const std::uint64_t h = mix64(key ^ mix64(i));
  const float u = static_cast<float>(h >> 40) * 0x1p-24f;
  return lo + (hi - lo) * u;
}

}  // namespace bench
