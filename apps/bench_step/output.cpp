// shardopt-bench-step: what rank 0 prints (output.hpp).
#include "output.hpp"

#include <omp.h>
#include <unistd.h>

#include <algorithm>
#include <cstdarg>
#include <cstdio>
#include <string>

#include "../support/bench_mpi.hpp"
#include "../support/cli.hpp"
#include "../support/machine.hpp"
#include "../support/report.hpp"

namespace bench_step {
namespace {

using cli::human_count;
using report::num;

// printf to stdout without trailing blanks.
__attribute__((format(printf, 1, 2))) void print_line(const char* format, ...) {
  std::va_list args;
  va_start(args, format);
  char line[512];
  std::vsnprintf(line, sizeof line, format, args);
  va_end(args);
  bench_mpi::TableLine l;
  l.add("%s", line);
  l.print();
}

// One JSON object, keys in the order added.
class JsonObject {
 public:
  void raw(const char* key, const std::string& value) {
    text_ += (text_.empty() ? "{" : ", ") + std::string("\"") + key + "\": " + value;
  }
  void str(const char* key, const char* value) { raw(key, std::string("\"") + value + "\""); }
  void count(const char* key, std::size_t value) { raw(key, std::to_string(value)); }
  void real(const char* key, double value, int digits) { raw(key, num(value, digits)); }
  std::string text() const { return text_ + "}"; }

 private:
  std::string text_;
};

}  // namespace

void print_header(const Options& o, const Bench& bench, int nranks, int local_ranks) {
  FILE* f = o.json ? stderr : stdout;
  std::fprintf(f, "# %s: a whole ZeRO step beside its limit (raw MPI collectives + kernel)\n",
               kProgram);
  std::fprintf(f, "# %s\n", shardopt::build_info_string().c_str());
  // Cores online, not omp_get_num_procs(): mpirun may bind a rank to one.
  std::fprintf(f, "# machine: %s, %ld cores online, %d rank%s here, %d OpenMP thread%s per rank\n",
               machine::cpu_model().c_str(), sysconf(_SC_NPROCESSORS_ONLN), local_ranks,
               local_ranks == 1 ? "" : "s", omp_get_max_threads(),
               omp_get_max_threads() == 1 ? "" : "s");
  std::fprintf(f,
               "# ranks %d, optimizer %s (%.0f state bytes per param), bucket %.3g MiB%s, warmup "
               "%d, iters %d (small sizes: more, about %.0f s per row, up to %d)\n",
               nranks, o.optimizer->name, bench.state_bytes(), bench.bucket_mb(),
               o.bucket_mb > 0 ? "" : " (SHARDOPT_BUCKET_MB)", o.warmup, o.iters, kSeriesBudgetS,
               std::max(o.iters, kMaxScaledIters));
  std::fprintf(f,
               "# times: medians over iterations of the slowest rank; limit = l_red + l_upd + "
               "l_gat (whole buffers); limit_b: the same with the collectives called per "
               "bucket; ratio = total / limit, rat_b = total / limit_b\n");
  std::fprintf(f,
               "# memory: mem = allocated + user params + user grads (MiB, largest rank); "
               "formula = zero_memory_formula + buckets at their most: %.0f of %.3g MiB (at most "
               "the model's gradient bytes each; stage 2: 1/ranks more each)\n",
               kBucketsCounted, bench.bucket_mb());
  if (std::find(o.stages.begin(), o.stages.end(), 2) != o.stages.end()) {
    for (Options::Grads g : o.grads)
      std::fprintf(f, "# stage 2 gradients (grads %s): %s\n", grads_name(g),
                   g == Options::Grads::owned
                       ? "owned by the optimizer (the formula adds the full gradient buffer)"
                   : g == Options::Grads::user
                       ? "the user's buffers (the formula adds the full gradient buffer)"
                       : "streamed into the buckets (stream_grads)");
  }
  if (std::find(o.dtypes.begin(), o.dtypes.end(), DType::bf16) != o.dtypes.end()) {
    std::fprintf(f, "# raw MPI reference for bf16: MPI_UINT16_T, MPI_SUM (MPI has no bf16 type)\n");
  }
  if (!o.json) {
    std::printf("#\n");
    print_line(
        "# %-5s %5s %7s %5s %9s %9s %9s %9s %9s %9s %9s %9s %9s %6s %9s %6s %8s %8s %6s %6s  "
        "%5s %6s %6s %9s\n",
        "stage", "ranks", "params", "dtype", "reduce", "update", "gather", "total", "exposed",
        "l_red", "l_upd", "l_gat", "limit", "ratio", "limit_b", "rat_b", "mem", "formula", "bkt",
        "m/f", "iters", "other", "grads", "pass");
    print_line(
        "# %-5s %5s %7s %5s %9s %9s %9s %9s %9s %9s %9s %9s %9s %6s %9s %6s %8s %8s %6s %6s  "
        "%5s %6s %6s %9s\n",
        "", "", "", "", "(us)", "(us)", "(us)", "(us)", "(us)", "(us)", "(us)", "(us)", "(us)", "",
        "(us)", "", "(MiB)", "(MiB)", "(MiB)", "", "", "", "", "(us)");
  }
  std::fflush(f);
}

void print_row(const Options& o, const Row& r, double bucket_mb) {
  if (o.json) {
    const auto& m = r.report;
    JsonObject j;
    j.count("stage", static_cast<std::size_t>(r.stage));
    j.count("ranks", static_cast<std::size_t>(r.ranks));
    j.count("params", r.params);
    j.str("dtype", shardopt::dtype_name(r.dtype));
    j.real("reduce_us", r.reduce.median_us, 2);
    j.real("update_us", r.update.median_us, 2);
    j.real("gather_us", r.gather.median_us, 2);
    j.real("total_us", r.total.median_us, 2);
    j.real("limit_us", r.limit_us, 2);
    j.real("mem_bytes", r.mem_bytes, 0);
    j.real("mem_formula_bytes", r.mem_formula_bytes(), 0);
    j.str("optimizer", r.optimizer.c_str());
    j.real("bucket_mb", bucket_mb, 4);
    j.count("tensors", r.tensors);
    j.str("numels", r.numels.c_str());
    // Stage 2's gradients as -g says; stages 0 and 1 register their buffers.
    j.str("grads", grads_name(r.grads));
    j.count("iters", static_cast<std::size_t>(r.iters));
    j.real("total_min_us", r.total.min_us, 2);
    j.real("total_max_us", r.total.max_us, 2);
    j.real("exposed_us", r.exposed_us(), 2);
    j.real("limit_reduce_us", r.l_reduce.median_us, 2);
    j.real("limit_update_us", r.l_update.median_us, 2);
    j.real("limit_gather_us", r.l_gather.median_us, 2);
    j.real("ratio", r.ratio(), 4);
    j.real("limit_reduce_bucketed_us", r.b_reduce.median_us, 2);
    j.real("limit_update_bucketed_us", r.b_update.median_us, 2);
    j.real("limit_gather_bucketed_us", r.b_gather.median_us, 2);
    j.real("limit_bucketed_us", r.limit_b_us, 2);
    j.real("ratio_bucketed", r.ratio_b(), 4);
    j.real("bucket_bytes_counted", r.bucket_bytes, 0);
    j.real("mem_ratio", r.mem_ratio(), 4);
    j.raw("mem_goal_met", r.mem_goal_met() ? "true" : "false");
    j.count("mem_master", m.master_params);
    j.count("mem_state", m.optimizer_state);
    j.count("mem_grad_shard", m.grad_shard);
    j.count("mem_reduced_grads", m.reduced_grads);
    j.count("mem_owned_grads", m.owned_grads);
    j.count("mem_buckets", m.buckets);
    j.count("mem_user_params", m.user_params);
    j.count("mem_user_grads", m.user_grads);
    j.raw("other_load", r.other_load >= 0 ? num(r.other_load, 4) : "null");
    j.real("pass_us", r.pass.median_us, 2);
    j.real("owned_us", r.owned.median_us, 2);
    std::printf("%s\n", j.text().c_str());
  } else {
    char other[16] = "?";
    if (r.other_load >= 0) {
      std::snprintf(other, sizeof other, "%3.0f%%%s", 100 * r.other_load, r.busy() ? "*" : "");
    }
    print_line(
        "  %-5d %5d %7s %5s %9.1f %9.1f %9.1f %9.1f %9.1f %9.1f %9.1f %9.1f %9.1f %6.3f %9.1f "
        "%6.3f %8.1f %8.1f %6.1f %6.3f%1s %5d %6s %6s %9.1f\n",
        r.stage, r.ranks, human_count(r.params).c_str(), shardopt::dtype_name(r.dtype),
        r.reduce.median_us, r.update.median_us, r.gather.median_us, r.total.median_us,
        r.exposed_us(), r.l_reduce.median_us, r.l_update.median_us, r.l_gather.median_us,
        r.limit_us, r.ratio(), r.limit_b_us, r.ratio_b(), mib(r.mem_bytes),
        mib(r.mem_formula_bytes()), mib(static_cast<double>(r.report.buckets)), r.mem_ratio(),
        r.mem_goal_met() ? "" : "*", r.iters, other, grads_name(r.grads), r.pass.median_us);
  }
  std::fflush(stdout);
}

void print_goals(const Options& o, const std::vector<Row>& rows) {
  FILE* f = o.json ? stderr : stdout;
  const double tol = 100 * kMemoryTolerance;
  std::fprintf(f,
               "#\n# goal 1: mem within %.0f%% of the formula plus the buckets: formula - %.0f%% "
               "<= mem <= (formula + buckets) + %.0f%% (the buckets counted are an upper bound)\n",
               tol, tol, tol);
  std::size_t missed = 0;
  for (const Row& r : rows) {
    if (r.mem_goal_met()) continue;
    ++missed;
    // Name the gradient buffer: the stage-2 formula has no full one, while
    // the engine works on one (the user's, or its own when Param::grad is
    // null), which is the usual gap.
    std::fprintf(f,
                 "#   not met: stage %d, %s params, %s: mem %.1f MiB, formula %.1f MiB + buckets "
                 "%.1f MiB (the report's buckets: %.1f MiB; full gradient buffers: %.1f MiB)\n",
                 r.stage, human_count(r.params).c_str(), shardopt::dtype_name(r.dtype),
                 mib(r.mem_bytes), mib(r.formula_bytes), mib(r.bucket_bytes),
                 mib(static_cast<double>(r.report.buckets)),
                 mib(static_cast<double>(r.report.user_grads + r.report.owned_grads)));
  }
  if (rows.empty()) {
    std::fprintf(f, "#   not evaluated: no rows\n");
  } else {
    std::fprintf(f, "#   %s: %zu of %zu rows in the band\n", missed == 0 ? "met" : "not met",
                 rows.size() - missed, rows.size());
  }
  std::fprintf(f, "# goal 2: stage-%d total within %.1fx of the limit at 25M params, %d ranks\n",
               kTimeGoalStage, kTimeGoalRatio, kTimeGoalRanks);
  bool any = false;
  for (const Row& r : rows) {
    const auto p = static_cast<double>(r.params);
    if (r.stage != kTimeGoalStage || r.ranks != kTimeGoalRanks || p < kTimeGoalParamsLo ||
        p > kTimeGoalParamsHi) {
      continue;
    }
    any = true;
    std::fprintf(f, "#   %s params, %s: ratio %.3f: %s (rat_b, per-bucket calls: %.3f)%s\n",
                 human_count(r.params).c_str(), shardopt::dtype_name(r.dtype), r.ratio(),
                 r.ratio() <= kTimeGoalRatio ? "met" : "not met", r.ratio_b(),
                 r.busy() ? "; busy machine, rerun it" : "");
  }
  if (!any) {
    std::fprintf(f,
                 "#   not evaluated: no stage-%d row at 25M params on %d ranks (run -p 25M under "
                 "mpirun -n %d)\n",
                 kTimeGoalStage, kTimeGoalRanks, kTimeGoalRanks);
  }
  // Goal 3: each streamed stage-2 row against the owned step and the pass
  // timed in its own iterations.
  bool compared = false;
  for (const Row& s : rows) {
    if (s.stage != 2 || s.grads != Options::Grads::stream) continue;
    if (!compared)
      std::fprintf(f,
                   "# goal 3: the streamed stage-2 step at most the owned one plus one pass over "
                   "the gradients, timed in the same iterations: stream / (owned + pass) <= 1\n");
    compared = true;
    const double ratio = s.total.median_us / (s.owned.median_us + s.pass.median_us);
    std::fprintf(f,
                 "#   %s params, %s: stream %.1f us, owned %.1f us + pass %.1f us: ratio %.3f: "
                 "%s%s\n",
                 human_count(s.params).c_str(), shardopt::dtype_name(s.dtype), s.total.median_us,
                 s.owned.median_us, s.pass.median_us, ratio, ratio <= 1.0 ? "met" : "not met",
                 s.busy() ? "; busy machine, rerun it" : "");
  }
  const auto busy = std::count_if(rows.begin(), rows.end(), [](const Row& r) { return r.busy(); });
  machine::print_busy_rows(f, static_cast<std::size_t>(busy), rows.size(), kBusyFraction,
                           "marked * under other", "the step's");
  std::fflush(f);
}

}  // namespace bench_step
