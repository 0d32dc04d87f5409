// The functional LAMB, on one tensor or a list: torch-style checks, then
// its two kernels (kernels/lamb.hpp) where the buffers live, with the trust
// ratio of each tensor in between. Not element-wise, so not
// functional::step: the ratio needs the whole tensor's norms.
#include <string>
#include <vector>

#include "kernels/lamb.hpp"
#include "shardopt/optim.hpp"
#include "step_checks.hpp"

namespace shardopt::functional {

using StateList = std::span<const std::span<float>>;

StepResult lamb(ParamView params, GradView grads, std::span<float> exp_avg,
                std::span<float> exp_avg_sq, std::span<float> update, std::int64_t step,
                const Lamb& o, const StepOptions& extra) {
  const char* opt = Lamb::name;
  detail::check_fields(o);
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
        kernels::cpu::lamb_apply(a, kernels::lamb_neg_step(norms, o.lr));
        return norms.grads_finite;
      },
      [&] {
        return detail::device_kernel(
            opt, extra.stream,
            [&] {
              const kernels::LambNorms norms = kernels::cuda::lamb_direction(b, s, extra.stream);
              kernels::cuda::lamb_apply(a, kernels::lamb_neg_step(norms, o.lr), extra.stream);
              return norms.grads_finite;
            },
            [&](const detail::Translate& tr) {
              const kernels::LambNorms norms =
                  kernels::cpu::lamb_direction(detail::translated_buffers(b, tr), s);
              kernels::cpu::lamb_apply(detail::translated_buffers(a, tr),
                                       kernels::lamb_neg_step(norms, o.lr));
              return norms.grads_finite;
            });
      });
}

StepResult lamb(std::span<const ParamView> params, std::span<const GradView> grads,
                StateList exp_avgs, StateList exp_avg_sqs, StateList updates, std::int64_t step,
                const Lamb& o, const StepOptions& extra, std::span<void* const> params_out) {
  const char* opt = Lamb::name;
  // Checked as a single step checks them, on no elements.
  {
    StepOptions none = extra;
    none.param_out = nullptr;
    functional::lamb(ParamView{}, GradView{}, {}, {}, {}, step, o, none);
  }
  const detail::TensorList list(opt, params.size(), grads.size(), extra, params_out);
  list.check_length("exp_avgs", exp_avgs.size(), false);
  list.check_length("exp_avg_sqs", exp_avg_sqs.size(), false);
  list.check_length("updates", updates.size(), false);
  std::vector<kernels::LambBuffers> directions(list.size());
  std::vector<kernels::LambApplyBuffers> applies(list.size());
  detail::ListLocation location(opt);
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
    const detail::NamedBuffer named[] = {
        {"params", params[i].data},   {"grads", b.grad},    {"exp_avg", b.exp_avg},
        {"exp_avg_sq", b.exp_avg_sq}, {"update", b.update}, {"remainders", params[i].remainders},
        {"param_out", e.param_out}};
    location.add(i, name, named);
  }
  const kernels::LambScalars s = kernels::make_lamb_scalars(
      o.betas.first, o.betas.second, o.eps, o.weight_decay, o.maximize, step, extra.grad_mul);
  return detail::run_list(
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
        return detail::device_kernel(
            opt, extra.stream,
            [&] {
              std::vector<kernels::LambNorms> norms(list.size());
              const bool finite = kernels::cuda::lamb_direction(
                  std::span<const kernels::LambBuffers>(directions), s, norms, extra.stream);
              std::vector<float> neg_steps(list.size());
              for (std::size_t i = 0; i < list.size(); ++i)
                neg_steps[i] = kernels::lamb_neg_step(norms[i], o.lr);
              kernels::cuda::lamb_apply(std::span<const kernels::LambApplyBuffers>(applies),
                                        neg_steps, extra.stream);
              return finite;
            },
            [&](const detail::Translate& tr) {
              bool finite = true;
              for (std::size_t i = 0; i < list.size(); ++i) {
                const kernels::LambNorms norms =
                    kernels::cpu::lamb_direction(detail::translated_buffers(directions[i], tr), s);
                kernels::cpu::lamb_apply(detail::translated_buffers(applies[i], tr),
                                         kernels::lamb_neg_step(norms, o.lr));
                finite = norms.grads_finite && finite;
              }
              return finite;
            });
      });
}

}  // namespace shardopt::functional
