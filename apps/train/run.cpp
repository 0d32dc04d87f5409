// shardopt-train: a run, from the model's construction to the summary
// (run.hpp).
#include "run.hpp"

#include <signal.h>

#include <array>
#include <chrono>
#include <cmath>
#include <csignal>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <numbers>
#include <optional>
#include <string>
#include <system_error>
#include <utility>
#include <vector>

#include "../support/cli.hpp"
#include "../support/report.hpp"
#include "device_net.hpp"
#include "files.hpp"
#include "model.hpp"
#include "output.hpp"
#include "shardopt/agree.hpp"
#include "shardopt/checkpoint.hpp"
#include "shardopt/zero.hpp"

namespace train {
namespace {

using report::json_number;

// ---------------------------------------------------------------------------
// --stop-on: the handler only notes the signal; the training loop looks at
// the note at each step boundary, and the ranks agree on it there.

volatile std::sig_atomic_t g_stop_signal = 0;

extern "C" void note_stop_signal(int signo) { g_stop_signal = signo; }

// SA_RESTART: a system call the signal interrupts (MPI's polls, file
// writes) goes on instead of failing with EINTR.
void install_stop_handlers(const std::vector<int>& signals) {
  for (const int signo : signals) {
    struct sigaction sa = {};
    sa.sa_handler = note_stop_signal;
    sigemptyset(&sa.sa_mask);
    sa.sa_flags = SA_RESTART;
    sigaction(signo, &sa, nullptr);
  }
}

const char* signal_name(int signo) {
  switch (signo) {
    case SIGUSR1:
      return "SIGUSR1";
    case SIGUSR2:
      return "SIGUSR2";
    case SIGTERM:
      return "SIGTERM";
    case SIGINT:
      return "SIGINT";
    default:
      return "a signal";
  }
}

double scheduled_lr(const Options& o, int step_index) {
  if (o.schedule == Schedule::constant) return o.learning_rate();
  const double t = static_cast<double>(step_index) / static_cast<double>(o.steps);
  return o.learning_rate() * 0.5 * (1.0 + std::cos(std::numbers::pi * t));
}

// ---------------------------------------------------------------------------
// Reductions over the ranks

// The slowest rank's sums of each phase (each phase's maximum on its own).
Times slowest(const Times& local, const shardopt::Communicator& comm) {
  std::array<double, 9> a = local.array();
  MPI_Allreduce(MPI_IN_PLACE, a.data(), static_cast<int>(a.size()), MPI_DOUBLE, MPI_MAX,
                comm.mpi_comm());
  return Times::from(a);
}

double mean_over_ranks(double v, const shardopt::Communicator& comm) {
  MPI_Allreduce(MPI_IN_PLACE, &v, 1, MPI_DOUBLE, MPI_SUM, comm.mpi_comm());
  return v / comm.size();
}

// FNV-1a over the bytes of every parameter (on a device, of a copy that
// mirror_params() makes first).
std::uint64_t params_hash(ModelTensors& m) {
  m.mirror_params();
  std::uint64_t h = report::kFnv1aBasis;
  const std::size_t esize = shardopt::dtype_size(m.dtype());
  for (std::size_t i = 0; i < m.count(); ++i)
    h = report::fnv1a(m.host_param(i), m.numel(i) * esize, h);
  return h;
}

double seconds_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

// ---------------------------------------------------------------------------
// Collective calls of the optimizer that write or read files

// Ends a collective library call (save, load, export) that throws the same
// error on every rank: each error is printed once, by the lowest rank that
// has it (every rank's with SHARDOPT_DEBUG=INFO), and the ranks agree, so
// that no rank goes on alone into a collective the others have left. True
// if it succeeded on every rank.
bool collective_ok(const RunContext& c, const std::string& error) {
  cli::print_once(kProgram, c.stats.mpi_comm(), c.rank, error);
  return shardopt::all_ranks(c.stats, error.empty());
}

// The library's error as the trainer's user reads it: its fix in the
// trainer's options where the library's names a C++ field (a load's
// LoadOptions::strict: the trainer always loads strictly).
std::string trainer_text(const shardopt::Error& e) {
  if (e.hint().find("LoadOptions::strict") == std::string::npos) return cli::error_text(e);
  return cli::error_text(e,
                         "resume with the model and optimizer options of the run that wrote it "
                         "(--hidden, --layers, -o, -p and the state its flags keep); shardopt-ckpt "
                         "info FILE shows its tensors");
}

// Runs a collective call of the optimizer that writes or reads `path`:
// returns its slowest rank's seconds, or nullopt after an error on any rank
// (printed once).
template <class Call>
std::optional<double> timed_collective(const RunContext& c, const std::string& what,
                                       const std::string& path, Call&& call) {
  std::string error;
  const auto t0 = std::chrono::steady_clock::now();
  try {
    call();
  } catch (const shardopt::Error& e) {
    error = what + " '" + path + "': " + trainer_text(e);
  }
  const double seconds = seconds_since(t0);
  if (!collective_ok(c, error)) return std::nullopt;
  return shardopt::max_over_ranks(c.stats, seconds);
}

// ---------------------------------------------------------------------------
// The training

// One run on one rank, in the order run() takes its steps. The methods that
// return false have stopped the run after an error, on every rank alike.
class Training final : private train::LayerSource {
 public:
  // The model and the data: the student's tensors and initial weights, its
  // network, and the teacher, drawn from the seed alike on every rank.
  explicit Training(const RunContext& c)
      : c_(c),
        model_(student_shape(c.o), c.o.precision, c.o.scattered, c.o.device),
        student_(student_shape(c.o), c.o.batch),
        teacher_net_(teacher_shape(c.o), c.o.batch),
        teacher_(make_teacher(teacher_net_, c.o.seed)),
        params_(model_.layer_params()),
        grads_(model_.layer_grads()) {
    model_.set_params(student_init(student_.shape(), c.o.seed));
    if (c.o.device) {
      // --device cuda: the student's passes on the device, over the batch,
      // its targets and the output's gradient copied there.
      device_net_ = make_device_net(student_shape(c.o), c.o.batch);
      const std::size_t rows = static_cast<std::size_t>(c.o.batch);
      device_x_ = shardopt::DeviceBuffer(rows * static_cast<std::size_t>(c.o.inputs) * 4);
      device_y_ = shardopt::DeviceBuffer(rows * static_cast<std::size_t>(c.o.outputs) * 4);
      device_dy_ = shardopt::DeviceBuffer(rows * static_cast<std::size_t>(c.o.outputs) * 4);
    }
  }

  bool make_optimizer();
  int resume();
  void start();
  bool train();
  int finish();
  // After train(): the signal that stopped the run (0: none).
  int stopped_by() const { return stopped_by_; }
  int stop();

 private:
  bool stop_requested();
  std::string refusal(const shardopt::ckpt::Header& h) const;
  bool checkpoint_is_current() const;
  bool write_checkpoint();
  double forward_backward(const Batch& batch, std::vector<float>& dy, double grad_scale);
  shardopt::StepInfo try_step(const Batch& batch, std::vector<float>& dy, Times& t, double& loss);
  void log_interval(const shardopt::StepInfo& info, double lr);
  // Stage 3 (LayerSource): layer l gathered for a pass, params_[l] pointing
  // at it (an fp32 model) or at the working copies it is converted into;
  // released after.
  void begin(int l) override;
  void end(int l) override;
  // The model's tensors (and working copies) as the optimizer has them, for
  // evaluation and the files: at stage 3 gathered layer by layer.
  void refresh_model();

  const RunContext& c_;
  ModelTensors model_;
  train::Mlp student_;
  train::Mlp teacher_net_;
  Teacher teacher_;
  std::vector<train::LayerParams> params_;
  std::vector<train::LayerGrads> grads_;
  // --device cuda: the student's passes and their device buffers.
  std::unique_ptr<DeviceNet> device_net_;
  shardopt::DeviceBuffer device_x_, device_y_, device_dy_;

  shardopt::OptimizerConfig config_;
  shardopt::ZeroOptions zopt_;
  std::optional<shardopt::ZeroRedundancyOptimizer> engine_;
  std::optional<Resumed> resumed_;
  std::int64_t start_step_ = 0;

  Batch eval_;
  double initial_loss_ = 0.0;

  // The checkpoints this run wrote.
  int checkpoints_ = 0;
  double checkpoint_seconds_ = 0.0;
  std::int64_t last_checkpoint_ = -1;  // the step of the newest one
  int stopped_by_ = 0;

  // The steps tried, and those since the last log line.
  Times all_;
  int attempts_ = 0;  // skipped ones included
  int skipped_ = 0;
  Times interval_;
  double interval_loss_ = 0.0;
  int interval_steps_ = 0;
  int interval_skipped_ = 0;
  double last_norm_ = -1.0;
  std::chrono::steady_clock::time_point last_redraw_;
};

// The optimizer: its configuration and the engine over the model's tensors.
bool Training::make_optimizer() {
  const Options& o = c_.o;
  config_ = optimizer_config(o.optimizer);
  zopt_.stage = o.stage;
  zopt_.bucket_mb = o.bucket_mb;
  zopt_.param_remainders = o.param_remainders;
  zopt_.reduce_in_fp32 = o.reduce_in_fp32;
  zopt_.reduction = o.grad_reduction;
  if (o.uses_scaler()) zopt_.loss_scaler = shardopt::LossScaler{};
  // Collective: a bad layout or argument throws the same error on every
  // rank, so every rank can stop cleanly here.
  try {
    engine_.emplace(c_.comm, model_.registration(o.stage == 3), config_, zopt_);
  } catch (const shardopt::Error& e) {
    if (c_.rank == 0) cli::print_error(kProgram, c_.rank, e.what());
    return false;
  }
  return true;
}

// --resume: why the checkpoint of header h cannot go on under this command
// line, or "". What a checkpoint's optimizer state is bound to cannot
// change on resume: the optimizer (-o), the model's precision (-p: the
// tensors of the model and the loss scaler's state are the checkpoint's),
// the loss scaler (--loss-scale) and whether the gradients are averaged or
// summed (--grad-reduction: the moments are of gradients of that scale).
// The same on every rank: every rank reads the same header.
std::string Training::refusal(const shardopt::ckpt::Header& h) const {
  const Options& o = c_.o;
  const auto meta = [&](const char* key) {
    const auto it = h.metadata.find(key);
    return it == h.metadata.end() ? std::string() : it->second;
  };
  // "-p bf16 (the default)" when the command line leaves the option out.
  const auto ours = [&](const char* flag, const char* long_name, const std::string& value) {
    return std::string(flag) + " " + value + (o.was_given(long_name) ? "" : " (the default)");
  };
  const auto refuse = [&](const std::string& flag, const std::string& saved,
                          const std::string& here, const std::string& why) {
    return "--resume " + o.resume + ": the checkpoint was trained with " + flag + " " + saved +
           ", this run has " + here + ": " + why + "; resume with " + flag + " " + saved +
           ", or start a new run without --resume";
  };
  const std::string kind = meta("shardopt.optimizer");
  if (!kind.empty() && kind != o.optimizer.key)
    return refuse("-o", kind, ours("-o", "optimizer", o.optimizer.key),
                  "its optimizer state is " + kind + "'s");
  const std::string dtype = meta("shardopt.dtype");
  const std::string precision = shardopt::dtype_name(o.precision);
  if (!dtype.empty() && dtype != precision)
    return refuse("-p", dtype, ours("-p", "precision", precision),
                  "the precision of the model does not change on resume");
  const bool scaler = h.find("shardopt.loss_scaler") != nullptr;
  if (meta("shardopt.content") == "checkpoint" && scaler != o.uses_scaler())
    return refuse("--loss-scale", scaler ? "dynamic" : "none",
                  ours("--loss-scale", "loss-scale", o.uses_scaler() ? "dynamic" : "none"),
                  scaler ? "the loss scale it holds would be dropped"
                         : "it holds no loss scale to go on from");
  const std::string reduction = meta("shardopt.grad_reduction");
  const std::string ours_reduction =
      o.grad_reduction == shardopt::GradReduction::sum ? "sum" : "avg";
  if (!reduction.empty() && reduction != ours_reduction)
    return refuse("--grad-reduction", reduction,
                  ours("--grad-reduction", "grad-reduction", ours_reduction),
                  "its optimizer state belongs to gradients " +
                      std::string(reduction == "sum" ? "summed" : "averaged") +
                      " over the ranks, which differ from this run's by the rank count");
  return {};
}

// --resume: the parameters, the optimizer state, the step count and the
// loss scaler as the checkpoint has them; training goes on from its step.
// The hyper-parameter flags the command line gives replace the
// checkpoint's (refusal() lists the options that cannot change). Returns
// 0, or the exit status after an error (1) or a refusal (2), alike on every
// rank.
int Training::resume() {
  const Options& o = c_.o;
  shardopt::ZeroRedundancyOptimizer& opt = *engine_;
  if (!o.resume.empty()) {
    std::string why;
    const std::optional<double> checked = timed_collective(c_, "cannot resume from", o.resume, [&] {
      const shardopt::ckpt::Reader reader(c_.comm, o.resume);
      why = refusal(reader.header());
    });
    if (!checked) return 1;
    if (!why.empty()) {
      if (c_.rank == 0) cli::print_error(kProgram, c_.rank, why);
      return 2;
    }
    Resumed r;
    r.path = o.resume;
    const std::optional<double> seconds = timed_collective(c_, "cannot resume from", o.resume,
                                                           [&] { r.report = opt.load(o.resume); });
    if (!seconds) return 1;
    r.seconds = *seconds;
    // The report is the same on every rank: every rank stops here alike.
    if (r.report.step > o.steps) {
      if (c_.rank == 0) {
        cli::print_error(kProgram, c_.rank,
                         "the checkpoint '" + o.resume + "' is at step " +
                             std::to_string(r.report.step) + ", past -n (--steps) " +
                             std::to_string(o.steps) +
                             ": --steps counts the steps in all, those before the checkpoint "
                             "included");
      }
      return 1;
    }
    r.applied = apply_given_fields(o.optimizer, opt.param_group(0));
    resumed_ = std::move(r);
  }
  start_step_ = opt.steps();
  return 0;
}

// The loss on held-out samples before training, then the configuration
// and the banner.
void Training::start() {
  const Options& o = c_.o;
  draw_batch(eval_, o.eval_samples,
             train::stream_key(o.seed, kEvalStream, static_cast<std::uint64_t>(c_.rank)), teacher_,
             teacher_net_);
  refresh_model();
  initial_loss_ = mean_over_ranks(evaluate(student_, model_.host_layer_params(), eval_), c_.stats);

  if (c_.printer) {
    print_start(c_, model_, *engine_, config_);
    if (resumed_) print_resumed(c_, *resumed_);
  }
}

// True if the file at --checkpoint holds this very state: this run wrote
// it at the current step, or took no step from the checkpoint it resumed
// at that very path.
bool Training::checkpoint_is_current() const {
  const Options& o = c_.o;
  const std::int64_t step = engine_->steps();
  if (last_checkpoint_ == step) return true;
  std::error_code ec;
  return step == start_step_ && !o.resume.empty() &&
         std::filesystem::equivalent(o.resume, o.checkpoint, ec);
}

// Collective: whether a --stop-on signal reached any rank; the same answer
// on every rank, so that all stop at the same step.
bool Training::stop_requested() {
  if (c_.o.stop_signals.empty()) return false;
  int signo = g_stop_signal;
  MPI_Allreduce(MPI_IN_PLACE, &signo, 1, MPI_INT, MPI_MAX, c_.stats.mpi_comm());
  stopped_by_ = signo;
  return signo != 0;
}

bool Training::write_checkpoint() {
  const Options& o = c_.o;
  shardopt::ZeroRedundancyOptimizer& opt = *engine_;
  shardopt::SaveOptions so;
  so.keep_last = o.keep_last.value_or(1);
  const std::optional<double> seconds = timed_collective(
      c_, "cannot write the checkpoint", o.checkpoint, [&] { opt.save(o.checkpoint, so); });
  if (!seconds) return false;
  ++checkpoints_;
  checkpoint_seconds_ += *seconds;
  last_checkpoint_ = opt.steps();
  if (c_.printer) print_written(c_, "checkpoint", o.checkpoint, opt.steps(), *seconds);
  return true;
}

// The forward and backward passes over the micro-batches of `batch`, each
// gradient handed to the optimizer as soon as it is complete; returns the
// batch's loss.
double Training::forward_backward(const Batch& batch, std::vector<float>& dy, double grad_scale) {
  const Options& o = c_.o;
  shardopt::ZeroRedundancyOptimizer& opt = *engine_;
  double loss = 0.0;
  int first = 0;
  const bool device = device_net_ != nullptr;
  if (device) {
    shardopt::device_copy(device_x_.data(), batch.x.data(), batch.x.size() * sizeof(float));
    shardopt::device_copy(device_y_.data(), batch.y.data(), batch.y.size() * sizeof(float));
  }
  const float* xs = device ? static_cast<const float*>(device_x_.data()) : batch.x.data();
  const float* ys = device ? static_cast<const float*>(device_y_.data()) : batch.y.data();
  float* dys = device ? static_cast<float*>(device_dy_.data()) : dy.data();
  for (int mb = 0; mb < o.micro_batches; ++mb) {
    // Micro-batch sizes differ by at most one sample.
    const int rows = o.batch / o.micro_batches + (mb < o.batch % o.micro_batches ? 1 : 0);
    const bool last = mb + 1 == o.micro_batches;
    const float* x = xs + static_cast<std::size_t>(first) * o.inputs;
    const float* y = ys + static_cast<std::size_t>(first) * o.outputs;
    const std::size_t count = static_cast<std::size_t>(rows) * o.outputs;
    if (device) {
      const float* y_hat = device_net_->forward(params_, x, rows);
      loss += device_net_->mse(y_hat, y, count, dys, grad_scale) * rows / o.batch;
    } else {
      const float* y_hat = student_.forward(params_, x, rows, o.stage == 3 ? this : nullptr);
      loss += train::mse(y_hat, y, count, dys, grad_scale) * rows / o.batch;
    }
    // Stages 2 and 3 reduce every micro-batch as its backward pass runs, into
    // the engine's fp32 gradient shard. Stages 0 and 1 accumulate the
    // micro-batches in the gradient buffers and reduce once, in the last.
    const bool reduce_now = o.stage >= 2 || last;
    const bool accumulate = o.stage < 2 && mb > 0;
    auto done = [&](int l) {
      if (!reduce_now) return;
      // The bias, then the weight: descending order, as buckets start. On
      // a device the gradient is written on the default stream, which the
      // optimizer's work follows.
      for (const std::size_t i :
           {2 * static_cast<std::size_t>(l) + 1, 2 * static_cast<std::size_t>(l)}) {
        model_.publish_grad(i);
        opt.grad_ready(i);
      }
    };
    if (device)
      device_net_->backward(params_, grads_, dys, rows, accumulate, done);
    else
      student_.backward(params_, grads_, dys, rows, accumulate, done,
                        o.stage == 3 ? this : nullptr);
    if (o.stage >= 2 && !last) opt.reduce_gradients();
    first += rows;
  }
  return loss;
}

void Training::begin(int l) {
  shardopt::ZeroRedundancyOptimizer& opt = *engine_;
  const auto u = static_cast<std::size_t>(l);
  opt.gather(u);
  const DType t = model_.dtype();
  const float* at[2];
  for (std::size_t k = 0; k < 2; ++k) {
    const std::size_t i = 2 * u + k;
    at[k] = static_cast<const float*>(opt.data(i));
    if (t != DType::f32) {
      shardopt::cast(opt.data(i), t, model_.fp32_param(i), DType::f32, model_.numel(i));
      at[k] = model_.fp32_param(i);
    }
  }
  params_[u] = {at[0], at[1]};
}

void Training::end(int l) { engine_->release(static_cast<std::size_t>(l)); }

void Training::refresh_model() {
  if (c_.o.stage == 3) {
    shardopt::ZeroRedundancyOptimizer& opt = *engine_;
    const std::size_t esize = shardopt::dtype_size(model_.dtype());
    for (std::size_t u = 0; u < opt.num_units(); ++u) {
      opt.gather(u);
      for (std::size_t i = 2 * u; i < 2 * u + 2; ++i)
        std::memcpy(model_.param(i), opt.data(i), model_.numel(i) * esize);
      opt.release(u);
    }
  }
  model_.refresh_working();
}

// One try of a step on `batch`, timed into t: the gradients, the clipping
// and step(). Sets `loss` to the batch's loss.
shardopt::StepInfo Training::try_step(const Batch& batch, std::vector<float>& dy, Times& t,
                                      double& loss) {
  const Options& o = c_.o;
  shardopt::ZeroRedundancyOptimizer& opt = *engine_;
  const auto t0 = std::chrono::steady_clock::now();
  if (o.stage != 3) model_.refresh_working();
  // The loss is multiplied by the scale, so its gradient is too; step()
  // divides it out in its fused update.
  const double loss_scale = opt.loss_scale();
  const double grad_scale =
      loss_scale / (static_cast<double>(o.batch) * static_cast<double>(o.outputs));
  loss = forward_backward(batch, dy, grad_scale);
  t.compute = seconds_since(t0);

  if (o.clip) {
    const auto tc = std::chrono::steady_clock::now();
    last_norm_ = opt.clip_grad_norm(*o.clip);
    t.reduce += seconds_since(tc);
  }
  const std::int64_t applied_before = opt.steps();
  shardopt::StepInfo info = opt.step();
  if (info.pending) {
    // Device parameters: the device decides whether the step applies, and
    // step() returned before it had. The trainer logs every step's
    // verdict, so it waits for it here.
    info.step = opt.steps();
    info.applied = info.step > applied_before;
    info.loss_scale = opt.loss_scale();
    info.pending = false;
  }
  t.total = seconds_since(t0);
  t.reduce += info.reduce_seconds;
  t.update = info.update_seconds;
  t.gather = info.gather_seconds;
  t.exposed = info.exposed_comm_seconds;
  t.span = info.reduce_span_seconds;
  t.reduce_bytes = static_cast<double>(info.reduce_bytes);
  t.gather_bytes = static_cast<double>(info.gather_bytes);
  return info;
}

// Collective: the log line of the steps since the previous one, printed by
// the printer; starts the next interval.
void Training::log_interval(const shardopt::StepInfo& info, double lr) {
  const Times worst = slowest(interval_, c_.stats);
  const double global_batch = static_cast<double>(c_.o.batch) * c_.ranks;
  LogLine line;
  line.step = static_cast<int>(info.step);
  line.loss = mean_over_ranks(interval_loss_ / interval_steps_, c_.stats);
  line.lr = lr;
  line.per_step = worst.per(interval_steps_);
  line.samples_per_s = worst.total > 0.0 ? global_batch * interval_steps_ / worst.total : 0.0;
  line.loss_scale = info.loss_scale;
  line.grad_norm = last_norm_;
  line.skipped = interval_skipped_;
  if (c_.printer) print_log(c_, line);
  interval_ = Times{};
  interval_loss_ = 0.0;
  interval_steps_ = 0;
  interval_skipped_ = 0;
}

// The training loop, to --steps steps in all.
//
// Step s (the steps applied so far) trains on a batch drawn from the seed,
// the rank and s alone, at the learning rate of s: no state carries from one
// step to the next but what the optimizer holds (and a checkpoint restores),
// so a resumed run takes the steps of one that was never stopped. A step
// the loss scaler skips is tried again, on the same batch, at the lower
// scale.
bool Training::train() {
  const Options& o = c_.o;
  shardopt::ZeroRedundancyOptimizer& opt = *engine_;
  Batch batch;
  std::vector<float> dy(static_cast<std::size_t>(o.batch) * static_cast<std::size_t>(o.outputs));
  last_redraw_ = std::chrono::steady_clock::now();
  while (opt.steps() < o.steps) {
    if (stop_requested()) return true;
    const int s = static_cast<int>(opt.steps());
    // The data is drawn outside the timed step: it stands for the input
    // pipeline, which a real code overlaps with training.
    draw_batch(batch, o.batch,
               train::stream_key(o.seed, kDataStream, static_cast<std::uint64_t>(c_.rank),
                                 static_cast<std::uint64_t>(s)),
               teacher_, teacher_net_);
    const double lr = scheduled_lr(o, s);
    opt.set_lr(lr);

    Times t;
    double loss = 0.0;
    const shardopt::StepInfo info = try_step(batch, dy, t, loss);

    ++attempts_;
    if (!info.applied) {
      ++skipped_;
      ++interval_skipped_;
    }
    interval_.add(t);
    all_.add(t);
    interval_loss_ += loss;
    ++interval_steps_;
    if (!info.applied && info.loss_scale <= zopt_.loss_scaler->min_scale) {
      // The next try would repeat this one: the same batch, parameters and
      // scale. Whether the step was applied is agreed across ranks, so
      // every rank stops here.
      if (c_.rank == 0) {
        cli::print_error(kProgram, c_.rank,
                         "step " + std::to_string(s + 1) +
                             ": the gradients are not finite even at the smallest loss scale (" +
                             json_number(info.loss_scale) +
                             "): the training diverged; lower --lr or clip the gradients (--clip)");
      }
      return false;
    }

    const std::int64_t done = info.step;  // steps applied, this one included
    const bool log =
        info.applied && (s == start_step_ || done % o.log_every == 0 || done == o.steps);
    if (log) {
      log_interval(info, lr);
    } else if (c_.live && seconds_since(last_redraw_) >= 0.1) {
      // At most ten redraws a second: a terminal is slower than a fast step.
      std::printf("\r\033[K  step %d/%d  loss %.4e (rank 0)", s + 1, o.steps, loss);
      std::fflush(stdout);
      last_redraw_ = std::chrono::steady_clock::now();
    }
    if (info.applied && !o.checkpoint.empty() && o.checkpoint_every > 0 &&
        done % o.checkpoint_every == 0 && !write_checkpoint()) {
      return false;
    }
  }
  return true;
}

// After the loop: the loss on the held-out samples, the parameters checked
// and written (--save-params), the last checkpoint, the export and the
// summary. Returns the exit status.
int Training::finish() {
  const Options& o = c_.o;
  shardopt::ZeroRedundancyOptimizer& opt = *engine_;
  Summary s;
  s.attempts = attempts_;
  s.skipped = skipped_;
  s.start_step = start_step_;
  s.resumed = resumed_.has_value();
  s.initial_loss = initial_loss_;
  refresh_model();
  s.final_loss = mean_over_ranks(evaluate(student_, model_.host_layer_params(), eval_), c_.stats);
  s.worst = slowest(all_, c_.stats);
  s.applied = opt.steps() - start_step_;

  // step() leaves every rank's parameters identical, so rank 0 writes its
  // own; check the promise first, at the cost of one small reduction.
  s.identical = shardopt::same_on_all_ranks(c_.stats, params_hash(model_));
  if (!s.identical) {
    s.save_error = "the parameters differ between ranks after the last step";
  } else if (!o.save_params.empty() && c_.rank == 0) {
    s.save_error = save_params(o.save_params, model_, opt.steps());
  }
  s.saved = shardopt::all_ranks(c_.stats, s.save_error.empty());

  // The checkpoint at the end, unless the file holds this state already.
  if (!o.checkpoint.empty() && !checkpoint_is_current() && !write_checkpoint()) return 1;
  if (!o.export_path.empty()) {
    shardopt::ExportOptions eo;
    eo.fp32 = true;
    const std::optional<double> seconds =
        timed_collective(c_, "cannot export the parameters to", o.export_path,
                         [&] { opt.export_params(o.export_path, eo); });
    if (!seconds) return 1;
    s.export_seconds = *seconds;
    if (c_.printer) print_written(c_, "export", o.export_path, opt.steps(), s.export_seconds);
  }

  s.final_step = opt.steps();
  s.checkpoints = checkpoints_;
  s.checkpoint_seconds = checkpoint_seconds_;
  if (c_.printer) print_summary(c_, s);
  if (!s.save_error.empty() && c_.rank == 0) cli::print_error(kProgram, c_.rank, s.save_error);
  return s.saved ? 0 : 1;
}

// A --stop-on signal stopped the run at a step boundary: the checkpoint,
// and the status a job script requeues on. No final loss, parameter file or
// export: the run is not over.
int Training::stop() {
  if (!checkpoint_is_current() && !write_checkpoint()) return 1;
  if (c_.printer) print_stopped(c_, signal_name(stopped_by_), engine_->steps());
  return kExitStopped;
}

}  // namespace

int run(const RunContext& c) {
  install_stop_handlers(c.o.stop_signals);
  Training t(c);  // the model and the data
  if (!t.make_optimizer()) return 1;
  if (const int status = t.resume(); status != 0) return status;
  t.start();  // the initial loss, the configuration and the banner
  if (!t.train()) return 1;
  if (t.stopped_by() != 0) return t.stop();
  return t.finish();  // the final loss, the files, the summary
}

}  // namespace train
