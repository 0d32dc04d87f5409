// shardopt-train: what rank 0 prints, as text or as one JSON object per
// line: the configuration and the memory per rank at the start, a line
// every --log-every steps, the checkpoints and exports written, and the
// summary; and the per-step times those lines report.
#pragma once

#include <array>
#include <cstdint>
#include <string>
#include <vector>

#include "model.hpp"
#include "run.hpp"
#include "shardopt/shardopt.hpp"
#include "shardopt/zero.hpp"

namespace train {

// Whether to redraw a progress line in place. Open MPI connects each rank's
// stdout to a pseudo-terminal of its own whatever mpirun's output is, so
// under a launcher the rank's own isatty() says nothing: then the launcher's
// stdout (that of the parent process, when it runs on this node) decides.
bool output_is_terminal();

// Per-step times of one rank, summed over an interval of steps, with the
// communication StepInfo reports (exposed: blocked waiting for collectives;
// span: the gradient reduction from its first reduce-scatter to its end).
struct Times {
  // Seconds.
  double compute = 0.0, reduce = 0.0, update = 0.0, gather = 0.0, total = 0.0;
  double exposed = 0.0, span = 0.0;
  // Bytes.
  double reduce_bytes = 0.0, gather_bytes = 0.0;

  void add(const Times& t) {
    std::array<double, 9> a = array();
    const std::array<double, 9> b = t.array();
    for (std::size_t i = 0; i < a.size(); ++i) a[i] += b[i];
    *this = from(a);
  }
  std::array<double, 9> array() const {
    return {compute, reduce, update, gather, total, exposed, span, reduce_bytes, gather_bytes};
  }
  static Times from(const std::array<double, 9>& a) {
    return {a[0], a[1], a[2], a[3], a[4], a[5], a[6], a[7], a[8]};
  }
  Times per(double n) const {
    std::array<double, 9> a = array();
    for (double& v : a) v /= n;
    return from(a);
  }
  // Bus bandwidth (1e9 B/s) of the reduction and the gather over N ranks.
  double reduce_busbw(int n) const {
    return span > 0 ? reduce_bytes * (n - 1) / n / span / 1e9 : 0.0;
  }
  double gather_busbw(int n) const {
    return gather > 0 ? gather_bytes * (n - 1) / n / gather / 1e9 : 0.0;
  }
};

// What --resume loaded, for the output.
struct Resumed {
  std::string path;
  shardopt::LoadReport report;
  double seconds = 0.0;  // the slowest rank's
  // The command line's hyper-parameters that replaced the checkpoint's:
  // "--weight-decay 0.1 (the checkpoint's 0.01)".
  std::vector<std::string> applied;
};

void print_resumed(const RunContext& c, const Resumed& r);

// A checkpoint (kind "checkpoint") or an export written at `step`.
void print_written(const RunContext& c, const char* kind, const std::string& path,
                   std::int64_t step, double seconds);

// The configuration, and the memory per rank beside the ZeRO formula; then
// the head of the log lines' table.
void print_start(const RunContext& c, const ModelTensors& m,
                 const shardopt::ZeroRedundancyOptimizer& opt,
                 const shardopt::OptimizerConfig& config);

struct LogLine {
  int step = 0;
  double loss = 0.0;
  double lr = 0.0;
  Times per_step;  // mean over the interval, slowest rank
  double samples_per_s = 0.0;
  double loss_scale = 1.0;
  double grad_norm = -1.0;
  int skipped = 0;  // in the interval
};

void print_log(const RunContext& c, const LogLine& l);

// What the summary at the end of a run reports.
struct Summary {
  int attempts = 0;          // steps tried in this run, skipped ones included
  std::int64_t applied = 0;  // steps applied in this run
  int skipped = 0;
  std::int64_t start_step = 0;  // the step the run started at
  std::int64_t final_step = 0;
  bool resumed = false;
  double initial_loss = 0.0;  // on the held-out samples, mean over the ranks
  double final_loss = 0.0;
  Times worst;             // sums over the steps tried, slowest rank
  bool identical = false;  // the parameters, on every rank
  bool saved = false;      // no --save-params error on any rank
  std::string save_error;  // this rank's --save-params error
  int checkpoints = 0;     // written by this run
  double checkpoint_seconds = 0.0;
  double export_seconds = 0.0;
};

void print_summary(const RunContext& c, const Summary& s);

// A --stop-on signal stopped the run at `step`; its checkpoint is written.
void print_stopped(const RunContext& c, const char* signal, std::int64_t step);

}  // namespace train
