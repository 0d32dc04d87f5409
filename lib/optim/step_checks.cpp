// The checks shared by the functional optimizers (see step_checks.hpp).
#include "step_checks.hpp"

#include <cmath>
#include <sstream>

#include "common/language.hpp"
#include "kernels/finite.hpp"

namespace shardopt::detail {

namespace {

std::string num(double v) {
  std::ostringstream os;
  os << v;
  return os.str();
}

}  // namespace

void bad_hyper(const char* opt, const std::string& what, double value, const std::string& rule) {
  throw_error(ErrorCode::invalid_argument,
              std::string(opt) + ": invalid " + what + ": " + num(value) + " (" + rule + ")",
              std::string("set ") + what + " within its range, as torch.optim." + opt + " requires",
              __FILE__, __LINE__);
}

void bad_buffer(const char* opt, const std::string& message, const char* hint) {
  throw_error(ErrorCode::invalid_argument, std::string(opt) + ": " + message, hint, __FILE__,
              __LINE__);
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

void check_optional(const char* opt, const char* name, std::span<float> buffer, std::size_t n,
                    bool used, const char* why_unused) {
  if (used) {
    check_size(opt, name, buffer.size(), n, buffer.data());
  } else if (!buffer.empty()) {
    bad_buffer(opt, std::string(name) + " was given but " + why_unused,
               "pass an empty span for a state buffer the options do not use");
  }
}

void check_step(const char* opt, std::int64_t step) {
  if (step < 1) {
    bad_buffer(opt, "step " + std::to_string(step) + " is not a step count",
               "pass the number of steps including this one: 1 for the first");
  }
}

namespace {

void check_params(const char* opt, const functional::ParamView& params,
                  const functional::StepOptions& extra) {
  const bool with_remainders = params.remainders != nullptr || params.remainders_size != 0;
  if (params.dtype == DType::f16 && with_remainders) {
    throw_error(ErrorCode::unsupported,
                std::string(opt) + ": parameter remainders need bf16 parameters, not f16",
                "keep fp32 parameters (the master copy) and write the f16 model copy with "
                "StepOptions::param_out: an f16 value is not the high half of an fp32 value",
                __FILE__, __LINE__);
  }
  if (params.dtype == DType::f32 && with_remainders) {
    bad_buffer(opt, "remainders were given with fp32 parameters",
               "pass bf16 parameters with their remainders, or fp32 parameters alone");
  }
  if (params.dtype == DType::bf16 && !with_remainders) {
    throw_error(ErrorCode::unsupported,
                std::string(opt) + ": bf16 parameters need their remainders (no fp32 master)",
                "pass the 16-bit remainders with the bf16 parameters (encode_param_remainders "
                "makes them from fp32 values), or fp32 parameters",
                __FILE__, __LINE__);
  }
  if (params.dtype != DType::f32 && params.dtype != DType::bf16) {
    throw_error(ErrorCode::unsupported,
                std::string(opt) + ": parameters of type " + dtype_name(params.dtype) +
                    " are not supported",
                "pass fp32 parameters, or bf16 parameters with remainders", __FILE__, __LINE__);
  }
  const std::size_t n = params.size;
  if (n != 0 && params.data == nullptr) bad_buffer(opt, "params is null", "pass the parameters");
  if (with_remainders) {
    if (params.remainders_size != n) {
      bad_buffer(opt,
                 "remainders has " + std::to_string(params.remainders_size) +
                     " elements, params have " + std::to_string(n),
                 "pass one remainder for each bf16 parameter");
    }
    if (n != 0 && params.remainders == nullptr) {
      bad_buffer(opt, "remainders is null", "pass the remainders of the bf16 parameters");
    }
    if (extra.param_out != nullptr) {
      bad_buffer(opt, "StepOptions::param_out was given with parameter remainders",
                 "leave param_out null: with remainders the bf16 parameters are the model's copy");
    }
  }
}

}  // namespace

void check_grad_mul(const char* opt, const char* name, double grad_mul) {
  if (!(std::isfinite(grad_mul))) {
    bad_buffer(opt, std::string(name) + " is " + num(grad_mul),
               "pass a finite multiplier (1 / loss_scale times the clip coefficient)");
  }
}

void check_grad_type(const char* opt, DType type) {
  if (type != DType::f32 && type != DType::bf16 && type != DType::f16) {
    throw_error(ErrorCode::unsupported,
                std::string(opt) + ": gradients of type " + dtype_name(type) + " are not supported",
                "pass f32, bf16 or f16 gradients", __FILE__, __LINE__);
  }
}

bool grads_finite_at(const char* opt, const MemoryLocation& where,
                     const functional::GradView& grads, double grad_mul, void* stream) {
  // The steps' scalars round grad_mul to float the same way (make_adam_scalars, ...).
  const float mul = static_cast<float>(grad_mul);
  return run_at(
      opt, where,
      [&] { return kernels::cpu::all_finite(grads.data, grads.dtype, grads.size, mul); },
      [&] {
        return device_kernel(
            opt, stream,
            [&] {
              return kernels::cuda::all_finite(grads.data, grads.dtype, grads.size, mul, stream);
            },
            [&](const Translate& tr) {
              return kernels::cpu::all_finite(translated(grads.data, tr), grads.dtype, grads.size,
                                              mul);
            });
      });
}

void check_step_buffers(const char* opt, const functional::ParamView& params,
                        const functional::GradView& grads, const functional::StepOptions& extra) {
  check_grad_mul(opt, "StepOptions::grad_mul", extra.grad_mul);
  if (extra.noop_flag != nullptr && extra.skip_nonfinite)
    throw_error(ErrorCode::invalid_argument,
                std::string(opt) + ": StepOptions::noop_flag with skip_nonfinite",
                "choose one: noop_flag decides on the device, skip_nonfinite on the host", __FILE__,
                __LINE__);
  check_params(opt, params, extra);
  const std::size_t n = params.size;
  check_grad_type(opt, grads.dtype);
  check_size(opt, "grads", grads.size, n, grads.data);
  if (extra.param_out != nullptr && extra.param_out_dtype != DType::bf16 &&
      extra.param_out_dtype != DType::f16) {
    throw_error(ErrorCode::unsupported,
                std::string(opt) + ": a parameter copy of type " +
                    dtype_name(extra.param_out_dtype) + " is not supported",
                "use bf16 or f16 for StepOptions::param_out_dtype", __FILE__, __LINE__);
  }
}

MemoryLocation common_location(const char* opt, std::span<const NamedBuffer> buffers,
                               const char* hint) {
  MemoryLocation first{};
  const char* first_name = nullptr;
  for (const auto& [name, ptr] : buffers) {
    if (ptr == nullptr) continue;
    const MemoryLocation here = locate(ptr);
    if (first_name == nullptr) {
      first = here;
      first_name = name;
      continue;
    }
    const bool same_device = here.kind == MemoryKind::host
                                 ? first.kind == MemoryKind::host
                                 : first.kind != MemoryKind::host && here.device == first.device;
    if (!same_device) {
      throw_error(ErrorCode::wrong_device,
                  std::string(opt) + ": " + name + " is in " + location_name(here) + " but " +
                      first_name + " is in " + location_name(first),
                  hint, __FILE__, __LINE__);
    }
  }
  return first;
}

void check_value(const char* opt, const char* name, const std::string& what, double value,
                 Check check) {
  const std::string n(name);
  switch (check) {
    case Check::non_neg:
      if (!(value >= 0.0)) bad_hyper(opt, what, value, n + " must be >= 0");
      break;
    case Check::finite:
      if (!std::isfinite(value)) bad_hyper(opt, what, value, n + " must be finite");
      break;
    case Check::unit_open:
      if (!(value >= 0.0 && value < 1.0)) bad_hyper(opt, what, value, n + " must be in [0, 1)");
      break;
    case Check::none:
      break;
  }
}

TensorList::TensorList(const char* opt, std::size_t params, std::size_t grads,
                       const functional::StepOptions& extra, std::span<void* const> params_out)
    : opt_(opt), size_(params), extra_(extra), params_out_(params_out) {
  if (extra.param_out != nullptr) {
    bad_buffer(opt, "StepOptions::param_out was given to a step on a list of tensors",
               "pass each tensor's low-precision copy in params_out (null for a tensor "
               "without one) and leave StepOptions::param_out null");
  }
  check_length("grads", grads, false);
  check_length("params_out", params_out.size(), true);
}

void TensorList::check_length(const std::string& what, std::size_t got, bool may_be_empty) const {
  if (got == size_ || (may_be_empty && got == 0)) return;
  bad_buffer(opt_,
             what + " has " + std::to_string(got) + " entries but params has " +
                 std::to_string(size_) + " tensors",
             may_be_empty ? "pass one entry per tensor, or an empty list for what the "
                            "options do not use"
                          : "pass one entry per tensor in every list");
}

std::string TensorList::name(std::size_t i) const {
  return std::string(opt_) + ": tensor " + index_text(i);
}

functional::StepOptions TensorList::options(std::size_t i) const {
  functional::StepOptions e = extra_;
  e.param_out = params_out_.empty() ? nullptr : params_out_[i];
  return e;
}

void ListLocation::add(std::size_t i, const std::string& name,
                       std::span<const NamedBuffer> buffers) {
  const MemoryLocation here = common_location(name.c_str(), buffers);
  bool any = false;
  for (const auto& buffer : buffers) any = any || buffer.second != nullptr;
  if (!any) return;
  if (!any_) {
    any_ = true;
    first_ = i;
    where_ = here;
    return;
  }
  const bool same = here.kind == MemoryKind::host
                        ? where_.kind == MemoryKind::host
                        : where_.kind != MemoryKind::host && here.device == where_.device;
  if (!same) {
    throw_error(ErrorCode::wrong_device,
                std::string(opt_) + ": tensor " + index_text(i) + " is in " + location_name(here) +
                    " but tensor " + index_text(first_) + " is in " + location_name(where_),
                "keep every tensor of a list in the same memory (all host, or all on one "
                "GPU), or call the step once per memory",
                __FILE__, __LINE__);
  }
}

}  // namespace shardopt::detail
