// shardopt apps: the sweep of the optimizer benchmarks (harness.hpp's
// parts): sizes x lanes x optimizers x precisions, each step timed beside
// its memory-only kernel, the rows printed as a table or JSON, the goal
// judged; the options parsed and bench::main_of, a program's main().
#pragma once

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdio>
#include <exception>
#include <optional>
#include <random>
#include <string>
#include <vector>

#include "harness.hpp"

namespace bench {

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
