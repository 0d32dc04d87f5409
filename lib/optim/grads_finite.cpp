// functional::grads_finite: the gradient checks of a step, then the
// finiteness kernel where the gradients live (kernels/finite.hpp), the same
// check a step makes with StepOptions::skip_nonfinite.
#include <string>

#include "shardopt/optim.hpp"
#include "step_checks.hpp"

namespace shardopt::functional {

bool grads_finite(GradView grads, double grad_mul, void* stream) {
  const char* what = "grads_finite";
  detail::check_grad_mul(what, "grad_mul", grad_mul);
  detail::check_grad_type(what, grads.dtype);
  if (grads.size != 0 && grads.data == nullptr)
    detail::bad_buffer(what, "grads is null with a size of " + std::to_string(grads.size),
                       "pass the gradients, or a size of 0");
  const detail::MemoryLocation where = detail::locate(grads.data);
  return detail::grads_finite_at(what, where, grads, grad_mul, stream);
}

}  // namespace shardopt::functional
