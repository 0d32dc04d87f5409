// shardopt-plan: the command line.
#include <cmath>
#include <string>

#include "plan/plan.hpp"
#include "shardopt/zero.hpp"
#include "support/cli.hpp"

namespace plan {

std::string usage() {
  return "usage: shardopt-plan MODEL [options]\n"
         "\n"
         "How much memory each rank of a ZeRO run holds, and how long its optimizer step\n"
         "takes, before the job is submitted. Runs as one process, without MPI ranks.\n"
         "Memory is computed by the library's own layout code (shardopt::plan_memory): it\n"
         "is what memory_report() says on every rank of the real run, byte for byte.\n"
         "\n"
         "The model (one of):\n"
         "  -p, --params N           N parameters as one flat tensor: an integer, 7e9, or\n"
         "                           with a K, M or G suffix (powers of 1024)\n"
         "  -t, --tensors LIST       tensor shapes, comma-separated: 4096x4096,4096, with\n"
         "                           *N to repeat one: 4096x11008*32\n"
         "  -f, --from FILE          a safetensors file: a shardopt checkpoint (its\n"
         "                           parameters, dtype and optimizer), an export, or any\n"
         "                           model's .safetensors (every tensor)\n"
         "  -d, --dtype NAME         f32, bf16 (fp32 master) or f16 (default: the file's,\n"
         "                           else f32)\n"
         "      --remainders         bf16 parameters with 16-bit remainders instead of an\n"
         "                           fp32 master (ZeroOptions::param_remainders)\n"
         "      --reduce-fp32        reduce 16-bit gradients in fp32 (reduce_in_fp32)\n"
         "  -o, --optimizer NAME     the optimizer's key (default: the checkpoint's, else\n"
         "                           adam; sgd with momentum 0.9), one of:\n"
         "                           " +
         optimizer_keys() +
         "\n"
         "  -s, --stages LIST        ZeRO stages, comma-separated (default 0,1,2,3)\n"
         "  -b, --bucket-mb X        gradient bucket size in MiB (default SHARDOPT_BUCKET_MB,\n"
         "                           25)\n"
         "  -g, --grads MODE         owned (Param::grad null: the optimizer's buffer; the\n"
         "                           default), user (the application's buffers) or stream\n"
         "                           (stream_grads, stages 2 and 3: no full gradient)\n"
         "      --separate           each parameter in its own buffer (default: one flat\n"
         "                           buffer for the parameters, one for the gradients)\n"
         "      --units SPEC         stage 3's units (Param::unit), which end gradient\n"
         "                           buckets at every stage: N (-p: the model as N tensors\n"
         "                           of near-equal size, a unit each; -t, -f: consecutive\n"
         "                           tensors grouped into N units of about equal size), or\n"
         "                           one unit per tensor, comma-separated: 1,1,2,2,-1\n"
         "                           (default: each tensor a unit of its own)\n"
         "      --gather-limit-mb X  stage 3's pool of gathered units, MiB\n"
         "                           (gather_limit_bytes; default 0: three times the\n"
         "                           largest unit, at least 64 MiB, at most the model)\n"
         "      --persist-below-kb X\n"
         "                           stage 3: units of fewer KiB stay whole on every rank\n"
         "                           (persist_below_bytes; default 64; 0: none)\n"
         "\n"
         "The job:\n"
         "  -N, --nodes N            nodes (default 1)\n"
         "  -n, --ranks-per-node R   ranks on each node (default 1)\n"
         "      --device             parameters in device memory, one GPU per rank\n"
         "      --threads T          OpenMP threads per rank: the update's rate (-u) and\n"
         "                           stage 2's per-thread blocks (default: what the\n"
         "                           run's ranks use, OMP_NUM_THREADS, else the cores)\n"
         "\n"
         "The machine, for the step's time (measured files, or rates; a rate given\n"
         "replaces what a file says):\n"
         "  -c, --comm FILE          rows of shardopt-bench-comm --json from the target\n"
         "                           machine: one node's (the node hop) and/or several\n"
         "                           nodes' (the network hop); may be given twice\n"
         "  -u, --optim FILE         rows of shardopt-bench-optim --json (the update's rate;\n"
         "                           with --device, shardopt-bench-optim-gpu's)\n"
         "      --node-gbps X        bus bandwidth within a node, GB/s (1e9 bytes/s)\n"
         "      --node-latency-us X  its latency per step (default 2 with --node-gbps)\n"
         "      --net-gbps X         network bandwidth per node (all its links), GB/s\n"
         "      --net-latency-us X   its latency per step (default 5 with --net-gbps)\n"
         "      --mem-gbps X         memory bandwidth one rank's update gets, GB/s (host:\n"
         "                           the node's bandwidth / ranks per node; device: HBM)\n"
         "      --backward-ms X      the backward pass's time: stage 2's reductions\n"
         "                           overlap it (default 0: nothing hidden)\n"
         "  -m, --memory SIZE        memory per rank (K, M, G suffix): the largest model\n"
         "                           that fits at each stage, as one flat tensor\n"
         "      --json               one JSON object per stage on stdout\n"
         "  -h, --help               this text\n"
         "\n"
         "The time model (docs/plan.md): each collective is two hops, within the node\n"
         "((L-1) a + (L-1)/L B b over L ranks) and across M nodes, through each node's\n"
         "link ((M-1) a + (M-1)/M B b), a and b fitted to the bench-comm rows (least\n"
         "squares) and scaled to the job's L and M; per bucket: a reduce-scatter (stages\n"
         "0 and 1 also an allgather of the gradients), then an allgather of the parameters\n"
         "(stages 1, 2). Stage 3 reduces as stage 2 and gathers each unit twice a step\n"
         "(forward and backward) and the whole units once after the update: the traffic\n"
         "prefetch must hide under the layers' compute, counted here as not hidden.\n"
         "The update moves the bytes per parameter of shardopt-bench-optim's\n"
         "accounting at the rate a rank's threads reach (-u: the row with as many\n"
         "threads), at most the node's rate (its most threads) over its ranks.\n"
         "\n"
         "Exit status: 0 done; 1 an input that cannot be planned (a file that is not what\n"
         "it should be, a model that does not fit); 2 a bad option.\n";
}

namespace {

double parse_positive(const std::string& label, std::string_view v, bool zero_ok = false) {
  std::size_t used = 0;
  double x = 0;
  try {
    x = std::stod(std::string(v), &used);
  } catch (...) {
    used = 0;
  }
  if (used != v.size() || v.empty() || !std::isfinite(x) || x < 0 || (!zero_ok && x == 0))
    cli::bad_value(label, v, zero_ok ? "a number >= 0" : "a number > 0");
  return x;
}

// An integer, a decimal with an exponent (7e9), or K/M/G (powers of 1024).
std::uint64_t parse_count(const std::string& label, std::string_view v) {
  if (const auto s = cli::parse_scaled(v, std::uint64_t{1} << 50)) return *s;
  const double x = parse_positive(label, v);
  if (x != std::floor(x) || x > 1e15)
    cli::bad_value(label, v, "a whole number of parameters up to 1e15 (7e9, 350M, 1000)");
  return static_cast<std::uint64_t>(x);
}

// --units: N, or one Param::unit (-1, or 0 and up) per tensor.
void parse_units(const std::string& label, std::string_view v, Options& o) {
  const char* accepted =
      "a unit count N >= 1, or one unit per tensor, comma-separated (-1 or 0 and up: 1,1,2,2,-1)";
  o.unit_count = 0;
  o.unit_list.clear();
  if (v.find(',') == std::string_view::npos) {
    const auto n = cli::parse_unsigned(v);
    if (!n || *n == 0 || *n > (std::uint64_t{1} << 40)) cli::bad_value(label, v, accepted);
    o.unit_count = static_cast<std::size_t>(*n);
    return;
  }
  for (std::string_view u : cli::split(v)) {
    if (u == "-1") {
      o.unit_list.push_back(-1);
      continue;
    }
    const auto n = cli::parse_unsigned(u);
    if (!n || *n > std::uint64_t{1} << 30)
      throw cli::UsageError{"bad unit '" + std::string(u) + "' in " + label + " '" +
                            std::string(v) + "'; accepted: " + accepted};
    o.unit_list.push_back(static_cast<int>(*n));
  }
}

}  // namespace

Options parse_options(int argc, char** argv) {
  static constexpr cli::OptionSpec specs[] = {
      {'p', "params", true},        {'t', "tensors", true},
      {'f', "from", true},          {'d', "dtype", true},
      {0, "remainders", false},     {0, "reduce-fp32", false},
      {'o', "optimizer", true},     {'s', "stages", true},
      {'b', "bucket-mb", true},     {'g', "grads", true},
      {0, "separate", false},       {0, "units", true},
      {0, "gather-limit-mb", true}, {0, "persist-below-kb", true},
      {'N', "nodes", true},         {'n', "ranks-per-node", true},
      {0, "device", false},         {0, "threads", true},
      {'c', "comm", true},          {'u', "optim", true},
      {0, "node-gbps", true},       {0, "node-latency-us", true},
      {0, "net-gbps", true},        {0, "net-latency-us", true},
      {0, "mem-gbps", true},        {0, "backward-ms", true},
      {'m', "memory", true},        {0, "json", false},
      {'h', "help", false},
  };
  Options o;
  int models = 0;
  cli::for_each_option(
      argc, argv, specs,
      [&](const cli::OptionSpec& s, const std::string& label, std::string_view v) {
        const std::string name = s.long_name;
        if (name == "params") {
          o.params = parse_count(label, v);
          ++models;
        } else if (name == "tensors") {
          o.tensors = std::string(v);
          ++models;
        } else if (name == "from") {
          o.file = std::string(v);
          ++models;
        } else if (name == "dtype") {
          o.dtype = dtype_of(std::string(v));
          if (!o.dtype) cli::bad_value(label, v, "f32 bf16 f16");
        } else if (name == "remainders") {
          o.remainders = true;
        } else if (name == "reduce-fp32") {
          o.reduce_fp32 = true;
        } else if (name == "optimizer") {
          if (!optimizer_of(std::string(v))) cli::bad_value(label, v, optimizer_keys());
          o.optimizer = std::string(v);
        } else if (name == "stages") {
          o.stages.clear();
          for (std::string_view st : cli::split(v))
            o.stages.push_back(cli::parse_int(label, st, 0, 3, "0, 1, 2, 3"));
        } else if (name == "bucket-mb") {
          o.bucket_mb = parse_positive(label, v);
        } else if (name == "grads") {
          o.grads = cli::parse_choice<GradMode>(
              label, v,
              {{"owned", GradMode::owned}, {"user", GradMode::user}, {"stream", GradMode::stream}});
        } else if (name == "separate") {
          o.separate = true;
        } else if (name == "units") {
          parse_units(label, v, o);
        } else if (name == "gather-limit-mb") {
          o.gather_limit_mb = parse_positive(label, v, true);
        } else if (name == "persist-below-kb") {
          o.persist_below_kb = parse_positive(label, v, true);
        } else if (name == "nodes") {
          o.nodes = cli::parse_int(label, v, 1, 1 << 20, "a node count >= 1");
        } else if (name == "ranks-per-node") {
          o.ranks_per_node = cli::parse_int(label, v, 1, 1 << 16, "a rank count >= 1");
        } else if (name == "device") {
          o.device = true;
        } else if (name == "threads") {
          o.threads = cli::parse_int(label, v, 1, 1 << 12, "a thread count >= 1");
        } else if (name == "comm") {
          o.comm_files.emplace_back(v);
        } else if (name == "optim") {
          o.optim_file = std::string(v);
        } else if (name == "node-gbps") {
          o.node_gbps = parse_positive(label, v);
        } else if (name == "node-latency-us") {
          o.node_latency_us = parse_positive(label, v, true);
        } else if (name == "net-gbps") {
          o.net_gbps = parse_positive(label, v);
        } else if (name == "net-latency-us") {
          o.net_latency_us = parse_positive(label, v, true);
        } else if (name == "mem-gbps") {
          o.mem_gbps = parse_positive(label, v);
        } else if (name == "backward-ms") {
          o.backward_ms = parse_positive(label, v, true);
        } else if (name == "memory") {
          const auto m = cli::parse_scaled(v, std::uint64_t{1} << 60);
          if (!m) cli::bad_value(label, v, "a size in bytes with an optional K, M or G suffix");
          o.memory = *m;
        } else if (name == "json") {
          o.json = true;
        } else if (name == "help") {
          throw cli::UsageError{""};  // main prints the usage
        }
      });
  if (models != 1)
    throw cli::UsageError{models == 0
                              ? "no model: give -p (--params), -t (--tensors) or -f (--from)"
                              : "give one model: -p, -t or -f, once"};
  if (o.comm_files.size() > 2)
    throw cli::UsageError{"-c (--comm) at most twice: one node's rows and several nodes' rows"};
  // No --threads: as many as the run's ranks would use, counted by the
  // library's own rule (the OMP_NUM_THREADS of this shell, else the cores).
  if (o.threads == 0) o.threads = shardopt::plan_threads(shardopt::MemoryPlan{});
  return o;
}

}  // namespace plan
