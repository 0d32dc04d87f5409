// The named functional steps: each is functional::step (functional_step.cpp)
// with its optimizer's state buffers spelled out, in the order of its slots
// (shardopt/optimizers.hpp).
#include "shardopt/optim.hpp"

namespace shardopt::functional {

using StateList = std::span<const std::span<float>>;

namespace {

// Adam's and AdamW's three states, single tensor or list (T: std::span<float>
// or StateList), in slot order; list steps take params_out.
template <class P, class G, class T, class O, class... Out>
StepResult adam_family(P params, G grads, T exp_avg, T exp_avg_sq, T max_exp_avg_sq,
                       std::int64_t step, const O& options, const StepOptions& extra,
                       Out... params_out) {
  const T states[] = {exp_avg, exp_avg_sq, max_exp_avg_sq};
  return functional::step(params, grads, states, step, options, extra, params_out...);
}

}  // namespace

StepResult adam(ParamView params, GradView grads, std::span<float> exp_avg,
                std::span<float> exp_avg_sq, std::span<float> max_exp_avg_sq, std::int64_t step,
                const Adam& options, const StepOptions& extra) {
  return adam_family(params, grads, exp_avg, exp_avg_sq, max_exp_avg_sq, step, options, extra);
}

StepResult adamw(ParamView params, GradView grads, std::span<float> exp_avg,
                 std::span<float> exp_avg_sq, std::span<float> max_exp_avg_sq, std::int64_t step,
                 const AdamW& options, const StepOptions& extra) {
  return adam_family(params, grads, exp_avg, exp_avg_sq, max_exp_avg_sq, step, options, extra);
}

StepResult nadam(ParamView params, GradView grads, std::span<float> exp_avg,
                 std::span<float> exp_avg_sq, std::int64_t step, const NAdam& options,
                 const StepOptions& extra) {
  const std::span<float> states[] = {exp_avg, exp_avg_sq};
  return functional::step(params, grads, states, step, options, extra);
}

StepResult radam(ParamView params, GradView grads, std::span<float> exp_avg,
                 std::span<float> exp_avg_sq, std::int64_t step, const RAdam& options,
                 const StepOptions& extra) {
  const std::span<float> states[] = {exp_avg, exp_avg_sq};
  return functional::step(params, grads, states, step, options, extra);
}

StepResult sgd(ParamView params, GradView grads, std::span<float> momentum_buffer,
               std::int64_t step, const SGD& options, const StepOptions& extra) {
  const std::span<float> states[] = {momentum_buffer};
  return functional::step(params, grads, states, step, options, extra);
}

StepResult adagrad(ParamView params, GradView grads, std::span<float> state_sum, std::int64_t step,
                   const Adagrad& options, const StepOptions& extra) {
  const std::span<float> states[] = {state_sum};
  return functional::step(params, grads, states, step, options, extra);
}

StepResult rmsprop(ParamView params, GradView grads, std::span<float> square_avg,
                   std::span<float> grad_avg, std::span<float> momentum_buffer,
                   const RMSprop& options, const StepOptions& extra) {
  const std::span<float> states[] = {square_avg, grad_avg, momentum_buffer};
  return functional::step(params, grads, states, 0, options, extra);
}

StepResult lion(ParamView params, GradView grads, std::span<float> exp_avg, const Lion& options,
                const StepOptions& extra) {
  const std::span<float> states[] = {exp_avg};
  return functional::step(params, grads, states, 0, options, extra);
}

StepResult adam(std::span<const ParamView> params, std::span<const GradView> grads,
                StateList exp_avgs, StateList exp_avg_sqs, StateList max_exp_avg_sqs,
                std::int64_t step, const Adam& options, const StepOptions& extra,
                std::span<void* const> params_out) {
  return adam_family(params, grads, exp_avgs, exp_avg_sqs, max_exp_avg_sqs, step, options, extra,
                     params_out);
}

StepResult adamw(std::span<const ParamView> params, std::span<const GradView> grads,
                 StateList exp_avgs, StateList exp_avg_sqs, StateList max_exp_avg_sqs,
                 std::int64_t step, const AdamW& options, const StepOptions& extra,
                 std::span<void* const> params_out) {
  return adam_family(params, grads, exp_avgs, exp_avg_sqs, max_exp_avg_sqs, step, options, extra,
                     params_out);
}

StepResult sgd(std::span<const ParamView> params, std::span<const GradView> grads,
               StateList momentum_buffers, std::int64_t step, const SGD& options,
               const StepOptions& extra, std::span<void* const> params_out) {
  const StateList states[] = {momentum_buffers};
  return functional::step(params, grads, states, step, options, extra, params_out);
}

StepResult adagrad(std::span<const ParamView> params, std::span<const GradView> grads,
                   StateList state_sums, std::int64_t step, const Adagrad& options,
                   const StepOptions& extra, std::span<void* const> params_out) {
  const StateList states[] = {state_sums};
  return functional::step(params, grads, states, step, options, extra, params_out);
}

StepResult rmsprop(std::span<const ParamView> params, std::span<const GradView> grads,
                   StateList square_avgs, StateList grad_avgs, StateList momentum_buffers,
                   const RMSprop& options, const StepOptions& extra,
                   std::span<void* const> params_out) {
  const StateList states[] = {square_avgs, grad_avgs, momentum_buffers};
  return functional::step(params, grads, states, 0, options, extra, params_out);
}

StepResult lion(std::span<const ParamView> params, std::span<const GradView> grads,
                StateList exp_avgs, const Lion& options, const StepOptions& extra,
                std::span<void* const> params_out) {
  const StateList states[] = {exp_avgs};
  return functional::step(params, grads, states, 0, options, extra, params_out);
}

StepResult nadam(std::span<const ParamView> params, std::span<const GradView> grads,
                 StateList exp_avgs, StateList exp_avg_sqs, std::int64_t step, const NAdam& options,
                 const StepOptions& extra, std::span<void* const> params_out) {
  const StateList states[] = {exp_avgs, exp_avg_sqs};
  return functional::step(params, grads, states, step, options, extra, params_out);
}

StepResult radam(std::span<const ParamView> params, std::span<const GradView> grads,
                 StateList exp_avgs, StateList exp_avg_sqs, std::int64_t step, const RAdam& options,
                 const StepOptions& extra, std::span<void* const> params_out) {
  const StateList states[] = {exp_avgs, exp_avg_sqs};
  return functional::step(params, grads, states, step, options, extra, params_out);
}

}  // namespace shardopt::functional
