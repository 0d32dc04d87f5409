// The functional step of every element-wise optimizer, from its descriptor
// (shardopt/optimizers.hpp) and its kernel (kernels/<key>.hpp): torch.optim's
// checks of the hyper-parameters, the checks of the buffers, then the kernel
// where the buffers live; on one tensor, or on a list of them (each tensor
// checked as the single step checks it, the messages naming the tensor; the
// CPU kernel tensor by tensor for host buffers, the multi-tensor CUDA kernels
// for device buffers).
#include <array>
#include <string>
#include <vector>

#include "kernels/optimizer_kernels.hpp"
#include "shardopt/optim.hpp"
#include "step_checks.hpp"
#include "trusted_step.hpp"

namespace shardopt::functional {

namespace {

template <class O>
using Buffers = typename kernels::Kernel<O>::Buffers;

template <class O>
std::vector<Slot> slots_of(const O& o) {
  std::vector<Slot> v;
  o.slots([&v](const Slot& s) { v.push_back(s); });
  return v;
}

// A list of a slot's buffers is named in the plural: "exp_avgs".
std::string plural(const char* label) {
  const std::string l(label);
  return l.substr(0, l.find(' ')) + "s";
}

// The state spans must be one per slot, in the descriptor's order.
template <class O>
void check_state_count(const O& o, std::size_t got) {
  // Every step passes here: no allocation unless the count is wrong.
  if (got == static_cast<std::size_t>(slot_count<O>())) return;
  const std::vector<Slot> slots = slots_of(o);
  std::string names;
  for (const Slot& s : slots) names += (names.empty() ? "" : ", ") + std::string(s.name);
  detail::bad_buffer(O::name,
                     "got " + std::to_string(got) + " state buffer(s); " + O::name + " has " +
                         std::to_string(slots.size()) + ": " + names,
                     "pass one span per state slot, in this order, an empty span for a slot the "
                     "options do not use");
}

// A kernel's buffers from a step's arguments (null for a slot the options
// do not use), unchecked.
template <class O>
Buffers<O> kernel_buffers(const O& o, const ParamView& params, const GradView& grads,
                          std::span<const std::span<float>> states, const StepOptions& extra) {
  std::array<float*, 8> ptrs{};
  int k = 0;
  o.slots([&](const Slot& s) {
    ptrs[std::size_t(k)] = s.used ? states[std::size_t(k)].data() : nullptr;
    ++k;
  });
  Buffers<O> b;
  b.grad = grads.data;
  b.grad_type = grads.dtype;
  kernels::Kernel<O>::set_states(b, ptrs.data());
  detail::set_params(b, params, extra);
  b.n = params.size;
  return b;
}

// Checks tensor `name`'s states against its n parameters and fills a
// kernel's buffers from them (null for a slot the options do not use), with
// the named buffers of the tensor for the memory checks.
template <class O>
Buffers<O> buffers_of(const char* name, const O& o, const ParamView& params, const GradView& grads,
                      std::span<const std::span<float>> states, const StepOptions& extra,
                      std::vector<detail::NamedBuffer>& named) {
  int k = 0;
  named = {{"params", params.data}, {"grads", grads.data}};
  o.slots([&](const Slot& s) {
    const std::span<float> st = states[std::size_t(k++)];
    detail::check_optional(name, s.label, st, params.size, s.used, s.unused_because);
    named.emplace_back(s.name, s.used ? st.data() : nullptr);
  });
  named.emplace_back("remainders", params.remainders);
  named.emplace_back("param_out", extra.param_out);
  named.emplace_back("noop_flag", extra.noop_flag);
  return kernel_buffers(o, params, grads, states, extra);
}

// Enqueues the step of `tensors` (device buffers, checked) on extra.stream,
// to apply only if *extra.noop_flag is 0 when the stream reaches it.
template <class O>
void enqueue_flagged(std::span<const Buffers<O>> tensors,
                     const typename kernels::Kernel<O>::Scalars& s, const StepOptions& extra) {
  using Family = kernels::family_of<O>;
  const auto* flag = reinterpret_cast<const unsigned*>(extra.noop_flag);
  detail::launch_kernel(
      O::name, extra.stream,
      [&] { kernels::cuda::step_async<Family>(tensors, s, flag, extra.stream); },
      // Runs later, on the stream: owns copies of what it reads.
      [list = std::vector<Buffers<O>>(tensors.begin(), tensors.end()), s,
       flag](const detail::Translate& tr) {
        if (*detail::translated(flag, tr) != 0) return;
        for (const auto& b : list) kernels::cpu::step<Family>(detail::translated_buffers(b, tr), s);
      });
}

}  // namespace

template <class O>
requires is_optimizer<O>
void check_options(const O& options) { detail::check_fields(options); }

template <class O>
requires is_elementwise<O> StepResult step(ParamView params, GradView grads,
                                           std::span<const std::span<float>> states,
                                           std::int64_t step, const O& o,
                                           const StepOptions& extra) {
  static_assert(slot_count<O>() <= 8);
  const char* opt = O::name;
  detail::check_fields(o);
  if constexpr (O::counts_steps) detail::check_step(opt, step);
  detail::check_step_buffers(opt, params, grads, extra);
  check_state_count(o, states.size());
  std::vector<detail::NamedBuffer> named;
  const Buffers<O> b = buffers_of(opt, o, params, grads, states, extra, named);
  const auto s = kernels::Kernel<O>::scalars(o, step, extra.grad_mul);
  using Family = kernels::family_of<O>;
  const detail::MemoryLocation where = detail::common_location(opt, named);
  return detail::run_step(
      opt, where, grads, extra, [&] { return kernels::cpu::step<Family>(b, s); },
      [&] {
        return detail::device_kernel(
            opt, extra.stream, [&] { return kernels::cuda::step<Family>(b, s, extra.stream); },
            [&](const detail::Translate& tr) {
              return kernels::cpu::step<Family>(detail::translated_buffers(b, tr), s);
            });
      },
      [&] { enqueue_flagged<O>(std::span<const Buffers<O>>(&b, 1), s, extra); });
}

template <class O>
requires is_elementwise<O> StepResult
step(std::span<const ParamView> params, std::span<const GradView> grads,
     std::span<const std::span<const std::span<float>>> states, std::int64_t step, const O& o,
     const StepOptions& extra, std::span<void* const> params_out) {
  const char* opt = O::name;
  // The hyper-parameters, the step count and StepOptions are checked by the
  // single-tensor step itself, on no elements: a list accepts exactly what a
  // tensor alone accepts, with the same messages.
  {
    StepOptions none = extra;
    none.param_out = nullptr;
    none.noop_flag = nullptr;  // checked with each tensor's buffers
    const std::array<std::span<float>, slot_count<O>()> empty{};
    functional::step(ParamView{}, GradView{}, empty, step, o, none);
  }
  const detail::TensorList list(opt, params.size(), grads.size(), extra, params_out);
  check_state_count(o, states.size());
  const std::vector<Slot> slots = slots_of(o);
  for (std::size_t k = 0; k < slots.size(); ++k)
    list.check_length(plural(slots[k].label), states[k].size(), !slots[k].used);
  std::vector<Buffers<O>> buffers(list.size());
  detail::ListLocation location(opt);
  std::vector<std::span<float>> mine(slots.size());
  std::vector<detail::NamedBuffer> named;
  for (std::size_t i = 0; i < list.size(); ++i) {
    const std::string name = list.name(i);
    const StepOptions e = list.options(i);
    detail::check_step_buffers(name.c_str(), params[i], grads[i], e);
    for (std::size_t k = 0; k < slots.size(); ++k) mine[k] = detail::entry(states[k], i);
    buffers[i] = buffers_of(name.c_str(), o, params[i], grads[i], mine, e, named);
    location.add(i, name, named);
  }
  const auto s = kernels::Kernel<O>::scalars(o, step, extra.grad_mul);
  using Family = kernels::family_of<O>;
  return detail::run_list(
      opt, location.where(), grads, extra,
      [&] {
        bool finite = true;
        for (const auto& b : buffers) finite = kernels::cpu::step<Family>(b, s) && finite;
        return finite;
      },
      [&] {
        return detail::device_kernel(
            opt, extra.stream,
            [&] {
              return kernels::cuda::step<Family>(std::span<const Buffers<O>>(buffers), s,
                                                 extra.stream);
            },
            [&](const detail::Translate& tr) {
              bool finite = true;
              for (const auto& b : buffers)
                finite = kernels::cpu::step<Family>(detail::translated_buffers(b, tr), s) && finite;
              return finite;
            });
      },
      [&] { enqueue_flagged<O>(std::span<const Buffers<O>>(buffers), s, extra); });
}

}  // namespace shardopt::functional

namespace shardopt::detail {

template <class O>
requires is_elementwise<O>
bool trusted_host_step(const functional::ParamView& params, const functional::GradView& grads,
                       std::span<const std::span<float>> states, std::int64_t step,
                       const O& options, const functional::StepOptions& extra) {
  return kernels::cpu::step<kernels::family_of<O>>(
      functional::kernel_buffers(options, params, grads, states, extra),
      kernels::Kernel<O>::scalars(options, step, extra.grad_mul));
}

// Instantiated for the element-wise optimizers through a pointer to each
// (the list holds LAMB too, which has no such step).
template <class O, bool = is_elementwise<O>>
struct Trusted {};
template <class O>
struct Trusted<O, true> {
  static bool (*const run)(const functional::ParamView&, const functional::GradView&,
                           std::span<const std::span<float>>, std::int64_t, const O&,
                           const functional::StepOptions&);
};
template <class O>
bool (*const Trusted<O, true>::run)(const functional::ParamView&, const functional::GradView&,
                                    std::span<const std::span<float>>, std::int64_t, const O&,
                                    const functional::StepOptions&) = &trusted_host_step<O>;
#define SHARDOPT_INSTANTIATE_TRUSTED(O) template struct Trusted<O>;
SHARDOPT_OPTIMIZERS(SHARDOPT_INSTANTIATE_TRUSTED)
#undef SHARDOPT_INSTANTIATE_TRUSTED

}  // namespace shardopt::detail

namespace shardopt::functional {

// Every optimizer's steps, compiled here for the library's users.
#define SHARDOPT_INSTANTIATE_CHECK(O) template SHARDOPT_API void check_options<O>(const O&);
SHARDOPT_OPTIMIZERS(SHARDOPT_INSTANTIATE_CHECK)
#undef SHARDOPT_INSTANTIATE_CHECK

// The element-wise optimizers' two steps, instantiated here for the
// library's users: an explicit instantiation of Steps<O> defines its two
// pointers, whose initializers need the steps (LAMB's Steps is empty).
template <class O, bool = is_elementwise<O>>
struct Steps {};
template <class O>
struct Steps<O, true> {
  static StepResult (*const single)(ParamView, GradView, std::span<const std::span<float>>,
                                    std::int64_t, const O&, const StepOptions&);
  static StepResult (*const list)(std::span<const ParamView>, std::span<const GradView>,
                                  std::span<const std::span<const std::span<float>>>, std::int64_t,
                                  const O&, const StepOptions&, std::span<void* const>);
};
template <class O>
StepResult (*const Steps<O, true>::single)(ParamView, GradView, std::span<const std::span<float>>,
                                           std::int64_t, const O&,
                                           const StepOptions&) = &functional::step<O>;
template <class O>
StepResult (*const Steps<O, true>::list)(std::span<const ParamView>, std::span<const GradView>,
                                         std::span<const std::span<const std::span<float>>>,
                                         std::int64_t, const O&, const StepOptions&,
                                         std::span<void* const>) = &functional::step<O>;
#define SHARDOPT_INSTANTIATE_STEPS(O) template struct Steps<O>;
SHARDOPT_OPTIMIZERS(SHARDOPT_INSTANTIATE_STEPS)
#undef SHARDOPT_INSTANTIATE_STEPS

}  // namespace shardopt::functional
