// shardopt internal: the checks every functional optimizer step makes (its
// hyper-parameters, the sizes and types of its buffers, the memory they live
// in), with torch.optim's wording, and the run of its kernel where the
// buffers live.
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

// Where the step runs: every non-null buffer must be in the same memory
// (host, or one CUDA device), else a WrongDevice error naming two of them.
MemoryLocation common_location(const char* opt,
                               std::initializer_list<std::pair<const char*, const void*>> buffers);

// Runs host() for host memory, device() (which may throw std::runtime_error
// on a CUDA error) for device memory; a device location in a build without
// CUDA is a NotCompiled error.
template <class Host, class Device>
functional::StepResult run_where(const char* opt, const MemoryLocation& where, Host&& host,
                                 [[maybe_unused]] Device&& device) {
  if (where.kind == MemoryKind::host) return {host()};
#if SHARDOPT_HAVE_CUDA
  try {
    return {device()};
  } catch (const std::runtime_error& e) {
    throw_error(ErrorCode::cuda, std::string(opt) + ": " + e.what(),
                "check the GPU's health (nvidia-smi) and that the buffers are valid", __FILE__,
                __LINE__);
  }
#else
  throw_error(ErrorCode::not_compiled,
              std::string(opt) +
                  ": the buffers are in CUDA memory but this shardopt was built without CUDA",
              "rebuild shardopt with -Dcuda=enabled on a machine with the CUDA toolkit", __FILE__,
              __LINE__);
#endif
}

}  // namespace shardopt::detail
