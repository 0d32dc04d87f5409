// shardopt-train: the command line (options.hpp).
#include "options.hpp"

#include <algorithm>
#include <charconv>
#include <cmath>
#include <csignal>
#include <cstdint>
#include <iterator>
#include <limits>
#include <system_error>
#include <utility>
#include <vector>

#include "../support/cli.hpp"

namespace train {

using cli::bad_value;
using cli::OptionSpec;
using cli::parse_int;
using cli::UsageError;
using shardopt::DType;

const char* const kUsage =
    "usage: shardopt-train [options]\n"
    "\n"
    "Trains a multi-layer perceptron (tanh hidden layers, matmuls through OpenBLAS) data-\n"
    "parallel on shardopt's ZeRO engine: it learns, with an MSE loss, to reproduce a fixed\n"
    "random teacher network on random inputs. Each rank draws its own samples; the global\n"
    "batch is --batch times the number of ranks. Run it under mpirun or srun.\n"
    "\n"
    "Optimizer and engine:\n"
    "  -o, --optimizer NAME   the optimizer (default adamw); the list and each one's flags\n"
    "                         are below\n"
    "  -s, --stage N          ZeRO stage 0, 1, 2 or 3 (default 2); at stage 3 each layer is a\n"
    "                         unit, gathered before its forward and backward passes and\n"
    "                         released after (host only)\n"
    "  -p, --precision T      f32 bf16 f16: the type of the model's parameters and gradients\n"
    "                         (default f32); 16-bit models are computed in fp32 working copies\n"
    "      --lr X             learning rate (default per optimizer, tuned on the default\n"
    "                         problem: in the list below; sgd with momentum 0.9)\n"
    "      --schedule S       cosine (decay to 0 over --steps) or constant (default cosine)\n"
    "      --clip MAX_NORM    clip the global gradient norm to MAX_NORM before each step\n"
    "      --bucket-mb X      gradient bucket size in MiB (default: SHARDOPT_BUCKET_MB, 25)\n"
    "      --loss-scale M     dynamic or none (default: dynamic for f16, none otherwise)\n"
    "      --param-remainders bf16 only: keep the fp32 master as 16-bit remainders\n"
    "      --reduce-fp32      reduce 16-bit gradients in fp32\n"
    "      --grad-reduction R avg or sum: the gradients averaged or summed over the ranks\n"
    "                         (default avg)\n"
    "\n"
    "Training:\n"
    "  -n, --steps N          optimizer steps, in all: those before a --resume checkpoint\n"
    "                         included (default 500)\n"
    "  -b, --batch N          samples per rank and step (default 128)\n"
    "  -m, --micro-batches N  split each rank's batch into N micro-batches, gradients\n"
    "                         accumulated (default 1)\n"
    "      --seed N           seed of the teacher, the initial weights and the data (default 1)\n"
    "      --eval-samples N   held-out samples per rank for the initial and final loss\n"
    "                         (default 1024)\n"
    "\n"
    "Model:\n"
    "      --inputs N         input features (default 16)\n"
    "      --outputs N        output features (default 4)\n"
    "      --hidden N         width of the hidden layers (default 768)\n"
    "      --layers N         linear layers, N - 1 of them hidden (default 3)\n"
    "      --teacher-hidden N width of the teacher's hidden layers (default 16)\n"
    "      --scattered        allocate each parameter and gradient separately instead of\n"
    "                         one buffer for all parameters and one for all gradients\n"
    "      --device D         host or cuda: where the model lives and trains (default\n"
    "                         host). cuda: parameters, gradients and optimizer state in\n"
    "                         device memory, the passes through cuBLAS, each rank on the\n"
    "                         device of its node's local rank (docs/gpu.md)\n"
    "\n"
    "Output:\n"
    "  -l, --log-every N      print a line every N steps (default 25), and the first and last\n"
    "      --json             one JSON object per line instead of text\n"
    "      --progress P       auto, on or off: a live progress line on a terminal (default\n"
    "                         auto: when the output goes to a terminal)\n"
    "      --save-params FILE write the final parameters to FILE (format: docs/train.md)\n"
    "  -h, --help             this text\n"
    "\n"
    "Checkpoints (safetensors files, docs/train.md):\n"
    "      --checkpoint PATH  write a checkpoint of the optimizer (master weights, optimizer\n"
    "                         state, step count, loss scaler) to PATH at the end\n"
    "      --checkpoint-every N\n"
    "                         also every N steps (default 0: at the end only)\n"
    "      --keep-last K      keep the K newest checkpoints: PATH, then the older ones at\n"
    "                         PATH.1, PATH.2, ... (default 1)\n"
    "      --resume PATH      load the checkpoint PATH (written at any rank count and stage)\n"
    "                         and go on from its step count to --steps steps in all; the\n"
    "                         optimizer's flags and --lr given with it replace the\n"
    "                         checkpoint's, while -o, -p, --loss-scale and --grad-reduction\n"
    "                         must be the checkpoint's (docs/train.md)\n"
    "      --overwrite        let --checkpoint replace an existing file without --resume\n"
    "                         (otherwise the run refuses to start)\n"
    "      --export PATH      write the final fp32 parameters to PATH, for inference\n"
    "      --stop-on SIGNALS  stop on any of these signals (a comma list of USR1, USR2, TERM,\n"
    "                         INT): at the next step boundary, agreed by every rank, write\n"
    "                         the checkpoint (--checkpoint) and exit with status 3, for a job\n"
    "                         script to requeue; --resume then goes on from it. For Slurm's\n"
    "                         --signal=B:USR1@SECONDS and scontrol requeue (SIGTERM):\n"
    "                         scripts/slurm/ (docs/getting-started.md)\n"
    "\n"
    "Each log line shows the step, the training loss of the step's batch averaged over the\n"
    "ranks, the learning rate, and the mean time per step since the previous line of the\n"
    "slowest rank: compute (forward and backward), reduce (finishing the gradient\n"
    "reduction, clip_grad_norm included), update, gather (the allgather of the\n"
    "parameters), the whole step, and the samples per second over all ranks. The summary\n"
    "gives the loss on held-out samples before and after training.\n"
    "\n"
    "A step the loss scaler skips (non-finite gradients) is tried again on the same batch\n"
    "at the lower scale: --steps counts the steps applied, so that the batch and the\n"
    "learning rate of step s depend on the seed, the rank and s only, and a run resumed\n"
    "from a checkpoint takes the same steps as one that was never stopped.\n"
    "\n"
    "Exit status: 0 done, 1 an error, 2 a bad option (or one a --resume checkpoint refuses, or\n"
    "an existing --checkpoint file without --resume or --overwrite), 3 stopped by a --stop-on "
    "signal with\n"
    "the checkpoint written.\n";

double parse_number(const std::string& label, std::string_view s, bool allow_zero) {
  double v = 0.0;
  const auto [end, ec] = std::from_chars(s.data(), s.data() + s.size(), v);
  if (s.empty() || ec != std::errc() || end != s.data() + s.size() || !std::isfinite(v) ||
      v < 0.0 || (!allow_zero && v == 0.0)) {
    bad_value(label, s, allow_zero ? "a number >= 0" : "a number > 0");
  }
  return v;
}

namespace {

// The options but the optimizer's (optimizer_option_specs()).
constexpr OptionSpec kOptionSpecs[] = {
    {'s', "stage", true},
    {'p', "precision", true},
    {0, "schedule", true},
    {0, "clip", true},
    {0, "bucket-mb", true},
    {0, "loss-scale", true},
    {0, "param-remainders", false},
    {0, "reduce-fp32", false},
    {0, "grad-reduction", true},
    {'n', "steps", true},
    {'b', "batch", true},
    {'m', "micro-batches", true},
    {0, "seed", true},
    {0, "eval-samples", true},
    {0, "inputs", true},
    {0, "outputs", true},
    {0, "hidden", true},
    {0, "layers", true},
    {0, "teacher-hidden", true},
    {0, "scattered", false},
    {0, "device", true},
    {'l', "log-every", true},
    {0, "json", false},
    {0, "progress", true},
    {0, "save-params", true},
    {0, "checkpoint", true},
    {0, "checkpoint-every", true},
    {0, "keep-last", true},
    {0, "resume", true},
    {0, "overwrite", false},
    {0, "export", true},
    {0, "stop-on", true},
    {'h', "help", false},
};

constexpr int kMaxDim = 1 << 16;

// --stop-on: "USR1,TERM" (with or without SIG) to signal numbers, each once.
std::vector<int> parse_signals(const std::string& label, std::string_view v) {
  static constexpr std::pair<std::string_view, int> kSignals[] = {
      {"USR1", SIGUSR1}, {"USR2", SIGUSR2}, {"TERM", SIGTERM}, {"INT", SIGINT}};
  std::vector<int> out;
  std::size_t begin = 0;
  while (begin <= v.size()) {
    std::size_t end = v.find(',', begin);
    if (end == std::string_view::npos) end = v.size();
    std::string_view name = v.substr(begin, end - begin);
    if (name.starts_with("SIG")) name.remove_prefix(3);
    const auto* it = std::find_if(std::begin(kSignals), std::end(kSignals),
                                  [&](const auto& s) { return s.first == name; });
    if (it == std::end(kSignals)) {
      bad_value(label, v, "a comma list of USR1, USR2, TERM, INT (e.g. USR1,TERM)");
    }
    if (std::find(out.begin(), out.end(), it->second) == out.end()) out.push_back(it->second);
    begin = end + 1;
  }
  return out;
}

void apply_option(Options& o, const OptionSpec& spec, const std::string& label,
                  std::string_view v) {
  if (apply_optimizer_option(o.optimizer, spec, label, v)) return;
  const std::string_view name = spec.long_name;
  if (name == "stage") {
    o.stage = parse_int(label, v, 0, 3, "0 1 2 3");
  } else if (name == "precision") {
    o.precision = cli::parse_choice<DType>(
        label, v, {{"f32", DType::f32}, {"bf16", DType::bf16}, {"f16", DType::f16}});
  } else if (name == "schedule") {
    o.schedule = cli::parse_choice<Schedule>(
        label, v, {{"cosine", Schedule::cosine}, {"constant", Schedule::constant}});
  } else if (name == "clip") {
    o.clip = parse_number(label, v, false);
  } else if (name == "bucket-mb") {
    o.bucket_mb = parse_number(label, v, false);
    if (o.bucket_mb > 65536.0) bad_value(label, v, "a number of MiB > 0 and <= 65536");
  } else if (name == "loss-scale") {
    o.loss_scale = cli::parse_choice<LossScaling>(
        label, v, {{"dynamic", LossScaling::dynamic}, {"none", LossScaling::none}});
  } else if (name == "param-remainders") {
    o.param_remainders = true;
  } else if (name == "reduce-fp32") {
    o.reduce_in_fp32 = true;
  } else if (name == "grad-reduction") {
    o.grad_reduction = cli::parse_choice<shardopt::GradReduction>(
        label, v, {{"avg", shardopt::GradReduction::avg}, {"sum", shardopt::GradReduction::sum}});
  } else if (name == "steps") {
    o.steps = parse_int(label, v, 1, 1 << 30, "an integer >= 1");
  } else if (name == "batch") {
    o.batch = parse_int(label, v, 1, 1 << 20, "an integer from 1 to 1048576");
  } else if (name == "micro-batches") {
    o.micro_batches = parse_int(label, v, 1, 1 << 20, "an integer >= 1 and <= --batch");
  } else if (name == "seed") {
    const auto s = cli::parse_unsigned(v);
    if (!s) bad_value(label, v, "an integer >= 0");
    o.seed = *s;
  } else if (name == "eval-samples") {
    o.eval_samples = parse_int(label, v, 1, 1 << 24, "an integer >= 1");
  } else if (name == "inputs") {
    o.inputs = parse_int(label, v, 1, kMaxDim, "an integer from 1 to 65536");
  } else if (name == "outputs") {
    o.outputs = parse_int(label, v, 1, kMaxDim, "an integer from 1 to 65536");
  } else if (name == "hidden") {
    o.hidden = parse_int(label, v, 1, kMaxDim, "an integer from 1 to 65536");
  } else if (name == "layers") {
    o.layers = parse_int(label, v, 1, 64, "an integer from 1 to 64");
  } else if (name == "teacher-hidden") {
    o.teacher_hidden = parse_int(label, v, 1, kMaxDim, "an integer from 1 to 65536");
  } else if (name == "scattered") {
    o.scattered = true;
  } else if (name == "device") {
    o.device = cli::parse_choice<bool>(label, v, {{"host", false}, {"cuda", true}});
  } else if (name == "log-every") {
    o.log_every = parse_int(label, v, 1, 1 << 30, "an integer >= 1");
  } else if (name == "json") {
    o.json = true;
  } else if (name == "progress") {
    o.progress = cli::parse_choice<Progress>(
        label, v, {{"auto", Progress::automatic}, {"on", Progress::on}, {"off", Progress::off}});
  } else if (name == "save-params") {
    if (v.empty()) bad_value(label, v, "a file name");
    o.save_params = std::string(v);
  } else if (name == "checkpoint") {
    if (v.empty()) bad_value(label, v, "a file name");
    o.checkpoint = std::string(v);
  } else if (name == "checkpoint-every") {
    o.checkpoint_every = parse_int(label, v, 0, 1 << 30, "an integer >= 0");
  } else if (name == "keep-last") {
    o.keep_last = parse_int(label, v, 1, 1000, "an integer from 1 to 1000");
  } else if (name == "resume") {
    if (v.empty()) bad_value(label, v, "a file name");
    o.resume = std::string(v);
  } else if (name == "overwrite") {
    o.overwrite = true;
  } else if (name == "export") {
    if (v.empty()) bad_value(label, v, "a file name");
    o.export_path = std::string(v);
  } else if (name == "stop-on") {
    o.stop_signals = parse_signals(label, v);
  } else if (name == "help") {
    o.help = true;
  }
}

}  // namespace

Options parse_options(int argc, char** argv) {
  Options o;
  std::vector<OptionSpec> specs(optimizer_option_specs().begin(), optimizer_option_specs().end());
  specs.insert(specs.end(), std::begin(kOptionSpecs), std::end(kOptionSpecs));
  cli::for_each_option(argc, argv, specs,
                       [&](const OptionSpec& spec, const std::string& label, std::string_view v) {
                         o.given.insert(spec.long_name);
                         apply_option(o, spec, label, v);
                       });
  if (o.help) return o;
  optimizer_config(o.optimizer);  // a flag the optimizer does not have is a usage error
  if (o.micro_batches > o.batch) {
    throw UsageError{"-m (--micro-batches) " + std::to_string(o.micro_batches) +
                     " is more than -b (--batch) " + std::to_string(o.batch) +
                     ": each micro-batch needs at least one sample"};
  }
  if (o.param_remainders && o.precision != DType::bf16) {
    throw UsageError{
        "--param-remainders needs -p (--precision) bf16: the remainders complete "
        "bf16 parameters to the fp32 master"};
  }
  if (o.device && o.stage == 3) {
    throw UsageError{
        "-s 3 trains on the host: the device passes take every layer at once, and stage 3 "
        "gathers one layer at a time; use --device host, or stage 2 on the device"};
  }
  if (o.device && o.scattered) {
    throw UsageError{
        "--scattered is a host layout: --device cuda keeps the parameters in one device "
        "buffer and the gradients in another; drop --scattered"};
  }
  if (o.checkpoint.empty() && !o.stop_signals.empty()) {
    throw UsageError{
        "--stop-on needs --checkpoint PATH: a stopped run writes its checkpoint there, and "
        "the requeued job resumes from it"};
  }
  if (o.checkpoint.empty() && o.overwrite) {
    throw UsageError{"--overwrite needs --checkpoint PATH: the file it lets the run replace"};
  }
  if (o.checkpoint.empty() && (o.checkpoint_every > 0 || o.keep_last)) {
    throw UsageError{std::string(o.checkpoint_every > 0 ? "--checkpoint-every" : "--keep-last") +
                     " needs --checkpoint PATH: where the checkpoints go"};
  }
  // Every layer's activations and gradients are [batch, width] fp32 arrays
  // indexed with int by BLAS.
  const std::int64_t widest = std::max({o.inputs, o.outputs, o.hidden, o.teacher_hidden});
  if (static_cast<std::int64_t>(o.batch) * widest > std::numeric_limits<int>::max() / 2) {
    throw UsageError{"-b (--batch) times the widest layer is too large for one BLAS call"};
  }
  return o;
}

}  // namespace train
