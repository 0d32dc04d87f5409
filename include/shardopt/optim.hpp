// shardopt: optimizer options (the names and defaults of torch.optim) and the
// functional optimizers: stateless steps over explicit parameter, gradient
// and state buffers, host or device.
//
// A functional step reads and writes only the buffers it is given, so the
// caller owns every byte of state (the ZeRO engine passes its shards). Each
// reproduces one step of the torch.optim class of the same name, operation by
// operation in fp32 (docs/optimizers.md gives the exact formulas). All
// buffers of one call must be in the same kind of memory: host, or the same
// CUDA device (then the step runs on `StepOptions::stream`).
#pragma once

#include <cstddef>
#include <cstdint>
#include <iterator>
#include <span>
#include <type_traits>
#include <utility>

#include "shardopt/export.h"
#include "shardopt/half.hpp"
#include "shardopt/types.hpp"

namespace shardopt {

// torch.optim.Adam.
struct Adam {
  double lr = 1e-3;
  std::pair<double, double> betas = {0.9, 0.999};
  double eps = 1e-8;
  double weight_decay = 0.0;  // L2: added to the gradient
  bool amsgrad = false;
  bool maximize = false;
};

// torch.optim.AdamW: decoupled weight decay, p *= 1 - lr * weight_decay.
struct AdamW {
  double lr = 1e-3;
  std::pair<double, double> betas = {0.9, 0.999};
  double eps = 1e-8;
  double weight_decay = 1e-2;
  bool amsgrad = false;
  bool maximize = false;
};

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

struct StepOptions {
  // Multiplies every gradient before anything else: 1 / loss_scale to
  // unscale, times a clip coefficient to clip. 1 leaves them as they are.
  double grad_mul = 1.0;
  // Optional low-precision copy of the new parameters, written in the same
  // pass (mixed precision: the fp32 params are the master copy). Its size
  // must equal the params'. dtype bf16 or f16.
  void* param_out = nullptr;
  DType param_out_dtype = DType::bf16;
  // For device buffers: the cudaStream_t to run on (null: the default
  // stream). The call returns when the step is done.
  void* stream = nullptr;
};

struct StepResult {
  // False if any gradient (after grad_mul) was inf or nan. The step was
  // applied regardless: callers that skip such steps check grads_finite()
  // first, or keep a copy.
  bool grads_finite = true;
};

// One Adam step. Reads grads; reads and writes params, exp_avg, exp_avg_sq
// and, with amsgrad, max_exp_avg_sq (pass an empty span without amsgrad).
// `step` counts steps including this one (1 for the first), as torch's
// state["step"] after its increment. Local; not collective.
// Errors: InvalidArgument for a bad hyper-parameter (naming it, as torch
// does), mismatched sizes or null buffers; DeviceError for buffers in
// different memories; NotCompiledError for device buffers in a build without
// CUDA.
SHARDOPT_API StepResult adam(std::span<float> params, GradView grads, std::span<float> exp_avg,
                             std::span<float> exp_avg_sq, std::span<float> max_exp_avg_sq,
                             std::int64_t step, const Adam& options, const StepOptions& extra = {});

// One AdamW step; buffers as adam().
SHARDOPT_API StepResult adamw(std::span<float> params, GradView grads, std::span<float> exp_avg,
                              std::span<float> exp_avg_sq, std::span<float> max_exp_avg_sq,
                              std::int64_t step, const AdamW& options,
                              const StepOptions& extra = {});

}  // namespace functional
}  // namespace shardopt
