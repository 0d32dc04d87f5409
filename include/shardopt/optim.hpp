// shardopt: the functional optimizers: stateless steps over explicit
// parameter, gradient and state buffers, host or device. Their options (the
// names and defaults of torch.optim) are in shardopt/optimizers.hpp.
//
// A functional step reads and writes only the buffers it is given, so the
// caller owns every byte of state (the ZeRO engine passes its shards). Each
// reproduces one step of the torch.optim class of the same name, operation by
// operation in fp32 (docs/optimizers.md gives the exact formulas). All
// buffers of one call must be in the same kind of memory: host, or the same
// CUDA device (then the step runs on `StepOptions::stream`).
#pragma once

#include <concepts>
#include <cstddef>
#include <cstdint>
#include <iterator>
#include <span>
#include <type_traits>
#include <utility>

#include "shardopt/export.h"
#include "shardopt/half.hpp"
#include "shardopt/optimizers.hpp"
#include "shardopt/types.hpp"

namespace shardopt {

namespace functional {

// Gradients of any supported type: f32, bf16 or f16 (read only).
struct GradView {
  const void* data = nullptr;
  std::size_t size = 0;
  DType dtype = DType::f32;

  GradView() = default;
  GradView(const void* d, std::size_t n, DType t) : data(d), size(n), dtype(t) {}
  // Any contiguous range of float, bfloat16 or float16 (std::vector, std::span, ...).
  template <class R>
  requires requires(const R& r) {
    std::data(r);
    std::size(r);
  }
  GradView(const R& r)
      : data(std::data(r)),
        size(std::size(r)),
        dtype(dtype_of<std::remove_cvref_t<decltype(*std::data(r))>>()) {}
};

// The parameters a step updates, in one of two storages:
//   fp32: the parameters themselves (the master copy in mixed precision,
//         optionally with a bf16 or f16 copy written by StepOptions::param_out);
//   bf16 with remainders ("parameter remainders"): the model's bf16
//         parameters plus one 16-bit remainder each, which together hold the
//         fp32 master exactly, with no fp32 buffer (2 bytes a parameter fewer
//         than an fp32 master beside a bf16 copy). Each step decodes the
//         master, updates it exactly as an fp32 step would, and encodes it
//         back, so the trajectory is the fp32 one bitwise and the bf16
//         parameters are the master rounded to nearest.
// The encoding, per element with u the bits of the fp32 master:
//   param = (u + 0x8000) >> 16,  remainder = u - (param << 16)  (as int16),
//   u = (param << 16) + int16(remainder)  (mod 2^32);
// to start from fp32 values, encode them (encode_param_remainders), or from a
// bf16 model, use zero remainders (the master is then the bf16 value).
// bf16 only: an f16 parameter is not the high half of an fp32 value.
struct ParamView {
  void* data = nullptr;
  std::size_t size = 0;
  DType dtype = DType::f32;
  std::uint16_t* remainders = nullptr;  // null for fp32 parameters
  std::size_t remainders_size = 0;

  ParamView() = default;
  // fp32 parameters: any contiguous range of float (std::vector, std::span, ...).
  template <class R>
  requires requires(R& r) {
    { std::data(r) } -> std::convertible_to<float*>;
    std::size(r);
  }
  ParamView(R&& r) : data(std::data(r)), size(std::size(r)) {}
  ParamView(float* d, std::size_t n) : data(d), size(n) {}
  // bf16 parameters with their remainders, as many as the parameters.
  ParamView(std::span<bfloat16> params, std::span<std::uint16_t> rem)
      : data(params.data()),
        size(params.size()),
        dtype(DType::bf16),
        remainders(rem.data()),
        remainders_size(rem.size()) {}
  // Raw buffers of any type (checked by the step: f32 alone, or bf16 with
  // remainders).
  ParamView(void* d, std::size_t n, DType t, std::span<std::uint16_t> rem)
      : data(d), size(n), dtype(t), remainders(rem.data()), remainders_size(rem.size()) {}
};

// Encodes fp32 values as bf16 parameters with remainders (the sizes must be
// equal); decode_param_remainders is the exact inverse, for every bit
// pattern. Host memory. Local. Errors: InvalidArgument for mismatched sizes.
SHARDOPT_API void encode_param_remainders(std::span<const float> master, std::span<bfloat16> params,
                                          std::span<std::uint16_t> remainders);
SHARDOPT_API void decode_param_remainders(std::span<const bfloat16> params,
                                          std::span<const std::uint16_t> remainders,
                                          std::span<float> master);

struct StepOptions {
  // Multiplies every gradient before anything else: 1 / loss_scale to
  // unscale, times a clip coefficient to clip. 1 leaves them as they are.
  double grad_mul = 1.0;
  // Optional low-precision copy of the new parameters, written in the same
  // pass (mixed precision: the fp32 params are the master copy). Its size
  // must equal the params'. dtype bf16 or f16. Not with parameter
  // remainders: the bf16 parameters are then the model's copy.
  void* param_out = nullptr;
  DType param_out_dtype = DType::bf16;
  // For device buffers: the cudaStream_t to run on (null: the default
  // stream). The call returns when the step is done.
  void* stream = nullptr;
  // Skip the step when a gradient is not finite (a loss scaler's overflow
  // step): the gradients are checked first (each times grad_mul, in float,
  // as the step would use it; grads_finite() below) and, if any is inf or
  // nan, the step returns {grads_finite = false, applied = false} without
  // writing a byte of params, states, param_out or remainders. Costs one
  // extra read of the gradients. Off: the step is always applied.
  bool skip_nonfinite = false;
  // Device buffers: a std::uint32_t in the buffers' device memory that
  // decides on the device whether the step applies (apex's noop flag). The
  // step is enqueued on `stream` and the call returns at once, the host
  // waiting for nothing; when the stream reaches it, a non-zero word makes
  // it write nothing. flag_nonfinite() below raises such a flag. The
  // StepResult is {true, true}: the host has not seen the gradients. Not
  // with skip_nonfinite (a decision on the host), host buffers (test the
  // flag and skip the call) or LAMB (its norms come back to the host).
  const std::uint32_t* noop_flag = nullptr;
};

struct StepResult {
  // False if any gradient (after grad_mul) was inf or nan.
  bool grads_finite = true;
  // Whether the update was applied: false only when the step was skipped
  // (StepOptions::skip_nonfinite with a non-finite gradient). Without
  // skip_nonfinite the update is applied even when grads_finite is false.
  bool applied = true;
};

// True if every gradient times grad_mul (in float, as a step with
// StepOptions::grad_mul computes it) is finite; true for no gradients. For
// a sharded caller, the check of its own shard: run it on each rank's
// gradient shard and agree on the flag across ranks (a logical and), so
// that every rank steps or every rank skips (as the ZeRO engine is to do).
// Host or device memory (then on `stream`, a cudaStream_t; returns when
// done). Reads grads only. Local; not collective.
// Errors: Unsupported for gradients that are not f32, bf16 or f16;
// InvalidArgument for null gradients with a size, or a grad_mul that is not
// finite; NotCompiledError for device gradients in a build without CUDA.
SHARDOPT_API bool grads_finite(GradView grads, double grad_mul = 1.0, void* stream = nullptr);

// The same check leaving its verdict where the gradients are: sets the
// std::uint32_t at `flag` (in the gradients' memory) to 1 if some gradient
// times grad_mul is not finite, and leaves it as it is otherwise, so several
// checks can raise one flag; clear it before the first. On a device it is
// enqueued on `stream` and returns at once (the host waits for nothing), and
// a step given the flag as StepOptions::noop_flag then applies or not on the
// device; on the host it is done on return. Local; not collective.
// Errors as grads_finite(); InvalidArgument for a null flag; DeviceError
// for a flag in another memory than the gradients.
SHARDOPT_API void flag_nonfinite(GradView grads, std::uint32_t* flag, double grad_mul = 1.0,
                                 void* stream = nullptr);

// One step of any element-wise optimizer O of shardopt/optimizers.hpp (every
// one but LAMB, which has lamb() below), with its state buffers in `states`,
// one span per slot of O in the order of O::slots (exp_avg, exp_avg_sq,
// max_exp_avg_sq for Adam), an empty span for a slot the options do not use.
// Reads grads; reads and writes params and the used states. `step` counts
// steps including this one (1 for the first), as torch's state["step"] after
// its increment; optimizers without a step count (O::counts_steps false)
// ignore it. The named steps below (adam(), sgd(), ...) are this step with
// their states spelled out. Local; not collective.
// Errors: InvalidArgument for a bad hyper-parameter (naming it, as torch
// does), a wrong number of state spans, mismatched sizes or null buffers;
// DeviceError for buffers in different memories; NotCompiledError for device
// buffers in a build without CUDA.
template <class O>
requires is_elementwise<O> SHARDOPT_API StepResult step(ParamView params, GradView grads,
                                                        std::span<const std::span<float>> states,
                                                        std::int64_t step, const O& options,
                                                        const StepOptions& extra = {});

// The same step on a list of tensors (see "Lists of tensors" below):
// states[k] is slot k's list, one span per tensor (or empty for a slot the
// options do not use).
template <class O>
requires is_elementwise<O> SHARDOPT_API StepResult
step(std::span<const ParamView> params, std::span<const GradView> grads,
     std::span<const std::span<const std::span<float>>> states, std::int64_t step, const O& options,
     const StepOptions& extra = {}, std::span<void* const> params_out = {});

// Checks O's hyper-parameters as torch.optim.O's constructor does (each
// field's range, then the rules between fields). Local.
// Errors: InvalidArgument naming the first bad value and its range.
template <class O>
requires is_optimizer<O> SHARDOPT_API void check_options(const O& options);

// Every step takes its parameters as a ParamView: fp32, or bf16 with
// remainders (then the remainders are read and written with them). Errors
// of the parameters, for every step: InvalidArgument for remainders of the
// wrong size or null, remainders with fp32 parameters, or
// StepOptions::param_out with remainders; Unsupported for bf16 parameters
// without remainders, remainders with f16 parameters (f16 is not the high
// half of an fp32 value), or any other parameter type.

// One Adam step. Reads grads; reads and writes params, exp_avg, exp_avg_sq
// and, with amsgrad, max_exp_avg_sq (pass an empty span without amsgrad).
// `step` counts steps including this one (1 for the first), as torch's
// state["step"] after its increment. Local; not collective.
// Errors: InvalidArgument for a bad hyper-parameter (naming it, as torch
// does), mismatched sizes or null buffers; DeviceError for buffers in
// different memories; NotCompiledError for device buffers in a build without
// CUDA.
SHARDOPT_API StepResult adam(ParamView params, GradView grads, std::span<float> exp_avg,
                             std::span<float> exp_avg_sq, std::span<float> max_exp_avg_sq,
                             std::int64_t step, const Adam& options, const StepOptions& extra = {});

// One AdamW step; buffers as adam().
SHARDOPT_API StepResult adamw(ParamView params, GradView grads, std::span<float> exp_avg,
                              std::span<float> exp_avg_sq, std::span<float> max_exp_avg_sq,
                              std::int64_t step, const AdamW& options,
                              const StepOptions& extra = {});

// One SGD step (torch.optim.SGD). Reads grads; reads and writes params and,
// with momentum != 0, momentum_buffer (pass an empty span without
// momentum). On step 1 momentum_buffer is only written: it becomes a copy of
// the gradient (after maximize and weight decay), as torch creates it, so its
// initial contents do not matter; later steps read it. `step` counts steps
// including this one (1 for the first). Local; not collective.
// Errors: InvalidArgument for a bad hyper-parameter (naming it, as torch
// does: lr, momentum, weight_decay, nesterov without momentum or with
// dampening), mismatched sizes or null buffers; DeviceError for buffers in
// different memories; NotCompiledError for device buffers in a build without
// CUDA.
SHARDOPT_API StepResult sgd(ParamView params, GradView grads, std::span<float> momentum_buffer,
                            std::int64_t step, const SGD& options, const StepOptions& extra = {});

// One Adagrad step (torch.optim.Adagrad). Reads grads; reads and writes
// params and state_sum, which the caller fills with
// options.initial_accumulator_value before the first step (torch's initial
// state). `step` counts steps including this one (1 for the first): it
// decays the learning rate. Local; not collective. Errors as sgd().
SHARDOPT_API StepResult adagrad(ParamView params, GradView grads, std::span<float> state_sum,
                                std::int64_t step, const Adagrad& options,
                                const StepOptions& extra = {});

// One RMSprop step (torch.optim.RMSprop). Reads grads; reads and writes
// params, square_avg, and grad_avg when centered, and momentum_buffer when
// momentum != 0 (pass empty spans for the buffers the options do not use).
// Every state starts at zero before the first step, as in torch. RMSprop
// has no bias correction, hence no step count. Local; not collective.
// Errors as sgd().
SHARDOPT_API StepResult rmsprop(ParamView params, GradView grads, std::span<float> square_avg,
                                std::span<float> grad_avg, std::span<float> momentum_buffer,
                                const RMSprop& options, const StepOptions& extra = {});

// One Lion step. Reads grads; reads and writes params and exp_avg (the
// momentum, zero before the first step). No step count. Local; not
// collective. Errors as sgd() (lr, betas in [0, 1), weight_decay >= 0).
SHARDOPT_API StepResult lion(ParamView params, GradView grads, std::span<float> exp_avg,
                             const Lion& options, const StepOptions& extra = {});

// One NAdam step (torch.optim.NAdam): buffers as adam() without amsgrad;
// the momentum product of torch's state["mu_product"] is computed from
// `step`. Local; not collective. Errors as adam().
SHARDOPT_API StepResult nadam(ParamView params, GradView grads, std::span<float> exp_avg,
                              std::span<float> exp_avg_sq, std::int64_t step, const NAdam& options,
                              const StepOptions& extra = {});

// One RAdam step (torch.optim.RAdam): buffers as adam() without amsgrad.
// Local; not collective. Errors as adam().
SHARDOPT_API StepResult radam(ParamView params, GradView grads, std::span<float> exp_avg,
                              std::span<float> exp_avg_sq, std::int64_t step, const RAdam& options,
                              const StepOptions& extra = {});

// One LAMB step on one tensor: the moments (exp_avg, exp_avg_sq, read and
// written, zero before the first step), the direction
// r = m_hat / (sqrt(v_hat) + eps) + weight_decay * p written to `update`
// (scratch the caller owns, as long as params; its contents on entry do not
// matter), then p -= lr * trust * r with trust = ||p|| / ||r|| over the
// whole span (1 when either norm is 0). The norms are summed in double in a
// fixed order, so the result does not depend on the thread count.
// `step` counts steps including this one. A sharded caller that needs the
// norms of a whole tensor spread over ranks uses the two kernels of
// kernels/lamb.hpp instead. Local; not collective. Errors as adam().
SHARDOPT_API StepResult lamb(ParamView params, GradView grads, std::span<float> exp_avg,
                             std::span<float> exp_avg_sq, std::span<float> update,
                             std::int64_t step, const Lamb& options, const StepOptions& extra = {});

// ---------------------------------------------------------------------------
// Lists of tensors (torch's foreach / multi-tensor optimizers).
//
// Each list form takes one entry per tensor in every list and does exactly
// what calling the single-tensor step above on each tensor in turn does, with
// the same hyper-parameters, step count and StepOptions: bitwise the same
// parameters and states, and grads_finite is false if any tensor's gradients
// were not finite (the update is applied regardless). Device buffers run in
// one CUDA launch per group of tensors stored alike, or a few for long lists
// (docs/optimizers.md, "The CUDA kernels"); host buffers run the CPU kernel
// tensor by tensor.
//
// The tensors of a list may differ in size (empty ones included), in
// gradient type and in storage (fp32, with or without a copy, or bf16 with
// remainders); they must not overlap. A state list that the options do not
// use (max_exp_avg_sqs without amsgrad, momentum_buffers without momentum,
// grad_avgs when not centered) may be empty, or hold one empty span per
// tensor. params_out holds each tensor's low-precision copy of the new
// parameters (StepOptions::param_out of a single step), of type
// StepOptions::param_out_dtype: empty for no copies, else one entry per
// tensor, null for a tensor without one; StepOptions::param_out itself must
// be null in a list call.
//
// Errors, before any buffer is touched: those of the single-tensor step,
// checked on every tensor, the message naming the tensor ("Adam: tensor 3:
// exp_avg has 5 elements, params have 7"); InvalidArgument for lists of
// different lengths or StepOptions::param_out set; WrongDevice for tensors in
// different memories (all on the host, or all on one CUDA device), naming
// the two tensors; NotCompiledError for device buffers in a build without
// CUDA. Local; not collective.

// Adam on a list of tensors: reads grads; reads and writes params, exp_avgs,
// exp_avg_sqs and, with amsgrad, max_exp_avg_sqs.
SHARDOPT_API StepResult adam(std::span<const ParamView> params, std::span<const GradView> grads,
                             std::span<const std::span<float>> exp_avgs,
                             std::span<const std::span<float>> exp_avg_sqs,
                             std::span<const std::span<float>> max_exp_avg_sqs, std::int64_t step,
                             const Adam& options, const StepOptions& extra = {},
                             std::span<void* const> params_out = {});

// AdamW on a list of tensors; buffers as the list adam().
SHARDOPT_API StepResult adamw(std::span<const ParamView> params, std::span<const GradView> grads,
                              std::span<const std::span<float>> exp_avgs,
                              std::span<const std::span<float>> exp_avg_sqs,
                              std::span<const std::span<float>> max_exp_avg_sqs, std::int64_t step,
                              const AdamW& options, const StepOptions& extra = {},
                              std::span<void* const> params_out = {});

// SGD on a list of tensors: reads grads; reads and writes params and, with
// momentum, momentum_buffers (only written on step 1).
SHARDOPT_API StepResult sgd(std::span<const ParamView> params, std::span<const GradView> grads,
                            std::span<const std::span<float>> momentum_buffers, std::int64_t step,
                            const SGD& options, const StepOptions& extra = {},
                            std::span<void* const> params_out = {});

// Adagrad on a list of tensors: reads grads; reads and writes params and
// state_sums.
SHARDOPT_API StepResult adagrad(std::span<const ParamView> params, std::span<const GradView> grads,
                                std::span<const std::span<float>> state_sums, std::int64_t step,
                                const Adagrad& options, const StepOptions& extra = {},
                                std::span<void* const> params_out = {});

// RMSprop on a list of tensors: reads grads; reads and writes params,
// square_avgs, and grad_avgs when centered, momentum_buffers with momentum.
SHARDOPT_API StepResult rmsprop(std::span<const ParamView> params, std::span<const GradView> grads,
                                std::span<const std::span<float>> square_avgs,
                                std::span<const std::span<float>> grad_avgs,
                                std::span<const std::span<float>> momentum_buffers,
                                const RMSprop& options, const StepOptions& extra = {},
                                std::span<void* const> params_out = {});

// Lion on a list of tensors: reads grads; reads and writes params and
// exp_avgs.
SHARDOPT_API StepResult lion(std::span<const ParamView> params, std::span<const GradView> grads,
                             std::span<const std::span<float>> exp_avgs, const Lion& options,
                             const StepOptions& extra = {}, std::span<void* const> params_out = {});

// NAdam on a list of tensors: reads grads; reads and writes params,
// exp_avgs and exp_avg_sqs.
SHARDOPT_API StepResult nadam(std::span<const ParamView> params, std::span<const GradView> grads,
                              std::span<const std::span<float>> exp_avgs,
                              std::span<const std::span<float>> exp_avg_sqs, std::int64_t step,
                              const NAdam& options, const StepOptions& extra = {},
                              std::span<void* const> params_out = {});

// RAdam on a list of tensors; buffers as the list nadam().
SHARDOPT_API StepResult radam(std::span<const ParamView> params, std::span<const GradView> grads,
                              std::span<const std::span<float>> exp_avgs,
                              std::span<const std::span<float>> exp_avg_sqs, std::int64_t step,
                              const RAdam& options, const StepOptions& extra = {},
                              std::span<void* const> params_out = {});

// LAMB on a list of tensors: each tensor's trust ratio from its own norms,
// as the single-tensor lamb(). Reads grads; reads and writes params,
// exp_avgs and exp_avg_sqs; writes updates (scratch, one per tensor).
SHARDOPT_API StepResult lamb(std::span<const ParamView> params, std::span<const GradView> grads,
                             std::span<const std::span<float>> exp_avgs,
                             std::span<const std::span<float>> exp_avg_sqs,
                             std::span<const std::span<float>> updates, std::int64_t step,
                             const Lamb& options, const StepOptions& extra = {},
                             std::span<void* const> params_out = {});

}  // namespace functional
}  // namespace shardopt
