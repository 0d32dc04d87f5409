// The functional optimizers: check the hyper-parameters and buffers the way
// torch.optim does, then run the kernel where the buffers live.
#include <cmath>
#include <sstream>
#include <string>

#include "build_config.hpp"
#include "common/check.hpp"
#include "common/device.hpp"
#include "kernels/adam.hpp"
#include "shardopt/optim.hpp"

namespace shardopt::functional {

namespace {

std::string num(double v) {
  std::ostringstream os;
  os << v;
  return os.str();
}

[[noreturn]] void bad_hyper(const char* opt, const std::string& what, double value,
                            const char* rule) {
  detail::throw_error(
      ErrorCode::invalid_argument,
      std::string(opt) + ": invalid " + what + ": " + num(value) + " (" + rule + ")",
      std::string("set ") + what + " within its range, as torch.optim." + opt + " requires",
      __FILE__, __LINE__);
}

template <class Options>
void check_adam_options(const char* opt, const Options& o) {
  // The checks and their order are torch.optim.Adam's.
  if (!(o.lr >= 0.0)) bad_hyper(opt, "learning rate (lr)", o.lr, "lr must be >= 0");
  if (!(o.eps >= 0.0)) bad_hyper(opt, "epsilon value (eps)", o.eps, "eps must be >= 0");
  if (!(o.betas.first >= 0.0 && o.betas.first < 1.0))
    bad_hyper(opt, "beta parameter at index 0 (betas.first)", o.betas.first,
              "betas must be in [0, 1)");
  if (!(o.betas.second >= 0.0 && o.betas.second < 1.0))
    bad_hyper(opt, "beta parameter at index 1 (betas.second)", o.betas.second,
              "betas must be in [0, 1)");
  if (!(o.weight_decay >= 0.0))
    bad_hyper(opt, "weight_decay value", o.weight_decay, "weight_decay must be >= 0");
}

[[noreturn]] void bad_buffer(const char* opt, const std::string& message, const char* hint) {
  detail::throw_error(ErrorCode::invalid_argument, std::string(opt) + ": " + message, hint,
                      __FILE__, __LINE__);
}

void check_size(const char* opt, const char* name, std::size_t got, std::size_t want,
                const void* data) {
  if (got != want) {
    bad_buffer(opt,
               std::string(name) + " has " + std::to_string(got) + " elements, params have " +
                   std::to_string(want),
               "every state buffer and the gradients must be as long as the parameters");
  }
  if (want != 0 && data == nullptr) {
    bad_buffer(opt, std::string(name) + " is null", "pass a buffer for it");
  }
}

// Where the step runs: every buffer must be in the same memory.
detail::MemoryLocation common_location(
    const char* opt, std::initializer_list<std::pair<const char*, const void*>> buffers) {
  detail::MemoryLocation first{};
  const char* first_name = nullptr;
  for (const auto& [name, ptr] : buffers) {
    if (ptr == nullptr) continue;
    const detail::MemoryLocation here = detail::locate(ptr);
    if (first_name == nullptr) {
      first = here;
      first_name = name;
      continue;
    }
    const bool same_device =
        here.kind == detail::MemoryKind::host
            ? first.kind == detail::MemoryKind::host
            : first.kind != detail::MemoryKind::host && here.device == first.device;
    if (!same_device) {
      detail::throw_error(
          ErrorCode::wrong_device,
          std::string(opt) + ": " + name + " is in " + detail::memory_kind_name(here.kind) +
              (here.device >= 0 ? " (device " + std::to_string(here.device) + ")" : "") + " but " +
              first_name + " is in " + detail::memory_kind_name(first.kind) +
              (first.device >= 0 ? " (device " + std::to_string(first.device) + ")" : ""),
          "keep a step's parameters, gradients and states in the same memory (all host, or all "
          "on one GPU)",
          __FILE__, __LINE__);
    }
  }
  return first;
}

template <class Options>
StepResult adam_like(const char* opt, bool decoupled, std::span<float> params, GradView grads,
                     std::span<float> exp_avg, std::span<float> exp_avg_sq,
                     std::span<float> max_exp_avg_sq, std::int64_t step, const Options& o,
                     const StepOptions& extra) {
  check_adam_options(opt, o);
  if (step < 1) {
    bad_buffer(opt, "step " + std::to_string(step) + " is not a step count",
               "pass the number of steps including this one: 1 for the first");
  }
  if (!(std::isfinite(extra.grad_mul))) {
    bad_buffer(opt, "StepOptions::grad_mul is " + num(extra.grad_mul),
               "pass a finite multiplier (1 / loss_scale times the clip coefficient)");
  }
  const std::size_t n = params.size();
  if (n != 0 && params.data() == nullptr) bad_buffer(opt, "params is null", "pass the parameters");
  if (grads.dtype != DType::f32 && grads.dtype != DType::bf16 && grads.dtype != DType::f16) {
    detail::throw_error(
        ErrorCode::unsupported,
        std::string(opt) + ": gradients of type " + dtype_name(grads.dtype) + " are not supported",
        "pass f32, bf16 or f16 gradients", __FILE__, __LINE__);
  }
  check_size(opt, "grads", grads.size, n, grads.data);
  check_size(opt, "exp_avg", exp_avg.size(), n, exp_avg.data());
  check_size(opt, "exp_avg_sq", exp_avg_sq.size(), n, exp_avg_sq.data());
  if (o.amsgrad) {
    check_size(opt, "max_exp_avg_sq (amsgrad)", max_exp_avg_sq.size(), n, max_exp_avg_sq.data());
  } else if (!max_exp_avg_sq.empty()) {
    bad_buffer(opt, "max_exp_avg_sq was given but amsgrad is off",
               "pass an empty span without amsgrad, or turn amsgrad on");
  }
  if (extra.param_out != nullptr && extra.param_out_dtype != DType::bf16 &&
      extra.param_out_dtype != DType::f16) {
    detail::throw_error(ErrorCode::unsupported,
                        std::string(opt) + ": a parameter copy of type " +
                            dtype_name(extra.param_out_dtype) + " is not supported",
                        "use bf16 or f16 for StepOptions::param_out_dtype", __FILE__, __LINE__);
  }

  kernels::AdamBuffers b;
  b.param = params.data();
  b.grad = grads.data;
  b.grad_type = grads.dtype;
  b.exp_avg = exp_avg.data();
  b.exp_avg_sq = exp_avg_sq.data();
  b.max_exp_avg_sq = o.amsgrad ? max_exp_avg_sq.data() : nullptr;
  b.param_out = extra.param_out;
  b.param_out_type = extra.param_out_dtype;
  b.n = n;
  const kernels::AdamScalars s =
      kernels::make_adam_scalars(o.lr, o.betas.first, o.betas.second, o.eps, o.weight_decay,
                                 decoupled, o.amsgrad, o.maximize, step, extra.grad_mul);

  const detail::MemoryLocation where = common_location(opt, {{"params", b.param},
                                                             {"grads", b.grad},
                                                             {"exp_avg", b.exp_avg},
                                                             {"exp_avg_sq", b.exp_avg_sq},
                                                             {"max_exp_avg_sq", b.max_exp_avg_sq},
                                                             {"param_out", b.param_out}});
  if (where.kind == detail::MemoryKind::host) return {kernels::cpu::adam(b, s)};
#if SHARDOPT_HAVE_CUDA
  try {
    return {kernels::cuda::adam(b, s, extra.stream)};
  } catch (const std::runtime_error& e) {
    detail::throw_error(ErrorCode::cuda, std::string(opt) + ": " + e.what(),
                        "check the GPU's health (nvidia-smi) and that the buffers are valid",
                        __FILE__, __LINE__);
  }
#else
  detail::throw_error(ErrorCode::not_compiled,
                      std::string(opt) +
                          ": the buffers are in CUDA memory but this shardopt was "
                          "built without CUDA",
                      "rebuild shardopt with -Dcuda=enabled on a machine with the CUDA toolkit",
                      __FILE__, __LINE__);
#endif
}

}  // namespace

StepResult adam(std::span<float> params, GradView grads, std::span<float> exp_avg,
                std::span<float> exp_avg_sq, std::span<float> max_exp_avg_sq, std::int64_t step,
                const Adam& options, const StepOptions& extra) {
  return adam_like("Adam", false, params, grads, exp_avg, exp_avg_sq, max_exp_avg_sq, step, options,
                   extra);
}

StepResult adamw(std::span<float> params, GradView grads, std::span<float> exp_avg,
                 std::span<float> exp_avg_sq, std::span<float> max_exp_avg_sq, std::int64_t step,
                 const AdamW& options, const StepOptions& extra) {
  return adam_like("AdamW", true, params, grads, exp_avg, exp_avg_sq, max_exp_avg_sq, step, options,
                   extra);
}

}  // namespace shardopt::functional
