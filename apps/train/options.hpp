// shardopt-train: the command line: the options, their defaults and checks,
// and the usage text. The optimizer's options are in optimizer_options.hpp.
#pragma once

#include <cstdint>
#include <optional>
#include <set>
#include <string>
#include <string_view>
#include <vector>

#include "optimizer_options.hpp"
#include "shardopt/shardopt.hpp"

namespace train {

enum class LossScaling { automatic, dynamic, none };
enum class Schedule { cosine, constant };
enum class Progress { automatic, on, off };

struct Options {
  OptimizerOptions optimizer;  // -o, --lr
  int stage = 2;
  shardopt::DType precision = shardopt::DType::f32;
  int steps = 500;
  Schedule schedule = Schedule::cosine;
  int batch = 128;
  int micro_batches = 1;
  int inputs = 16;
  int outputs = 4;
  int hidden = 768;
  int layers = 3;
  int teacher_hidden = 16;
  int eval_samples = 1024;
  std::optional<double> clip;
  double bucket_mb = 0.0;
  std::uint64_t seed = 1;
  int log_every = 25;
  LossScaling loss_scale = LossScaling::automatic;
  bool param_remainders = false;
  bool reduce_in_fp32 = false;
  shardopt::GradReduction grad_reduction = shardopt::GradReduction::avg;
  bool scattered = false;
  bool device = false;  // --device cuda
  std::string save_params;
  std::string checkpoint;  // --checkpoint: where checkpoints go
  int checkpoint_every = 0;
  std::optional<int> keep_last;
  bool overwrite = false;  // --overwrite: replace an existing --checkpoint file
  std::string resume;      // --resume: the checkpoint to start from
  std::string export_path;
  std::vector<int> stop_signals;  // --stop-on: signal numbers
  bool json = false;
  Progress progress = Progress::automatic;
  bool help = false;
  // The long names of the options the command line gives ("precision",
  // "weight-decay", ...): on resume only those count, not the defaults.
  std::set<std::string> given;

  bool was_given(const std::string& long_name) const { return given.count(long_name) > 0; }
  double learning_rate() const { return optimizer.learning_rate(); }
  bool uses_scaler() const {
    return loss_scale == LossScaling::dynamic ||
           (loss_scale == LossScaling::automatic && precision == shardopt::DType::f16);
  }
};

// The exit status of a run that a --stop-on signal stopped, its checkpoint
// written: a job script requeues the job on it.
inline constexpr int kExitStopped = 3;

// What -h prints.
extern const char* const kUsage;

// A finite number >= 0 (> 0 unless allow_zero) for the option `label`;
// cli::UsageError otherwise.
double parse_number(const std::string& label, std::string_view s, bool allow_zero);

// The options of argv, checked together; throws cli::UsageError for a bad
// command line.
Options parse_options(int argc, char** argv);

}  // namespace train
