// shardopt-bench-step: its command line and its goals.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "../support/optim_steps.hpp"
#include "shardopt/shardopt.hpp"
#include "shardopt/zero.hpp"

namespace bench_step {

using bench::OptimizerEntry;
using shardopt::DType;

inline constexpr const char* kProgram = "shardopt-bench-step";
inline constexpr std::uint64_t kSeed = 0x243f6a8885a308d3ULL;
// Small sizes run more iterations than --iters: about this long per row,
// up to kMaxScaledIters.
inline constexpr double kSeriesBudgetS = 1.0;
inline constexpr int kMaxScaledIters = 1000;

// The goals. Memory: what a rank holds is the formula plus the buckets,
// within this fraction (a band, since the buckets counted are an upper
// bound: see Row::mem_goal_met). Time: stage 2 at about 25M parameters on
// 2 ranks within this factor of the limit.
inline constexpr double kMemoryTolerance = 0.05;
inline constexpr double kTimeGoalRatio = 1.3;
inline constexpr int kTimeGoalStage = 2;
inline constexpr int kTimeGoalRanks = 2;
inline constexpr double kTimeGoalParamsLo = 24e6;  // 25M read as 25e6 or as 25 * 2^20
inline constexpr double kTimeGoalParamsHi = 27e6;
// On a device (--device cuda): stage 2 within this factor of its limit, at
// every size.
inline constexpr double kDeviceGoalRatio = 1.2;

// The memory the benchmark counts for the buckets: what the configuration
// allows the engine at most. Two bucket buffers (one being packed while the
// previous one is in flight), each of the configured size in the reduced
// dtype, capped at the model's gradients (no bucket holds more than the
// model), and in stage 2 each with room for this rank's reduced piece
// (1/ranks of a bucket). An upper bound: a bucket whose gradients are already
// contiguous in the user's buffer is reduced in place, with no buffer.
inline constexpr double kBucketsCounted = 2.0;

// ---------------------------------------------------------------------------
// Options

struct Options {
  std::vector<int> stages{0, 1, 2};
  std::vector<std::size_t> params;
  std::vector<DType> dtypes{DType::f32};
  const OptimizerEntry* optimizer = nullptr;
  double bucket_mb = 0.0;  // 0: the engine's default (SHARDOPT_BUCKET_MB)
  int warmup = 3;
  int iters = 20;
  bool json = false;
  bool help = false;
  // Stage 2's gradients: streamed into the buckets (stream_grads), in
  // buffers the optimizer owns, or in the user's buffers (the fused update
  // where it applies, for the last two).
  // Several (-g stream,owned): a stage-2 row for each, one after the
  // other, and goal 3 compares streamed with owned.
  enum class Grads { stream, owned, user };
  std::vector<Grads> grads{Grads::stream};
  bool device = false;  // --device cuda: the step on device buffers (device.hpp)
  // -s 3 (units.hpp): the MiB each unit's forward and backward compute
  // reads and writes; with compute_sleep, the compute sleeps as long as
  // that loop takes instead, leaving the cores to the transport (as a
  // GPU's kernels would).
  double compute_mb = 32.0;
  bool compute_sleep = false;
};

inline const char* grads_name(Options::Grads g) {
  return g == Options::Grads::stream ? "stream" : g == Options::Grads::owned ? "owned" : "user";
}

// The text of -h.
std::string usage();

// Parses argv the same way on every rank; throws cli::UsageError.
Options parse_options(int argc, char** argv);

// The engine's hyper-parameters of the optimizer the functional entry runs.
shardopt::OptimizerConfig engine_config(const OptimizerEntry& e);

}  // namespace bench_step
