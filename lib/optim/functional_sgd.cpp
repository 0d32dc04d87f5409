// The functional SGD, Adagrad and RMSprop: torch.optim's checks, then the
// kernel where the buffers live.
#include <cmath>
#include <string>

#include "kernels/adagrad.hpp"
#include "kernels/rmsprop.hpp"
#include "kernels/sgd.hpp"
#include "shardopt/optim.hpp"
#include "step_checks.hpp"

namespace shardopt::functional {

StepResult sgd(ParamView params, GradView grads, std::span<float> momentum_buffer,
               std::int64_t step, const SGD& o, const StepOptions& extra) {
  const char* opt = "SGD";
  // The checks and their order are torch.optim.SGD's.
  if (!(o.lr >= 0.0)) detail::bad_hyper(opt, "learning rate (lr)", o.lr, "lr must be >= 0");
  if (!(o.momentum >= 0.0))
    detail::bad_hyper(opt, "momentum value", o.momentum, "momentum must be >= 0");
  if (!(o.weight_decay >= 0.0))
    detail::bad_hyper(opt, "weight_decay value", o.weight_decay, "weight_decay must be >= 0");
  if (o.nesterov && (o.momentum <= 0.0 || o.dampening != 0.0)) {
    detail::bad_buffer(opt,
                       "Nesterov momentum requires a momentum and zero dampening (momentum " +
                           std::to_string(o.momentum) + ", dampening " +
                           std::to_string(o.dampening) + ")",
                       "set momentum > 0 and dampening = 0 with nesterov, or turn nesterov off");
  }
  if (!std::isfinite(o.dampening))
    detail::bad_hyper(opt, "dampening value", o.dampening, "dampening must be finite");
  detail::check_step(opt, step);
  detail::check_step_buffers(opt, params, grads, extra);
  const std::size_t n = params.size;
  const bool with_momentum = o.momentum != 0.0;
  detail::check_optional(opt, "momentum_buffer", momentum_buffer, n, with_momentum,
                         "momentum is 0");

  kernels::SgdBuffers b;
  b.grad = grads.data;
  b.grad_type = grads.dtype;
  b.momentum_buffer = with_momentum ? momentum_buffer.data() : nullptr;
  detail::set_params(b, params, extra);
  b.n = n;
  const kernels::SgdScalars s = kernels::make_sgd_scalars(
      o.lr, o.momentum, o.dampening, o.weight_decay, o.nesterov, o.maximize, step, extra.grad_mul);
  const detail::MemoryLocation where =
      detail::common_location(opt, {{"params", params.data},
                                    {"grads", b.grad},
                                    {"momentum_buffer", b.momentum_buffer},
                                    {"remainders", params.remainders},
                                    {"param_out", extra.param_out}});
  return detail::run_step(
      opt, where, grads, extra, [&] { return kernels::cpu::sgd(b, s); },
      [&] { return kernels::cuda::sgd(b, s, extra.stream); });
}

StepResult adagrad(ParamView params, GradView grads, std::span<float> state_sum, std::int64_t step,
                   const Adagrad& o, const StepOptions& extra) {
  const char* opt = "Adagrad";
  // The checks and their order are torch.optim.Adagrad's.
  if (!(o.lr >= 0.0)) detail::bad_hyper(opt, "learning rate (lr)", o.lr, "lr must be >= 0");
  if (!(o.lr_decay >= 0.0))
    detail::bad_hyper(opt, "lr_decay value", o.lr_decay, "lr_decay must be >= 0");
  if (!(o.weight_decay >= 0.0))
    detail::bad_hyper(opt, "weight_decay value", o.weight_decay, "weight_decay must be >= 0");
  if (!(o.initial_accumulator_value >= 0.0))
    detail::bad_hyper(opt, "initial_accumulator_value value", o.initial_accumulator_value,
                      "initial_accumulator_value must be >= 0");
  if (!(o.eps >= 0.0)) detail::bad_hyper(opt, "epsilon value (eps)", o.eps, "eps must be >= 0");
  detail::check_step(opt, step);
  detail::check_step_buffers(opt, params, grads, extra);
  const std::size_t n = params.size;
  detail::check_size(opt, "state_sum", state_sum.size(), n, state_sum.data());

  kernels::AdagradBuffers b;
  b.grad = grads.data;
  b.grad_type = grads.dtype;
  b.sum = state_sum.data();
  detail::set_params(b, params, extra);
  b.n = n;
  const kernels::AdagradScalars s = kernels::make_adagrad_scalars(
      o.lr, o.lr_decay, o.weight_decay, o.eps, o.maximize, step, extra.grad_mul);
  const detail::MemoryLocation where =
      detail::common_location(opt, {{"params", params.data},
                                    {"grads", b.grad},
                                    {"state_sum", b.sum},
                                    {"remainders", params.remainders},
                                    {"param_out", extra.param_out}});
  return detail::run_step(
      opt, where, grads, extra, [&] { return kernels::cpu::adagrad(b, s); },
      [&] { return kernels::cuda::adagrad(b, s, extra.stream); });
}

StepResult rmsprop(ParamView params, GradView grads, std::span<float> square_avg,
                   std::span<float> grad_avg, std::span<float> momentum_buffer, const RMSprop& o,
                   const StepOptions& extra) {
  const char* opt = "RMSprop";
  // The checks and their order are torch.optim.RMSprop's.
  if (!(o.lr >= 0.0)) detail::bad_hyper(opt, "learning rate (lr)", o.lr, "lr must be >= 0");
  if (!(o.eps >= 0.0)) detail::bad_hyper(opt, "epsilon value (eps)", o.eps, "eps must be >= 0");
  if (!(o.momentum >= 0.0))
    detail::bad_hyper(opt, "momentum value", o.momentum, "momentum must be >= 0");
  if (!(o.weight_decay >= 0.0))
    detail::bad_hyper(opt, "weight_decay value", o.weight_decay, "weight_decay must be >= 0");
  if (!(o.alpha >= 0.0)) detail::bad_hyper(opt, "alpha value", o.alpha, "alpha must be >= 0");
  detail::check_step_buffers(opt, params, grads, extra);
  const std::size_t n = params.size;
  const bool with_momentum = o.momentum != 0.0;
  detail::check_size(opt, "square_avg", square_avg.size(), n, square_avg.data());
  detail::check_optional(opt, "grad_avg (centered)", grad_avg, n, o.centered, "centered is off");
  detail::check_optional(opt, "momentum_buffer", momentum_buffer, n, with_momentum,
                         "momentum is 0");

  kernels::RmspropBuffers b;
  b.grad = grads.data;
  b.grad_type = grads.dtype;
  b.square_avg = square_avg.data();
  b.grad_avg = o.centered ? grad_avg.data() : nullptr;
  b.momentum_buffer = with_momentum ? momentum_buffer.data() : nullptr;
  detail::set_params(b, params, extra);
  b.n = n;
  const kernels::RmspropScalars s = kernels::make_rmsprop_scalars(
      o.lr, o.alpha, o.eps, o.weight_decay, o.momentum, o.centered, o.maximize, extra.grad_mul);
  const detail::MemoryLocation where =
      detail::common_location(opt, {{"params", params.data},
                                    {"grads", b.grad},
                                    {"square_avg", b.square_avg},
                                    {"grad_avg", b.grad_avg},
                                    {"momentum_buffer", b.momentum_buffer},
                                    {"remainders", params.remainders},
                                    {"param_out", extra.param_out}});
  return detail::run_step(
      opt, where, grads, extra, [&] { return kernels::cpu::rmsprop(b, s); },
      [&] { return kernels::cuda::rmsprop(b, s, extra.stream); });
}

}  // namespace shardopt::functional
