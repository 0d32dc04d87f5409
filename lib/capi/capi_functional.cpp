// shardopt: the C API's functional optimizers (shardopt.h).
#include <span>
#include <string>
#include <type_traits>
#include <variant>
#include <vector>

#include "capi.hpp"
#include "common/check.hpp"
#include "common/language.hpp"
#include "hparams.hpp"
#include "shardopt/optim.hpp"

using namespace shardopt;
using namespace shardopt::capi;

namespace {

// The buffers a step of O takes: its state slots, and LAMB's update scratch.
template <class O>
std::vector<std::string> slot_names(const O& o, std::vector<bool>* used = nullptr) {
  std::vector<std::string> names;
  o.slots([&](const Slot& s) {
    names.emplace_back(s.name);
    if (used) used->push_back(s.used);
  });
  if constexpr (!is_elementwise<O>) {
    names.emplace_back("update");
    if (used) used->push_back(true);
  }
  return names;
}

functional::ParamView param_view(void* params, DType dtype, std::size_t count,
                                 std::uint16_t* remainders) {
  if (dtype == DType::f32 && !remainders)
    return functional::ParamView(static_cast<float*>(params), count);
  // Anything else is checked by the step, which names the problem.
  return functional::ParamView(params, count, dtype,
                               std::span<std::uint16_t>(remainders, remainders ? count : 0));
}

}  // namespace

extern "C" {

SHARDOPT_API shardopt_status_t shardopt_step_options_init(shardopt_step_options_t* options) {
  return guard("shardopt_step_options_init", [&] {
    check_out(options, "options");
    *options = shardopt_step_options_t{1.0, nullptr, SHARDOPT_BF16, nullptr, 0, nullptr};
  });
}

SHARDOPT_API shardopt_status_t shardopt_functional_slots(const char* spec, int* num_states, int k,
                                                         char* name, size_t name_size) {
  return guard("shardopt_functional_slots", [&] {
    const OptimizerConfig config = parse_spec(string_of(spec, "spec"));
    check_out(num_states, "num_states");
    std::visit(
        [&](const auto& o) {
          using O = std::remove_cvref_t<decltype(o)>;
          if constexpr (is_optimizer<O>) {
            const auto names = slot_names(o);
            *num_states = static_cast<int>(names.size());
            if (!name) return;
            if (k < 0 || k >= *num_states)
              SHARDOPT_THROW(invalid_argument,
                             "k " + detail::index_text(k) + " is not a slot of " + O::key +
                                 ", which has " + std::to_string(names.size()),
                             "pass k from " + detail::index_text(0) + " to " +
                                 detail::index_text(*num_states - 1) + ", or a NULL name");
            copy_out(names[static_cast<std::size_t>(k)], name, name_size, "name");
          }
        },
        config);
  });
}

SHARDOPT_API shardopt_status_t shardopt_functional_slot_used(const char* spec, int k, int* used) {
  return guard("shardopt_functional_slot_used", [&] {
    const OptimizerConfig config = parse_spec(string_of(spec, "spec"));
    check_out(used, "used");
    std::visit(
        [&](const auto& o) {
          using O = std::remove_cvref_t<decltype(o)>;
          if constexpr (is_optimizer<O>) {
            std::vector<bool> in_use;
            const auto names = slot_names(o, &in_use);
            if (k < 0 || k >= static_cast<int>(names.size()))
              SHARDOPT_THROW(invalid_argument,
                             "k " + detail::index_text(k) + " is not a slot of " + O::key +
                                 ", which has " + std::to_string(names.size()),
                             "pass k from " + detail::index_text(0) + " to " +
                                 detail::index_text(static_cast<long long>(names.size()) - 1));
            *used = in_use[static_cast<std::size_t>(k)] ? 1 : 0;
          }
        },
        config);
  });
}

SHARDOPT_API shardopt_status_t shardopt_functional_step(
    const char* spec, void* params, shardopt_dtype_t param_dtype, const void* grads,
    shardopt_dtype_t grad_dtype, size_t count, float* const* states, int num_states, int64_t step,
    const shardopt_step_options_t* options, int* applied, int* grads_finite) {
  return guard("shardopt_functional_step", [&] {
    const OptimizerConfig config = parse_spec(string_of(spec, "spec"));
    check_count(count, "count");
    const DType pt = dtype_of_code(param_dtype, "param_dtype");
    const DType gt = dtype_of_code(grad_dtype, "grad_dtype");
    functional::StepOptions extra;
    std::uint16_t* remainders = nullptr;
    if (options) {
      extra.grad_mul = options->grad_mul;
      extra.param_out = options->param_out;
      extra.param_out_dtype = dtype_of_code(options->param_out_dtype, "options->param_out_dtype");
      extra.stream = options->stream;
      extra.skip_nonfinite = options->skip_nonfinite != 0;
      remainders = options->remainders;
    }
    const functional::ParamView p = param_view(params, pt, count, remainders);
    const functional::GradView g(grads, count, gt);
    functional::StepResult result;
    std::visit(
        [&](const auto& o) {
          using O = std::remove_cvref_t<decltype(o)>;
          if constexpr (is_optimizer<O>) {
            const auto names = slot_names(o);
            if (num_states != static_cast<int>(names.size())) {
              std::string list;
              for (const auto& n : names) list += (list.empty() ? "" : ", ") + n;
              SHARDOPT_THROW(invalid_argument,
                             std::string(O::key) + " takes " + std::to_string(names.size()) +
                                 " state buffers (" + list + "), not " + std::to_string(num_states),
                             "pass one buffer of count floats per slot, in that order, NULL for a "
                             "slot the options do not use");
            }
            if (!states && num_states > 0)
              SHARDOPT_THROW(invalid_argument,
                             "states is NULL, and " + std::string(O::key) + " takes " +
                                 std::to_string(num_states) + " state buffers",
                             "pass an array of num_states pointers (NULL for an unused slot)");
            std::vector<std::span<float>> spans;
            for (int k = 0; k < num_states; ++k)
              spans.emplace_back(states[k], states[k] ? count : 0);
            if constexpr (is_elementwise<O>) {
              result = functional::step<O>(p, g, std::span<const std::span<float>>(spans), step, o,
                                           extra);
            } else {
              result = functional::lamb(p, g, spans[0], spans[1], spans[2], step, o, extra);
            }
          }
        },
        config);
    if (applied) *applied = result.applied ? 1 : 0;
    if (grads_finite) *grads_finite = result.grads_finite ? 1 : 0;
  });
}

}  // extern "C"
