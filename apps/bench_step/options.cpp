// shardopt-bench-step: the command line (options.hpp).
#include "options.hpp"

#include <algorithm>
#include <cstdlib>
#include <optional>
#include <stdexcept>
#include <string>
#include <string_view>

#include "../support/cli.hpp"

namespace bench_step {

using cli::bad_value;
using cli::OptionSpec;
using cli::parse_int;
using cli::split;

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
      "  -s, --stages LIST      ZeRO stages, comma-separated (default 0,1,2); 3: a step of\n"
      "                         the model in units (its blocks and head), each unit's\n"
      "                         forward and backward computing a loop over --compute-mb,\n"
      "                         at stage 3 (gathered a unit at a time) and stage 2 in the\n"
      "                         same iterations, beside the limit: per unit and pass the\n"
      "                         larger of the loop and the unit's raw communication, summed\n"
      "                         (host memory, streamed gradients)\n"
      "      --compute-mb X     -s 3: MiB each unit's forward and backward loop reads and\n"
      "                         writes (default 32)\n"
      "      --compute KIND     -s 3: loop (default) runs the loop; sleep sleeps as long\n"
      "                         as the loop takes, leaving the cores to the transport\n"
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
         "  -g, --grads LIST       stage 2's gradients, comma-separated, a row each: stream\n"
         "                         (default: stream_grads, each copied into its bucket by\n"
         "                         grad_ready(i, grad)), owned (buffers the optimizer owns)\n"
         "                         or user (the user's buffers, registered in Param::grad);\n"
         "                         owned and user are written once before the steps as a\n"
         "                         backward pass would write them and marked by\n"
         "                         grad_ready(i): the fused reduce-scatter + update where\n"
         "                         SHARDOPT_FUSED_UPDATE and the shm transport allow; the\n"
         "                         formula then counts the full gradient buffer too. A\n"
         "                         stream row also times the owned step in its iterations\n"
         "                         (a second optimizer on the same parameters; goal 3)\n"
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
         "  grads    stage 2's gradients (-g); stages 0 and 1: user\n"
         "  pass     stage 2: one pass over the gradients, a copy of the model's gradient\n"
         "           bytes (memcpy), timed in the same iterations\n"
         "  owned    stream rows: the same step on owned gradients, timed in the same\n"
         "           iterations (goal 3's reference)\n"
         "\n"
         "Goals, printed after the table: mem within 5% of the formula plus the buckets, that\n"
         "is 0.95 * formula alone <= mem <= 1.05 * (formula + buckets), since the buckets\n"
         "counted are an upper bound; stage-2 total within 1.3x of the limit at 25M params on\n"
         "2 ranks; the streamed step at most the owned one plus one pass over the gradients,\n"
         "all three timed in the stream row's iterations: stream / (owned + pass) <= 1.\n"
         "Timings are not pass/fail.\n"
         "\n"
         "Exit status: 0 every step ran and left every rank's parameters identical; 1 an error\n"
         "or parameters that differ across ranks; 2 a bad option. With --json, rank 0 prints one\n"
         "object per row with the keys stage, ranks, params, dtype, reduce_us, update_us,\n"
         "gather_us, total_us, limit_us, mem_bytes, mem_formula_bytes, then optimizer,\n"
         "bucket_mb, tensors, numels (each tensor's elements, comma-separated: what\n"
         "shardopt-plan -t takes), grads (stream, owned, user: stages 0, 1 user), iters, "
         "total_min_us, total_max_us, exposed_us,\n"
         "limit_reduce_us, limit_update_us, limit_gather_us, ratio, limit_reduce_bucketed_us,\n"
         "limit_update_bucketed_us, limit_gather_bucketed_us, limit_bucketed_us,\n"
         "ratio_bucketed, bucket_bytes_counted, mem_ratio, mem_goal_met, the memory report's\n"
         "categories (mem_master, mem_state, mem_grad_shard, mem_reduced_grads,\n"
         "mem_owned_grads, mem_buckets, mem_user_params, mem_user_grads), other_load\n"
         "(null: unknown), pass_us (0 below stage 2) and owned_us (stream rows; else 0).\n";
}

Options parse_options(int argc, char** argv) {
  Options o;
  for (std::size_t n : {1, 4, 25}) o.params.push_back(n << 20);
  // Adam, as the usage says (the list's first entry is SGD).
  for (const bench::OptimizerEntry& e : bench::optimizers())
    if (std::string_view(e.name) == "adam") o.optimizer = &e;

  static constexpr OptionSpec kSpecs[] = {
      {'s', "stages", true},    {'p', "params", true},    {'d', "dtype", true},
      {'o', "optimizer", true}, {'b', "bucket-mb", true}, {'w', "warmup", true},
      {'n', "iters", true},     {0, "json", false},       {'h', "help", false},
      {0, "device", true},      {'g', "grads", true},     {0, "compute-mb", true},
      {0, "compute", true},
  };
  cli::for_each_option(
      argc, argv, kSpecs,
      [&](const OptionSpec& spec, const std::string& label, std::string_view v) {
        const std::string_view name = spec.long_name;
        if (name == "stages") {
          o.stages.clear();
          for (std::string_view item : split(v))
            o.stages.push_back(parse_int(label, item, 0, 3, "0 1 2 3"));
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
            o.dtypes.push_back(cli::parse_choice<DType>(
                label, item, {{"f32", DType::f32}, {"bf16", DType::bf16}}));
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
        } else if (name == "device") {
          o.device = cli::parse_choice<bool>(label, v, {{"host", false}, {"cuda", true}});
        } else if (name == "grads") {
          o.grads.clear();
          for (std::string_view item : split(v)) {
            o.grads.push_back(cli::parse_choice<Options::Grads>(label, item,
                                                                {{"stream", Options::Grads::stream},
                                                                 {"owned", Options::Grads::owned},
                                                                 {"user", Options::Grads::user}}));
          }
        } else if (name == "compute-mb") {
          char* end = nullptr;
          const std::string s(v);
          const double x = std::strtod(s.c_str(), &end);
          if (s.empty() || *end != '\0' || !(x >= 0) || x > 65536)
            bad_value(label, v, "a number of MiB >= 0 and <= 65536 (32, 0.5)");
          o.compute_mb = x;
        } else if (name == "compute") {
          o.compute_sleep = cli::parse_choice<bool>(label, v, {{"loop", false}, {"sleep", true}});
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
  if (o.device && o.stages.back() == 3)
    throw cli::UsageError{"-s 3 runs on host memory: drop --device cuda, or give stages 0-2"};
  unique_sorted(o.params);
  unique_sorted(o.dtypes);
  // In the order given (owned first times it first), each once.
  for (std::size_t i = o.grads.size(); i-- > 0;)
    if (std::find(o.grads.begin(), o.grads.begin() + static_cast<std::ptrdiff_t>(i), o.grads[i]) !=
        o.grads.begin() + static_cast<std::ptrdiff_t>(i))
      o.grads.erase(o.grads.begin() + static_cast<std::ptrdiff_t>(i));
  return o;
}

shardopt::OptimizerConfig engine_config(const OptimizerEntry& e) {
  // From the descriptors, as bench::optimizers() makes its entries: every
  // optimizer the table offers has its engine options here.
  std::optional<shardopt::OptimizerConfig> config;
  shardopt::Optimizers::each([&]<class O>() {
    if (std::string_view(O::key) == e.name) config = bench::bench_options<O>();
  });
  if (!config) throw std::logic_error(std::string("no optimizer descriptor has the key ") + e.name);
  return *config;
}

}  // namespace bench_step
