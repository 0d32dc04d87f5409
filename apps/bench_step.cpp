// shardopt-bench-step: one whole ZeRO optimizer step on host memory beside
// its limit, measured in the same run on the same sizes.
//
// For each stage, parameter count and model dtype it builds a model of
// several parameters of varied sizes (the blocks of an MLP: a few large
// weights, small biases and norms) in one contiguous parameter buffer and one
// contiguous gradient buffer, registers them with a ZeroRedundancyOptimizer,
// and times the step as a training loop would run it: grad_ready(i) for each
// parameter in reverse (backward) order, then step(). In the same iterations,
// in an order drawn at random, it times what the step cannot avoid: the raw
// MPI collectives of the stage on buffers of the same total size (whole, and
// again cut into buckets as the engine cuts them), and the functional
// optimizer alone on a buffer the size of the shard. The table prints the
// phases of the step, the limit, their ratio, and the memory per rank beside
// the ZeRO formula plus the buckets.
//
//   mpirun -n 2 shardopt-bench-step                       # 1M,4M,25M, stages 0-2
//   mpirun -n 2 shardopt-bench-step -p 100M -d bf16 --json
//
// Uses only the public API of shardopt, MPI, OpenMP and the standard library.
#include <mpi.h>
#include <omp.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdarg>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <iterator>
#include <random>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "cli.hpp"
#include "machine.hpp"
#include "optim_steps.hpp"
#include "report.hpp"
#include "shardopt/shardopt.hpp"
#include "shardopt/zero.hpp"

namespace {

using bench::OptimizerEntry;
using bench::Streams;
using bench::uniform;
using cli::bad_value;
using cli::human_count;
using cli::OptionSpec;
using cli::parse_int;
using cli::split;
using cli::UsageError;
using report::num;
using report::Stats;
using report::stats_of;
using shardopt::DType;

constexpr const char* kProgram = "shardopt-bench-step";
constexpr std::uint64_t kSeed = 0x243f6a8885a308d3ULL;
// Small sizes run more iterations than --iters: about this long per row,
// up to kMaxScaledIters.
constexpr double kSeriesBudgetS = 1.0;
constexpr int kMaxScaledIters = 1000;

// The goals. Memory: what a rank holds is the formula plus the buckets,
// within this fraction (a band, since the buckets counted are an upper
// bound: see Row::mem_goal_met). Time: stage 2 at about 25M parameters on
// 2 ranks within this factor of the limit.
constexpr double kMemoryTolerance = 0.05;
constexpr double kTimeGoalRatio = 1.3;
constexpr int kTimeGoalStage = 2;
constexpr int kTimeGoalRanks = 2;
constexpr double kTimeGoalParamsLo = 24e6;  // 25M read as 25e6 or as 25 * 2^20
constexpr double kTimeGoalParamsHi = 27e6;

// The memory the benchmark counts for the buckets: what the configuration
// allows the engine at most. Two bucket buffers (one being packed while the
// previous one is in flight), each of the configured size in the reduced
// dtype, capped at the model's gradients (no bucket holds more than the
// model), and in stage 2 each with room for this rank's reduced piece
// (1/ranks of a bucket). An upper bound: a bucket whose gradients are already
// contiguous in the user's buffer is reduced in place, with no buffer.
constexpr double kBucketsCounted = 2.0;

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
};

std::string usage() {
  const std::string names = bench::names_of(bench::optimizers());
  std::string text =
      "usage: shardopt-bench-step [options]\n"
      "\n"
      "Times one whole ZeRO optimizer step (shardopt::ZeroRedundancyOptimizer, host\n"
      "memory) beside its limit, measured in the same run: the raw MPI collectives the\n"
      "stage needs plus the functional optimizer alone on the shard. Run it under\n"
      "mpirun/srun at any rank count; every row runs at that count.\n"
      "\n"
      "  -s, --stages LIST      ZeRO stages, comma-separated (default 0,1,2)\n"
      "  -p, --params LIST      parameter counts, comma-separated, with an optional K, M\n"
      "                         or G suffix (powers of 1024) (default 1M,4M,25M); 100M\n"
      "                         takes about 3.5 GiB per rank (f32 Adam, stage 0 asked)\n"
      "  -d, --dtype LIST       model dtype: f32, bf16 (fp32 master weights, bf16 params\n"
      "                         and grads), comma-separated (default f32)\n"
      "  -o, --optimizer NAME   one of: ";
  return text + names +
         " (default adam;\n"
         "                         torch's defaults, sgd with momentum 0.9)\n"
         "  -b, --bucket-mb X      gradient bucket size in MiB (default: SHARDOPT_BUCKET_MB, 25)\n"
         "  -w, --warmup N         untimed steps first (default 3)\n"
         "  -n, --iters N          timed steps, at least (default 20); small sizes run more,\n"
         "                         about 1 s worth per row, up to 1000 (after -w warm-up)\n"
         "      --json             one JSON object per row on stdout; the rest on stderr\n"
         "  -h, --help             this text\n"
         "\n"
         "The model: 4 blocks of an MLP of width d (norm.weight d, fc1.weight 4d*d, fc1.bias 4d,\n"
         "fc2.weight d*4d, fc2.bias d) and a head.weight that takes the rest, 21 parameters in\n"
         "one contiguous buffer, gradients in another, random values: params in [-1,1), the\n"
         "same on every rank, grads in [-1e-2,1e-2), different on every rank. The gradients\n"
         "stay fixed; each step marks every parameter ready in reverse order (grad_ready),\n"
         "then calls step().\n"
         "\n"
         "Each iteration runs the step, the limit and the per-bucket limit (below) in an order\n"
         "drawn at random (the same on every rank); each limit runs its parts in a step's order\n"
         "(reduce, update, gather). Every part starts after a barrier and is timed with\n"
         "MPI_Wtime; an iteration's time is the slowest rank's. The table shows medians over\n"
         "iterations (--json adds the total's min and max).\n"
         "\n"
         "Columns:\n"
         "  reduce, update, gather  the phases of step() from StepInfo (finishing the gradient\n"
         "           reduction, the fused update, the allgather of the parameters)\n"
         "  total    the whole step: the grad_ready calls and step()\n"
         "  exposed  total - update: the communication the step does not hide\n"
         "  l_red    raw MPI reduction on buffers of the model's size in the gradient dtype:\n"
         "           MPI_Reduce_scatter_block then MPI_Allgather (the allreduce, stages 0, 1),\n"
         "           MPI_Reduce_scatter_block alone (stage 2); MPI_SUM (MPI has no average);\n"
         "           bf16 as MPI_UINT16_T (MPI has no bf16 type: a timing reference only)\n"
         "  l_upd    the functional optimizer alone on the shard (stage 0: the whole model;\n"
         "           1, 2: 1/ranks of it), fp32 master and states, gradients of the model's\n"
         "           dtype, and with bf16 the bf16 copy of the new parameters written in the\n"
         "           same pass\n"
         "  l_gat    raw MPI_Allgather (in place) of the parameters (stages 1, 2)\n"
         "           (on 1 rank no collective is needed: l_red and l_gat are 0)\n"
         "  limit    l_red + l_upd + l_gat\n"
         "  ratio    total / limit (1: the step costs nothing beyond its limit; below 1:\n"
         "           the step hides communication, or its messages are cheaper)\n"
         "  limit_b  the same limit (its own run of the kernel) with the collectives called\n"
         "           once per bucket, one after another, blocking: buckets of --bucket-mb MiB\n"
         "           in the gradient dtype (a multiple of the ranks), the last one shorter,\n"
         "           as the engine cuts them.\n"
         "           Large messages can cost more per byte than several bucket-sized ones\n"
         "           (caches), so this limit can be the lower one.\n"
         "  rat_b    total / limit_b\n"
         "  mem      bytes this rank holds for the step: memory_report().allocated() plus the\n"
         "           user's parameter and gradient buffers\n"
         "  formula  shardopt::zero_memory_formula(stage, params, ranks, dtype, state bytes:\n"
         "           4 per fp32 state, LAMB's direction counted as one; Adam 8)\n"
         "           plus the configured buckets, counted at their most: 2 bucket buffers of\n"
         "           --bucket-mb MiB (at most the model's gradient bytes each), in stage 2\n"
         "           each with room for the rank's reduced piece (1/ranks more)\n"
         "  bkt      the buckets memory_report() lists (MiB)\n"
         "  m/f      mem / formula; * marks a row outside the memory goal's band\n"
         "  other    CPU time other processes used while the row was timed, as a share of\n"
         "           all cores (from /proc/stat, this node's ranks' own time taken out);\n"
         "           over 5% the row is marked * and its times are a busy machine's\n"
         "\n"
         "Goals, printed after the table: mem within 5% of the formula plus the buckets, that\n"
         "is 0.95 * formula alone <= mem <= 1.05 * (formula + buckets), since the buckets\n"
         "counted are an upper bound; stage-2 total within 1.3x of the limit at 25M params on\n"
         "2 ranks. Timings are not pass/fail.\n"
         "\n"
         "Exit status: 0 every step ran and left every rank's parameters identical; 1 an error\n"
         "or parameters that differ across ranks; 2 a bad option. With --json, rank 0 prints one\n"
         "object per row with the keys stage, ranks, params, dtype, reduce_us, update_us,\n"
         "gather_us, total_us, limit_us, mem_bytes, mem_formula_bytes, then optimizer,\n"
         "bucket_mb, tensors, iters, total_min_us, total_max_us, exposed_us, limit_reduce_us,\n"
         "limit_update_us, limit_gather_us, ratio, limit_reduce_bucketed_us,\n"
         "limit_update_bucketed_us, limit_gather_bucketed_us, limit_bucketed_us,\n"
         "ratio_bucketed, bucket_bytes_counted, mem_ratio, mem_goal_met, the memory report's\n"
         "categories (mem_master, mem_state, mem_grad_shard, mem_reduced_grads,\n"
         "mem_owned_grads, mem_buckets, mem_user_params, mem_user_grads), and other_load\n"
         "(null: unknown).\n";
}

Options parse_options(int argc, char** argv) {
  Options o;
  for (std::size_t n : {1, 4, 25}) o.params.push_back(n << 20);
  o.optimizer = &bench::optimizers().front();

  static constexpr OptionSpec kSpecs[] = {
      {'s', "stages", true},    {'p', "params", true},    {'d', "dtype", true},
      {'o', "optimizer", true}, {'b', "bucket-mb", true}, {'w', "warmup", true},
      {'n', "iters", true},     {0, "json", false},       {'h', "help", false},
  };
  cli::for_each_option(
      argc, argv, kSpecs,
      [&](const OptionSpec& spec, const std::string& label, std::string_view v) {
        const std::string_view name = spec.long_name;
        if (name == "stages") {
          o.stages.clear();
          for (std::string_view item : split(v))
            o.stages.push_back(parse_int(label, item, 0, 2, "0 1 2"));
        } else if (name == "params") {
          o.params.clear();
          for (std::string_view item : split(v)) {
            const auto n = cli::parse_scaled(item, std::uint64_t{1} << 36);
            if (!n) {
              bad_value(label, item,
                        "positive counts with an optional K, M or G suffix, e.g. 1M,25M,100M");
            }
            o.params.push_back(static_cast<std::size_t>(*n));
          }
        } else if (name == "dtype") {
          o.dtypes.clear();
          for (std::string_view item : split(v)) {
            if (item == "f32") {
              o.dtypes.push_back(DType::f32);
            } else if (item == "bf16") {
              o.dtypes.push_back(DType::bf16);
            } else {
              bad_value(label, item, "f32 bf16");
            }
          }
        } else if (name == "optimizer") {
          const auto chosen = bench::choose(label, v, bench::optimizers());
          if (chosen.size() != 1) bad_value(label, v, "one optimizer name");
          o.optimizer = chosen.front();
        } else if (name == "bucket-mb") {
          char* end = nullptr;
          const std::string s(v);
          const double x = std::strtod(s.c_str(), &end);
          if (s.empty() || *end != '\0' || !(x > 0) || x > 65536) {
            bad_value(label, v, "a number of MiB > 0 and <= 65536 (25, 0.5)");
          }
          o.bucket_mb = x;
        } else if (name == "warmup") {
          o.warmup = parse_int(label, v, 0, 100000, "an integer >= 0");
        } else if (name == "iters") {
          o.iters = parse_int(label, v, 1, 100000, "an integer >= 1");
        } else if (name == "json") {
          o.json = true;
        } else if (name == "help") {
          o.help = true;
        }
      });
  // Each value once, in increasing order.
  auto unique_sorted = [](auto& v) {
    std::sort(v.begin(), v.end());
    v.erase(std::unique(v.begin(), v.end()), v.end());
  };
  unique_sorted(o.stages);
  unique_sorted(o.params);
  unique_sorted(o.dtypes);
  return o;
}

// The engine's hyper-parameters of the optimizer the functional entry runs.
shardopt::OptimizerConfig engine_config(const OptimizerEntry& e) {
  const std::string_view n = e.name;
  if (n == "adamw") return shardopt::AdamW{};
  if (n == "sgd") {
    shardopt::SGD o;
    o.momentum = 0.9;  // as bench::optimizers(): with a momentum buffer
    return o;
  }
  if (n == "adagrad") return shardopt::Adagrad{};
  if (n == "rmsprop") return shardopt::RMSprop{};
  if (n == "lion") return shardopt::Lion{};
  if (n == "lamb") return shardopt::Lamb{};
  return shardopt::Adam{};
}

// ---------------------------------------------------------------------------
// The model

struct Tensor {
  std::string name;
  std::size_t numel;
};

// kBlocks MLP blocks of width d, the largest d that fits, and a head that
// takes the rest, so the parameters add up to `total` exactly.
std::vector<Tensor> mlp_layout(std::size_t total) {
  constexpr std::size_t kBlocks = 4;
  auto block_numel = [](std::size_t d) { return 8 * d * d + 6 * d; };
  auto d = static_cast<std::size_t>(std::sqrt(static_cast<double>(total) / (8.0 * kBlocks)));
  while (d > 0 && kBlocks * block_numel(d) > total) --d;
  std::vector<Tensor> t;
  std::size_t used = 0;
  if (d > 0) {
    for (std::size_t b = 0; b < kBlocks; ++b) {
      const std::string p = "block" + std::to_string(b) + ".";
      for (Tensor x : {Tensor{p + "norm.weight", d}, Tensor{p + "fc1.weight", 4 * d * d},
                       Tensor{p + "fc1.bias", 4 * d}, Tensor{p + "fc2.weight", 4 * d * d},
                       Tensor{p + "fc2.bias", d}}) {
        used += x.numel;
        t.push_back(std::move(x));
      }
    }
  }
  if (total > used) t.push_back({"head.weight", total - used});
  return t;
}

// ---------------------------------------------------------------------------
// Machine and helpers

// CPU seconds this process used and the whole machine was busy, and the
// wall clock: two samples give the share of the CPUs other processes used
// in between. Every rank busy-waits in MPI, so a step and its limit slowed
// down alike by a competing process would still read ratio 1: such rows are
// marked instead.
struct CpuClock {
  double self_s = 0, busy_s = 0, wall_s = 0;
  bool ok = false;
};

CpuClock cpu_clock() {
  CpuClock c;
  c.wall_s = MPI_Wtime();
  const machine::CpuTimes t = machine::cpu_times();
  c.self_s = t.self_s;
  c.busy_s = t.busy_s;
  c.ok = t.ok;
  return c;
}

// A row is marked busy when other processes used more than this share of
// the machine while it ran.
constexpr double kBusyFraction = 0.05;

double mib(double bytes) { return bytes / (1 << 20); }

MPI_Datatype raw_mpi_type(DType t) {
  // MPI has no bf16: the same bytes as 16-bit integers, a timing reference.
  return t == DType::bf16 ? MPI_UINT16_T : MPI_FLOAT;
}

// ---------------------------------------------------------------------------
// The run

struct Row {
  int stage = 0;
  int ranks = 0;
  std::size_t params = 0;
  DType dtype = DType::f32;
  std::size_t tensors = 0;
  int iters = 0;
  Stats reduce, update, gather, total, l_reduce, l_update, l_gather;
  double limit_us = 0;
  Stats b_reduce, b_update, b_gather;  // the limit with the collectives called per bucket
  double limit_b_us = 0;
  double other_load = -1;  // other processes' share of the CPUs while timed; -1 unknown
  bool busy() const { return other_load > kBusyFraction; }
  shardopt::MemoryReport report;
  double mem_bytes = 0;
  double formula_bytes = 0;  // zero_memory_formula alone
  double bucket_bytes = 0;   // the buckets counted beside it
  double mem_formula_bytes() const { return formula_bytes + bucket_bytes; }
  double exposed_us() const { return total.median_us - update.median_us; }
  double ratio() const { return limit_us > 0 ? total.median_us / limit_us : 0; }
  double ratio_b() const { return limit_b_us > 0 ? total.median_us / limit_b_us : 0; }
  double mem_ratio() const { return mem_bytes / mem_formula_bytes(); }
  // The buckets counted are an upper bound, so the memory goal is a band:
  // at least the formula (less 5%), at most the formula plus the buckets
  // (plus 5%).
  bool mem_goal_met() const {
    return mem_bytes >= (1 - kMemoryTolerance) * formula_bytes &&
           mem_bytes <= (1 + kMemoryTolerance) * mem_formula_bytes();
  }
};

// The buffers of one parameter count, allocated once (2 MiB aligned, touched
// at allocation) for the widest dtype and every stage asked for.
struct Buffers {
  std::size_t psi = 0;                 // parameters
  std::size_t block = 0;               // ceil(psi / ranks): a rank's block in the raw collectives
  shardopt::HostBuffer params, grads;  // the model's, registered with the engine
  // The limit: the raw collectives' input (the ranks' unreduced gradients)
  // and output (reduced gradients, then the gathered parameters), and the
  // functional optimizer's fp32 master, states and two-pass scratch.
  shardopt::HostBuffer lim_in, lim_out, master, scratch;
  std::vector<shardopt::HostBuffer> states;
};

class Bench {
 public:
  Bench(const Options& o, shardopt::Communicator& comm, MPI_Comm raw, MPI_Comm timing,
        MPI_Comm node)
      : o_(o),
        comm_(comm),
        raw_(raw),
        timing_(timing),
        node_(node),
        rank_(comm.rank()),
        nranks_(comm.size()),
        order_(12345) {}

  // Allocates the buffers of psi parameters.
  void allocate(std::size_t psi) {
    b_ = Buffers{};
    const std::size_t n = static_cast<std::size_t>(nranks_);
    b_.psi = psi;
    b_.block = (psi + n - 1) / n;
    const bool stage0 = std::find(o_.stages.begin(), o_.stages.end(), 0) != o_.stages.end();
    const std::size_t kernel_n = stage0 ? psi : b_.block;
    const std::size_t wide = 4;  // f32, the widest dtype
    b_.params = shardopt::HostBuffer(psi * wide);
    b_.grads = shardopt::HostBuffer(psi * wide);
    // Per-bucket calls pad each bucket to a multiple of the ranks: room for
    // that, with the most buckets any dtype cuts.
    const std::size_t lim = std::max(n * b_.block, psi + n * bucket_count(psi, 4));
    b_.lim_in = shardopt::HostBuffer(lim * wide);
    b_.lim_out = shardopt::HostBuffer(lim * wide);
    b_.master = shardopt::HostBuffer(kernel_n * 4);
    for (std::size_t i = 0; i < o_.optimizer->states.size(); ++i) {
      b_.states.emplace_back(kernel_n * 4);
    }
    if (o_.optimizer->scratch != nullptr) b_.scratch = shardopt::HostBuffer(kernel_n * 4);
  }

  // The bytes allocate(psi) takes on a rank, plus the engine's formula and
  // buckets at the largest stage asked for.
  double bytes_needed(std::size_t psi) const {
    const double n = nranks_;
    const double block = std::ceil(static_cast<double>(psi) / n) + n * bucket_count(psi, 4);
    const bool stage0 = std::find(o_.stages.begin(), o_.stages.end(), 0) != o_.stages.end();
    const double kernel_n = stage0 ? static_cast<double>(psi) : block;
    const double mine =
        8.0 * static_cast<double>(psi) + 8.0 * n * block + (4.0 + state_bytes()) * kernel_n;
    double engine = 0;
    for (int stage : o_.stages) {
      for (DType t : o_.dtypes) {
        engine = std::max(engine, shardopt::zero_memory_formula(stage, static_cast<double>(psi),
                                                                nranks_, t, state_bytes()) +
                                      bucket_bytes(psi, t, stage) - 2.0 * dsize(t) * psi);
      }
    }
    return mine + engine;
  }

  // The optimizer's fp32 bytes per element of the shard: its states, and
  // LAMB's direction, which the engine keeps for the whole shard as well.
  double state_bytes() const {
    const std::size_t k = o_.optimizer->states.size() + (o_.optimizer->scratch != nullptr ? 1 : 0);
    return 4.0 * static_cast<double>(k);
  }

  double bucket_mb() const {
    return o_.bucket_mb > 0 ? o_.bucket_mb : shardopt::settings().bucket_mb;
  }

  // The bucket bytes counted beside the formula (see kBucketsCounted).
  double bucket_bytes(std::size_t psi, DType t, int stage) const {
    const double one = std::min(bucket_mb() * (1 << 20), dsize(t) * static_cast<double>(psi));
    return kBucketsCounted * one * (stage == 2 ? 1.0 + 1.0 / nranks_ : 1.0);
  }

  static double dsize(DType t) { return static_cast<double>(shardopt::dtype_size(t)); }

  // Elements of one bucket of elements of `elem` bytes: the configured MiB,
  // rounded down to a multiple of the ranks (equal pieces), at least one
  // element per rank.
  std::size_t bucket_elems(std::size_t elem) const {
    const auto n = static_cast<std::size_t>(nranks_);
    const auto b = static_cast<std::size_t>(bucket_mb() * (1 << 20)) / elem;
    return std::max(n, b / n * n);
  }
  std::size_t bucket_count(std::size_t psi, std::size_t elem) const {
    const std::size_t b = bucket_elems(elem);
    return (psi + b - 1) / b;
  }

  // Random parameters and gradients of dtype t, and the limit's arrays
  // (its input: gradients again, at the block size). The engine reads the
  // parameters at construction, so every row starts from fresh ones.
  void fill(DType t) {
    const std::uint64_t key = bench::mix64(kSeed + 1000 * static_cast<std::uint64_t>(rank_) +
                                           static_cast<std::uint64_t>(t));
    const std::size_t n = b_.lim_in.size() / 4;  // elements the limit's buffers hold
    // Every rank starts from the same parameters, as a model broadcast from
    // rank 0 would; the gradients differ per rank.
    fill_values(b_.params.data(), t, b_.psi, bench::mix64(kSeed), -1.0f, 1.0f);
    fill_values(b_.grads.data(), t, b_.psi, key + 1, -1e-2f, 1e-2f);
    fill_values(b_.lim_in.data(), t, n, key + 1, -1e-2f, 1e-2f);
    fill_values(b_.lim_out.data(), t, n, key + 2, -1e-2f, 1e-2f);
    const std::size_t kn = b_.master.size() / 4;
    fill_values(b_.master.data(), DType::f32, kn, key + 3, -1.0f, 1.0f);
    for (std::size_t s = 0; s < b_.states.size(); ++s) {
      // In [0, 1e-2): some states are sums of squares.
      fill_values(b_.states[s].data(), DType::f32, kn, key + 4 + s, 0.0f, 1e-2f);
    }
  }

  // One row: constructs the engine, times it beside the limit, and returns
  // the row (on every rank; times are the slowest rank's). Sets `differ` if
  // the ranks' parameters differ after the steps.
  Row run(int stage, DType t, bool& differ) {
    const std::vector<Tensor> layout = mlp_layout(b_.psi);
    const std::size_t es = shardopt::dtype_size(t);
    std::vector<shardopt::Param> params;
    // Stage 2 streams each gradient into its bucket (ZeroOptions::
    // stream_grads), as a backward pass that hands over each layer's
    // gradient would: no full-size gradient buffer is registered, which is
    // the memory the stage-2 formula counts. b_.grads stands for the
    // backward pass's output and is not counted.
    const bool stream = stage == 2;
    std::vector<const unsigned char*> grad_of;
    std::size_t offset = 0;
    for (const Tensor& x : layout) {
      shardopt::Param p;
      p.name = x.name;
      p.data = b_.params.as<unsigned char>() + offset * es;
      grad_of.push_back(b_.grads.as<unsigned char>() + offset * es);
      p.grad = stream ? nullptr : b_.grads.as<unsigned char>() + offset * es;
      p.numel = x.numel;
      p.dtype = t;
      params.push_back(std::move(p));
      offset += x.numel;
    }
    shardopt::ZeroOptions zo;
    zo.stage = stage;
    zo.bucket_mb = o_.bucket_mb;
    zo.stream_grads = stream;
    shardopt::ZeroRedundancyOptimizer opt(comm_, params, engine_config(*o_.optimizer), zo);
    const std::size_t np = params.size();

    // The limit's arrays: stage 0 updates the whole model, 1 and 2 this
    // rank's block; the gradients are the raw collectives' input (random,
    // never written), the bf16 copy goes where the allgather reads it.
    const std::size_t mine = static_cast<std::size_t>(rank_) * b_.block;
    Streams s;
    s.n = stage == 0 ? b_.psi : b_.block;
    s.param = b_.master.as<float>();
    for (std::size_t i = 0; i < b_.states.size(); ++i) s.state[i] = b_.states[i].as<float>();
    s.scratch = b_.scratch.size() > 0 ? b_.scratch.as<float>() : nullptr;
    s.grad_type = t;
    s.grad = b_.lim_in.as<unsigned char>() + (stage == 0 ? 0 : mine * es);
    s.copy =
        t == DType::bf16 ? b_.lim_out.as<unsigned char>() + (stage == 0 ? 0 : mine * es) : nullptr;
    s.copy_type = DType::bf16;
    const int block = static_cast<int>(b_.block);
    const MPI_Datatype mt = raw_mpi_type(t);
    void* const out = b_.lim_out.data();
    void* const own_block = b_.lim_out.as<unsigned char>() + mine * es;
    // The same calls cut as the engine cuts them, one bucket at a time: each
    // piece is (first element, elements per rank).
    std::vector<std::pair<std::size_t, int>> pieces;
    {
      const auto n = static_cast<std::size_t>(nranks_);
      const std::size_t bk = bucket_elems(es);
      std::size_t at = 0;
      for (std::size_t begin = 0; begin < b_.psi; begin += bk) {
        const std::size_t per = (std::min(bk, b_.psi - begin) + n - 1) / n;
        pieces.emplace_back(at, static_cast<int>(per));
        at += n * per;
      }
    }
    auto byte_at = [&](shardopt::HostBuffer& buf, std::size_t element) {
      return buf.as<unsigned char>() + element * es;
    };

    std::int64_t kernel_steps = 0;
    shardopt::StepInfo info;
    enum Part {
      kReduce,
      kUpdate,
      kGather,
      kTotal,
      kLReduce,
      kLUpdate,
      kLGather,
      kBReduce,
      kBUpdate,
      kBGather,
      kParts
    };
    double sample[kParts] = {};
    auto timed = [&](auto&& fn) {
      MPI_Barrier(timing_);
      const double t0 = MPI_Wtime();
      fn();
      return MPI_Wtime() - t0;
    };
    auto run_engine = [&] {
      sample[kTotal] = timed([&] {
        for (std::size_t i = np; i-- > 0;) {
          if (stream)
            opt.grad_ready(i, grad_of[i]);
          else
            opt.grad_ready(i);
        }
        info = opt.step();
      });
      sample[kReduce] = info.reduce_seconds;
      sample[kUpdate] = info.update_seconds;
      sample[kGather] = info.gather_seconds;
    };
    // One rank needs no collective (MPI's would be copies): its limit is
    // the kernel alone. Each limit runs in the order of a step (reduce,
    // update, gather), so that what stays in cache from one part to the
    // next is what a step finds.
    const bool communicates = nranks_ > 1;
    const bool gathers = communicates && stage > 0;
    const auto mine_of = [&](std::size_t at, int per) {
      return at + static_cast<std::size_t>(rank_) * static_cast<std::size_t>(per);
    };
    auto run_limit = [&] {
      sample[kLReduce] = sample[kLGather] = 0;
      if (communicates) {
        sample[kLReduce] = timed([&] {
          MPI_Reduce_scatter_block(b_.lim_in.data(), own_block, block, mt, MPI_SUM, raw_);
          if (stage < 2) MPI_Allgather(MPI_IN_PLACE, 0, MPI_DATATYPE_NULL, out, block, mt, raw_);
        });
      }
      sample[kLUpdate] = timed([&] { o_.optimizer->step(s, ++kernel_steps); });
      if (gathers) {
        sample[kLGather] =
            timed([&] { MPI_Allgather(MPI_IN_PLACE, 0, MPI_DATATYPE_NULL, out, block, mt, raw_); });
      }
    };
    auto run_bucketed_limit = [&] {
      sample[kBReduce] = sample[kBGather] = 0;
      if (communicates) {
        sample[kBReduce] = timed([&] {
          for (const auto& [at, per] : pieces) {
            MPI_Reduce_scatter_block(byte_at(b_.lim_in, at), byte_at(b_.lim_out, mine_of(at, per)),
                                     per, mt, MPI_SUM, raw_);
            if (stage < 2) {
              MPI_Allgather(MPI_IN_PLACE, 0, MPI_DATATYPE_NULL, byte_at(b_.lim_out, at), per, mt,
                            raw_);
            }
          }
        });
      }
      sample[kBUpdate] = timed([&] { o_.optimizer->step(s, ++kernel_steps); });
      if (gathers) {
        sample[kBGather] = timed([&] {
          for (const auto& [at, per] : pieces) {
            MPI_Allgather(MPI_IN_PLACE, 0, MPI_DATATYPE_NULL, byte_at(b_.lim_out, at), per, mt,
                          raw_);
          }
        });
      }
    };
    // The step and the two limits in an order drawn at random per iteration
    // (the same on every rank), so that none always follows the same one.
    auto iteration = [&] {
      int order[] = {0, 1, 2};
      std::shuffle(std::begin(order), std::end(order), order_);
      for (int what : order) {
        if (what == 0) run_engine();
        if (what == 1) run_limit();
        if (what == 2) run_bucketed_limit();
      }
    };

    double per_iteration = 0;  // of the last warm-up iteration, barriers included
    for (int i = 0; i < o_.warmup; ++i) {
      const double w0 = MPI_Wtime();
      iteration();
      per_iteration = MPI_Wtime() - w0;
    }
    // Small sizes run more iterations, so that a row lasts long enough for
    // a stable median and for the busy check; every rank must run as many.
    MPI_Allreduce(MPI_IN_PLACE, &per_iteration, 1, MPI_DOUBLE, MPI_MAX, timing_);
    std::size_t iters = static_cast<std::size_t>(o_.iters);
    if (per_iteration > 0) {
      const double wanted = std::ceil(kSeriesBudgetS / per_iteration);
      iters = static_cast<std::size_t>(std::clamp(wanted, static_cast<double>(o_.iters),
                                                  std::max<double>(o_.iters, kMaxScaledIters)));
    }
    std::vector<double> t_all(kParts * iters);
    const CpuClock before = cpu_clock();
    for (std::size_t i = 0; i < iters; ++i) {
      iteration();
      for (int p = 0; p < kParts; ++p) t_all[static_cast<std::size_t>(p) * iters + i] = sample[p];
    }
    const CpuClock after = cpu_clock();
    double node_self = after.self_s - before.self_s;
    MPI_Allreduce(MPI_IN_PLACE, &node_self, 1, MPI_DOUBLE, MPI_SUM, node_);
    const double wall = after.wall_s - before.wall_s;
    const double cores = static_cast<double>(sysconf(_SC_NPROCESSORS_ONLN));
    // /proc/stat counts in clock ticks: below about 100 ticks of all the
    // cores together, the share would be mostly rounding.
    const double ticks = wall * cores * static_cast<double>(sysconf(_SC_CLK_TCK));
    double other = -1;
    if (before.ok && after.ok && ticks >= 100) {
      other = std::max(0.0, (after.busy_s - before.busy_s - node_self) / (wall * cores));
    }
    MPI_Allreduce(MPI_IN_PLACE, &other, 1, MPI_DOUBLE, MPI_MAX, timing_);
    MPI_Allreduce(MPI_IN_PLACE, t_all.data(), static_cast<int>(t_all.size()), MPI_DOUBLE, MPI_MAX,
                  timing_);
    auto part = [&](int p) {
      const auto first = t_all.begin() + static_cast<std::ptrdiff_t>(p * iters);
      return stats_of(std::vector<double>(first, first + static_cast<std::ptrdiff_t>(iters)));
    };

    Row r;
    r.stage = stage;
    r.ranks = nranks_;
    r.params = b_.psi;
    r.dtype = t;
    r.tensors = np;
    r.iters = static_cast<int>(iters);
    r.reduce = part(kReduce);
    r.update = part(kUpdate);
    r.gather = part(kGather);
    r.total = part(kTotal);
    r.l_reduce = part(kLReduce);
    r.l_update = part(kLUpdate);
    r.l_gather = part(kLGather);
    r.limit_us = r.l_reduce.median_us + r.l_update.median_us + r.l_gather.median_us;
    r.b_reduce = part(kBReduce);
    r.b_update = part(kBUpdate);
    r.b_gather = part(kBGather);
    r.limit_b_us = r.b_reduce.median_us + r.b_update.median_us + r.b_gather.median_us;
    r.other_load = other;

    // Memory after the steps, so that anything allocated at the first step
    // counts; the largest rank's.
    r.report = opt.memory_report();
    double mem =
        static_cast<double>(r.report.allocated() + r.report.user_params + r.report.user_grads);
    MPI_Allreduce(MPI_IN_PLACE, &mem, 1, MPI_DOUBLE, MPI_MAX, timing_);
    r.mem_bytes = mem;
    r.formula_bytes = shardopt::zero_memory_formula(stage, static_cast<double>(b_.psi), nranks_, t,
                                                    state_bytes());
    r.bucket_bytes = bucket_bytes(b_.psi, t, stage);

    // Every rank must hold the same parameters after a step.
    const std::uint64_t h = report::fnv1a(b_.params.data(), b_.psi * es);
    std::uint64_t lo = h, hi = h;
    MPI_Allreduce(MPI_IN_PLACE, &lo, 1, MPI_UINT64_T, MPI_MIN, timing_);
    MPI_Allreduce(MPI_IN_PLACE, &hi, 1, MPI_UINT64_T, MPI_MAX, timing_);
    differ = lo != hi;
    return r;
  }

 private:
  static void fill_values(void* dst, DType t, std::size_t n, std::uint64_t key, float lo,
                          float hi) {
    if (t == DType::bf16) {
      auto* p = static_cast<shardopt::bfloat16*>(dst);
#pragma omp parallel for schedule(static)
      for (std::size_t i = 0; i < n; ++i) p[i] = shardopt::bf16_from_float(uniform(key, i, lo, hi));
    } else {
      auto* p = static_cast<float*>(dst);
#pragma omp parallel for schedule(static)
      for (std::size_t i = 0; i < n; ++i) p[i] = uniform(key, i, lo, hi);
    }
  }

  const Options& o_;
  shardopt::Communicator& comm_;
  MPI_Comm raw_;     // the raw MPI collectives run here
  MPI_Comm timing_;  // barriers and the reductions of the results run here
  MPI_Comm node_;    // the ranks on this rank's node: their CPU time adds up
  int rank_;
  int nranks_;
  std::mt19937 order_;  // the same draws on every rank
  Buffers b_;
};

// ---------------------------------------------------------------------------
// Output

// printf to stdout without trailing blanks.
__attribute__((format(printf, 1, 2))) void print_line(const char* format, ...) {
  char line[512];
  std::va_list args;
  va_start(args, format);
  std::vsnprintf(line, sizeof line, format, args);
  va_end(args);
  std::string text(line);
  text.erase(text.find_last_not_of(" \n") + 1);
  std::printf("%s\n", text.c_str());
}

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
  if (std::find(o.dtypes.begin(), o.dtypes.end(), DType::bf16) != o.dtypes.end()) {
    std::fprintf(f, "# raw MPI reference for bf16: MPI_UINT16_T, MPI_SUM (MPI has no bf16 type)\n");
  }
  if (!o.json) {
    std::printf("#\n");
    print_line(
        "# %-5s %5s %7s %5s %9s %9s %9s %9s %9s %9s %9s %9s %9s %6s %9s %6s %8s %8s %6s %6s  "
        "%5s %6s\n",
        "stage", "ranks", "params", "dtype", "reduce", "update", "gather", "total", "exposed",
        "l_red", "l_upd", "l_gat", "limit", "ratio", "limit_b", "rat_b", "mem", "formula", "bkt",
        "m/f", "iters", "other");
    print_line(
        "# %-5s %5s %7s %5s %9s %9s %9s %9s %9s %9s %9s %9s %9s %6s %9s %6s %8s %8s %6s %6s  "
        "%5s %6s\n",
        "", "", "", "", "(us)", "(us)", "(us)", "(us)", "(us)", "(us)", "(us)", "(us)", "(us)", "",
        "(us)", "", "(MiB)", "(MiB)", "(MiB)", "", "", "");
  }
  std::fflush(f);
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
    j.str("optimizer", o.optimizer->name);
    j.real("bucket_mb", bucket_mb, 4);
    j.count("tensors", r.tensors);
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
    std::printf("%s\n", j.text().c_str());
  } else {
    char other[16] = "?";
    if (r.other_load >= 0) {
      std::snprintf(other, sizeof other, "%3.0f%%%s", 100 * r.other_load, r.busy() ? "*" : "");
    }
    print_line(
        "  %-5d %5d %7s %5s %9.1f %9.1f %9.1f %9.1f %9.1f %9.1f %9.1f %9.1f %9.1f %6.3f %9.1f "
        "%6.3f %8.1f %8.1f %6.1f %6.3f%1s %5d %6s\n",
        r.stage, r.ranks, human_count(r.params).c_str(), shardopt::dtype_name(r.dtype),
        r.reduce.median_us, r.update.median_us, r.gather.median_us, r.total.median_us,
        r.exposed_us(), r.l_reduce.median_us, r.l_update.median_us, r.l_gather.median_us,
        r.limit_us, r.ratio(), r.limit_b_us, r.ratio_b(), mib(r.mem_bytes),
        mib(r.mem_formula_bytes()), mib(static_cast<double>(r.report.buckets)), r.mem_ratio(),
        r.mem_goal_met() ? "" : "*", r.iters, other);
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
  const auto busy = std::count_if(rows.begin(), rows.end(), [](const Row& r) { return r.busy(); });
  machine::print_busy_rows(f, static_cast<std::size_t>(busy), rows.size(), kBusyFraction,
                           "marked * under other", "the step's");
  std::fflush(f);
}

int bench_main(int argc, char** argv) {
  int rank = 0;
  int nranks = 1;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &nranks);

  Options opt;
  try {
    opt = parse_options(argc, argv);
  } catch (const UsageError& e) {
    cli::print_usage_error(kProgram, rank, e);
    return 2;
  }
  if (opt.help) {
    if (rank == 0) std::fputs(usage().c_str(), stdout);
    return 0;
  }

  // Ranks sharing this node's memory, and what it has free.
  MPI_Comm node = MPI_COMM_NULL;
  MPI_Comm_split_type(MPI_COMM_WORLD, MPI_COMM_TYPE_SHARED, rank, MPI_INFO_NULL, &node);
  int local_ranks = 1;
  MPI_Comm_size(node, &local_ranks);
  double available = static_cast<double>(machine::mem_available_bytes());
  MPI_Allreduce(MPI_IN_PLACE, &available, 1, MPI_DOUBLE, MPI_MIN, MPI_COMM_WORLD);

  // From here on a failure may happen on some ranks only, in the middle of a
  // collective the others are waiting in: abort the job rather than hang.
  try {
    shardopt::Communicator comm(MPI_COMM_WORLD);
    MPI_Comm raw = MPI_COMM_NULL;
    MPI_Comm timing = MPI_COMM_NULL;
    MPI_Comm_dup(MPI_COMM_WORLD, &raw);
    MPI_Comm_dup(MPI_COMM_WORLD, &timing);
    Bench bench(opt, comm, raw, timing, node);
    const bool printer = rank == 0;
    if (printer) print_header(opt, bench, nranks, local_ranks);

    std::vector<Row> rows;
    bool any_differ = false;
    for (std::size_t psi : opt.params) {
      const double need = bench.bytes_needed(psi) * local_ranks;
      if (available > 0 && need > 0.9 * available) {
        if (printer) {
          std::fprintf(opt.json ? stderr : stdout,
                       "# skipping %s params: %d ranks here need about %.1f GiB, %.1f GiB "
                       "available\n",
                       human_count(psi).c_str(), local_ranks, need / (1 << 30),
                       available / (1 << 30));
        }
        continue;
      }
      bench.allocate(psi);
      for (DType t : opt.dtypes) {
        for (int stage : opt.stages) {
          bench.fill(t);
          bool differ = false;
          const Row r = bench.run(stage, t, differ);
          if (printer) print_row(opt, r, bench.bucket_mb());
          if (differ) {
            any_differ = true;
            if (printer) {
              std::fprintf(stderr,
                           "%s: stage %d, %s params, %s: the ranks' parameters differ after the "
                           "steps\n",
                           kProgram, stage, human_count(psi).c_str(), shardopt::dtype_name(t));
            }
          }
          rows.push_back(r);
        }
      }
    }
    if (printer) print_goals(opt, rows);
    MPI_Comm_free(&timing);
    MPI_Comm_free(&raw);
    MPI_Comm_free(&node);
    comm.free();
    return any_differ ? 1 : 0;
  } catch (const shardopt::Error& e) {
    cli::print_error(kProgram, rank, std::string(e.what()) + " (hint: " + e.hint() + ")");
    MPI_Abort(MPI_COMM_WORLD, 1);
    return 1;
  } catch (const std::exception& e) {
    cli::print_error(kProgram, rank, e.what());
    MPI_Abort(MPI_COMM_WORLD, 1);
    return 1;
  }
}

}  // namespace

int main(int argc, char** argv) { return cli::run_with_mpi(kProgram, argc, argv, bench_main); }
