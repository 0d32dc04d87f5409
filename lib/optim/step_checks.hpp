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
#include <type_traits>
#include <utility>
#include <vector>

#include "build_config.hpp"
#include "common/check.hpp"
#include "device/device.hpp"
#include "device/device_runtime.hpp"
#include "shardopt/optim.hpp"

namespace shardopt::detail {

// "<opt>: invalid <what>: <value> (<rule>)", an InvalidArgument error.
[[noreturn]] void bad_hyper(const char* opt, const std::string& what, double value,
                            const std::string& rule);

// One hyper-parameter `name` (torch's words: `what`) within its range.
void check_value(const char* opt, const char* name, const std::string& what, double value,
                 Check check);

// O's hyper-parameters, from its descriptor (shardopt/optimizers.hpp): each
// field's range in order, then the rules between fields.
template <class O>
void check_fields(const O& o) {
  O::fields([&](const char* name, auto member, const char* what, Check check) {
    const auto& v = o.*member;
    using T = std::remove_cvref_t<decltype(v)>;
    if constexpr (std::is_same_v<T, double>) {
      check_value(O::name, name, what, v, check);
    } else if constexpr (std::is_same_v<T, std::pair<double, double>>) {
      const std::string n(name);
      check_value(O::name, name, std::string(what) + " at index 0 (" + n + ".first)", v.first,
                  check);
      check_value(O::name, name, std::string(what) + " at index 1 (" + n + ".second)", v.second,
                  check);
    }
  });
  if constexpr (requires { o.check_rules([](const std::string&, const char*) {}); })
    o.check_rules([](const std::string& message, const char* hint) {
      throw_error(ErrorCode::invalid_argument, std::string(O::name) + ": " + message, hint,
                  __FILE__, __LINE__);
    });
}

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
using NamedBuffer = std::pair<const char*, const void*>;
MemoryLocation common_location(const char* opt, std::span<const NamedBuffer> buffers,
                               const char* hint = kSameMemoryHint);
inline MemoryLocation common_location(const char* opt, std::initializer_list<NamedBuffer> buffers,
                                      const char* hint = kSameMemoryHint) {
  return common_location(opt, std::span<const NamedBuffer>(buffers.begin(), buffers.size()), hint);
}

// Runs host() for host memory or device() for device memory and returns its
// result; a std::runtime_error from device() (a failed CUDA call) becomes a
// CUDA error naming `what`.
template <class Host, class Device>
auto run_at(const char* what, const MemoryLocation& where, Host&& host, Device&& device)
    -> decltype(host()) {
  if (where.kind == MemoryKind::host) return host();
  // device() runs through device_kernel (device/device_runtime.hpp), which
  // raises NotCompiled in a build without CUDA.
  try {
    return device();
  } catch (const Error&) {
    throw;
  } catch (const std::runtime_error& e) {
    throw_error(ErrorCode::cuda, std::string(what) + ": " + e.what(),
                "check the GPU's health (nvidia-smi) and that the buffers are valid", __FILE__,
                __LINE__);
  }
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
// A step with StepOptions::noop_flag: enqueued by launch() on the device,
// no result read back. Steps without such a form (LAMB) pass null.
template <class Launch>
functional::StepResult run_flagged(const char* opt, const MemoryLocation& where, Launch&& launch) {
  if constexpr (std::is_null_pointer_v<std::remove_cvref_t<Launch>>) {
    throw_error(ErrorCode::unsupported,
                std::string(opt) +
                    ": StepOptions::noop_flag is not supported: the step reads "
                    "its norms back on the host",
                "decide on the host: StepOptions::skip_nonfinite, or grads_finite() first",
                __FILE__, __LINE__);
  } else {
    if (where.kind == MemoryKind::host)
      throw_error(ErrorCode::invalid_argument,
                  std::string(opt) +
                      ": StepOptions::noop_flag is for device buffers, and these "
                      "are in host memory",
                  "on the host, test the flag and skip the call (or use skip_nonfinite)", __FILE__,
                  __LINE__);
    run_at(
        opt, where, [] { return true; },
        [&] {
          launch();
          return true;
        });
    return {};
  }
}

template <class Host, class Device, class Launch = std::nullptr_t>
functional::StepResult run_step(const char* opt, const MemoryLocation& where,
                                const functional::GradView& grads,
                                const functional::StepOptions& extra, Host&& host, Device&& device,
                                Launch&& launch = nullptr) {
  if (extra.noop_flag != nullptr) return run_flagged(opt, where, launch);
  if (extra.skip_nonfinite && !grads_finite_at(opt, where, grads, extra.grad_mul, extra.stream))
    return {.grads_finite = false, .applied = false};
  return {.grads_finite = run_at(opt, where, host, device), .applied = true};
}

// ------------------------------------------------------------------------
// Steps on lists of tensors.

// Runs a list step where its buffers live, through the skip rule of the
// single steps: with StepOptions::skip_nonfinite every tensor's gradients
// are checked first, and one non-finite gradient anywhere skips the whole
// list, writing nothing.
template <class Host, class Device, class Launch = std::nullptr_t>
functional::StepResult run_list(const char* opt, const MemoryLocation& where,
                                std::span<const functional::GradView> grads,
                                const functional::StepOptions& extra, Host&& host, Device&& device,
                                Launch&& launch = nullptr) {
  if (extra.noop_flag != nullptr) return run_flagged(opt, where, launch);
  if (extra.skip_nonfinite) {
    for (const functional::GradView& g : grads)
      if (!grads_finite_at(opt, where, g, extra.grad_mul, extra.stream))
        return {.grads_finite = false, .applied = false};
  }
  return {.grads_finite = run_at(opt, where, host, device), .applied = true};
}

// The lists' lengths, each tensor's name in messages and its StepOptions.
class TensorList {
 public:
  TensorList(const char* opt, std::size_t params, std::size_t grads,
             const functional::StepOptions& extra, std::span<void* const> params_out);

  std::size_t size() const { return size_; }

  // A list needs one entry per tensor; one `may_be_empty` may also be empty.
  void check_length(const std::string& what, std::size_t got, bool may_be_empty) const;

  // "Adam: tensor 3", the prefix of tensor i's messages.
  std::string name(std::size_t i) const;

  // The StepOptions of a single step on tensor i: the list's, with its copy.
  functional::StepOptions options(std::size_t i) const;

 private:
  const char* opt_;
  std::size_t size_;
  functional::StepOptions extra_;
  std::span<void* const> params_out_;
};

// Entry i of a state list that may be empty (a state the options do not use).
inline std::span<float> entry(std::span<const std::span<float>> list, std::size_t i) {
  return list.empty() ? std::span<float>{} : list[i];
}

// Where a list's tensors live: each tensor's buffers in one memory (checked as
// a single step checks them), and every tensor with a buffer in the same one.
class ListLocation {
 public:
  explicit ListLocation(const char* opt) : opt_(opt) {}
  void add(std::size_t i, const std::string& name, std::span<const NamedBuffer> buffers);
  const MemoryLocation& where() const { return where_; }

 private:
  const char* opt_;
  bool any_ = false;
  std::size_t first_ = 0;
  MemoryLocation where_{};
};

}  // namespace shardopt::detail
