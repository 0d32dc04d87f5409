// shardopt internal: the checks every functional optimizer step makes (its
// hyper-parameters, the sizes and types of its buffers, the memory they live
// in), with torch.optim's wording, and the run of its kernel where the
// buffers live, skipped on non-finite gradients when the caller asks.
#pragma once

#include <cstddef>
#include <initializer_list>
#include <span>
#include <stdexcept>
#include <string>
#include <utility>

#include "build_config.hpp"
#include "common/check.hpp"
#include "common/device.hpp"
#include "shardopt/optim.hpp"

namespace shardopt::detail {

// "<opt>: invalid <what>: <value> (<rule>)", an InvalidArgument error.
[[noreturn]] void bad_hyper(const char* opt, const std::string& what, double value,
                            const char* rule);

// "<opt>: <message>", an InvalidArgument error with `hint`.
[[noreturn]] void bad_buffer(const char* opt, const std::string& message, const char* hint);

// A buffer `name` must have `want` elements and, when want > 0, not be null.
void check_size(const char* opt, const char* name, std::size_t got, std::size_t want,
                const void* data);

// A state buffer used only in some modes: with `used`, as check_size; without,
// it must be empty (`unused_hint` says which option turns it on).
void check_optional(const char* opt, const char* name, std::span<float> buffer, std::size_t n,
                    bool used, const char* why_unused);

// step counts steps including this one: 1 for the first.
void check_step(const char* opt, std::int64_t step);

// What every step checks: the parameters (f32, or bf16 with as many
// remainders), the gradients (f32, bf16 or f16, as many as the parameters),
// StepOptions (a finite grad_mul, a bf16 or f16 copy, none with remainders).
void check_step_buffers(const char* opt, const functional::ParamView& params,
                        const functional::GradView& grads, const functional::StepOptions& extra);

// Sets a kernel's parameter buffers (param, param_out, param_out_type,
// remainder) from checked params and StepOptions: with remainders, the bf16
// parameters go to param_out (kernels/element.hpp, RemainderParams).
template <class Buffers>
void set_params(Buffers& b, const functional::ParamView& params,
                const functional::StepOptions& extra) {
  if (params.remainders != nullptr) {
    b.param = nullptr;
    b.param_out = params.data;
    b.param_out_type = DType::bf16;
    b.remainder = params.remainders;
  } else {
    b.param = static_cast<float*>(params.data);
    b.param_out = extra.param_out;
    b.param_out_type = extra.param_out_dtype;
    b.remainder = nullptr;
  }
}

// The hint of common_location's error for a step's buffers.
inline constexpr const char* kSameMemoryHint =
    "keep a step's parameters, gradients and states in the same memory (all host, or all on one "
    "GPU)";

// Where the step runs: every non-null buffer must be in the same memory
// (host, or one CUDA device), else a WrongDevice error naming two of them,
// with `hint`.
MemoryLocation common_location(const char* opt,
                               std::initializer_list<std::pair<const char*, const void*>> buffers,
                               const char* hint = kSameMemoryHint);

// Runs host() for host memory or device() for device memory and returns its
// result; a std::runtime_error from device() (a failed CUDA call) becomes a
// CUDA error naming `what`, and a device location in a build without CUDA is
// a NotCompiled error.
template <class Host, class Device>
auto run_at(const char* what, const MemoryLocation& where, Host&& host,
            [[maybe_unused]] Device&& device) -> decltype(host()) {
  if (where.kind == MemoryKind::host) return host();
#if SHARDOPT_HAVE_CUDA
  try {
    return device();
  } catch (const std::runtime_error& e) {
    throw_error(ErrorCode::cuda, std::string(what) + ": " + e.what(),
                "check the GPU's health (nvidia-smi) and that the buffers are valid", __FILE__,
                __LINE__);
  }
#else
  throw_error(ErrorCode::not_compiled,
              std::string(what) +
                  ": the buffers are in CUDA memory but this shardopt was built without CUDA",
              "rebuild shardopt with -Dcuda=enabled on a machine with the CUDA toolkit", __FILE__,
              __LINE__);
#endif
}

// A gradient multiplier (`name`: StepOptions::grad_mul, or grads_finite()'s
// grad_mul) must be finite.
void check_grad_mul(const char* opt, const char* name, double grad_mul);

// Gradients are f32, bf16 or f16 (Unsupported otherwise).
void check_grad_type(const char* opt, DType type);

// Whether every gradient times grad_mul (rounded to float, as the steps'
// scalars round it) is finite, by the kernel of kernels/finite.hpp where the
// checked gradients live (`where`).
bool grads_finite_at(const char* opt, const MemoryLocation& where,
                     const functional::GradView& grads, double grad_mul, void* stream);

// Runs a checked step where its buffers live: host() or device(), each
// returning whether every gradient was finite. Every functional step goes
// through here, so the skip is decided in this one place: with
// StepOptions::skip_nonfinite the gradients are checked first and, if any is
// not finite, the step returns {false, false} without running a kernel (no
// buffer is written).
template <class Host, class Device>
functional::StepResult run_step(const char* opt, const MemoryLocation& where,
                                const functional::GradView& grads,
                                const functional::StepOptions& extra, Host&& host,
                                Device&& device) {
  if (extra.skip_nonfinite && !grads_finite_at(opt, where, grads, extra.grad_mul, extra.stream))
    return {.grads_finite = false, .applied = false};
  return {.grads_finite = run_at(opt, where, host, device), .applied = true};
}

}  // namespace shardopt::detail
