// The functional optimizers: check the hyper-parameters and buffers the way
// torch.optim does, then run the kernel where the buffers live.
#include "kernels/adam.hpp"
#include "shardopt/optim.hpp"
#include "step_checks.hpp"

namespace shardopt::functional {

namespace {

template <class Options>
void check_adam_options(const char* opt, const Options& o) {
  // The checks and their order are torch.optim.Adam's.
  if (!(o.lr >= 0.0)) detail::bad_hyper(opt, "learning rate (lr)", o.lr, "lr must be >= 0");
  if (!(o.eps >= 0.0)) detail::bad_hyper(opt, "epsilon value (eps)", o.eps, "eps must be >= 0");
  if (!(o.betas.first >= 0.0 && o.betas.first < 1.0))
    detail::bad_hyper(opt, "beta parameter at index 0 (betas.first)", o.betas.first,
                      "betas must be in [0, 1)");
  if (!(o.betas.second >= 0.0 && o.betas.second < 1.0))
    detail::bad_hyper(opt, "beta parameter at index 1 (betas.second)", o.betas.second,
                      "betas must be in [0, 1)");
  if (!(o.weight_decay >= 0.0))
    detail::bad_hyper(opt, "weight_decay value", o.weight_decay, "weight_decay must be >= 0");
}

template <class Options>
StepResult adam_like(const char* opt, bool decoupled, ParamView params, GradView grads,
                     std::span<float> exp_avg, std::span<float> exp_avg_sq,
                     std::span<float> max_exp_avg_sq, std::int64_t step, const Options& o,
                     const StepOptions& extra) {
  check_adam_options(opt, o);
  detail::check_step(opt, step);
  detail::check_step_buffers(opt, params, grads, extra);
  const std::size_t n = params.size;
  detail::check_size(opt, "exp_avg", exp_avg.size(), n, exp_avg.data());
  detail::check_size(opt, "exp_avg_sq", exp_avg_sq.size(), n, exp_avg_sq.data());
  if (o.amsgrad) {
    detail::check_size(opt, "max_exp_avg_sq (amsgrad)", max_exp_avg_sq.size(), n,
                       max_exp_avg_sq.data());
  } else if (!max_exp_avg_sq.empty()) {
    detail::bad_buffer(opt, "max_exp_avg_sq was given but amsgrad is off",
                       "pass an empty span without amsgrad, or turn amsgrad on");
  }

  kernels::AdamBuffers b;
  b.grad = grads.data;
  b.grad_type = grads.dtype;
  b.exp_avg = exp_avg.data();
  b.exp_avg_sq = exp_avg_sq.data();
  b.max_exp_avg_sq = o.amsgrad ? max_exp_avg_sq.data() : nullptr;
  detail::set_params(b, params, extra);
  b.n = n;
  const kernels::AdamScalars s =
      kernels::make_adam_scalars(o.lr, o.betas.first, o.betas.second, o.eps, o.weight_decay,
                                 decoupled, o.amsgrad, o.maximize, step, extra.grad_mul);

  const detail::MemoryLocation where =
      detail::common_location(opt, {{"params", params.data},
                                    {"grads", b.grad},
                                    {"exp_avg", b.exp_avg},
                                    {"exp_avg_sq", b.exp_avg_sq},
                                    {"max_exp_avg_sq", b.max_exp_avg_sq},
                                    {"remainders", params.remainders},
                                    {"param_out", extra.param_out}});
  return detail::run_step(
      opt, where, grads, extra, [&] { return kernels::cpu::adam(b, s); },
      [&] { return kernels::cuda::adam(b, s, extra.stream); });
}

}  // namespace

StepResult adam(ParamView params, GradView grads, std::span<float> exp_avg,
                std::span<float> exp_avg_sq, std::span<float> max_exp_avg_sq, std::int64_t step,
                const Adam& options, const StepOptions& extra) {
  return adam_like("Adam", false, params, grads, exp_avg, exp_avg_sq, max_exp_avg_sq, step, options,
                   extra);
}

StepResult adamw(ParamView params, GradView grads, std::span<float> exp_avg,
                 std::span<float> exp_avg_sq, std::span<float> max_exp_avg_sq, std::int64_t step,
                 const AdamW& options, const StepOptions& extra) {
  return adam_like("AdamW", true, params, grads, exp_avg, exp_avg_sq, max_exp_avg_sq, step, options,
                   extra);
}

}  // namespace shardopt::functional
