// shardopt apps: the harness of the optimizer benchmarks, shared by
// shardopt-bench-optim (host memory) and shardopt-bench-optim-gpu (a CUDA
// device): the description of a program and of its options, the arrays a
// run needs and their random values, the memory a program times on
// (bench::Memory, below: a program derives one, with its arrays, its
// memory-only kernel, its clock and its reference rate) and the timing of
// a series. sweep.hpp sweeps sizes x lanes x optimizers x precisions with
// them, prints the rows and judges the goal; a program's main() is
// bench::main_of(memory, argc, argv).
//
// The optimizers are one table, bench::optimizers() (optim_steps.hpp): the
// harness iterates it for the options, the sweep, the byte counts and the
// goal, and a memory-only kernel takes its shape (state arrays, one pass or
// two) from the entry.
#pragma once

#include <algorithm>
#include <array>
#include <chrono>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <exception>
#include <functional>
#include <optional>
#include <random>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "../support/cli.hpp"
#include "../support/machine.hpp"
#include "../support/optim_steps.hpp"
#include "../support/report.hpp"
#include "shardopt/build_info.hpp"
#include "shardopt/error.hpp"
#include "shardopt/half.hpp"
#include "shardopt/types.hpp"

namespace bench {

// The seed of every random value and of the order of the timed pairs.
constexpr std::uint64_t kSeed = 0x243f6a8885a308d3ULL;
// The goal is judged on the rows with at least this many parameters.
constexpr std::size_t kGoalNumel = std::size_t{16} << 20;
// A row is marked busy when other processes used more than this fraction of
// the machine while it ran (Memory::other_load).
constexpr double kBusyFraction = 0.05;

inline double gib(std::size_t bytes) { return static_cast<double>(bytes) / (1 << 30); }

// ---------------------------------------------------------------------------
// What a program is

// How many times to run a series: at least `reps` after `warmup`, or with a
// budget about budget_s seconds worth, up to max_reps.
struct Series {
  int warmup, reps;
  double budget_s;
  int max_reps;
};

// The columns of the table that differ between the programs: the title and
// width of the threads column, the width of time_us, the digits of the
// rates, the reference rate's title, and whether a column shows the other
// processes' load.
struct Table {
  const char* threads;
  int threads_width, time_width, rate_digits;
  const char* reference;
  bool load;
};

// The goal: a step at `at_least` or better of its limit (the ratio), or of
// the reference rate with of_reference; names_threads: the verdict names
// the worst row's thread count.
struct Goal {
  double at_least;
  bool of_reference;
  bool names_threads;
};

struct Program {
  const char* name;
  const char* sizes_option;  // the long name of -s
  std::vector<std::size_t> default_sizes;
  // The defaults of -w and -n, the budget of a series (0: exactly -n) and
  // the most -n accepts (and a series runs).
  Series series;
  // Whether the memory-only kernel handles bf16 parameters with remainders
  // (the bf16-rem precision).
  bool remainders;
  Table table;
  Goal goal;
};

// The precisions a program offers: the table's, without bf16 parameters with
// remainders unless its memory-only kernel handles them.
inline const std::vector<Precision>& precisions(bool remainders) {
  static const auto of = [](bool rem) {
    std::vector<Precision> v;
    for (const Precision& p : kPrecisions) {
      if (rem || !p.remainders) v.push_back(p);
    }
    return v;
  };
  static const std::vector<Precision> with = of(true), without = of(false);
  return remainders ? with : without;
}

// ---------------------------------------------------------------------------
// Options

struct Options {
  std::vector<std::size_t> sizes;
  std::vector<const OptimizerEntry*> optimizers;
  std::vector<const Precision*> precisions;
  int reps = 0;
  int warmup = 0;
  bool json = false;
  bool help = false;
};

// The usage lines of -o and -p: the optimizers' names, the default
// precisions and one line per precision.
inline std::string optimizer_and_precision_usage(const Program& p) {
  std::string defaults, lines;
  for (const Precision& e : precisions(p.remainders)) {
    if (e.by_default) defaults += std::string(defaults.empty() ? "" : ",") + e.name;
    lines += std::string("                          ") + e.name +
             std::string(10 - std::strlen(e.name), ' ') + e.description + "\n";
  }
  return "  -o, --optimizers LIST   comma-separated, or all (default all): " +
         names_of(optimizers()) + "\n  -p, --precisions LIST   comma-separated, or all (default " +
         defaults + "):\n" + lines;
}

// ---------------------------------------------------------------------------
// The arrays of a run

// The arrays the chosen optimizers and precisions use, each one element per
// parameter.
struct Needs {
  std::size_t states = 0;
  bool scratch = false, f32_params = false, remainders = false;
  bool grad32 = false, grad_bf16 = false, grad_f16 = false, copy = false;

  explicit Needs(const Options& o) {
    for (const auto* e : o.optimizers) {
      states = std::max(states, e->states.size());
      scratch |= e->scratch != nullptr;
    }
    for (const auto* p : o.precisions) {
      f32_params |= !p->remainders;
      remainders |= p->remainders;
      grad32 |= p->grad == DType::f32;
      grad_bf16 |= p->grad == DType::bf16;
      grad_f16 |= p->grad == DType::f16;
      copy |= p->copy;
    }
  }
  // Their bytes per parameter.
  std::size_t bytes() const {
    return (f32_params ? 4 : 0) + (remainders ? 4 : 0) + 4 * states + (scratch ? 4 : 0) +
           (grad32 ? 4 : 0) + (grad_bf16 ? 2 : 0) + (grad_f16 ? 2 : 0) + (copy ? 2 : 0);
  }
};

// Where the arrays are; null for those not needed.
struct ArraySet {
  float* param = nullptr;
  shardopt::bfloat16* param_bf16 = nullptr;
  std::uint16_t* remainders = nullptr;
  std::array<float*, kMaxStates> state{};
  void* grad32 = nullptr;
  void* grad_bf16 = nullptr;
  void* grad_f16 = nullptr;
  void* copy = nullptr;
  float* scratch = nullptr;
};

// The arrays for n parameters, each a Buffer (shardopt::HostBuffer or a
// device buffer: made from a byte count, none for 0; as<T>()).
template <class Buffer>
class Arrays {
 public:
  Arrays(const Needs& need, std::size_t n)
      : param_(need.f32_params ? n * 4 : 0),
        param_bf16_(need.remainders ? n * 2 : 0),
        remainders_(need.remainders ? n * 2 : 0),
        grad32_(need.grad32 ? n * 4 : 0),
        grad_bf16_(need.grad_bf16 ? n * 2 : 0),
        grad_f16_(need.grad_f16 ? n * 2 : 0),
        copy_(need.copy ? n * 2 : 0),
        scratch_(need.scratch ? n * 4 : 0) {
    for (std::size_t i = 0; i < need.states; ++i) states_.emplace_back(n * 4);
  }

  ArraySet pointers() {
    ArraySet a;
    a.param = param_.template as<float>();
    a.param_bf16 = param_bf16_.template as<shardopt::bfloat16>();
    a.remainders = remainders_.template as<std::uint16_t>();
    for (std::size_t i = 0; i < states_.size(); ++i) a.state[i] = states_[i].template as<float>();
    a.grad32 = grad32_.template as<void>();
    a.grad_bf16 = grad_bf16_.template as<void>();
    a.grad_f16 = grad_f16_.template as<void>();
    a.copy = copy_.template as<void>();
    a.scratch = scratch_.template as<float>();
    return a;
  }

 private:
  Buffer param_, param_bf16_, remainders_, grad32_, grad_bf16_, grad_f16_, copy_, scratch_;
  std::vector<Buffer> states_;
};

// The arrays of one step of `opt` in precision `prec` over the first n
// parameters.
inline Streams streams_of(const ArraySet& a, std::size_t n, const OptimizerEntry& opt,
                          const Precision& prec, void* stream) {
  Streams s;
  s.n = n;
  if (prec.remainders) {
    s.param_bf16 = a.param_bf16;
    s.remainders = a.remainders;
  } else {
    s.param = a.param;
  }
  for (std::size_t i = 0; i < opt.states.size(); ++i) s.state[i] = a.state[i];
  s.grad_type = prec.grad;
  s.grad = prec.grad == DType::bf16 ? a.grad_bf16 : prec.grad == DType::f16 ? a.grad_f16 : a.grad32;
  s.copy = prec.copy ? a.copy : nullptr;
  s.copy_type = prec.copy_type;
  s.scratch = opt.scratch != nullptr ? a.scratch : nullptr;
  s.stream = stream;
  return s;
}

// ---------------------------------------------------------------------------
// Random values: one array's, the same on the host and on a device

struct Fill {
  enum class As { f32, bf16, f16, remainders };
  void* data;                 // of `as`; the bf16 parameters for remainders
  std::uint16_t* remainders;  // with As::remainders
  As as;
  std::uint64_t key;
  float lo, hi;

  // Stores element i: uniform(key, i, lo, hi) as `as` (for remainders the
  // fp32 value as bf16 parameter and remainder, as optim.hpp encodes them).
  SHARDOPT_HOST_DEVICE void store(std::size_t i) const {
    const float v = uniform(key, i, lo, hi);
    switch (as) {
      case As::f32:
        static_cast<float*>(data)[i] = v;
        break;
      case As::bf16:
        static_cast<std::uint16_t*>(data)[i] = shardopt::bf16_from_float(v).bits;
        break;
      case As::f16:
        static_cast<std::uint16_t*>(data)[i] = shardopt::f16_from_float(v).bits;
        break;
      case As::remainders: {
        std::uint32_t u;
        std::memcpy(&u, &v, sizeof u);
        const auto top = static_cast<std::uint16_t>((u + 0x8000u) >> 16);
        static_cast<std::uint16_t*>(data)[i] = top;
        remainders[i] = static_cast<std::uint16_t>(u - (static_cast<std::uint32_t>(top) << 16));
        break;
      }
    }
  }
};

// The key of the random values of arrays allocated for n parameters.
inline std::uint64_t fill_key(std::size_t n) { return mix64(kSeed + n); }

// The fill of the gradients of type t: in [-1e-2, 1e-2).
inline Fill grad_fill(const ArraySet& a, DType t, std::uint64_t key) {
  switch (t) {
    case DType::bf16:
      return {a.grad_bf16, nullptr, Fill::As::bf16, key + 10, -1e-2f, 1e-2f};
    case DType::f16:
      return {a.grad_f16, nullptr, Fill::As::f16, key + 11, -1e-2f, 1e-2f};
    default:
      return {a.grad32, nullptr, Fill::As::f32, key + 12, -1e-2f, 1e-2f};
  }
}

// The fills of every array of `a` there is: parameters in [-1, 1) (fp32,
// or the same values as bf16 with remainders), states in [0, 1e-2) (some are
// sums of squares: v, Adagrad's sum, RMSprop's sq), gradients.
inline std::vector<Fill> fills(const ArraySet& a, std::uint64_t key) {
  std::vector<Fill> f;
  if (a.param != nullptr) f.push_back({a.param, nullptr, Fill::As::f32, key + 1, -1.0f, 1.0f});
  if (a.param_bf16 != nullptr)
    f.push_back({a.param_bf16, a.remainders, Fill::As::remainders, key + 1, -1.0f, 1.0f});
  for (std::size_t s = 0; s < a.state.size(); ++s) {
    if (a.state[s] != nullptr)
      f.push_back({a.state[s], nullptr, Fill::As::f32, key + 2 + s, 0.0f, 1e-2f});
  }
  for (DType t : {DType::f32, DType::bf16, DType::f16}) {
    const Fill g = grad_fill(a, t, key);
    if (g.data != nullptr) f.push_back(g);
  }
  return f;
}

// ---------------------------------------------------------------------------
// The memory a benchmark runs in

struct Lane {
  int threads;            // OpenMP threads, or a device's SMs
  double reference_gbps;  // STREAM triad, or a device-to-device copy
};

class Memory {
 public:
  virtual ~Memory() = default;
  virtual const Program& program() const = 0;

  // Options of its own beside the shared ones: their specs, and each one
  // given (name is the long name, label the option as messages name it).
  virtual std::span<const cli::OptionSpec> own_options() const { return {}; }
  virtual void set_option(std::string_view name, const std::string& label, std::string_view value) {
    (void)name, (void)label, (void)value;
  }
  // The text of -h.
  virtual std::string usage() const = 0;
  // After the options: throws cli::UsageError if the program cannot run so.
  virtual void check_launch() const {}
  // Before the run: an exit status if there is nothing to measure here (the
  // reason printed).
  virtual std::optional<int> unavailable() const { return std::nullopt; }

  // Prints the lines that describe the machine to `info`, may add arrays of
  // its own to `needs`, and prepares what every size uses; an exit status
  // to stop with, or 0.
  virtual int start(const Options& o, Needs& needs, FILE* info) = 0;
  // Makes the arrays for n parameters ready, filled (fill_key(), fills()),
  // and returns true; false for a size it skips (said why on `info`).
  virtual bool prepare(std::size_t n, const Needs& needs, FILE* info) = 0;
  virtual ArraySet arrays() = 0;
  // The lanes of size n, each with its reference rate measured; and
  // entering one (the OpenMP threads of the rows that follow).
  virtual std::vector<Lane> lanes(std::size_t n, const Series& series) = 0;
  virtual void enter(const Lane& lane) { (void)lane; }
  // The steps' StepOptions::stream.
  virtual void* stream() const { return nullptr; }
  // Seconds that f takes, on its clock.
  virtual double seconds(const std::function<void()>& f) = 0;
  // The memory-only kernel of a step of `opt` over s.
  virtual void memory_only(const Streams& s, const OptimizerEntry& opt) = 0;

  // The share of the machine other processes used since row_started(); -1
  // unknown or not measured.
  virtual void row_started() {}
  virtual double other_load() { return -1; }
  // The thread count the goal is judged at, and what the goal line says of
  // it (" with 8 threads (all cores)").
  virtual int goal_threads() const = 0;
  virtual std::string goal_scope() const { return ""; }
};

// ---------------------------------------------------------------------------
// Timing

// The times of a and b over the repetitions of a series, each its median,
// min and max in microseconds.
struct PairTimes {
  report::Stats a, b;
  int reps = 0;
};

// The repetitions of a series whose last run took `last` seconds: about
// budget_s worth, at least s.reps.
inline int series_reps(const Series& s, double last, double budget_s) {
  if (s.budget_s <= 0) return s.reps;
  const int budget_reps =
      last > 0 ? static_cast<int>(std::min<double>(s.max_reps, std::ceil(budget_s / last)))
               : s.max_reps;
  return std::max(s.reps, budget_reps);
}

// The times of a and of b on m's clock, timed alternately in a random order
// per pair, after warm-up: each pair sees the same state of the machine, so
// the ratio of the medians holds where the machine's memory bandwidth drifts.
inline PairTimes time_pair(Memory& m, const std::function<void()>& a,
                           const std::function<void()>& b, const Series& s, std::mt19937_64& rng) {
  double last = 0;
  for (int i = 0; i < s.warmup; ++i) last = m.seconds(a) + m.seconds(b);
  if (s.warmup == 0 && s.budget_s > 0) last = m.seconds(a) + m.seconds(b);
  const int reps = series_reps(s, last, 2 * s.budget_s);
  std::vector<double> ta, tb;
  ta.reserve(static_cast<std::size_t>(reps));
  tb.reserve(static_cast<std::size_t>(reps));
  for (int r = 0; r < reps; ++r) {
    if (rng() & 1) {
      ta.push_back(m.seconds(a));
      tb.push_back(m.seconds(b));
    } else {
      tb.push_back(m.seconds(b));
      ta.push_back(m.seconds(a));
    }
  }
  return {report::stats_of(std::move(ta)), report::stats_of(std::move(tb)), reps};
}

// Median seconds of a on m's clock, after warm-up.
inline double time_median(Memory& m, const std::function<void()>& a, const Series& s) {
  double last = 0;
  for (int i = 0; i < s.warmup; ++i) last = m.seconds(a);
  if (s.warmup == 0 && s.budget_s > 0) last = m.seconds(a);
  const int reps = series_reps(s, last, s.budget_s);
  std::vector<double> t;
  t.reserve(static_cast<std::size_t>(reps));
  for (int r = 0; r < reps; ++r) t.push_back(m.seconds(a));
  return report::median(t);
}

// Seconds that f takes on the host's steady clock.
inline double wall_seconds(const std::function<void()>& f) {
  const auto t0 = std::chrono::steady_clock::now();
  f();
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

}  // namespace bench
