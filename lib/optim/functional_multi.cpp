// The functional optimizers on lists of tensors: every tensor checked as the
// single-tensor step checks it (the messages name the tensor), then the CPU
// kernel tensor by tensor for host buffers, or the multi-tensor CUDA kernels
// for device buffers (kernels/cuda/multi_tensor.cuh).
#include <initializer_list>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "kernels/adagrad.hpp"
#include "kernels/adam.hpp"
#include "kernels/lamb.hpp"
#include "kernels/lion.hpp"
#include "kernels/rmsprop.hpp"
#include "kernels/sgd.hpp"
#include "shardopt/optim.hpp"
#include "step_checks.hpp"

namespace shardopt::functional {

namespace {

using StateList = std::span<const std::span<float>>;

// The hyper-parameters, the step count and StepOptions are checked by the
// single-tensor step itself, on no elements (`single(options)` runs it): a
// list accepts exactly what a tensor alone accepts, with the same messages.
template <class Single>
void check_like_single(const StepOptions& extra, Single&& single) {
  StepOptions none = extra;
  none.param_out = nullptr;
  single(none);
}

// Runs a list step where its buffers live, through the skip rule of the
// single steps: with StepOptions::skip_nonfinite every tensor's gradients
// are checked first, and one non-finite gradient anywhere skips the whole
// list, writing nothing.
template <class Host, class Device>
StepResult run_list(const char* opt, const detail::MemoryLocation& where,
                    std::span<const GradView> grads, const StepOptions& extra, Host&& host,
                    Device&& device) {
  if (extra.skip_nonfinite) {
    for (const GradView& g : grads)
      if (!detail::grads_finite_at(opt, where, g, extra.grad_mul, extra.stream))
        return {.grads_finite = false, .applied = false};
  }
  return {.grads_finite = detail::run_at(opt, where, host, device), .applied = true};
}

// The lists' lengths, each tensor's name in messages and its StepOptions.
class TensorList {
 public:
  TensorList(const char* opt, std::size_t params, std::size_t grads, const StepOptions& extra,
             std::span<void* const> params_out)
      : opt_(opt), size_(params), extra_(extra), params_out_(params_out) {
    if (extra.param_out != nullptr) {
      detail::bad_buffer(opt, "StepOptions::param_out was given to a step on a list of tensors",
                         "pass each tensor's low-precision copy in params_out (null for a tensor "
                         "without one) and leave StepOptions::param_out null");
    }
    check_length("grads", grads, false);
    check_length("params_out", params_out.size(), true);
  }

  std::size_t size() const { return size_; }

  // A list needs one entry per tensor; one `may_be_empty` may also be empty.
  void check_length(const char* what, std::size_t got, bool may_be_empty) const {
    if (got == size_ || (may_be_empty && got == 0)) return;
    detail::bad_buffer(opt_,
                       std::string(what) + " has " + std::to_string(got) +
                           " entries but params has " + std::to_string(size_) + " tensors",
                       may_be_empty ? "pass one entry per tensor, or an empty list for what the "
                                      "options do not use"
                                    : "pass one entry per tensor in every list");
  }

  // "Adam: tensor 3", the prefix of tensor i's messages.
  std::string name(std::size_t i) const {
    return std::string(opt_) + ": tensor " + std::to_string(i);
  }

  // The StepOptions of a single step on tensor i: the list's, with its copy.
  StepOptions options(std::size_t i) const {
    StepOptions e = extra_;
    e.param_out = params_out_.empty() ? nullptr : params_out_[i];
    return e;
  }

 private:
  const char* opt_;
  std::size_t size_;
  StepOptions extra_;
  std::span<void* const> params_out_;
};

// Entry i of a state list that may be empty (a state the options do not use).
std::span<float> entry(StateList list, std::size_t i) {
  return list.empty() ? std::span<float>{} : list[i];
}

// Where a list's tensors live: each tensor's buffers in one memory (checked as
// a single step checks them), and every tensor with a buffer in the same one.
class ListLocation {
 public:
  explicit ListLocation(const char* opt) : opt_(opt) {}

  void add(std::size_t i, const std::string& name,
           std::initializer_list<std::pair<const char*, const void*>> buffers) {
    const detail::MemoryLocation here = detail::common_location(name.c_str(), buffers);
    bool any = false;
    for (const auto& buffer : buffers) any = any || buffer.second != nullptr;
    if (!any) return;
    if (!first_) {
      first_ = i;
      where_ = here;
      return;
    }
    const bool same = here.kind == detail::MemoryKind::host
                          ? where_.kind == detail::MemoryKind::host
                          : where_.kind != detail::MemoryKind::host && here.device == where_.device;
    if (!same) {
      detail::throw_error(ErrorCode::wrong_device,
                          std::string(opt_) + ": tensor " + std::to_string(i) + " is in " +
                              detail::location_name(here) + " but tensor " +
                              std::to_string(*first_) + " is in " + detail::location_name(where_),
                          "keep every tensor of a list in the same memory (all host, or all on one "
                          "GPU), or call the step once per memory",
                          __FILE__, __LINE__);
    }
  }

  const detail::MemoryLocation& where() const { return where_; }

 private:
  const char* opt_;
  std::optional<std::size_t> first_;
  detail::MemoryLocation where_{};
};

// Runs a kernel on every tensor's buffers in turn; true if all were finite.
template <class Buffers, class Kernel>
bool each_tensor(const std::vector<Buffers>& buffers, Kernel&& kernel) {
  bool finite = true;
  for (const Buffers& b : buffers) finite = kernel(b) && finite;
  return finite;
}

template <class Options>
StepResult adam_list(const char* opt, bool decoupled, std::span<const ParamView> params,
                     std::span<const GradView> grads, StateList exp_avgs, StateList exp_avg_sqs,
                     StateList max_exp_avg_sqs, std::int64_t step, const Options& o,
                     const StepOptions& extra, std::span<void* const> params_out) {
  check_like_single(extra, [&](const StepOptions& e) {
    if constexpr (std::is_same_v<Options, Adam>)
      functional::adam(ParamView{}, GradView{}, {}, {}, {}, step, o, e);
    else
      functional::adamw(ParamView{}, GradView{}, {}, {}, {}, step, o, e);
  });
  const TensorList list(opt, params.size(), grads.size(), extra, params_out);
  list.check_length("exp_avgs", exp_avgs.size(), false);
  list.check_length("exp_avg_sqs", exp_avg_sqs.size(), false);
  list.check_length("max_exp_avg_sqs", max_exp_avg_sqs.size(), !o.amsgrad);
  std::vector<kernels::AdamBuffers> buffers(list.size());
  ListLocation location(opt);
  for (std::size_t i = 0; i < list.size(); ++i) {
    const std::string name = list.name(i);
    const StepOptions e = list.options(i);
    detail::check_step_buffers(name.c_str(), params[i], grads[i], e);
    const std::size_t n = params[i].size;
    detail::check_size(name.c_str(), "exp_avg", exp_avgs[i].size(), n, exp_avgs[i].data());
    detail::check_size(name.c_str(), "exp_avg_sq", exp_avg_sqs[i].size(), n, exp_avg_sqs[i].data());
    const std::span<float> vmax = entry(max_exp_avg_sqs, i);
    if (o.amsgrad) {
      detail::check_size(name.c_str(), "max_exp_avg_sq (amsgrad)", vmax.size(), n, vmax.data());
    } else if (!vmax.empty()) {
      detail::bad_buffer(name.c_str(), "max_exp_avg_sq was given but amsgrad is off",
                         "pass an empty span without amsgrad, or turn amsgrad on");
    }
    kernels::AdamBuffers& b = buffers[i];
    b.grad = grads[i].data;
    b.grad_type = grads[i].dtype;
    b.exp_avg = exp_avgs[i].data();
    b.exp_avg_sq = exp_avg_sqs[i].data();
    b.max_exp_avg_sq = o.amsgrad ? vmax.data() : nullptr;
    detail::set_params(b, params[i], e);
    b.n = n;
    location.add(i, name,
                 {{"params", params[i].data},
                  {"grads", b.grad},
                  {"exp_avg", b.exp_avg},
                  {"exp_avg_sq", b.exp_avg_sq},
                  {"max_exp_avg_sq", b.max_exp_avg_sq},
                  {"remainders", params[i].remainders},
                  {"param_out", e.param_out}});
  }
  const kernels::AdamScalars s =
      kernels::make_adam_scalars(o.lr, o.betas.first, o.betas.second, o.eps, o.weight_decay,
                                 decoupled, o.amsgrad, o.maximize, step, extra.grad_mul);
  return run_list(
      opt, location.where(), grads, extra,
      [&] { return each_tensor(buffers, [&](const auto& b) { return kernels::cpu::adam(b, s); }); },
      [&] {
        return kernels::cuda::adam(std::span<const kernels::AdamBuffers>(buffers), s, extra.stream);
      });
}

}  // namespace

StepResult adam(std::span<const ParamView> params, std::span<const GradView> grads,
                StateList exp_avgs, StateList exp_avg_sqs, StateList max_exp_avg_sqs,
                std::int64_t step, const Adam& options, const StepOptions& extra,
                std::span<void* const> params_out) {
  return adam_list("Adam", false, params, grads, exp_avgs, exp_avg_sqs, max_exp_avg_sqs, step,
                   options, extra, params_out);
}

StepResult adamw(std::span<const ParamView> params, std::span<const GradView> grads,
                 StateList exp_avgs, StateList exp_avg_sqs, StateList max_exp_avg_sqs,
                 std::int64_t step, const AdamW& options, const StepOptions& extra,
                 std::span<void* const> params_out) {
  return adam_list("AdamW", true, params, grads, exp_avgs, exp_avg_sqs, max_exp_avg_sqs, step,
                   options, extra, params_out);
}

StepResult sgd(std::span<const ParamView> params, std::span<const GradView> grads,
               StateList momentum_buffers, std::int64_t step, const SGD& o,
               const StepOptions& extra, std::span<void* const> params_out) {
  const char* opt = "SGD";
  check_like_single(extra, [&](const StepOptions& e) {
    functional::sgd(ParamView{}, GradView{}, {}, step, o, e);
  });
  const bool with_momentum = o.momentum != 0.0;
  const TensorList list(opt, params.size(), grads.size(), extra, params_out);
  list.check_length("momentum_buffers", momentum_buffers.size(), !with_momentum);
  std::vector<kernels::SgdBuffers> buffers(list.size());
  ListLocation location(opt);
  for (std::size_t i = 0; i < list.size(); ++i) {
    const std::string name = list.name(i);
    const StepOptions e = list.options(i);
    detail::check_step_buffers(name.c_str(), params[i], grads[i], e);
    const std::size_t n = params[i].size;
    const std::span<float> buf = entry(momentum_buffers, i);
    detail::check_optional(name.c_str(), "momentum_buffer", buf, n, with_momentum, "momentum is 0");
    kernels::SgdBuffers& b = buffers[i];
    b.grad = grads[i].data;
    b.grad_type = grads[i].dtype;
    b.momentum_buffer = with_momentum ? buf.data() : nullptr;
    detail::set_params(b, params[i], e);
    b.n = n;
    location.add(i, name,
                 {{"params", params[i].data},
                  {"grads", b.grad},
                  {"momentum_buffer", b.momentum_buffer},
                  {"remainders", params[i].remainders},
                  {"param_out", e.param_out}});
  }
  const kernels::SgdScalars s = kernels::make_sgd_scalars(
      o.lr, o.momentum, o.dampening, o.weight_decay, o.nesterov, o.maximize, step, extra.grad_mul);
  return run_list(
      opt, location.where(), grads, extra,
      [&] { return each_tensor(buffers, [&](const auto& b) { return kernels::cpu::sgd(b, s); }); },
      [&] {
        return kernels::cuda::sgd(std::span<const kernels::SgdBuffers>(buffers), s, extra.stream);
      });
}

StepResult adagrad(std::span<const ParamView> params, std::span<const GradView> grads,
                   StateList state_sums, std::int64_t step, const Adagrad& o,
                   const StepOptions& extra, std::span<void* const> params_out) {
  const char* opt = "Adagrad";
  check_like_single(extra, [&](const StepOptions& e) {
    functional::adagrad(ParamView{}, GradView{}, {}, step, o, e);
  });
  const TensorList list(opt, params.size(), grads.size(), extra, params_out);
  list.check_length("state_sums", state_sums.size(), false);
  std::vector<kernels::AdagradBuffers> buffers(list.size());
  ListLocation location(opt);
  for (std::size_t i = 0; i < list.size(); ++i) {
    const std::string name = list.name(i);
    const StepOptions e = list.options(i);
    detail::check_step_buffers(name.c_str(), params[i], grads[i], e);
    const std::size_t n = params[i].size;
    detail::check_size(name.c_str(), "state_sum", state_sums[i].size(), n, state_sums[i].data());
    kernels::AdagradBuffers& b = buffers[i];
    b.grad = grads[i].data;
    b.grad_type = grads[i].dtype;
    b.sum = state_sums[i].data();
    detail::set_params(b, params[i], e);
    b.n = n;
    location.add(i, name,
                 {{"params", params[i].data},
                  {"grads", b.grad},
                  {"state_sum", b.sum},
                  {"remainders", params[i].remainders},
                  {"param_out", e.param_out}});
  }
  const kernels::AdagradScalars s = kernels::make_adagrad_scalars(
      o.lr, o.lr_decay, o.weight_decay, o.eps, o.maximize, step, extra.grad_mul);
  return run_list(
      opt, location.where(), grads, extra,
      [&] {
        return each_tensor(buffers, [&](const auto& b) { return kernels::cpu::adagrad(b, s); });
      },
      [&] {
        return kernels::cuda::adagrad(std::span<const kernels::AdagradBuffers>(buffers), s,
                                      extra.stream);
      });
}

StepResult rmsprop(std::span<const ParamView> params, std::span<const GradView> grads,
                   StateList square_avgs, StateList grad_avgs, StateList momentum_buffers,
                   const RMSprop& o, const StepOptions& extra, std::span<void* const> params_out) {
  const char* opt = "RMSprop";
  check_like_single(extra, [&](const StepOptions& e) {
    functional::rmsprop(ParamView{}, GradView{}, {}, {}, {}, o, e);
  });
  const bool with_momentum = o.momentum != 0.0;
  const TensorList list(opt, params.size(), grads.size(), extra, params_out);
  list.check_length("square_avgs", square_avgs.size(), false);
  list.check_length("grad_avgs", grad_avgs.size(), !o.centered);
  list.check_length("momentum_buffers", momentum_buffers.size(), !with_momentum);
  std::vector<kernels::RmspropBuffers> buffers(list.size());
  ListLocation location(opt);
  for (std::size_t i = 0; i < list.size(); ++i) {
    const std::string name = list.name(i);
    const StepOptions e = list.options(i);
    detail::check_step_buffers(name.c_str(), params[i], grads[i], e);
    const std::size_t n = params[i].size;
    const std::span<float> ga = entry(grad_avgs, i), buf = entry(momentum_buffers, i);
    detail::check_size(name.c_str(), "square_avg", square_avgs[i].size(), n, square_avgs[i].data());
    detail::check_optional(name.c_str(), "grad_avg (centered)", ga, n, o.centered,
                           "centered is off");
    detail::check_optional(name.c_str(), "momentum_buffer", buf, n, with_momentum, "momentum is 0");
    kernels::RmspropBuffers& b = buffers[i];
    b.grad = grads[i].data;
    b.grad_type = grads[i].dtype;
    b.square_avg = square_avgs[i].data();
    b.grad_avg = o.centered ? ga.data() : nullptr;
    b.momentum_buffer = with_momentum ? buf.data() : nullptr;
    detail::set_params(b, params[i], e);
    b.n = n;
    location.add(i, name,
                 {{"params", params[i].data},
                  {"grads", b.grad},
                  {"square_avg", b.square_avg},
                  {"grad_avg", b.grad_avg},
                  {"momentum_buffer", b.momentum_buffer},
                  {"remainders", params[i].remainders},
                  {"param_out", e.param_out}});
  }
  const kernels::RmspropScalars s = kernels::make_rmsprop_scalars(
      o.lr, o.alpha, o.eps, o.weight_decay, o.momentum, o.centered, o.maximize, extra.grad_mul);
  return run_list(
      opt, location.where(), grads, extra,
      [&] {
        return each_tensor(buffers, [&](const auto& b) { return kernels::cpu::rmsprop(b, s); });
      },
      [&] {
        return kernels::cuda::rmsprop(std::span<const kernels::RmspropBuffers>(buffers), s,
                                      extra.stream);
      });
}

StepResult lion(std::span<const ParamView> params, std::span<const GradView> grads,
                StateList exp_avgs, const Lion& o, const StepOptions& extra,
                std::span<void* const> params_out) {
  const char* opt = "Lion";
  check_like_single(
      extra, [&](const StepOptions& e) { functional::lion(ParamView{}, GradView{}, {}, o, e); });
  const TensorList list(opt, params.size(), grads.size(), extra, params_out);
  list.check_length("exp_avgs", exp_avgs.size(), false);
  std::vector<kernels::LionBuffers> buffers(list.size());
  ListLocation location(opt);
  for (std::size_t i = 0; i < list.size(); ++i) {
    const std::string name = list.name(i);
    const StepOptions e = list.options(i);
    detail::check_step_buffers(name.c_str(), params[i], grads[i], e);
    const std::size_t n = params[i].size;
    detail::check_size(name.c_str(), "exp_avg", exp_avgs[i].size(), n, exp_avgs[i].data());
    kernels::LionBuffers& b = buffers[i];
    b.grad = grads[i].data;
    b.grad_type = grads[i].dtype;
    b.exp_avg = exp_avgs[i].data();
    detail::set_params(b, params[i], e);
    b.n = n;
    location.add(i, name,
                 {{"params", params[i].data},
                  {"grads", b.grad},
                  {"exp_avg", b.exp_avg},
                  {"remainders", params[i].remainders},
                  {"param_out", e.param_out}});
  }
  const kernels::LionScalars s = kernels::make_lion_scalars(
      o.lr, o.betas.first, o.betas.second, o.weight_decay, o.maximize, extra.grad_mul);
  return run_list(
      opt, location.where(), grads, extra,
      [&] { return each_tensor(buffers, [&](const auto& b) { return kernels::cpu::lion(b, s); }); },
      [&] {
        return kernels::cuda::lion(std::span<const kernels::LionBuffers>(buffers), s, extra.stream);
      });
}

StepResult lamb(std::span<const ParamView> params, std::span<const GradView> grads,
                StateList exp_avgs, StateList exp_avg_sqs, StateList updates, std::int64_t step,
                const Lamb& o, const StepOptions& extra, std::span<void* const> params_out) {
  const char* opt = "Lamb";
  check_like_single(extra, [&](const StepOptions& e) {
    functional::lamb(ParamView{}, GradView{}, {}, {}, {}, step, o, e);
  });
  const TensorList list(opt, params.size(), grads.size(), extra, params_out);
  list.check_length("exp_avgs", exp_avgs.size(), false);
  list.check_length("exp_avg_sqs", exp_avg_sqs.size(), false);
  list.check_length("updates", updates.size(), false);
  std::vector<kernels::LambBuffers> directions(list.size());
  std::vector<kernels::LambApplyBuffers> applies(list.size());
  ListLocation location(opt);
  for (std::size_t i = 0; i < list.size(); ++i) {
    const std::string name = list.name(i);
    const StepOptions e = list.options(i);
    detail::check_step_buffers(name.c_str(), params[i], grads[i], e);
    const std::size_t n = params[i].size;
    detail::check_size(name.c_str(), "exp_avg", exp_avgs[i].size(), n, exp_avgs[i].data());
    detail::check_size(name.c_str(), "exp_avg_sq", exp_avg_sqs[i].size(), n, exp_avg_sqs[i].data());
    detail::check_size(name.c_str(), "update", updates[i].size(), n, updates[i].data());
    kernels::LambBuffers& b = directions[i];
    const bool with_remainders = params[i].remainders != nullptr;
    b.param = with_remainders ? nullptr : static_cast<const float*>(params[i].data);
    b.param_bf16 = with_remainders ? static_cast<const bfloat16*>(params[i].data) : nullptr;
    b.remainder = params[i].remainders;
    b.grad = grads[i].data;
    b.grad_type = grads[i].dtype;
    b.exp_avg = exp_avgs[i].data();
    b.exp_avg_sq = exp_avg_sqs[i].data();
    b.update = updates[i].data();
    b.n = n;
    kernels::LambApplyBuffers& a = applies[i];
    detail::set_params(a, params[i], e);
    a.update = updates[i].data();
    a.n = n;
    location.add(i, name,
                 {{"params", params[i].data},
                  {"grads", b.grad},
                  {"exp_avg", b.exp_avg},
                  {"exp_avg_sq", b.exp_avg_sq},
                  {"update", b.update},
                  {"remainders", params[i].remainders},
                  {"param_out", e.param_out}});
  }
  const kernels::LambScalars s = kernels::make_lamb_scalars(
      o.betas.first, o.betas.second, o.eps, o.weight_decay, o.maximize, step, extra.grad_mul);
  return run_list(
      opt, location.where(), grads, extra,
      [&] {
        bool finite = true;
        for (std::size_t i = 0; i < list.size(); ++i) {
          const kernels::LambNorms norms = kernels::cpu::lamb_direction(directions[i], s);
          kernels::cpu::lamb_apply(applies[i], kernels::lamb_neg_step(norms, o.lr));
          finite = norms.grads_finite && finite;
        }
        return finite;
      },
      [&] {
        std::vector<kernels::LambNorms> norms(list.size());
        const bool finite = kernels::cuda::lamb_direction(
            std::span<const kernels::LambBuffers>(directions), s, norms, extra.stream);
        std::vector<float> neg_steps(list.size());
        for (std::size_t i = 0; i < list.size(); ++i)
          neg_steps[i] = kernels::lamb_neg_step(norms[i], o.lr);
        kernels::cuda::lamb_apply(std::span<const kernels::LambApplyBuffers>(applies), neg_steps,
                                  extra.stream);
        return finite;
      });
}

}  // namespace shardopt::functional
