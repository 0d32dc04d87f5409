// shardopt-train: a small data-parallel training job on the ZeRO engine.
//
// A multi-layer perceptron (matmuls through OpenBLAS) learns, with an MSE
// loss, to reproduce a fixed random "teacher" network on random inputs. The
// teacher and the student's initial weights are drawn from the seed, the
// same on every rank; each rank draws its own samples (from the seed and its
// rank), so the global batch is split across the ranks. Each layer's weight
// and bias is one shardopt::Param in the trainer's own buffers; the backward
// pass hands each gradient to the optimizer as soon as it is complete
// (grad_ready, last layer first), so that stage 2 reduces while the rest of
// the backward pass runs, and step() updates and gathers the parameters.
//
//   mpirun -n 2 shardopt-train                          # adamw, stage 2, f32
//   mpirun -n 4 shardopt-train -o lamb -s 1 -p bf16 --clip 1.0 --json
//
// Rank 0 prints the configuration, the memory per rank beside the ZeRO
// formula, a line every --log-every steps and a summary; docs/train.md
// describes the options, the output and the --save-params file. With
// --checkpoint the optimizer saves checkpoints (save()), which --resume
// loads (load()) at any rank count; --export writes the parameters
// (export_params()). Uses only the public API of shardopt, MPI, OpenBLAS
// and the standard library.
#include <mpi.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <charconv>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <filesystem>
#include <limits>
#include <memory>
#include <numbers>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <system_error>
#include <utility>
#include <variant>
#include <vector>

#include "cli.hpp"
#include "report.hpp"
#include "shardopt/shardopt.hpp"
#include "shardopt/zero.hpp"
#include "train_model.hpp"

namespace {

using cli::bad_value;
using cli::OptionSpec;
using cli::parse_int;
using cli::UsageError;
using report::json_number;

using shardopt::DType;

constexpr const char* kProgram = "shardopt-train";

// The loss the default run must end below (README.md, tests/cli/test_train.sh).
constexpr double kDemoThreshold = 1e-2;

// Purposes of the random streams (see train::stream_key).
constexpr std::uint64_t kTeacherStream = 1;
constexpr std::uint64_t kStudentStream = 2;
constexpr std::uint64_t kDataStream = 3;
constexpr std::uint64_t kEvalStream = 4;

// ---------------------------------------------------------------------------
// Options

enum class OptimizerKind { sgd, adam, adamw, adagrad, rmsprop, lion, lamb };

struct OptimizerEntry {
  OptimizerKind kind;
  const char* name;
  double default_lr;  // tuned on the default problem
};

constexpr OptimizerEntry kOptimizers[] = {
    {OptimizerKind::sgd, "sgd", 0.2},          {OptimizerKind::adam, "adam", 5e-3},
    {OptimizerKind::adamw, "adamw", 5e-3},     {OptimizerKind::adagrad, "adagrad", 1e-2},
    {OptimizerKind::rmsprop, "rmsprop", 1e-3}, {OptimizerKind::lion, "lion", 3e-4},
    {OptimizerKind::lamb, "lamb", 2e-2},
};

const OptimizerEntry& entry_of(OptimizerKind k) {
  for (const OptimizerEntry& e : kOptimizers) {
    if (e.kind == k) return e;
  }
  return kOptimizers[0];
}

enum class LossScaling { automatic, dynamic, none };
enum class Schedule { cosine, constant };
enum class Progress { automatic, on, off };

struct Options {
  OptimizerKind optimizer = OptimizerKind::adamw;
  int stage = 2;
  DType precision = DType::f32;
  int steps = 500;
  std::optional<double> lr;
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
  bool scattered = false;
  std::string save_params;
  std::string checkpoint;  // --checkpoint: where checkpoints go
  int checkpoint_every = 0;
  std::optional<int> keep_last;
  std::string resume;  // --resume: the checkpoint to start from
  std::string export_path;
  bool json = false;
  Progress progress = Progress::automatic;
  bool help = false;

  double learning_rate() const { return lr.value_or(entry_of(optimizer).default_lr); }
  bool uses_scaler() const {
    return loss_scale == LossScaling::dynamic ||
           (loss_scale == LossScaling::automatic && precision == DType::f16);
  }
};

constexpr const char* kUsage =
    "usage: shardopt-train [options]\n"
    "\n"
    "Trains a multi-layer perceptron (tanh hidden layers, matmuls through OpenBLAS) data-\n"
    "parallel on shardopt's ZeRO engine: it learns, with an MSE loss, to reproduce a fixed\n"
    "random teacher network on random inputs. Each rank draws its own samples; the global\n"
    "batch is --batch times the number of ranks. Run it under mpirun or srun.\n"
    "\n"
    "Optimizer and engine:\n"
    "  -o, --optimizer NAME   sgd adam adamw adagrad rmsprop lion lamb (default adamw)\n"
    "  -s, --stage N          ZeRO stage 0, 1 or 2 (default 2)\n"
    "  -p, --precision T      f32 bf16 f16: the type of the model's parameters and gradients\n"
    "                         (default f32); 16-bit models are computed in fp32 working copies\n"
    "      --lr X             learning rate (default per optimizer: sgd 0.2 with momentum\n"
    "                         0.9, adam 5e-3, adamw 5e-3, adagrad 1e-2, rmsprop 1e-3,\n"
    "                         lion 3e-4, lamb 2e-2)\n"
    "      --schedule S       cosine (decay to 0 over --steps) or constant (default cosine)\n"
    "      --clip MAX_NORM    clip the global gradient norm to MAX_NORM before each step\n"
    "      --bucket-mb X      gradient bucket size in MiB (default: SHARDOPT_BUCKET_MB, 25)\n"
    "      --loss-scale M     dynamic or none (default: dynamic for f16, none otherwise)\n"
    "      --param-remainders bf16 only: keep the fp32 master as 16-bit remainders\n"
    "      --reduce-fp32      reduce 16-bit gradients in fp32\n"
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
    "                         and go on from its step count to --steps steps in all\n"
    "      --export PATH      write the final fp32 parameters to PATH, for inference\n"
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
    "Exit status: 0 done, 1 an error, 2 a bad option.\n";

double parse_number(const std::string& label, std::string_view s, bool allow_zero) {
  double v = 0.0;
  const auto [end, ec] = std::from_chars(s.data(), s.data() + s.size(), v);
  if (s.empty() || ec != std::errc() || end != s.data() + s.size() || !std::isfinite(v) ||
      v < 0.0 || (!allow_zero && v == 0.0)) {
    bad_value(label, s, allow_zero ? "a number >= 0" : "a number > 0");
  }
  return v;
}

constexpr OptionSpec kOptionSpecs[] = {
    {'o', "optimizer", true},
    {'s', "stage", true},
    {'p', "precision", true},
    {0, "lr", true},
    {0, "schedule", true},
    {0, "clip", true},
    {0, "bucket-mb", true},
    {0, "loss-scale", true},
    {0, "param-remainders", false},
    {0, "reduce-fp32", false},
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
    {'l', "log-every", true},
    {0, "json", false},
    {0, "progress", true},
    {0, "save-params", true},
    {0, "checkpoint", true},
    {0, "checkpoint-every", true},
    {0, "keep-last", true},
    {0, "resume", true},
    {0, "export", true},
    {'h', "help", false},
};

constexpr int kMaxDim = 1 << 16;

void apply_option(Options& o, const OptionSpec& spec, const std::string& label,
                  std::string_view v) {
  const std::string_view name = spec.long_name;
  if (name == "optimizer") {
    const auto it = std::find_if(std::begin(kOptimizers), std::end(kOptimizers),
                                 [&](const OptimizerEntry& e) { return v == e.name; });
    if (it == std::end(kOptimizers)) {
      bad_value(label, v, "sgd adam adamw adagrad rmsprop lion lamb");
    }
    o.optimizer = it->kind;
  } else if (name == "stage") {
    o.stage = parse_int(label, v, 0, 2, "0 1 2");
  } else if (name == "precision") {
    if (v == "f32") {
      o.precision = DType::f32;
    } else if (v == "bf16") {
      o.precision = DType::bf16;
    } else if (v == "f16") {
      o.precision = DType::f16;
    } else {
      bad_value(label, v, "f32 bf16 f16");
    }
  } else if (name == "lr") {
    o.lr = parse_number(label, v, false);
  } else if (name == "schedule") {
    if (v == "cosine") {
      o.schedule = Schedule::cosine;
    } else if (v == "constant") {
      o.schedule = Schedule::constant;
    } else {
      bad_value(label, v, "cosine constant");
    }
  } else if (name == "clip") {
    o.clip = parse_number(label, v, false);
  } else if (name == "bucket-mb") {
    o.bucket_mb = parse_number(label, v, false);
    if (o.bucket_mb > 65536.0) bad_value(label, v, "a number of MiB > 0 and <= 65536");
  } else if (name == "loss-scale") {
    if (v == "dynamic") {
      o.loss_scale = LossScaling::dynamic;
    } else if (v == "none") {
      o.loss_scale = LossScaling::none;
    } else {
      bad_value(label, v, "dynamic none");
    }
  } else if (name == "param-remainders") {
    o.param_remainders = true;
  } else if (name == "reduce-fp32") {
    o.reduce_in_fp32 = true;
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
  } else if (name == "log-every") {
    o.log_every = parse_int(label, v, 1, 1 << 30, "an integer >= 1");
  } else if (name == "json") {
    o.json = true;
  } else if (name == "progress") {
    if (v == "auto") {
      o.progress = Progress::automatic;
    } else if (v == "on") {
      o.progress = Progress::on;
    } else if (v == "off") {
      o.progress = Progress::off;
    } else {
      bad_value(label, v, "auto on off");
    }
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
  } else if (name == "export") {
    if (v.empty()) bad_value(label, v, "a file name");
    o.export_path = std::string(v);
  } else if (name == "help") {
    o.help = true;
  }
}

Options parse_options(int argc, char** argv) {
  Options o;
  cli::for_each_option(argc, argv, kOptionSpecs,
                       [&](const OptionSpec& spec, const std::string& label, std::string_view v) {
                         apply_option(o, spec, label, v);
                       });
  if (o.help) return o;
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

// ---------------------------------------------------------------------------
// The optimizer configuration

shardopt::OptimizerConfig optimizer_config(const Options& o) {
  const double lr = o.learning_rate();
  switch (o.optimizer) {
    case OptimizerKind::sgd: {
      shardopt::SGD c;
      c.lr = lr;
      c.momentum = 0.9;
      return c;
    }
    case OptimizerKind::adam: {
      shardopt::Adam c;
      c.lr = lr;
      return c;
    }
    case OptimizerKind::adamw: {
      shardopt::AdamW c;
      c.lr = lr;
      return c;
    }
    case OptimizerKind::adagrad: {
      shardopt::Adagrad c;
      c.lr = lr;
      return c;
    }
    case OptimizerKind::rmsprop: {
      shardopt::RMSprop c;
      c.lr = lr;
      return c;
    }
    case OptimizerKind::lion: {
      shardopt::Lion c;
      c.lr = lr;
      return c;
    }
    case OptimizerKind::lamb: {
      shardopt::Lamb c;
      c.lr = lr;
      return c;
    }
  }
  return shardopt::AdamW{};
}

double scheduled_lr(const Options& o, int step_index) {
  if (o.schedule == Schedule::constant) return o.learning_rate();
  const double t = static_cast<double>(step_index) / static_cast<double>(o.steps);
  return o.learning_rate() * 0.5 * (1.0 + std::cos(std::numbers::pi * t));
}

// ---------------------------------------------------------------------------
// The model's tensors

train::Shape student_shape(const Options& o) {
  train::Shape s;
  s.dims.push_back(o.inputs);
  for (int l = 1; l < o.layers; ++l) s.dims.push_back(o.hidden);
  s.dims.push_back(o.outputs);
  return s;
}

train::Shape teacher_shape(const Options& o) {
  train::Shape s;
  s.dims.push_back(o.inputs);
  for (int l = 1; l < o.layers; ++l) s.dims.push_back(o.teacher_hidden);
  s.dims.push_back(o.outputs);
  return s;
}

// The parameters and gradients the optimizer works on, in the model's
// dtype, and the fp32 views the forward and backward passes use. Tensor 2l
// is layer l's weight, 2l + 1 its bias (the order of the forward pass).
// Contiguous (the default): one buffer holds every parameter, end to end in
// that order, and one every gradient, as a code with flat parameter
// storage has them. Scattered: a buffer per tensor.
class ModelTensors {
 public:
  ModelTensors(const train::Shape& shape, DType dtype, bool scattered)
      : dtype_(dtype), scattered_(scattered) {
    for (int l = 0; l < shape.layers(); ++l) {
      add("layers." + std::to_string(l) + ".weight", shape.weight_numel(l),
          {static_cast<std::uint32_t>(shape.out(l)), static_cast<std::uint32_t>(shape.in(l))});
      add("layers." + std::to_string(l) + ".bias", shape.bias_numel(l),
          {static_cast<std::uint32_t>(shape.out(l)), 0});
    }
    const std::size_t esize = shardopt::dtype_size(dtype);
    if (scattered_) {
      for (Tensor& t : tensors_) {
        // At least one element, so that no pointer is null.
        t.param_storage.resize(std::max<std::size_t>(t.numel, 1) * esize);
        t.grad_storage.resize(std::max<std::size_t>(t.numel, 1) * esize);
        t.param = t.param_storage.data();
        t.grad = t.grad_storage.data();
      }
    } else {
      params_ = shardopt::HostBuffer(std::max<std::size_t>(numel_, 1) * esize);
      grads_ = shardopt::HostBuffer(std::max<std::size_t>(numel_, 1) * esize);
      for (Tensor& t : tensors_) {
        t.param = params_.as<std::byte>() + t.offset * esize;
        t.grad = grads_.as<std::byte>() + t.offset * esize;
      }
    }
    if (dtype_ != DType::f32) {
      work_params_.resize(numel_);
      work_grads_.resize(numel_);
    }
  }

  std::size_t count() const { return tensors_.size(); }
  std::size_t numel() const { return numel_; }
  DType dtype() const { return dtype_; }
  bool scattered() const { return scattered_; }
  const std::string& name(std::size_t i) const { return tensors_[i].name; }
  std::size_t numel(std::size_t i) const { return tensors_[i].numel; }
  std::size_t offset(std::size_t i) const { return tensors_[i].offset; }
  // {rows, columns}; columns 0 for a vector.
  std::array<std::uint32_t, 2> dims(std::size_t i) const { return tensors_[i].dims; }
  void* param(std::size_t i) { return tensors_[i].param; }
  const void* param(std::size_t i) const { return tensors_[i].param; }
  void* grad(std::size_t i) { return tensors_[i].grad; }
  // Bytes of the trainer's fp32 working copies (16-bit models only).
  std::size_t working_bytes() const {
    return (work_params_.size() + work_grads_.size()) * sizeof(float);
  }

  std::vector<shardopt::Param> registration() {
    std::vector<shardopt::Param> out;
    for (Tensor& t : tensors_) {
      shardopt::Param p;
      p.name = t.name;
      p.data = t.param;
      p.numel = t.numel;
      p.dtype = dtype_;
      p.grad = t.grad;
      // [out, in] for a weight, [out] for a bias: the shapes of checkpoints
      // and exports.
      p.shape = {t.dims[0]};
      if (t.dims[1] != 0) p.shape.push_back(t.dims[1]);
      out.push_back(std::move(p));
    }
    return out;
  }

  // Sets the parameters from fp32 values laid out as offset() says.
  void set_params(std::span<const float> values) {
    for (std::size_t i = 0; i < count(); ++i) {
      shardopt::cast(values.data() + offset(i), DType::f32, param(i), dtype_, numel(i));
    }
  }

  // The fp32 parameters of each layer: the parameters themselves for an
  // fp32 model, else working copies that refresh_working() fills.
  std::vector<train::LayerParams> layer_params() {
    std::vector<train::LayerParams> out;
    for (std::size_t i = 0; i + 1 < count(); i += 2) {
      out.push_back({fp32_param(i), fp32_param(i + 1)});
    }
    return out;
  }
  // The fp32 gradients of each layer: the registered gradient buffers for an
  // fp32 model, else working copies that publish_grad() converts.
  std::vector<train::LayerGrads> layer_grads() {
    std::vector<train::LayerGrads> out;
    for (std::size_t i = 0; i + 1 < count(); i += 2) {
      out.push_back({fp32_grad(i), fp32_grad(i + 1)});
    }
    return out;
  }

  // 16-bit models: converts the parameters (as the last step left them)
  // into the fp32 working copies.
  void refresh_working() {
    if (dtype_ == DType::f32) return;
    if (!scattered_) {
      shardopt::cast(params_.data(), dtype_, work_params_.data(), DType::f32, numel_);
      return;
    }
    for (std::size_t i = 0; i < count(); ++i) {
      shardopt::cast(param(i), dtype_, work_params_.data() + offset(i), DType::f32, numel(i));
    }
  }

  // 16-bit models: writes tensor i's fp32 gradient into its gradient buffer.
  void publish_grad(std::size_t i) {
    if (dtype_ == DType::f32) return;
    shardopt::cast(work_grads_.data() + offset(i), DType::f32, grad(i), dtype_, numel(i));
  }

 private:
  struct Tensor {
    std::string name;
    std::size_t numel = 0;
    std::size_t offset = 0;  // elements before it in the contiguous layout
    std::array<std::uint32_t, 2> dims{};
    void* param = nullptr;
    void* grad = nullptr;
    std::vector<std::byte> param_storage;  // scattered only
    std::vector<std::byte> grad_storage;
  };

  void add(std::string name, std::size_t numel, std::array<std::uint32_t, 2> dims) {
    Tensor t;
    t.name = std::move(name);
    t.numel = numel;
    t.offset = numel_;
    t.dims = dims;
    numel_ += numel;
    tensors_.push_back(std::move(t));
  }

  float* fp32_param(std::size_t i) {
    if (dtype_ == DType::f32) return static_cast<float*>(param(i));
    return work_params_.data() + offset(i);
  }
  float* fp32_grad(std::size_t i) {
    if (dtype_ == DType::f32) return static_cast<float*>(grad(i));
    return work_grads_.data() + offset(i);
  }

  DType dtype_;
  bool scattered_;
  std::size_t numel_ = 0;
  std::vector<Tensor> tensors_;
  shardopt::HostBuffer params_;  // contiguous only
  shardopt::HostBuffer grads_;
  std::vector<float> work_params_;  // 16-bit models only
  std::vector<float> work_grads_;
};

// torch.nn.Linear's default initialization: weights and biases uniform in
// +-1/sqrt(fan_in). Laid out as ModelTensors' offsets.
std::vector<float> student_init(const train::Shape& shape, std::uint64_t seed) {
  std::vector<float> v(shape.numel());
  train::Rng rng(train::stream_key(seed, kStudentStream));
  std::size_t k = 0;
  for (int l = 0; l < shape.layers(); ++l) {
    const double bound = 1.0 / std::sqrt(static_cast<double>(shape.in(l)));
    const std::size_t n = shape.weight_numel(l) + shape.bias_numel(l);
    for (std::size_t j = 0; j < n; ++j) v[k++] = static_cast<float>(rng.uniform(-bound, bound));
  }
  return v;
}

// The teacher: fp32 weights of unit gain, small biases, and each output
// standardized (zero mean,
// unit variance over random inputs), so that the loss reads as the fraction
// of the targets' variance the student has not learned: about 1 at first.
struct Teacher {
  std::vector<float> values;
  std::vector<train::LayerParams> layers;
};

Teacher make_teacher(train::Mlp& net, std::uint64_t seed) {
  const train::Shape& shape = net.shape();
  Teacher t;
  t.values.resize(shape.numel());
  train::Rng rng(train::stream_key(seed, kTeacherStream));
  std::size_t k = 0;
  std::vector<std::size_t> at;
  for (int l = 0; l < shape.layers(); ++l) {
    // Unit gain: the tanh layers are mildly nonlinear, a function a wider
    // student learns to a small fraction of its variance in a few hundred steps.
    const double std_w = 1.0 / std::sqrt(static_cast<double>(shape.in(l)));
    at.push_back(k);
    for (std::size_t j = 0; j < shape.weight_numel(l); ++j) {
      t.values[k++] = static_cast<float>(std_w * rng.normal());
    }
    at.push_back(k);
    for (std::size_t j = 0; j < shape.bias_numel(l); ++j) {
      t.values[k++] = static_cast<float>(0.1 * rng.normal());
    }
  }
  for (int l = 0; l < shape.layers(); ++l) {
    const auto i = 2 * static_cast<std::size_t>(l);
    t.layers.push_back({t.values.data() + at[i], t.values.data() + at[i + 1]});
  }

  // Standardize the outputs, measured on samples of a stream of their own.
  const int in = shape.dims.front();
  const int out = shape.dims.back();
  const int samples = 4096;
  std::vector<double> sum(static_cast<std::size_t>(out), 0.0);
  std::vector<double> sum_sq(static_cast<std::size_t>(out), 0.0);
  std::vector<float> x(static_cast<std::size_t>(net.max_batch()) * static_cast<std::size_t>(in));
  train::Rng sample_rng(train::stream_key(seed, kTeacherStream, 1));
  for (int first = 0; first < samples; first += net.max_batch()) {
    const int rows = std::min(net.max_batch(), samples - first);
    for (float& v : x) v = static_cast<float>(sample_rng.normal());
    const float* y = net.forward(t.layers, x.data(), rows);
    for (int r = 0; r < rows; ++r) {
      for (int j = 0; j < out; ++j) {
        const double v = y[static_cast<std::ptrdiff_t>(r) * out + j];
        sum[static_cast<std::size_t>(j)] += v;
        sum_sq[static_cast<std::size_t>(j)] += v * v;
      }
    }
  }
  float* w_last = t.values.data() + at[at.size() - 2];
  float* b_last = t.values.data() + at[at.size() - 1];
  for (int j = 0; j < out; ++j) {
    const double mean = sum[static_cast<std::size_t>(j)] / samples;
    const double var = std::max(sum_sq[static_cast<std::size_t>(j)] / samples - mean * mean, 1e-12);
    const double inv_sd = 1.0 / std::sqrt(var);
    for (int c = 0; c < shape.in(shape.layers() - 1); ++c) {
      float& w = w_last[static_cast<std::ptrdiff_t>(j) * shape.in(shape.layers() - 1) + c];
      w = static_cast<float>(w * inv_sd);
    }
    b_last[j] = static_cast<float>((b_last[j] - mean) * inv_sd);
  }
  return t;
}

// One batch of samples: inputs [n, inputs] and the teacher's outputs.
struct Batch {
  std::vector<float> x;
  std::vector<float> y;
};

void draw_batch(Batch& batch, int n, std::uint64_t key, const Teacher& teacher,
                train::Mlp& teacher_net) {
  const train::Shape& shape = teacher_net.shape();
  const auto n_in = static_cast<std::size_t>(n) * static_cast<std::size_t>(shape.dims.front());
  const auto n_out = static_cast<std::size_t>(n) * static_cast<std::size_t>(shape.dims.back());
  batch.x.resize(n_in);
  batch.y.resize(n_out);
  train::Rng rng(key);
  for (float& v : batch.x) v = static_cast<float>(rng.normal());
  // In chunks of the teacher's largest batch.
  const int chunk = teacher_net.max_batch();
  for (int first = 0; first < n; first += chunk) {
    const int rows = std::min(chunk, n - first);
    const float* out = teacher_net.forward(
        teacher.layers, batch.x.data() + static_cast<std::size_t>(first) * shape.dims.front(),
        rows);
    std::copy_n(out, static_cast<std::size_t>(rows) * static_cast<std::size_t>(shape.dims.back()),
                batch.y.data() + static_cast<std::size_t>(first) * shape.dims.back());
  }
}

// The student's mean loss on a batch, forward only, in chunks of its
// largest batch.
double evaluate(train::Mlp& net, std::span<const train::LayerParams> params, const Batch& batch) {
  const train::Shape& shape = net.shape();
  const std::size_t in = static_cast<std::size_t>(shape.dims.front());
  const std::size_t out = static_cast<std::size_t>(shape.dims.back());
  const int n = static_cast<int>(batch.x.size() / in);
  double sum = 0.0;
  for (int first = 0; first < n; first += net.max_batch()) {
    const int rows = std::min(net.max_batch(), n - first);
    const float* y_hat =
        net.forward(params, batch.x.data() + static_cast<std::size_t>(first) * in, rows);
    const std::size_t count = static_cast<std::size_t>(rows) * out;
    sum += train::mse(y_hat, batch.y.data() + static_cast<std::size_t>(first) * out, count, nullptr,
                      0.0) *
           static_cast<double>(count);
  }
  return sum / static_cast<double>(static_cast<std::size_t>(n) * out);
}

// ---------------------------------------------------------------------------
// Output

std::string format_bytes(double bytes) {
  char s[64];
  if (bytes >= 1024.0 * 1024.0) {
    std::snprintf(s, sizeof s, "%.2f MiB", bytes / (1024.0 * 1024.0));
  } else if (bytes >= 1024.0) {
    std::snprintf(s, sizeof s, "%.1f KiB", bytes / 1024.0);
  } else {
    std::snprintf(s, sizeof s, "%.0f B", bytes);
  }
  return s;
}

const char* precision_name(DType t) { return shardopt::dtype_name(t); }

// Whether to redraw a progress line in place. Open MPI connects each rank's
// stdout to a pseudo-terminal of its own whatever mpirun's output is, so
// under a launcher the rank's own isatty() says nothing: then the launcher's
// stdout (that of the parent process, when it runs on this node) decides.
bool output_is_terminal() {
  if (isatty(STDOUT_FILENO) == 0) return false;
  const bool launched = std::getenv("OMPI_COMM_WORLD_SIZE") != nullptr ||
                        std::getenv("PMIX_RANK") != nullptr || std::getenv("PMI_RANK") != nullptr;
  if (!launched) return true;
  const std::string link = "/proc/" + std::to_string(getppid()) + "/fd/1";
  std::error_code ec;
  const std::filesystem::path target = std::filesystem::read_symlink(link, ec);
  if (ec) return false;
  const std::string t = target.string();
  return t.starts_with("/dev/pts/") || t.starts_with("/dev/tty");
}

// Per-step times of one rank, summed over an interval of steps, with the
// communication StepInfo reports (exposed: blocked waiting for collectives;
// span: the gradient reduction from its first reduce-scatter to its end).
struct Times {
  double compute = 0.0;
  double reduce = 0.0;
  double update = 0.0;
  double gather = 0.0;
  double total = 0.0;
  double exposed = 0.0;
  double span = 0.0;
  double reduce_bytes = 0.0;
  double gather_bytes = 0.0;

  void add(const Times& t) {
    compute += t.compute;
    reduce += t.reduce;
    update += t.update;
    gather += t.gather;
    total += t.total;
    exposed += t.exposed;
    span += t.span;
    reduce_bytes += t.reduce_bytes;
    gather_bytes += t.gather_bytes;
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

// The slowest rank's sums of each phase (each phase's maximum on its own).
Times slowest(const Times& local, MPI_Comm comm) {
  std::array<double, 9> a = local.array();
  MPI_Allreduce(MPI_IN_PLACE, a.data(), static_cast<int>(a.size()), MPI_DOUBLE, MPI_MAX, comm);
  return Times::from(a);
}

double mean_over_ranks(double v, MPI_Comm comm) {
  int n = 1;
  MPI_Comm_size(comm, &n);
  MPI_Allreduce(MPI_IN_PLACE, &v, 1, MPI_DOUBLE, MPI_SUM, comm);
  return v / n;
}

// ---------------------------------------------------------------------------
// --save-params

// The file's layout (docs/train.md): a 64-byte header, a 64-byte record per
// tensor, then every tensor's values in order, all little-endian.
constexpr char kMagic[8] = {'S', 'O', 'P', 'A', 'R', 'A', 'M', 'S'};
constexpr std::uint32_t kFormatVersion = 1;
constexpr std::size_t kHeaderBytes = 64;
constexpr std::size_t kRecordBytes = 64;
constexpr std::size_t kNameBytes = 40;

template <class T>
void put_le(std::vector<std::byte>& out, std::size_t at, T value) {
  for (std::size_t k = 0; k < sizeof(T); ++k) {
    out[at + k] = static_cast<std::byte>((static_cast<std::uint64_t>(value) >> (8 * k)) & 0xffu);
  }
}

std::vector<std::byte> params_file_head(const ModelTensors& m, std::int64_t steps) {
  const std::size_t t = m.count();
  std::vector<std::byte> out(kHeaderBytes + kRecordBytes * t, std::byte{0});
  std::memcpy(out.data(), kMagic, sizeof kMagic);
  put_le<std::uint32_t>(out, 8, kFormatVersion);
  put_le<std::uint32_t>(out, 12, static_cast<std::uint32_t>(m.dtype()));
  put_le<std::uint32_t>(out, 16, static_cast<std::uint32_t>(shardopt::dtype_size(m.dtype())));
  put_le<std::uint32_t>(out, 20, static_cast<std::uint32_t>(t));
  put_le<std::uint64_t>(out, 24, static_cast<std::uint64_t>(m.numel()));
  put_le<std::uint64_t>(out, 32, static_cast<std::uint64_t>(steps));
  put_le<std::uint64_t>(out, 40, static_cast<std::uint64_t>(out.size()));
  for (std::size_t i = 0; i < t; ++i) {
    const std::size_t r = kHeaderBytes + kRecordBytes * i;
    const std::string& name = m.name(i);
    std::memcpy(out.data() + r, name.data(), std::min(name.size(), kNameBytes - 1));
    const auto dims = m.dims(i);
    put_le<std::uint32_t>(out, r + 40, dims[1] == 0 ? 1u : 2u);
    put_le<std::uint32_t>(out, r + 44, dims[0]);
    put_le<std::uint32_t>(out, r + 48, dims[1]);
    put_le<std::uint64_t>(out, r + 56, static_cast<std::uint64_t>(m.offset(i)));
  }
  return out;
}

bool host_is_little_endian() {
  const std::uint16_t one = 1;
  std::uint8_t first = 0;
  std::memcpy(&first, &one, 1);
  return first == 1;
}

// Writes FILE.tmp and renames it to FILE, so that FILE is either the old
// file or the whole new one. Returns an error message, empty on success.
std::string save_params(const std::string& path, const ModelTensors& m, std::int64_t steps) {
  const std::string tmp = path + ".tmp";
  std::FILE* f = std::fopen(tmp.c_str(), "wb");
  if (f == nullptr) {
    return "cannot write '" + tmp + "': " + std::strerror(errno);
  }
  const std::vector<std::byte> head = params_file_head(m, steps);
  bool ok = std::fwrite(head.data(), 1, head.size(), f) == head.size();
  const std::size_t esize = shardopt::dtype_size(m.dtype());
  std::vector<std::byte> swapped;
  for (std::size_t i = 0; ok && i < m.count(); ++i) {
    const auto* p = static_cast<const std::byte*>(m.param(i));
    const std::size_t bytes = m.numel(i) * esize;
    if (!host_is_little_endian()) {
      swapped.assign(p, p + bytes);
      for (std::size_t k = 0; k < bytes; k += esize) std::reverse(&swapped[k], &swapped[k + esize]);
      p = swapped.data();
    }
    ok = std::fwrite(p, 1, bytes, f) == bytes;
  }
  const int saved_errno = errno;
  if (std::fclose(f) != 0 || !ok) {
    const std::string why = std::strerror(ok ? errno : saved_errno);
    std::remove(tmp.c_str());
    return "cannot write '" + tmp + "': " + why;
  }
  if (std::rename(tmp.c_str(), path.c_str()) != 0) {
    const std::string why = std::strerror(errno);
    std::remove(tmp.c_str());
    return "cannot rename '" + tmp + "' to '" + path + "': " + why;
  }
  return {};
}

// Before training: fails early where FILE.tmp cannot be created.
std::string check_writable(const std::string& path) {
  const std::string tmp = path + ".tmp";
  std::FILE* f = std::fopen(tmp.c_str(), "wb");
  if (f == nullptr) return "cannot write '" + tmp + "': " + std::strerror(errno);
  std::fclose(f);
  std::remove(tmp.c_str());
  return {};
}

// Before training: fails early where no file can be created beside PATH
// (checkpoints and exports are written under a temporary name in PATH's
// directory, then renamed to PATH).
std::string check_directory(const std::string& option, const std::string& path) {
  std::filesystem::path dir = std::filesystem::path(path).parent_path();
  if (dir.empty()) dir = ".";
  if (access(dir.c_str(), W_OK | X_OK) != 0) {
    return option + " " + path + ": cannot create files in '" + dir.string() +
           "': " + std::strerror(errno);
  }
  return {};
}

// ---------------------------------------------------------------------------
// Training

// True on every rank if `ok` is true on every rank.
bool all_ok(bool ok, MPI_Comm comm) {
  int v = ok ? 1 : 0;
  MPI_Allreduce(MPI_IN_PLACE, &v, 1, MPI_INT, MPI_MIN, comm);
  return v == 1;
}

// FNV-1a over the bytes of every parameter.
std::uint64_t params_hash(const ModelTensors& m) {
  std::uint64_t h = report::kFnv1aBasis;
  const std::size_t esize = shardopt::dtype_size(m.dtype());
  for (std::size_t i = 0; i < m.count(); ++i) h = report::fnv1a(m.param(i), m.numel(i) * esize, h);
  return h;
}

bool same_on_every_rank(std::uint64_t v, MPI_Comm comm) {
  std::array<std::uint64_t, 2> lo_hi = {v, ~v};
  MPI_Allreduce(MPI_IN_PLACE, lo_hi.data(), 2, MPI_UINT64_T, MPI_MIN, comm);
  return lo_hi[0] == v && lo_hi[1] == ~v;
}

double seconds_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

struct RunContext {
  const Options& o;
  shardopt::Communicator& comm;
  MPI_Comm stats;  // the trainer's own reductions (losses, times)
  int rank;
  int ranks;
  bool printer;
  bool live;  // a progress line redrawn in place
};

// ---------------------------------------------------------------------------
// Checkpoints

// The slowest rank's value of `seconds`.
double slowest_seconds(double seconds, MPI_Comm comm) {
  MPI_Allreduce(MPI_IN_PLACE, &seconds, 1, MPI_DOUBLE, MPI_MAX, comm);
  return seconds;
}

// Ends a collective library call (save, load, export) that throws the same
// error on every rank: each rank that failed prints the error (a job's ranks
// often log to files of their own), and the ranks agree, so that no rank
// goes on alone into a collective the others have left. True if it
// succeeded on every rank.
bool collective_ok(const RunContext& c, const std::string& error) {
  if (!error.empty()) cli::print_error(kProgram, c.rank, error);
  return all_ok(error.empty(), c.stats);
}

// Runs a collective call of the optimizer that writes or reads `path`:
// returns its slowest rank's seconds, or nullopt after an error on any rank
// (printed by every rank that saw it).
template <class Call>
std::optional<double> timed_collective(const RunContext& c, const std::string& what,
                                       const std::string& path, Call&& call) {
  std::string error;
  const auto t0 = std::chrono::steady_clock::now();
  try {
    call();
  } catch (const shardopt::Error& e) {
    error = what + " '" + path + "': " + e.what();
  }
  const double seconds = seconds_since(t0);
  if (!collective_ok(c, error)) return std::nullopt;
  return slowest_seconds(seconds, c.stats);
}

// A JSON string: quotes, backslashes and control characters escaped.
std::string json_string(std::string_view s) {
  std::string out = "\"";
  for (const char ch : s) {
    const auto u = static_cast<unsigned char>(ch);
    if (ch == '"' || ch == '\\') {
      out += '\\';
      out += ch;
    } else if (u < 0x20) {
      char esc[8];
      std::snprintf(esc, sizeof esc, "\\u%04x", u);
      out += esc;
    } else {
      out += ch;
    }
  }
  return out + "\"";
}

// What --resume loaded, for the output.
struct Resumed {
  std::string path;
  shardopt::LoadReport report;
  double seconds = 0.0;  // the slowest rank's
};

// LoadReport::summary() on one line: its lines joined with "; ".
std::string one_line(const std::string& text) {
  std::string out;
  std::size_t at = 0;
  while (at < text.size()) {
    std::size_t end = text.find('\n', at);
    if (end == std::string::npos) end = text.size();
    const std::string_view line = std::string_view(text).substr(at, end - at);
    const std::size_t first = line.find_first_not_of(" \t");
    if (first != std::string_view::npos) {
      if (!out.empty()) out += "; ";
      out += line.substr(first);
    }
    at = end + 1;
  }
  return out;
}

void print_resumed(const RunContext& c, const Resumed& r) {
  const shardopt::LoadReport& rep = r.report;
  const std::string summary = one_line(rep.summary());
  if (c.o.json) {
    std::printf(
        "{\"type\":\"resume\",\"path\":%s,\"step\":%lld,\"saved_ranks\":%d,\"ranks\":%d,"
        "\"loaded\":%zu,\"missing\":%zu,\"unexpected\":%zu,\"mismatched\":%zu,"
        "\"hyper_parameters\":%s,\"seconds\":%.6f,\"summary\":%s}\n",
        json_string(r.path).c_str(), static_cast<long long>(rep.step), rep.saved_ranks, c.ranks,
        rep.loaded.size(), rep.missing.size(), rep.unexpected.size(), rep.mismatched.size(),
        rep.hyper_parameters ? "true" : "false", r.seconds, json_string(summary).c_str());
  } else {
    // The summary gives the step and the rank count the file was saved at.
    std::printf("# resumed from %s at %d rank%s: %s; read in %.3f s\n", r.path.c_str(), c.ranks,
                c.ranks == 1 ? "" : "s", summary.c_str(), r.seconds);
  }
  std::fflush(stdout);
}

// A checkpoint (kind "checkpoint") or an export written at `step`.
void print_written(const RunContext& c, const char* kind, const std::string& path,
                   std::int64_t step, double seconds) {
  if (c.o.json) {
    std::printf("{\"type\":\"%s\",\"step\":%lld,\"path\":%s,\"seconds\":%.6f}\n", kind,
                static_cast<long long>(step), json_string(path).c_str(), seconds);
  } else {
    std::printf("%s# step %lld: %s written to %s in %.3f s\n", c.live ? "\r\033[K" : "",
                static_cast<long long>(step),
                std::string_view(kind) == "export" ? "parameters" : "checkpoint", path.c_str(),
                seconds);
  }
  std::fflush(stdout);
}

void print_start(const RunContext& c, const ModelTensors& m,
                 const shardopt::ZeroRedundancyOptimizer& opt,
                 const shardopt::OptimizerConfig& config) {
  const Options& o = c.o;
  const shardopt::MemoryReport mem = opt.memory_report();
  const double psi = static_cast<double>(m.numel());
  const double formula = shardopt::zero_memory_formula(o.stage, psi, c.ranks, o.precision,
                                                       shardopt::state_bytes_per_param(config));
  // What the formula counts, measured: shardopt's allocations but its
  // buckets, the model's parameters, and in stages 0 and 1 its gradients
  // (stage 2 counts the gradient shard instead: a code that frees or reuses
  // its gradient buffers after grad_ready needs no full ones).
  const double comparable = static_cast<double>(mem.allocated() - mem.buckets + mem.user_params +
                                                (o.stage < 2 ? mem.user_grads : 0));
  const double bucket_mb = o.bucket_mb > 0.0 ? o.bucket_mb : shardopt::settings().bucket_mb;
  const char* scaling = o.uses_scaler() ? "dynamic" : "none";
  const train::Shape shape = student_shape(o);
  std::string dims;
  for (std::size_t i = 0; i < shape.dims.size(); ++i) {
    dims += (i == 0 ? "" : " -> ") + std::to_string(shape.dims[i]);
  }
  if (o.json) {
    std::printf(
        "{\"type\":\"start\",\"ranks\":%d,\"stage\":%d,\"optimizer\":\"%s\",\"lr\":%s,"
        "\"schedule\":\"%s\",\"precision\":\"%s\",\"loss_scale\":\"%s\",\"clip\":%s,"
        "\"params\":%zu,\"tensors\":%zu,\"layers\":%d,\"inputs\":%d,\"hidden\":%d,"
        "\"outputs\":%d,\"teacher_hidden\":%d,\"batch\":%d,\"global_batch\":%lld,"
        "\"micro_batches\":%d,\"steps\":%d,\"bucket_mb\":%s,\"scattered\":%s,\"seed\":%llu,"
        "\"memory\":{\"master_params\":%zu,\"optimizer_state\":%zu,\"grad_shard\":%zu,"
        "\"reduced_grads\":%zu,\"owned_grads\":%zu,\"buckets\":%zu,\"allocated\":%zu,"
        "\"user_params\":%zu,\"user_grads\":%zu,\"working_copies\":%zu,"
        "\"comparable\":%.0f,\"formula\":%.0f}}\n",
        c.ranks, o.stage, entry_of(o.optimizer).name, json_number(o.learning_rate()).c_str(),
        o.schedule == Schedule::cosine ? "cosine" : "constant", precision_name(o.precision),
        scaling, o.clip ? json_number(*o.clip).c_str() : "null", m.numel(), m.count(), o.layers,
        o.inputs, o.hidden, o.outputs, o.teacher_hidden, o.batch,
        static_cast<long long>(o.batch) * c.ranks, o.micro_batches, o.steps,
        json_number(bucket_mb).c_str(), o.scattered ? "true" : "false",
        static_cast<unsigned long long>(o.seed), mem.master_params, mem.optimizer_state,
        mem.grad_shard, mem.reduced_grads, mem.owned_grads, mem.buckets, mem.allocated(),
        mem.user_params, mem.user_grads, m.working_bytes(), comparable, formula);
    std::fflush(stdout);
    return;
  }
  std::printf("# %s: a data-parallel MLP learning a teacher network, on shardopt's ZeRO engine\n",
              kProgram);
  std::printf("# %s\n", shardopt::build_info_string().c_str());
  std::printf("# ranks %d, stage %d, optimizer %s (lr %g, %s schedule), precision %s%s%s\n",
              c.ranks, o.stage, entry_of(o.optimizer).name, o.learning_rate(),
              o.schedule == Schedule::cosine ? "cosine" : "constant", precision_name(o.precision),
              o.param_remainders ? " with remainders" : "",
              o.reduce_in_fp32 ? ", reduced in fp32" : "");
  std::printf("# loss scale %s, clip %s, buckets %g MiB, %s buffers\n", scaling,
              o.clip ? json_number(*o.clip).c_str() : "none", bucket_mb,
              o.scattered ? "scattered" : "contiguous");
  std::printf("# model %s (%zu parameters in %zu tensors), teacher hidden width %d\n", dims.c_str(),
              m.numel(), m.count(), o.teacher_hidden);
  std::printf("# batch %d per rank (%lld in all), %d micro-batch%s, %d steps, seed %llu\n", o.batch,
              static_cast<long long>(o.batch) * c.ranks, o.micro_batches,
              o.micro_batches == 1 ? "" : "es", o.steps, static_cast<unsigned long long>(o.seed));
  const auto b = [](std::size_t bytes) { return format_bytes(static_cast<double>(bytes)); };
  std::printf(
      "# memory on rank 0: shardopt allocated %s: master params %s, optimizer state %s,\n"
      "#   grad shard %s, reduced grads %s, owned grads %s, buckets %s\n",
      b(mem.allocated()).c_str(), b(mem.master_params).c_str(), b(mem.optimizer_state).c_str(),
      b(mem.grad_shard).c_str(), b(mem.reduced_grads).c_str(), b(mem.owned_grads).c_str(),
      b(mem.buckets).c_str());
  std::printf("#   the trainer's buffers: params %s, grads %s", b(mem.user_params).c_str(),
              b(mem.user_grads).c_str());
  if (m.working_bytes() > 0) {
    std::printf(", fp32 working copies %s", b(m.working_bytes()).c_str());
  }
  std::printf("\n");
  std::printf(
      "#   ZeRO formula (stage %d, %zu params, %d ranks, %s, %g B of state a param): %s;\n"
      "#   measured alike (allocated less buckets, plus params%s): %s\n",
      o.stage, m.numel(), c.ranks, precision_name(o.precision),
      shardopt::state_bytes_per_param(config), format_bytes(formula).c_str(),
      o.stage < 2 ? " and grads" : "", format_bytes(comparable).c_str());
  std::printf("#\n");
  std::printf("# %6s %11s %9s %9s %9s %9s %9s %9s %10s\n", "step", "loss", "lr", "compute",
              "reduce", "update", "gather", "step", "samples/s");
  std::printf("# %6s %11s %9s %9s %9s %9s %9s %9s\n", "", "", "", "(ms)", "(ms)", "(ms)", "(ms)",
              "(ms)");
  std::fflush(stdout);
}

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

void print_log(const RunContext& c, const LogLine& l) {
  const Options& o = c.o;
  if (o.json) {
    std::printf(
        "{\"type\":\"step\",\"step\":%d,\"loss\":%s,\"lr\":%s,\"compute_ms\":%.4f,"
        "\"reduce_ms\":%.4f,\"update_ms\":%.4f,\"gather_ms\":%.4f,\"step_ms\":%.4f,"
        "\"samples_per_s\":%.1f,\"loss_scale\":%s,\"grad_norm\":%s,\"skipped\":%d,"
        "\"exposed_comm_ms\":%.4f,\"reduce_mb\":%.4f,\"gather_mb\":%.4f,"
        "\"reduce_busbw_gbps\":%.4f,\"gather_busbw_gbps\":%.4f}\n",
        l.step, json_number(l.loss).c_str(), json_number(l.lr).c_str(), l.per_step.compute * 1e3,
        l.per_step.reduce * 1e3, l.per_step.update * 1e3, l.per_step.gather * 1e3,
        l.per_step.total * 1e3, l.samples_per_s, json_number(l.loss_scale).c_str(),
        l.grad_norm >= 0.0 || !std::isfinite(l.grad_norm) ? json_number(l.grad_norm).c_str()
                                                          : "null",
        l.skipped, l.per_step.exposed * 1e3, l.per_step.reduce_bytes / 1e6,
        l.per_step.gather_bytes / 1e6, l.per_step.reduce_busbw(c.ranks),
        l.per_step.gather_busbw(c.ranks));
    std::fflush(stdout);
    return;
  }
  std::string extra;
  char piece[64];
  if (o.uses_scaler()) {
    std::snprintf(piece, sizeof piece, "  scale %g", l.loss_scale);
    extra += piece;
  }
  if (o.clip) {
    std::snprintf(piece, sizeof piece, "  norm %.3e", l.grad_norm);
    extra += piece;
  }
  if (l.skipped > 0) {
    std::snprintf(piece, sizeof piece, "  skipped %d", l.skipped);
    extra += piece;
  }
  if (c.ranks > 1) {
    std::snprintf(piece, sizeof piece, "  exposed %.3f ms, busbw %.2f/%.2f GB/s",
                  l.per_step.exposed * 1e3, l.per_step.reduce_busbw(c.ranks),
                  l.per_step.gather_busbw(c.ranks));
    extra += piece;
  }
  std::printf("%s  %6d %11.4e %9.2e %9.3f %9.3f %9.3f %9.3f %9.3f %10.0f%s\n",
              c.live ? "\r\033[K" : "", l.step, l.loss, l.lr, l.per_step.compute * 1e3,
              l.per_step.reduce * 1e3, l.per_step.update * 1e3, l.per_step.gather * 1e3,
              l.per_step.total * 1e3, l.samples_per_s, extra.c_str());
  std::fflush(stdout);
}

// Runs the training on every rank; returns the exit status.
int run(const RunContext& c) {
  const Options& o = c.o;
  const train::Shape shape = student_shape(o);
  const train::Shape tshape = teacher_shape(o);

  ModelTensors model(shape, o.precision, o.scattered);
  model.set_params(student_init(shape, o.seed));
  train::Mlp student(shape, o.batch);
  train::Mlp teacher_net(tshape, o.batch);
  const Teacher teacher = make_teacher(teacher_net, o.seed);

  const shardopt::OptimizerConfig config = optimizer_config(o);
  shardopt::ZeroOptions zopt;
  zopt.stage = o.stage;
  zopt.bucket_mb = o.bucket_mb;
  zopt.param_remainders = o.param_remainders;
  zopt.reduce_in_fp32 = o.reduce_in_fp32;
  if (o.uses_scaler()) zopt.loss_scaler = shardopt::LossScaler{};
  // Collective: a bad layout or argument throws the same error on every
  // rank, so every rank can stop cleanly here.
  std::optional<shardopt::ZeroRedundancyOptimizer> engine;
  try {
    engine.emplace(c.comm, model.registration(), config, zopt);
  } catch (const shardopt::Error& e) {
    if (c.rank == 0) cli::print_error(kProgram, c.rank, e.what());
    return 1;
  }
  shardopt::ZeroRedundancyOptimizer& opt = *engine;

  const std::vector<train::LayerParams> params = model.layer_params();
  const std::vector<train::LayerGrads> grads = model.layer_grads();

  // --resume: the parameters, the optimizer state, the step count and the
  // loss scaler as the checkpoint has them; training goes on from its step.
  std::optional<Resumed> resumed;
  if (!o.resume.empty()) {
    Resumed r;
    r.path = o.resume;
    const std::optional<double> seconds =
        timed_collective(c, "cannot resume from", o.resume, [&] { r.report = opt.load(o.resume); });
    if (!seconds) return 1;
    r.seconds = *seconds;
    // The report is the same on every rank: every rank stops here alike.
    if (r.report.step > o.steps) {
      if (c.rank == 0) {
        cli::print_error(kProgram, c.rank,
                         "the checkpoint '" + o.resume + "' is at step " +
                             std::to_string(r.report.step) + ", past -n (--steps) " +
                             std::to_string(o.steps) +
                             ": --steps counts the steps in all, those before the checkpoint "
                             "included");
      }
      return 1;
    }
    resumed = std::move(r);
  }
  const std::int64_t start_step = opt.steps();

  int checkpoints = 0;
  double checkpoint_seconds = 0.0;
  std::int64_t last_checkpoint = -1;  // the step of the newest checkpoint this run wrote
  const auto write_checkpoint = [&]() -> bool {
    shardopt::SaveOptions so;
    so.keep_last = o.keep_last.value_or(1);
    const std::optional<double> seconds = timed_collective(
        c, "cannot write the checkpoint", o.checkpoint, [&] { opt.save(o.checkpoint, so); });
    if (!seconds) return false;
    ++checkpoints;
    checkpoint_seconds += *seconds;
    last_checkpoint = opt.steps();
    if (c.printer) print_written(c, "checkpoint", o.checkpoint, opt.steps(), *seconds);
    return true;
  };

  Batch eval;
  draw_batch(eval, o.eval_samples,
             train::stream_key(o.seed, kEvalStream, static_cast<std::uint64_t>(c.rank)), teacher,
             teacher_net);
  model.refresh_working();
  const double initial_loss = mean_over_ranks(evaluate(student, params, eval), c.stats);

  if (c.printer) {
    print_start(c, model, opt, config);
    if (resumed) print_resumed(c, *resumed);
  }

  Batch batch;
  std::vector<float> dy(static_cast<std::size_t>(o.batch) * static_cast<std::size_t>(o.outputs));
  const double global_batch = static_cast<double>(o.batch) * c.ranks;
  Times interval;
  Times all;
  double interval_loss = 0.0;
  int interval_steps = 0;
  int interval_skipped = 0;
  int skipped = 0;
  int attempts = 0;  // steps tried, skipped ones included
  double last_norm = -1.0;
  auto last_redraw = std::chrono::steady_clock::now();

  // Step s (the steps applied so far) trains on a batch drawn from the
  // seed, the rank and s alone, at the learning rate of s: no state carries
  // from one step to the next but what the optimizer holds (and a
  // checkpoint restores), so a resumed run takes the steps of one that was
  // never stopped. A step the loss scaler skips is tried again, on the same
  // batch, at the lower scale.
  while (opt.steps() < o.steps) {
    const int s = static_cast<int>(opt.steps());
    // The data is drawn outside the timed step: it stands for the input
    // pipeline, which a real code overlaps with training.
    draw_batch(batch, o.batch,
               train::stream_key(o.seed, kDataStream, static_cast<std::uint64_t>(c.rank),
                                 static_cast<std::uint64_t>(s)),
               teacher, teacher_net);
    const double lr = scheduled_lr(o, s);
    opt.set_lr(lr);

    Times t;
    const auto t0 = std::chrono::steady_clock::now();
    model.refresh_working();
    // The loss is multiplied by the scale, so its gradient is too; step()
    // divides it out in its fused update.
    const double loss_scale = opt.loss_scale();
    const double grad_scale =
        loss_scale / (static_cast<double>(o.batch) * static_cast<double>(o.outputs));
    double loss = 0.0;
    int first = 0;
    for (int mb = 0; mb < o.micro_batches; ++mb) {
      // Micro-batch sizes differ by at most one sample.
      const int rows = o.batch / o.micro_batches + (mb < o.batch % o.micro_batches ? 1 : 0);
      const bool last = mb + 1 == o.micro_batches;
      const float* x = batch.x.data() + static_cast<std::size_t>(first) * o.inputs;
      const float* y = batch.y.data() + static_cast<std::size_t>(first) * o.outputs;
      const float* y_hat = student.forward(params, x, rows);
      const std::size_t count = static_cast<std::size_t>(rows) * o.outputs;
      loss += train::mse(y_hat, y, count, dy.data(), grad_scale) * rows / o.batch;
      // Stage 2 reduces every micro-batch as its backward pass runs, into
      // the engine's fp32 gradient shard. Stages 0 and 1 accumulate the
      // micro-batches in the gradient buffers and reduce once, in the last.
      const bool reduce_now = o.stage == 2 || last;
      const bool accumulate = o.stage != 2 && mb > 0;
      student.backward(params, grads, dy.data(), rows, accumulate, [&](int l) {
        if (!reduce_now) return;
        // The bias, then the weight: descending order, as buckets start.
        for (const std::size_t i :
             {2 * static_cast<std::size_t>(l) + 1, 2 * static_cast<std::size_t>(l)}) {
          model.publish_grad(i);
          opt.grad_ready(i);
        }
      });
      if (o.stage == 2 && !last) opt.reduce_gradients();
      first += rows;
    }
    t.compute = seconds_since(t0);

    if (o.clip) {
      const auto tc = std::chrono::steady_clock::now();
      last_norm = opt.clip_grad_norm(*o.clip);
      t.reduce += seconds_since(tc);
    }
    const shardopt::StepInfo info = opt.step();
    t.total = seconds_since(t0);
    t.reduce += info.reduce_seconds;
    t.update = info.update_seconds;
    t.gather = info.gather_seconds;
    t.exposed = info.exposed_comm_seconds;
    t.span = info.reduce_span_seconds;
    t.reduce_bytes = static_cast<double>(info.reduce_bytes);
    t.gather_bytes = static_cast<double>(info.gather_bytes);

    ++attempts;
    if (!info.applied) {
      ++skipped;
      ++interval_skipped;
    }
    interval.add(t);
    all.add(t);
    interval_loss += loss;
    ++interval_steps;
    if (!info.applied && info.loss_scale <= zopt.loss_scaler->min_scale) {
      // The next try would repeat this one: the same batch, parameters and
      // scale. Whether the step was applied is agreed across ranks, so
      // every rank stops here.
      if (c.rank == 0) {
        cli::print_error(kProgram, c.rank,
                         "step " + std::to_string(s + 1) +
                             ": the gradients are not finite even at the smallest loss scale (" +
                             json_number(info.loss_scale) +
                             "): the training diverged; lower --lr or clip the gradients (--clip)");
      }
      return 1;
    }

    const std::int64_t done = info.step;  // steps applied, this one included
    const bool log =
        info.applied && (s == start_step || done % o.log_every == 0 || done == o.steps);
    if (log) {
      const Times worst = slowest(interval, c.stats);
      LogLine line;
      line.step = static_cast<int>(done);
      line.loss = mean_over_ranks(interval_loss / interval_steps, c.stats);
      line.lr = lr;
      line.per_step = worst.per(interval_steps);
      line.samples_per_s = worst.total > 0.0 ? global_batch * interval_steps / worst.total : 0.0;
      line.loss_scale = info.loss_scale;
      line.grad_norm = last_norm;
      line.skipped = interval_skipped;
      if (c.printer) print_log(c, line);
      interval = Times{};
      interval_loss = 0.0;
      interval_steps = 0;
      interval_skipped = 0;
    } else if (c.live && seconds_since(last_redraw) >= 0.1) {
      // At most ten redraws a second: a terminal is slower than a fast step.
      std::printf("\r\033[K  step %d/%d  loss %.4e (rank 0)", s + 1, o.steps, loss);
      std::fflush(stdout);
      last_redraw = std::chrono::steady_clock::now();
    }
    if (info.applied && !o.checkpoint.empty() && o.checkpoint_every > 0 &&
        done % o.checkpoint_every == 0 && !write_checkpoint()) {
      return 1;
    }
  }

  model.refresh_working();
  const double final_loss = mean_over_ranks(evaluate(student, params, eval), c.stats);
  const Times worst = slowest(all, c.stats);
  // Means per step tried in this run (none: zero times).
  const double n = std::max(1.0, static_cast<double>(attempts));
  const std::int64_t applied = opt.steps() - start_step;
  const double samples_per_s = worst.total > 0.0 ? global_batch * n / worst.total : 0.0;

  // step() leaves every rank's parameters identical, so rank 0 writes its
  // own; check the promise first, at the cost of one small reduction.
  const bool identical = same_on_every_rank(params_hash(model), c.stats);
  std::string save_error;
  if (!identical) {
    save_error = "the parameters differ between ranks after the last step";
  } else if (!o.save_params.empty() && c.rank == 0) {
    save_error = save_params(o.save_params, model, opt.steps());
  }
  const bool saved = all_ok(save_error.empty(), c.stats);

  // The checkpoint at the end, unless this run already wrote it, or the
  // run took no step from the checkpoint it resumed at that very path.
  std::error_code same_ec;
  const bool unchanged_resume = applied == 0 && !o.resume.empty() && !o.checkpoint.empty() &&
                                std::filesystem::equivalent(o.resume, o.checkpoint, same_ec);
  if (!o.checkpoint.empty() && last_checkpoint != opt.steps() && !unchanged_resume &&
      !write_checkpoint()) {
    return 1;
  }
  double export_seconds = 0.0;
  if (!o.export_path.empty()) {
    shardopt::ExportOptions eo;
    eo.fp32 = true;
    const std::optional<double> seconds =
        timed_collective(c, "cannot export the parameters to", o.export_path,
                         [&] { opt.export_params(o.export_path, eo); });
    if (!seconds) return 1;
    export_seconds = *seconds;
    if (c.printer) print_written(c, "export", o.export_path, opt.steps(), export_seconds);
  }

  if (c.printer) {
    const double ratio = final_loss > 0.0 ? initial_loss / final_loss : 0.0;
    const char* verdict = final_loss < kDemoThreshold ? "below" : "not below";
    if (o.json) {
      std::printf(
          "{\"type\":\"summary\",\"steps\":%d,\"applied\":%lld,\"skipped\":%d,"
          "\"initial_loss\":%s,\"final_loss\":%s,\"eval_samples\":%lld,\"compute_ms\":%.4f,"
          "\"reduce_ms\":%.4f,\"update_ms\":%.4f,\"gather_ms\":%.4f,\"step_ms\":%.4f,"
          "\"samples_per_s\":%.1f,\"wall_s\":%.3f,\"params_identical\":%s,\"saved\":%s,"
          "\"start_step\":%lld,\"final_step\":%lld,\"checkpoints\":%d,\"checkpoint_s\":%.6f,"
          "\"exported\":%s,\"export_s\":%.6f}\n",
          attempts, static_cast<long long>(applied), skipped,
          json_number(initial_loss, "%.6e").c_str(), json_number(final_loss, "%.6e").c_str(),
          static_cast<long long>(o.eval_samples) * c.ranks, worst.compute / n * 1e3,
          worst.reduce / n * 1e3, worst.update / n * 1e3, worst.gather / n * 1e3,
          worst.total / n * 1e3, samples_per_s, worst.total, identical ? "true" : "false",
          !o.save_params.empty() && save_error.empty() ? "true" : "false",
          static_cast<long long>(start_step), static_cast<long long>(opt.steps()), checkpoints,
          checkpoint_seconds, o.export_path.empty() ? "false" : "true", export_seconds);
    } else {
      std::printf("%s#\n", c.live ? "\r\033[K" : "");
      std::string from;
      if (resumed) from = ", resumed at step " + std::to_string(start_step);
      std::printf(
          "# summary: %d steps (%lld applied, %d skipped%s); loss on %lld held-out samples: "
          "initial %.4e, final %.4e (%.0fx lower)\n",
          attempts, static_cast<long long>(applied), skipped, from.c_str(),
          static_cast<long long>(o.eval_samples) * c.ranks, initial_loss, final_loss, ratio);
      std::printf(
          "# mean step (ms, slowest rank): compute %.3f, reduce %.3f, update %.3f, gather %.3f, "
          "total %.3f; %.0f samples/s; %.2f s of steps\n",
          worst.compute / n * 1e3, worst.reduce / n * 1e3, worst.update / n * 1e3,
          worst.gather / n * 1e3, worst.total / n * 1e3, samples_per_s, worst.total);
      std::printf("# final loss %.4e: %s %g, the threshold the default run must reach\n",
                  final_loss, verdict, kDemoThreshold);
      if (checkpoints > 0) {
        std::printf("# %d checkpoint%s written to %s: %.3f s of saving (slowest rank)\n",
                    checkpoints, checkpoints == 1 ? "" : "s", o.checkpoint.c_str(),
                    checkpoint_seconds);
      }
      if (identical) {
        std::printf("# parameters identical on every rank%s%s\n",
                    saved && !o.save_params.empty() ? "; written to " : "",
                    saved && !o.save_params.empty() ? o.save_params.c_str() : "");
      }
    }
    std::fflush(stdout);
  }
  if (!save_error.empty() && c.rank == 0) cli::print_error(kProgram, c.rank, save_error);
  return saved ? 0 : 1;
}

// Everything that needs MPI; run_with_mpi's Environment outlives it.
int train_main(int argc, char** argv) {
  int rank = 0;
  int ranks = 1;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &ranks);

  Options opt;
  try {
    opt = parse_options(argc, argv);
  } catch (const UsageError& e) {
    // Every rank parses the same argv: every rank stops here, rank 0 says why.
    cli::print_usage_error(kProgram, rank, e);
    return 2;
  }
  if (opt.help) {
    if (rank == 0) std::fputs(kUsage, stdout);
    return 0;
  }

  // Local checks that can fail on some ranks only: agree before going on,
  // so that every rank stops.
  std::string local_error;
  try {
    (void)shardopt::settings();
    if (rank == 0 && !opt.save_params.empty()) local_error = check_writable(opt.save_params);
    if (rank == 0 && local_error.empty() && !opt.checkpoint.empty()) {
      local_error = check_directory("--checkpoint", opt.checkpoint);
    }
    if (rank == 0 && local_error.empty() && !opt.export_path.empty()) {
      local_error = check_directory("--export", opt.export_path);
    }
  } catch (const std::exception& e) {
    local_error = e.what();
  }
  if (!all_ok(local_error.empty(), MPI_COMM_WORLD)) {
    if (!local_error.empty()) cli::print_error(kProgram, rank, local_error);
    return 1;
  }

  // The ranks are the parallelism: one BLAS thread each, unless the user
  // asks for more.
  if (std::getenv("OPENBLAS_NUM_THREADS") == nullptr) openblas_set_num_threads(1);

  MPI_Comm stats = MPI_COMM_NULL;
  MPI_Comm_dup(MPI_COMM_WORLD, &stats);
  int status = 1;
  try {
    shardopt::Communicator comm(MPI_COMM_WORLD);
    const bool live = rank == 0 && !opt.json &&
                      (opt.progress == Progress::on ||
                       (opt.progress == Progress::automatic && output_is_terminal()));
    status = run({opt, comm, stats, rank, ranks, rank == 0, live});
    comm.free();
  } catch (const std::exception& e) {
    // A failure on some ranks only, possibly in the middle of a collective
    // the others wait in: stop the job rather than hang.
    cli::print_error(kProgram, rank, e.what());
    MPI_Abort(MPI_COMM_WORLD, 1);
  }
  MPI_Comm_free(&stats);
  return status;
}

}  // namespace

int main(int argc, char** argv) { return cli::run_with_mpi(kProgram, argc, argv, train_main); }
