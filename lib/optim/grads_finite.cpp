// functional::grads_finite: the gradient checks of a step, then the
// finiteness kernel where the gradients live (kernels/finite.hpp), the same
// check a step makes with StepOptions::skip_nonfinite.
#include <cstdint>
#include <string>

#include "kernels/finite.hpp"
#include "shardopt/optim.hpp"
#include "step_checks.hpp"

namespace shardopt::functional {

namespace {

void check_grads(const char* what, const GradView& grads, double grad_mul) {
  detail::check_grad_mul(what, "grad_mul", grad_mul);
  detail::check_grad_type(what, grads.dtype);
  if (grads.size != 0 && grads.data == nullptr)
    detail::bad_buffer(what, "grads is null with a size of " + std::to_string(grads.size),
                       "pass the gradients, or a size of 0");
}

}  // namespace

bool grads_finite(GradView grads, double grad_mul, void* stream) {
  const char* what = "grads_finite";
  check_grads(what, grads, grad_mul);
  const detail::MemoryLocation where = detail::locate(grads.data);
  return detail::grads_finite_at(what, where, grads, grad_mul, stream);
}

void flag_nonfinite(GradView grads, std::uint32_t* flag, double grad_mul, void* stream) {
  const char* what = "flag_nonfinite";
  check_grads(what, grads, grad_mul);
  if (flag == nullptr)
    detail::bad_buffer(what, "the flag is null",
                       "pass a std::uint32_t in the gradients' memory, cleared before the checks");
  const detail::MemoryLocation where =
      detail::common_location(what, {{"grads", grads.data}, {"flag", flag}},
                              "keep the flag in the gradients' memory (host, or their GPU)");
  if (grads.size == 0) return;
  const float mul = static_cast<float>(grad_mul);  // as the steps' scalars round it
  detail::run_at(
      what, where,
      [&] {
        if (!kernels::cpu::all_finite(grads.data, grads.dtype, grads.size, mul)) *flag = 1;
      },
      [&] {
        detail::launch_kernel(
            what, stream,
            [&] {
              kernels::cuda::flag_nonfinite(grads.data, grads.dtype, grads.size, mul, flag, stream);
            },
            [g = grads, flag, mul](const detail::Translate& tr) {
              if (!kernels::cpu::all_finite(detail::translated(g.data, tr), g.dtype, g.size, mul))
                *detail::translated(flag, tr) = 1;
            });
      });
}

}  // namespace shardopt::functional
