// shardopt from a LibTorch program: a small torch::nn model trained data
// parallel with shardopt::ZeroRedundancyOptimizer (AdamW) in place of
// torch::optim::AdamW. docs/libtorch.md walks through it.
//
// The model's parameters stay torch tensors: shardopt is given their data
// pointers and updates them in place in step(). Gradients reach shardopt
// from one autograd hook per parameter, as the backward pass produces them,
// so that at stage 2 a bucket is reduce-scattered while the backward pass
// still runs. At stage 3 each rank keeps only its shard of the parameters:
// each Linear layer is a unit whose weight and bias are gathered inside its
// forward and again inside its backward, and released right after (the
// UnitLinear function below). Every rank holds the whole synthetic data set
// (drawn from fixed seeds) and takes its slice of each global batch.
//
//   mpirun -n 3 torch_example --stage 2                  # train, data parallel
//   torch_example --reference                            # the same with torch::optim::AdamW
//   mpirun -n 2 torch_example --check                    # and compare with it
//
// Exit status: 0 when the final loss is below kLossThreshold (and, with
// --check, the parameters agree with torch's AdamW), 1 otherwise or for
// --device cuda without CUDA, 2 for a bad command line or an error.
#include <torch/torch.h>

#include <cerrno>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <fstream>
#include <functional>
#include <stdexcept>
#include <string>
#include <vector>

#include "shardopt/shardopt.hpp"

namespace {

// The problem: learn a fixed random "teacher" network from 1000 samples.
constexpr std::int64_t kInputs = 32, kHidden = 64, kOutputs = 8;  // 2,632 parameters
constexpr std::int64_t kSamples = 1000;
constexpr std::int64_t kBatch = 100;  // global batch: 50+50 at 2 ranks, 33+33+34 at 3
// AdamW's hyper-parameters, the same for shardopt and for torch.
constexpr double kLr = 1e-2, kWeightDecay = 1e-2;
// The mean squared error over the whole data set that the default 300
// steps must reach: a twentieth of the initial loss (about 0.5). Seeds 1 to
// 20 end between 0.98e-2 and 1.43e-2.
constexpr double kLossThreshold = 2.5e-2;

// --check compares parameters element by element (check() below), which
// is meaningful while rounding differences grow slowly: measured up to 1500
// steps; by 3000 the float32 trajectories diverge chaotically.
constexpr int kMaxCheckSteps = 1000;

const char* const kUsage =
    "usage: torch_example [options]   (under mpirun for several ranks)\n"
    "  --stage 0|1|2|3      ZeRO stage (default 1)\n"
    "  --steps N            optimizer steps (default 300)\n"
    "  --seed N             seed of the data and the initial weights (default 1)\n"
    "  --device cpu|cuda    where the model and its tensors live (default cpu)\n"
    "  --reference          train on one process with torch::optim::AdamW instead\n"
    "  --check              afterwards, compare with the --reference training (rank 0;\n"
    "                       at most 1000 steps)\n"
    "  --save-params FILE   write every parameter at the end, raw float32\n";

struct Options {
  int stage = 1;
  int steps = 300;
  std::uint64_t seed = 1;
  std::string device = "cpu";
  bool reference = false;
  bool check = false;
  std::string save_params;
};

struct UsageError : std::runtime_error {
  using std::runtime_error::runtime_error;
};

long parse_number(const std::string& flag, const char* text, long lo, long hi) {
  char* end = nullptr;
  errno = 0;
  const long v = std::strtol(text, &end, 10);
  if (errno != 0 || end == text || *end != '\0' || v < lo || v > hi)
    throw UsageError(flag + " takes an integer from " + std::to_string(lo) + " to " +
                     std::to_string(hi) + ", not '" + text + "'");
  return v;
}

Options parse(int argc, char** argv) {
  Options o;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    auto value = [&]() -> const char* {
      if (i + 1 >= argc) throw UsageError(a + " needs a value");
      return argv[++i];
    };
    if (a == "--stage") {
      o.stage = static_cast<int>(parse_number(a, value(), 0, 3));
    } else if (a == "--steps") {
      o.steps = static_cast<int>(parse_number(a, value(), 1, 1000000));
    } else if (a == "--seed") {
      o.seed = static_cast<std::uint64_t>(parse_number(a, value(), 0, 1L << 30));
    } else if (a == "--device") {
      o.device = value();
      if (o.device != "cpu" && o.device != "cuda")
        throw UsageError("--device takes cpu or cuda, not '" + o.device + "'");
    } else if (a == "--reference") {
      o.reference = true;
    } else if (a == "--check") {
      o.check = true;
    } else if (a == "--save-params") {
      o.save_params = value();
    } else if (a == "-h" || a == "--help") {
      std::fputs(kUsage, stdout);
      std::exit(0);
    } else {
      throw UsageError("unknown option '" + a + "'");
    }
  }
  if (o.reference && o.check) throw UsageError("--check compares with --reference: pick one");
  if (o.check && o.steps > kMaxCheckSteps)
    throw UsageError("--check's limits hold while rounding differences grow slowly, up to about " +
                     std::to_string(kMaxCheckSteps) +
                     " steps of this problem; past that the float32 trajectories diverge "
                     "chaotically (docs/libtorch.md): use --steps " +
                     std::to_string(kMaxCheckSteps) + " or fewer with --check");
  return o;
}

// A two-layer perceptron: Linear, tanh, Linear.
struct MlpImpl : torch::nn::Module {
  MlpImpl()
      : fc1(register_module("fc1", torch::nn::Linear(kInputs, kHidden))),
        fc2(register_module("fc2", torch::nn::Linear(kHidden, kOutputs))) {}
  torch::Tensor forward(const torch::Tensor& x) { return fc2(torch::tanh(fc1(x))); }
  torch::nn::Linear fc1, fc2;
};
TORCH_MODULE(Mlp);

struct Problem {
  torch::Tensor x, y;  // kSamples rows each
  Mlp model;
  // The forward pass training uses: the model's own, or at stage 3 one
  // that gathers each layer's parameters as it goes.
  std::function<torch::Tensor(const torch::Tensor&)> forward;
};

// The data and the initial model, the same on every rank and in every run
// with the same seed: drawn in float32 on the CPU from torch's generator,
// then converted to `dtype` and moved to `device`.
Problem make_problem(std::uint64_t seed, torch::Device device, torch::Dtype dtype) {
  torch::manual_seed(seed);
  const auto w1 = torch::randn({kInputs, kHidden}) / std::sqrt(double(kInputs));
  const auto w2 = torch::randn({kHidden, kOutputs}) / std::sqrt(double(kHidden));
  auto x = torch::randn({kSamples, kInputs});
  auto y = torch::tanh(x.matmul(w1)).matmul(w2) + 0.01 * torch::randn({kSamples, kOutputs});
  torch::manual_seed(seed + 1);
  Mlp model;  // torch's default initialization
  model->to(device, dtype);
  return {x.to(device, dtype), y.to(device, dtype), model,
          [model](const torch::Tensor& in) mutable { return model->forward(in); }};
}

// The loss of samples [begin, end) of the global batch of step `step`:
// their squared errors summed and divided by the size of the whole batch,
// so that the sum of the ranks' losses (and of their gradients, hence
// GradReduction::sum) is the mean squared error over the global batch,
// however unevenly it is split. One rank owning the whole batch computes
// exactly what the single-process reference computes.
torch::Tensor batch_loss(Problem& p, int step, std::int64_t begin, std::int64_t end) {
  const std::int64_t first = (step * kBatch) % kSamples;
  const auto x = p.x.narrow(0, first + begin, end - begin);
  const auto y = p.y.narrow(0, first + begin, end - begin);
  return (p.forward(x) - y).square().sum() / double(kBatch * kOutputs);
}

double full_loss(Problem& p) {
  torch::NoGradGuard no_grad;
  return (p.model->forward(p.x) - p.y).square().mean().item<double>();
}

// Every parameter, flattened in registration order, on the CPU.
torch::Tensor flat_params(Mlp& model) {
  std::vector<torch::Tensor> flat;
  for (const auto& t : model->parameters()) flat.push_back(t.detach().reshape({-1}));
  return torch::cat(flat).to(torch::kCPU);
}

struct Trained {
  torch::Tensor params;
  double initial_loss, loss;
};

// Single process, the whole batch, torch::optim::AdamW: the reference.
Trained train_reference(const Options& o, torch::Device device, torch::Dtype dtype) {
  Problem p = make_problem(o.seed, device, dtype);
  const double initial = full_loss(p);
  torch::optim::AdamW adamw(p.model->parameters(),
                            torch::optim::AdamWOptions(kLr).weight_decay(kWeightDecay));
  for (int step = 0; step < o.steps; ++step) {
    adamw.zero_grad();
    batch_loss(p, step, 0, kBatch).backward();
    adamw.step();
  }
  return {flat_params(p.model), initial, full_loss(p)};
}

// Stage 3: one Linear layer, a shardopt unit (its weight, then its bias).
struct Layer {
  shardopt::ZeroRedundancyOptimizer* opt;
  std::size_t unit, weight, bias;  // the unit, and the two parameters' indices
  torch::Tensor like;              // the module's weight tensor: its shape and device
  std::int64_t outputs;
  // The whole weight and bias, gathered from the ranks' shards into
  // shardopt's pool: valid until release().
  std::pair<torch::Tensor, torch::Tensor> gather() const {
    opt->gather(unit);
    const auto on = torch::TensorOptions().dtype(torch::kFloat32).device(like.device());
    return {torch::from_blob(const_cast<void*>(opt->data(weight)), like.sizes(), on),
            torch::from_blob(const_cast<void*>(opt->data(bias)), {outputs}, on)};
  }
  void release() const { opt->release(unit); }
};

// y = x W^T + b with the layer's parameters gathered only while forward and
// backward run, as stage 3 wants: autograd keeps the input, not the
// weight. Both passes compute what torch::nn::Linear and its autograd
// compute, op for op (addmm forward; mm backward in the layouts torch picks),
// so every stage trains bitwise alike. The gradients of weight and bias go
// to shardopt in backward; autograd gets none for them. weight and bias are
// the module's tensors, inputs only so that autograd runs this backward.
struct UnitLinear : torch::autograd::Function<UnitLinear> {
  static torch::Tensor forward(torch::autograd::AutogradContext* ctx, const torch::Tensor& x,
                               const torch::Tensor& /*weight*/, const torch::Tensor& /*bias*/,
                               const Layer* layer) {
    // saved_data holds IValues: the layer's address as an integer.
    ctx->saved_data["layer"] = static_cast<std::int64_t>(reinterpret_cast<std::intptr_t>(layer));
    ctx->save_for_backward({x});
    const auto [w, b] = layer->gather();
    torch::Tensor y = torch::addmm(b, x, w.t());  // a new tensor: w and b may go
    layer->release();
    return y;
  }
  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grads) {
    const auto* layer = reinterpret_cast<const Layer*>(
        static_cast<std::intptr_t>(ctx->saved_data["layer"].toInt()));
    const torch::Tensor x = ctx->get_saved_variables()[0];
    const torch::Tensor& g = grads[0];
    const auto [w, b] = layer->gather();
    torch::Tensor gx = g.mm(w);
    const torch::Tensor gw = g.t().mm(x);  // [outputs, inputs], contiguous
    const torch::Tensor gb = g.sum(0);
    layer->opt->grad_ready(layer->weight, gw.data_ptr());
    layer->opt->grad_ready(layer->bias, gb.data_ptr());
    layer->release();
    return {gx, torch::Tensor(), torch::Tensor(), torch::Tensor()};
  }
};

// Data parallel with shardopt. Collective over comm.
Trained train_sharded(const Options& o, torch::Device device, shardopt::Communicator& comm) {
  Problem p = make_problem(o.seed, device, torch::kFloat32);
  const double initial = full_loss(p);

  // Registration by data pointer, in forward order (the backward pass then
  // produces gradients in the descending order shardopt's buckets expect).
  // Param::grad stays null: shardopt owns the gradient buffers, or at stage
  // 2 with stream_grads has none and copies each gradient straight into its
  // communication bucket.
  // Each Linear layer is a unit (fc1's weight and bias, then fc2's): stage
  // 3 gathers it whole; at stages 0-2 units only end gradient buckets.
  std::vector<torch::Tensor> tensors;
  std::vector<shardopt::Param> params;
  for (const auto& item : p.model->named_parameters()) {
    const torch::Tensor& t = item.value();
    // shardopt reads and writes numel consecutive floats at data_ptr().
    if (!t.is_contiguous() || t.scalar_type() != torch::kFloat32)
      throw std::runtime_error("parameter " + item.key() + " is not a contiguous float32 tensor");
    std::vector<std::size_t> shape(t.sizes().begin(), t.sizes().end());
    params.push_back({.name = item.key(),
                      .data = t.data_ptr(),
                      .numel = static_cast<std::size_t>(t.numel()),
                      .dtype = shardopt::DType::f32,
                      .unit = static_cast<int>(tensors.size() / 2),
                      .shape = shape});
    tensors.push_back(t);
  }
  shardopt::ZeroRedundancyOptimizer opt(
      comm, params, shardopt::AdamW{.lr = kLr, .weight_decay = kWeightDecay},
      {.stage = o.stage, .reduction = shardopt::GradReduction::sum, .stream_grads = o.stage == 2});

  // Stage 3: shardopt read the tensors above once, to fill its shards; the
  // layers' forward and backward take the parameters from it.
  const std::vector<Layer> layers = {{&opt, 0, 0, 1, tensors[0], kHidden},
                                     {&opt, 1, 2, 3, tensors[2], kOutputs}};
  if (o.stage == 3)
    p.forward = [&](const torch::Tensor& in) {
      const torch::Tensor h =
          torch::tanh(UnitLinear::apply(in, tensors[0], tensors[1], &layers[0]));
      return UnitLinear::apply(h, tensors[2], tensors[3], &layers[1]);
    };

  // Autograd calls each hook with the parameter's gradient as soon as it is
  // computed; grad_ready copies it before returning. Hooks on CPU tensors
  // run on the thread that called backward(); on CUDA tensors, on
  // autograd's device thread (hence MPI_THREAD_MULTIPLE in run()).
  for (std::size_t i = 0; i < tensors.size() && o.stage < 3; ++i)
    tensors[i].register_hook([&opt, i](const torch::Tensor& grad) {
      const torch::Tensor g = grad.contiguous();
      opt.grad_ready(i, g.data_ptr());
    });

  // This rank's slice of every global batch: [begin, end).
  const std::int64_t begin = kBatch * comm.rank() / comm.size();
  const std::int64_t end = kBatch * (comm.rank() + 1) / comm.size();
  for (int step = 0; step < o.steps; ++step) {
    opt.zero_grad();
    // Autograd still sums each gradient into p.grad() after the hooks;
    // shardopt has its own copy, so free torch's every step.
    p.model->zero_grad(/*set_to_none=*/true);
    torch::Tensor loss = batch_loss(p, step, begin, end);
    loss.backward();  // the hooks hand every gradient to shardopt
    opt.step();       // sums the gradients over ranks, updates, allgathers
    if (step % 100 == 0 || step + 1 == o.steps) {
      double global = loss.item<double>();
      MPI_Allreduce(MPI_IN_PLACE, &global, 1, MPI_DOUBLE, MPI_SUM, MPI_COMM_WORLD);
      if (comm.rank() == 0) std::printf("step %4d  batch loss %.4e\n", step, global);
    }
  }
  // Stage 3: the trained parameters into the module, a unit at a time.
  if (o.stage == 3) {
    torch::NoGradGuard no_grad;
    for (const Layer& l : layers) {
      const auto [w, b] = l.gather();
      tensors[l.weight].copy_(w);
      tensors[l.bias].copy_(b);
      l.release();
    }
  }
  return {flat_params(p.model), initial, full_loss(p)};
}

void save(const std::string& path, const torch::Tensor& flat) {
  const torch::Tensor f = flat.to(torch::kFloat32).contiguous();
  std::ofstream out(path, std::ios::binary);
  out.write(static_cast<const char*>(f.data_ptr()),
            static_cast<std::streamsize>(f.numel() * sizeof(float)));
  if (!out.flush()) throw std::runtime_error("cannot write " + path);
}

// The mean squared error over the whole data set before and after training.
bool report_loss(double initial, double final) {
  const bool ok = final < kLossThreshold;
  std::printf("initial loss %.4e, final loss %.4e: %s threshold %.1e\n", initial, final,
              ok ? "reached" : "MISSED", kLossThreshold);
  return ok;
}

// --check, on rank 0: the data-parallel parameters against torch's AdamW.
// One rank computes exactly what the reference computes, so on the CPU the
// parameters must be equal bit for bit. (Not on CUDA, where torch's
// kernels round differently, dividing by a scalar as a multiplication by
// its reciprocal for one: there one rank is held to the tolerance.)
// Several ranks sum each gradient over the batch in another order (each
// rank its slice, then across ranks): a rounding difference of a few ulps
// per step, of the same kind as the rounding of the float32 reference
// itself. Adam's normalized step amplifies such differences where a
// gradient is small, so no useful a priori bound exists (the worst case,
// each trajectory moving by up to 7.3 lr per step in opposite directions,
// is larger than the weights). The bound is measured instead, with the
// reference trained in float64: D = max |ref32 - ref64| is how far float32
// rounding alone takes torch's training from the exact trajectory. The
// data-parallel run is another float32 trajectory with rounding of the
// same size, so it must lie as close to ref64 as ref32 does, up to the
// spread of such errors: max |p - ref64| <= 2 D, and hence max |p - ref32|
// <= 3 D. (Measured over seeds 1-20 at 2 and 3 ranks: max |p - ref64| from
// 0.73 D to 1.24 D, max |p - ref32| from 0.12 D to 0.57 D, with D from
// 1.5e-6 to 2.4e-6: docs/libtorch.md.)
bool check(const Options& o, torch::Device device, const torch::Tensor& params, int ranks) {
  const Trained t32 = train_reference(o, device, torch::kFloat32);
  const Trained t64 = train_reference(o, device, torch::kFloat64);
  const torch::Tensor& ref32 = t32.params;
  const torch::Tensor& ref64 = t64.params;
  const torch::Tensor p64 = params.to(torch::kFloat64);
  const double drift = (ref32.to(torch::kFloat64) - ref64).abs().max().item<double>();
  const double to_ref32 = (p64 - ref32.to(torch::kFloat64)).abs().max().item<double>();
  const double to_ref64 = (p64 - ref64).abs().max().item<double>();
  std::printf("reference: torch::optim::AdamW loss %.4e (float64: %.4e); float32 drift D %.3e\n",
              t32.loss, t64.loss, drift);
  if (ranks == 1 && device.is_cpu()) {
    const bool equal = torch::equal(params, ref32);
    std::printf("check: %s torch::optim::AdamW bit for bit (max |p - ref32| %.3e)\n",
                equal ? "equal to" : "DIFFERENT from", to_ref32);
    // shardopt's AdamW rounds where torch's AVX2 and AVX-512 kernels do;
    // torch's generic kernels do not fuse the multiply-adds.
    if (!equal)
      std::printf(
          "check: torch's generic CPU kernels (ATEN_CPU_CAPABILITY=default, or a CPU without "
          "AVX2) round add_ and addcmul_ twice where shardopt, like torch's AVX2 and AVX-512 "
          "kernels, rounds once\n");
    return equal;
  }
  const bool ok = to_ref64 <= 2.0 * drift && to_ref32 <= 3.0 * drift;
  std::printf(
      "check: max |p - ref64| %.3e (%.2f D, limit 2 D), max |p - ref32| %.3e (%.2f D, limit 3 D): "
      "%s\n",
      to_ref64, to_ref64 / drift, to_ref32, to_ref32 / drift, ok ? "within" : "OUTSIDE");
  return ok;
}

// Each rank of a node takes its own GPU (local rank modulo the GPUs it
// sees), for torch and for shardopt, before the communicator is made.
// Collective over MPI_COMM_WORLD.
torch::Device pick_gpu() {
  MPI_Comm node;
  MPI_Comm_split_type(MPI_COMM_WORLD, MPI_COMM_TYPE_SHARED, 0, MPI_INFO_NULL, &node);
  int local = 0;
  MPI_Comm_rank(node, &local);
  MPI_Comm_free(&node);
  if (shardopt::device_count() == 0)
    throw std::runtime_error(
        "--device cuda, but this shardopt sees no device (its device runtime: " +
        std::string(shardopt::device_runtime_name()) +
        "): build shardopt with CUDA (docs/gpu.md), or use --device cpu");
  const int gpu = local % shardopt::device_count();
  shardopt::set_device(gpu);
  return torch::Device(torch::kCUDA, static_cast<torch::DeviceIndex>(gpu));
}

int run(const Options& o, int& argc, char**& argv) {
  torch::Device device(o.device == "cuda" ? torch::kCUDA : torch::kCPU);
  if (device.is_cuda() && !torch::cuda::is_available()) {
    std::fprintf(stderr,
                 "torch_example: --device cuda, but this LibTorch sees no CUDA device "
                 "(torch::cuda::is_available() is false; Debian's libtorch is built for the "
                 "CPU only): use --device cpu, or build against a CUDA LibTorch\n");
    return 1;
  }
  // One thread per process: the ranks are the parallelism, and results do
  // not depend on the machine's core count.
  torch::set_num_threads(1);

  if (o.reference) {
    std::printf("reference: torch::optim::AdamW lr %g weight_decay %g, %d steps, one process\n",
                kLr, kWeightDecay, o.steps);
    const Trained t = train_reference(o, device, torch::kFloat32);
    if (!o.save_params.empty()) save(o.save_params, t.params);
    return report_loss(t.initial_loss, t.loss) ? 0 : 1;
  }

  // Autograd calls the hooks of CUDA tensors from its own thread, and
  // device buffers may move through the staged backend, which needs
  // MPI_THREAD_MULTIPLE; host tensors need only shardopt's default.
  shardopt::Environment env(
      &argc, &argv,
      device.is_cuda() ? shardopt::ThreadLevel::multiple : shardopt::required_thread_level);
  if (device.is_cuda()) device = pick_gpu();
  shardopt::Communicator comm(MPI_COMM_WORLD);
  if (comm.rank() == 0)
    std::printf("shardopt %s: stage %d, %d rank(s), %d steps, AdamW lr %g weight_decay %g\n",
                SHARDOPT_VERSION_STRING, o.stage, comm.size(), o.steps, kLr, kWeightDecay);
  const Trained t = train_sharded(o, device, comm);
  // Rank 0 reports; the others wait for its verdict, which every rank
  // returns (an error on rank 0 alone must not leave them waiting).
  int ok = 1;
  if (comm.rank() == 0) {
    try {
      ok = report_loss(t.initial_loss, t.loss) ? 1 : 0;
      if (!o.save_params.empty()) save(o.save_params, t.params);
      if (o.check && !check(o, device, t.params, comm.size())) ok = 0;
    } catch (const std::exception& e) {
      std::fprintf(stderr, "torch_example: %s\n", e.what());
      ok = 0;
    }
  }
  MPI_Bcast(&ok, 1, MPI_INT, 0, MPI_COMM_WORLD);
  return ok ? 0 : 1;
}

}  // namespace

int main(int argc, char** argv) {
  try {
    const Options o = parse(argc, argv);
    return run(o, argc, argv);
  } catch (const UsageError& e) {
    std::fprintf(stderr, "torch_example: %s\n%s", e.what(), kUsage);
    return 2;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "torch_example: %s\n", e.what());
    return 2;
  }
}
