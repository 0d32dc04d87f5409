// The functional Lion and LAMB: Adam-style checks, then the kernels where
// the buffers live. LAMB runs its two passes with the trust ratio in between.
#include <cmath>
#include <string>

#include "kernels/lamb.hpp"
#include "kernels/lion.hpp"
#include "shardopt/optim.hpp"
#include "step_checks.hpp"

namespace shardopt::functional {

namespace {

void check_betas(const char* opt, const std::pair<double, double>& betas) {
  if (!(betas.first >= 0.0 && betas.first < 1.0))
    detail::bad_hyper(opt, "beta parameter at index 0 (betas.first)", betas.first,
                      "betas must be in [0, 1)");
  if (!(betas.second >= 0.0 && betas.second < 1.0))
    detail::bad_hyper(opt, "beta parameter at index 1 (betas.second)", betas.second,
                      "betas must be in [0, 1)");
}

}  // namespace

StepResult lion(ParamView params, GradView grads, std::span<float> exp_avg, const Lion& o,
                const StepOptions& extra) {
  const char* opt = "Lion";
  if (!(o.lr >= 0.0)) detail::bad_hyper(opt, "learning rate (lr)", o.lr, "lr must be >= 0");
  check_betas(opt, o.betas);
  if (!(o.weight_decay >= 0.0))
    detail::bad_hyper(opt, "weight_decay value", o.weight_decay, "weight_decay must be >= 0");
  detail::check_step_buffers(opt, params, grads, extra);
  const std::size_t n = params.size;
  detail::check_size(opt, "exp_avg", exp_avg.size(), n, exp_avg.data());

  kernels::LionBuffers b;
  b.grad = grads.data;
  b.grad_type = grads.dtype;
  b.exp_avg = exp_avg.data();
  detail::set_params(b, params, extra);
  b.n = n;
  const kernels::LionScalars s = kernels::make_lion_scalars(
      o.lr, o.betas.first, o.betas.second, o.weight_decay, o.maximize, extra.grad_mul);
  const detail::MemoryLocation where =
      detail::common_location(opt, {{"params", params.data},
                                    {"grads", b.grad},
                                    {"exp_avg", b.exp_avg},
                                    {"remainders", params.remainders},
                                    {"param_out", extra.param_out}});
  return detail::run_step(
      opt, where, grads, extra, [&] { return kernels::cpu::lion(b, s); },
      [&] { return kernels::cuda::lion(b, s, extra.stream); });
}

StepResult lamb(ParamView params, GradView grads, std::span<float> exp_avg,
                std::span<float> exp_avg_sq, std::span<float> update, std::int64_t step,
                const Lamb& o, const StepOptions& extra) {
  const char* opt = "Lamb";
  if (!(o.lr >= 0.0)) detail::bad_hyper(opt, "learning rate (lr)", o.lr, "lr must be >= 0");
  if (!(o.eps >= 0.0)) detail::bad_hyper(opt, "epsilon value (eps)", o.eps, "eps must be >= 0");
  check_betas(opt, o.betas);
  if (!(o.weight_decay >= 0.0))
    detail::bad_hyper(opt, "weight_decay value", o.weight_decay, "weight_decay must be >= 0");
  detail::check_step(opt, step);
  detail::check_step_buffers(opt, params, grads, extra);
  const std::size_t n = params.size;
  detail::check_size(opt, "exp_avg", exp_avg.size(), n, exp_avg.data());
  detail::check_size(opt, "exp_avg_sq", exp_avg_sq.size(), n, exp_avg_sq.data());
  detail::check_size(opt, "update", update.size(), n, update.data());

  kernels::LambBuffers b;
  const bool with_remainders = params.remainders != nullptr;
  b.param = with_remainders ? nullptr : static_cast<const float*>(params.data);
  b.param_bf16 = with_remainders ? static_cast<const bfloat16*>(params.data) : nullptr;
  b.remainder = params.remainders;
  b.grad = grads.data;
  b.grad_type = grads.dtype;
  b.exp_avg = exp_avg.data();
  b.exp_avg_sq = exp_avg_sq.data();
  b.update = update.data();
  b.n = n;
  kernels::LambApplyBuffers a;
  detail::set_params(a, params, extra);
  a.update = update.data();
  a.n = n;
  const kernels::LambScalars s = kernels::make_lamb_scalars(
      o.betas.first, o.betas.second, o.eps, o.weight_decay, o.maximize, step, extra.grad_mul);
  // trust = ||p|| / ||r||, 1 when either is 0; the step -lr * trust rounded to float.
  const auto neg_step = [&](const kernels::LambNorms& norms) {
    const double trust = norms.param_sq > 0.0 && norms.update_sq > 0.0
                             ? std::sqrt(norms.param_sq) / std::sqrt(norms.update_sq)
                             : 1.0;
    return static_cast<float>(-(o.lr * trust));
  };
  const detail::MemoryLocation where =
      detail::common_location(opt, {{"params", params.data},
                                    {"grads", b.grad},
                                    {"exp_avg", b.exp_avg},
                                    {"exp_avg_sq", b.exp_avg_sq},
                                    {"update", b.update},
                                    {"remainders", params.remainders},
                                    {"param_out", extra.param_out}});
  return detail::run_step(
      opt, where, grads, extra,
      [&] {
        const kernels::LambNorms norms = kernels::cpu::lamb_direction(b, s);
        kernels::cpu::lamb_apply(a, neg_step(norms));
        return norms.grads_finite;
      },
      [&] {
        const kernels::LambNorms norms = kernels::cuda::lamb_direction(b, s, extra.stream);
        kernels::cuda::lamb_apply(a, neg_step(norms), extra.stream);
        return norms.grads_finite;
      });
}

}  // namespace shardopt::functional
