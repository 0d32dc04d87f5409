// shardopt apps: the harness of the optimizer benchmarks, shared by
// shardopt-bench-optim (host memory) and shardopt-bench-optim-gpu (a CUDA
// device). It parses the shared options, works out the arrays a run needs
// and their random values, sweeps sizes x lanes x optimizers x precisions,
// times each step beside its memory-only kernel, prints the table or the
// JSON rows and judges the goal. What depends on the memory is a
// bench::Memory (below): a program derives one, with its arrays, its
// memory-only kernel, its clock and its reference rate, and its main() is
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

#include "cli.hpp"
#include "machine.hpp"
#include "optim_steps.hpp"
#include "report.hpp"
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

// ---------------------------------------------------------------------------
// The rows

// A rate's median and its spread over the repetitions: GB/s of the median
// time, of the slowest and of the fastest repetition.
struct Rate {
  double median = 0, min = 0, max = 0;
};

// The rate of moving `bytes` in the times t.
inline Rate rate_of(double bytes, const report::Stats& t) {
  return {bytes / t.median_us / 1e3, bytes / t.max_us / 1e3, bytes / t.min_us / 1e3};
}

struct Row {
  const OptimizerEntry* opt;
  const Precision* prec;
  std::size_t numel;
  int threads;
  std::size_t bpp;
  report::Stats step_us{}, limit_us{};  // the step's and the limit's times
  int reps = 0;                         // pairs timed
  Rate gbps{}, limit_gbps{};
  double reference_gbps = 0;
  double ratio = 0;        // of the medians: limit time / step time
  double other_load = -1;  // other processes' share of the CPUs during the row; -1 unknown
};

// "min-max" of a rate, with `digits` decimals.
inline std::string rate_range(const Rate& r, int digits) {
  char buf[48];
  std::snprintf(buf, sizeof buf, "%.*f-%.*f", digits, r.min, digits, r.max);
  return buf;
}

inline void print_table_header(const Table& t) {
  std::printf("#\n# %-8s %-10s %6s %*s %4s %*s %8s %15s %8s %15s %8s %6s", "optimizer", "precision",
              "numel", t.threads_width, t.threads, "B_pp", t.time_width, "time_us", "GB/s",
              "min-max", "limit", "min-max", t.reference, "ratio");
  if (t.load) std::printf(" %6s", "other");
  std::printf("  %s\n", "bytes per param (r read, w written)");
}

inline void print_row(const Table& t, const Options& o, const Row& r) {
  using report::num;
  if (o.json) {
    std::printf(
        "{\"optimizer\": \"%s\", \"precision\": \"%s\", \"numel\": %zu, \"threads\": %d, "
        "\"bytes_per_param\": %zu, \"time_us\": %s, \"gbps\": %s, \"limit_gbps\": %s, "
        "\"stream_gbps\": %s, \"ratio\": %s, \"reps\": %d, \"time_us_min\": %s, "
        "\"time_us_max\": %s, \"limit_time_us\": %s, \"limit_time_us_min\": %s, "
        "\"limit_time_us_max\": %s, \"gbps_min\": %s, \"gbps_max\": %s, "
        "\"limit_gbps_min\": %s, \"limit_gbps_max\": %s, \"other_load\": %s}\n",
        r.opt->name, r.prec->name, r.numel, r.threads, r.bpp, num(r.step_us.median_us, 2).c_str(),
        num(r.gbps.median, 3).c_str(), num(r.limit_gbps.median, 3).c_str(),
        num(r.reference_gbps, 3).c_str(), num(r.ratio, 4).c_str(), r.reps,
        num(r.step_us.min_us, 2).c_str(), num(r.step_us.max_us, 2).c_str(),
        num(r.limit_us.median_us, 2).c_str(), num(r.limit_us.min_us, 2).c_str(),
        num(r.limit_us.max_us, 2).c_str(), num(r.gbps.min, 3).c_str(), num(r.gbps.max, 3).c_str(),
        num(r.limit_gbps.min, 3).c_str(), num(r.limit_gbps.max, 3).c_str(),
        r.other_load >= 0 ? num(r.other_load, 3).c_str() : "null");
  } else {
    const int d = t.rate_digits;
    std::printf("%-10s %-10s %6s %*d %4zu %*.1f %8.*f %15s %8.*f %15s %8.*f %6.3f", r.opt->name,
                r.prec->name, cli::human_count(r.numel).c_str(), t.threads_width, r.threads, r.bpp,
                t.time_width, r.step_us.median_us, d, r.gbps.median, rate_range(r.gbps, d).c_str(),
                d, r.limit_gbps.median, rate_range(r.limit_gbps, d).c_str(), d, r.reference_gbps,
                r.ratio);
    if (t.load) {
      char other[16] = "?";
      if (r.other_load >= 0) {
        std::snprintf(other, sizeof other, "%3.0f%%%s", 100 * r.other_load,
                      r.other_load > kBusyFraction ? "*" : " ");
      }
      std::printf(" %6s", other);
    }
    std::printf("  %s\n", bytes_formula(*r.opt, *r.prec).c_str());
  }
  std::fflush(stdout);
}

// ---------------------------------------------------------------------------
// The goal

// The value the goal is judged on: the ratio to the limit, or the fraction
// of the reference rate.
inline double goal_value(const Program& p, const Row& r) {
  return p.goal.of_reference ? r.gbps.median / r.reference_gbps : r.ratio;
}

inline void print_goal(const Program& p, Memory& m, const std::vector<Row>& rows, const Options& o,
                       FILE* info) {
  const std::string at = cli::human_count(kGoalNumel);
  const std::string metric =
      p.goal.of_reference ? std::string("GB/s / ") + p.table.reference : "ratio";
  if (p.goal.of_reference) {
    std::fprintf(info, "#\n# goal: a step at >= %.2f of the %s rate at >= %s params%s\n",
                 p.goal.at_least, p.table.reference, at.c_str(), m.goal_scope().c_str());
  } else {
    std::fprintf(info, "#\n# goal: ratio >= %.2f at >= %s params%s\n", p.goal.at_least, at.c_str(),
                 m.goal_scope().c_str());
  }
  const int threads = m.goal_threads();
  const Row* worst = nullptr;
  for (const auto* opt : o.optimizers) {
    for (const auto* prec : o.precisions) {
      const Row* w = nullptr;
      double min_ratio = INFINITY;  // over the rows judged, not only the worst
      for (const Row& r : rows) {
        if (r.opt != opt || r.prec != prec || r.numel < kGoalNumel || r.threads != threads)
          continue;
        if (w == nullptr || goal_value(p, r) < goal_value(p, *w)) w = &r;
        min_ratio = std::min(min_ratio, r.ratio);
      }
      if (w == nullptr) {
        std::fprintf(info, "#   %-10s %-10s not evaluated: no row at >= %s params\n", opt->name,
                     prec->name, at.c_str());
        continue;
      }
      const double v = goal_value(p, *w);
      std::string ratio_part;
      if (p.goal.of_reference) {
        char buf[64];
        std::snprintf(buf, sizeof buf, "ratio to the limit %.3f; worst ", min_ratio);
        ratio_part = buf;
      }
      std::fprintf(info, "#   %-10s %-10s worst %s%s %.3f (%s params): %s\n", opt->name, prec->name,
                   ratio_part.c_str(), metric.c_str(), v, cli::human_count(w->numel).c_str(),
                   v >= p.goal.at_least ? "met" : "not met");
      if (worst == nullptr || v < goal_value(p, *worst)) worst = w;
    }
  }
  const auto busy = std::count_if(rows.begin(), rows.end(),
                                  [](const Row& r) { return r.other_load > kBusyFraction; });
  machine::print_busy_rows(info, static_cast<std::size_t>(busy), rows.size(), kBusyFraction,
                           "marked * in the table", "this kernel's");
  if (worst == nullptr) {
    std::fprintf(info, "# goal: not evaluated (run sizes >= %s)\n", at.c_str());
    return;
  }
  const double v = goal_value(p, *worst);
  std::string threads_part;
  if (p.goal.names_threads) threads_part = std::to_string(worst->threads) + " threads, ";
  std::fprintf(info, "# goal: %s; worst row: %s %s %s params, %s%s %.3f\n",
               v >= p.goal.at_least ? "met" : "not met", worst->opt->name, worst->prec->name,
               cli::human_count(worst->numel).c_str(), threads_part.c_str(), metric.c_str(), v);
}

// ---------------------------------------------------------------------------
// The run

inline Options parse_options(Memory& m, int argc, char** argv) {
  const Program& p = m.program();
  Options o;
  o.sizes = p.default_sizes;
  for (const auto& e : optimizers()) o.optimizers.push_back(&e);
  for (const Precision& e : precisions(p.remainders)) {
    if (e.by_default) o.precisions.push_back(&e);
  }
  o.reps = p.series.reps;
  o.warmup = p.series.warmup;

  std::vector<cli::OptionSpec> specs = {
      {'s', p.sizes_option, true}, {'o', "optimizers", true}, {'p', "precisions", true},
      {'n', "reps", true},         {'w', "warmup", true},     {0, "json", false},
      {'h', "help", false},
  };
  for (const cli::OptionSpec& s : m.own_options()) specs.push_back(s);
  cli::for_each_option(
      argc, argv, specs,
      [&](const cli::OptionSpec& spec, const std::string& label, std::string_view v) {
        const std::string_view name = spec.long_name;
        if (name == p.sizes_option) {
          o.sizes.clear();
          for (std::string_view item : cli::split(v)) {
            const auto n = cli::parse_scaled(item, std::uint64_t{1} << 40);
            if (!n) {
              cli::bad_value(label, v,
                             "positive counts with an optional K, M or G suffix, e.g. 1M,16M");
            }
            o.sizes.push_back(*n);
          }
        } else if (name == "optimizers") {
          o.optimizers = choose(label, v, optimizers());
        } else if (name == "precisions") {
          o.precisions = choose(label, v, precisions(p.remainders));
        } else if (name == "reps") {
          o.reps = cli::parse_int(label, v, 1, p.series.max_reps,
                                  "an integer, 1 to " + std::to_string(p.series.max_reps));
        } else if (name == "warmup") {
          o.warmup = cli::parse_int(label, v, 0, 1000, "an integer, 0 to 1000");
        } else if (name == "json") {
          o.json = true;
        } else if (name == "help") {
          o.help = true;
        } else {
          m.set_option(name, label, v);
        }
      });
  std::sort(o.sizes.begin(), o.sizes.end());
  o.sizes.erase(std::unique(o.sizes.begin(), o.sizes.end()), o.sizes.end());
  return o;
}

// Every row: for each size the memory prepares, each lane, each optimizer
// and each precision, the step beside the memory-only kernel; then the goal.
inline int run(Memory& m, const Options& o) {
  const Program& p = m.program();
  // Header and summary go to stderr with --json, so stdout holds rows only.
  FILE* info = o.json ? stderr : stdout;
  std::fprintf(info, "# %s: %s\n", p.name, shardopt::build_info_string().c_str());
  Needs needs(o);
  if (const int rc = m.start(o, needs, info); rc != 0) return rc;
  if (!o.json) print_table_header(p.table);

  const Series series{o.warmup, o.reps, p.series.budget_s, p.series.max_reps};
  std::vector<Row> rows;
  std::mt19937_64 rng(kSeed);
  for (const std::size_t n : o.sizes) {
    if (!m.prepare(n, needs, info)) continue;
    for (const Lane& lane : m.lanes(n, series)) {
      m.enter(lane);
      for (const auto* opt : o.optimizers) {
        for (const auto* prec : o.precisions) {
          const Streams s = streams_of(m.arrays(), n, *opt, *prec, m.stream());
          std::int64_t step = 0;
          m.row_started();
          const PairTimes t = time_pair(
              m, [&] { opt->step(s, ++step); }, [&] { m.memory_only(s, *opt); }, series, rng);
          Row r{opt, prec, n, lane.threads, bytes_per_param(*opt, *prec)};
          r.other_load = m.other_load();
          const double bytes = static_cast<double>(n) * static_cast<double>(r.bpp);
          r.step_us = t.a;
          r.limit_us = t.b;
          r.reps = t.reps;
          r.gbps = rate_of(bytes, t.a);
          r.limit_gbps = rate_of(bytes, t.b);
          r.reference_gbps = lane.reference_gbps;
          r.ratio = t.b.median_us / t.a.median_us;
          print_row(p.table, o, r);
          rows.push_back(r);
        }
      }
    }
  }
  print_goal(p, m, rows, o, info);
  return 0;
}

// The main() of an optimizer benchmark: exit status 0 all steps ran, 1 a
// step or an allocation failed, 2 a bad option, or m.unavailable()'s.
inline int main_of(Memory& m, int argc, char** argv) {
  const char* program = m.program().name;
  Options o;
  try {
    o = parse_options(m, argc, argv);
    m.check_launch();
  } catch (const cli::UsageError& e) {
    std::fprintf(stderr, "%s: %s\n(%s -h lists the options)\n", program, e.message.c_str(),
                 program);
    return 2;
  }
  if (o.help) {
    std::fputs(m.usage().c_str(), stdout);
    return 0;
  }
  if (const auto rc = m.unavailable()) return *rc;
  try {
    return run(m, o);
  } catch (const shardopt::Error& e) {
    std::fprintf(stderr, "%s: %s\n  hint: %s\n", program, e.what(), e.hint().c_str());
  } catch (const std::exception& e) {
    std::fprintf(stderr, "%s: %s\n", program, e.what());
  }
  return 1;
}

}  // namespace bench
