// shardopt: the optimizers, one descriptor each. A descriptor is the options
// struct (the names and defaults of torch.optim) plus what the rest of
// shardopt derives from it:
//
//   name, key       torch's class name ("RMSprop"), and its lower-case form
//                   ("rmsprop"): the checkpoint's optimizer key, the apps'
//                   -o value, the file names of its golden trajectories
//   fields(f)       every hyper-parameter in torch's order, as
//                   f(name, &O::member, what, check): the layout fingerprint,
//                   the checkpoint's group metadata, the apps' --flags and the
//                   range checks all come from this list
//   slots(f)        its per-element fp32 states in order, as f(Slot{...}),
//                   with whether the options use each one: the functional
//                   steps' state arguments, the engine's state buffers and the
//                   checkpoint's tensor names
//   counts_steps    whether a step takes the step count (bias corrections)
//   check_rules(f)  optional: rules between fields (SGD's nesterov)
//
// SHARDOPT_OPTIMIZERS below lists them, in the order of OptimizerConfig's
// alternatives; the build (kernels/meson.build) reads the same list to
// compile each optimizer's kernels from its math header,
// kernels/<key>.hpp. docs/optimizers.md describes how to add one.
#pragma once

#include <cstdint>
#include <string>
#include <type_traits>
#include <utility>

#include "shardopt/export.h"

namespace shardopt {

// The range of a hyper-parameter, with torch.optim's rules.
enum class Check : unsigned char {
  none,       // a flag, or any value
  finite,     // a finite number
  non_neg,    // >= 0 (not NaN)
  unit_open,  // in [0, 1), each of a pair
};

// One state slot of an optimizer: a per-element fp32 buffer.
struct SHARDOPT_API Slot {
  // The state's name in state_names(), gather_state() and checkpoints.
  const char* name;
  // Its name in the functional API's messages, with the option that needs it
  // when it is optional: "max_exp_avg_sq (amsgrad)".
  const char* label;
  // Whether the options use it; an unused slot takes no memory.
  bool used = true;
  // Why it is unused, for the message when one is passed anyway: "amsgrad is off".
  const char* unused_because = "";
  // Its value before the first step.
  double initial = 0.0;
};

// torch.optim.SGD. torch has no default learning rate (lr is required
// there); shardopt's 1e-3 is a placeholder to be set.
struct SHARDOPT_API SGD {
  double lr = 1e-3;
  double momentum = 0.0;
  double dampening = 0.0;
  double weight_decay = 0.0;  // L2: added to the gradient
  bool nesterov = false;      // needs momentum > 0 and dampening 0
  bool maximize = false;

  static constexpr const char* name = "SGD";
  static constexpr const char* key = "sgd";
  static constexpr bool counts_steps = true;  // step 1 starts the momentum buffer
  template <class F>
  static constexpr void fields(F&& f) {
    f("lr", &SGD::lr, "learning rate (lr)", Check::non_neg);
    f("momentum", &SGD::momentum, "momentum value", Check::non_neg);
    f("dampening", &SGD::dampening, "dampening value", Check::finite);
    f("weight_decay", &SGD::weight_decay, "weight_decay value", Check::non_neg);
    f("nesterov", &SGD::nesterov, "nesterov", Check::none);
    f("maximize", &SGD::maximize, "maximize", Check::none);
  }
  template <class F>
  constexpr void slots(F&& f) const {
    f(Slot{"momentum_buffer", "momentum_buffer", momentum != 0.0, "momentum is 0"});
  }
  // f(message, hint) for a rule between fields that the options break.
  template <class F>
  void check_rules(F&& f) const {
    if (nesterov && (momentum <= 0.0 || dampening != 0.0))
      f("Nesterov momentum requires a momentum and zero dampening (momentum " +
            std::to_string(momentum) + ", dampening " + std::to_string(dampening) + ")",
        "set momentum > 0 and dampening = 0 with nesterov, or turn nesterov off");
  }
};

// torch.optim.Adam.
struct SHARDOPT_API Adam {
  double lr = 1e-3;
  std::pair<double, double> betas = {0.9, 0.999};
  double eps = 1e-8;
  double weight_decay = 0.0;  // L2: added to the gradient
  bool amsgrad = false;
  bool maximize = false;

  static constexpr const char* name = "Adam";
  static constexpr const char* key = "adam";
  static constexpr bool counts_steps = true;
  template <class F>
  static constexpr void fields(F&& f) {
    f("lr", &Adam::lr, "learning rate (lr)", Check::non_neg);
    f("betas", &Adam::betas, "beta parameter", Check::unit_open);
    f("eps", &Adam::eps, "epsilon value (eps)", Check::non_neg);
    f("weight_decay", &Adam::weight_decay, "weight_decay value", Check::non_neg);
    f("amsgrad", &Adam::amsgrad, "amsgrad", Check::none);
    f("maximize", &Adam::maximize, "maximize", Check::none);
  }
  template <class F>
  constexpr void slots(F&& f) const {
    f(Slot{"exp_avg", "exp_avg"});
    f(Slot{"exp_avg_sq", "exp_avg_sq"});
    f(Slot{"max_exp_avg_sq", "max_exp_avg_sq (amsgrad)", amsgrad, "amsgrad is off"});
  }
};

// torch.optim.AdamW: decoupled weight decay, p *= 1 - lr * weight_decay.
struct SHARDOPT_API AdamW {
  double lr = 1e-3;
  std::pair<double, double> betas = {0.9, 0.999};
  double eps = 1e-8;
  double weight_decay = 1e-2;
  bool amsgrad = false;
  bool maximize = false;

  static constexpr const char* name = "AdamW";
  static constexpr const char* key = "adamw";
  static constexpr bool counts_steps = true;
  template <class F>
  static constexpr void fields(F&& f) {
    f("lr", &AdamW::lr, "learning rate (lr)", Check::non_neg);
    f("betas", &AdamW::betas, "beta parameter", Check::unit_open);
    f("eps", &AdamW::eps, "epsilon value (eps)", Check::non_neg);
    f("weight_decay", &AdamW::weight_decay, "weight_decay value", Check::non_neg);
    f("amsgrad", &AdamW::amsgrad, "amsgrad", Check::none);
    f("maximize", &AdamW::maximize, "maximize", Check::none);
  }
  template <class F>
  constexpr void slots(F&& f) const {
    f(Slot{"exp_avg", "exp_avg"});
    f(Slot{"exp_avg_sq", "exp_avg_sq"});
    f(Slot{"max_exp_avg_sq", "max_exp_avg_sq (amsgrad)", amsgrad, "amsgrad is off"});
  }
};

// torch.optim.Adagrad.
struct SHARDOPT_API Adagrad {
  double lr = 1e-2;
  double lr_decay = 0.0;  // step t uses lr / (1 + (t - 1) * lr_decay)
  double weight_decay = 0.0;
  double initial_accumulator_value = 0.0;  // the initial state_sum
  double eps = 1e-10;
  bool maximize = false;

  static constexpr const char* name = "Adagrad";
  static constexpr const char* key = "adagrad";
  static constexpr bool counts_steps = true;
  template <class F>
  static constexpr void fields(F&& f) {
    f("lr", &Adagrad::lr, "learning rate (lr)", Check::non_neg);
    f("lr_decay", &Adagrad::lr_decay, "lr_decay value", Check::non_neg);
    f("weight_decay", &Adagrad::weight_decay, "weight_decay value", Check::non_neg);
    f("initial_accumulator_value", &Adagrad::initial_accumulator_value,
      "initial_accumulator_value value", Check::non_neg);
    f("eps", &Adagrad::eps, "epsilon value (eps)", Check::non_neg);
    f("maximize", &Adagrad::maximize, "maximize", Check::none);
  }
  template <class F>
  constexpr void slots(F&& f) const {
    f(Slot{"sum", "state_sum", true, "", initial_accumulator_value});
  }
};

// torch.optim.RMSprop.
struct SHARDOPT_API RMSprop {
  double lr = 1e-2;
  double alpha = 0.99;
  double eps = 1e-8;  // added outside the square root
  double weight_decay = 0.0;
  double momentum = 0.0;
  bool centered = false;
  bool maximize = false;

  static constexpr const char* name = "RMSprop";
  static constexpr const char* key = "rmsprop";
  static constexpr bool counts_steps = false;  // no bias correction
  template <class F>
  static constexpr void fields(F&& f) {
    f("lr", &RMSprop::lr, "learning rate (lr)", Check::non_neg);
    f("alpha", &RMSprop::alpha, "alpha value", Check::non_neg);
    f("eps", &RMSprop::eps, "epsilon value (eps)", Check::non_neg);
    f("weight_decay", &RMSprop::weight_decay, "weight_decay value", Check::non_neg);
    f("momentum", &RMSprop::momentum, "momentum value", Check::non_neg);
    f("centered", &RMSprop::centered, "centered", Check::none);
    f("maximize", &RMSprop::maximize, "maximize", Check::none);
  }
  template <class F>
  constexpr void slots(F&& f) const {
    f(Slot{"square_avg", "square_avg"});
    f(Slot{"grad_avg", "grad_avg (centered)", centered, "centered is off"});
    f(Slot{"momentum_buffer", "momentum_buffer", momentum != 0.0, "momentum is 0"});
  }
};

// Lion (Chen et al. 2023; torch.optim has none): the sign of an
// interpolated momentum, decoupled weight decay p *= 1 - lr * weight_decay.
struct SHARDOPT_API Lion {
  double lr = 1e-4;
  std::pair<double, double> betas = {0.9, 0.99};
  double weight_decay = 0.0;
  bool maximize = false;

  static constexpr const char* name = "Lion";
  static constexpr const char* key = "lion";
  static constexpr bool counts_steps = false;
  template <class F>
  static constexpr void fields(F&& f) {
    f("lr", &Lion::lr, "learning rate (lr)", Check::non_neg);
    f("betas", &Lion::betas, "beta parameter", Check::unit_open);
    f("weight_decay", &Lion::weight_decay, "weight_decay value", Check::non_neg);
    f("maximize", &Lion::maximize, "maximize", Check::none);
  }
  template <class F>
  constexpr void slots(F&& f) const {
    f(Slot{"exp_avg", "exp_avg"});
  }
};

// LAMB (You et al. 2020; torch.optim has none): Adam's direction plus
// weight_decay * p, scaled per tensor by the trust ratio ||p|| / ||r||. Not
// element-wise: its step needs whole tensors' norms (functional::lamb).
struct SHARDOPT_API Lamb {
  double lr = 1e-3;
  std::pair<double, double> betas = {0.9, 0.999};
  double eps = 1e-6;
  double weight_decay = 0.01;
  bool maximize = false;

  static constexpr const char* name = "Lamb";
  static constexpr const char* key = "lamb";
  static constexpr bool counts_steps = true;
  static constexpr bool per_tensor_norms = true;
  template <class F>
  static constexpr void fields(F&& f) {
    f("lr", &Lamb::lr, "learning rate (lr)", Check::non_neg);
    f("betas", &Lamb::betas, "beta parameter", Check::unit_open);
    f("eps", &Lamb::eps, "epsilon value (eps)", Check::non_neg);
    f("weight_decay", &Lamb::weight_decay, "weight_decay value", Check::non_neg);
    f("maximize", &Lamb::maximize, "maximize", Check::none);
  }
  template <class F>
  constexpr void slots(F&& f) const {
    f(Slot{"exp_avg", "exp_avg"});
    f(Slot{"exp_avg_sq", "exp_avg_sq"});
  }
};

// torch.optim.NAdam: Adam with Nesterov momentum, whose coefficient mu_t
// rises towards beta1 as momentum_decay sets. Options of torch 2
// (decoupled_weight_decay, maximize) included; docs/optimizers.md.
struct SHARDOPT_API NAdam {
  double lr = 2e-3;
  std::pair<double, double> betas = {0.9, 0.999};
  double eps = 1e-8;
  double weight_decay = 0.0;
  double momentum_decay = 4e-3;
  bool decoupled_weight_decay = false;  // p *= 1 - lr * weight_decay instead of L2
  bool maximize = false;

  static constexpr const char* name = "NAdam";
  static constexpr const char* key = "nadam";
  static constexpr bool counts_steps = true;
  template <class F>
  static constexpr void fields(F&& f) {
    f("lr", &NAdam::lr, "learning rate (lr)", Check::non_neg);
    f("betas", &NAdam::betas, "beta parameter", Check::unit_open);
    f("eps", &NAdam::eps, "epsilon value (eps)", Check::non_neg);
    f("weight_decay", &NAdam::weight_decay, "weight_decay value", Check::non_neg);
    f("momentum_decay", &NAdam::momentum_decay, "momentum_decay value", Check::non_neg);
    f("decoupled_weight_decay", &NAdam::decoupled_weight_decay, "decoupled_weight_decay",
      Check::none);
    f("maximize", &NAdam::maximize, "maximize", Check::none);
  }
  template <class F>
  constexpr void slots(F&& f) const {
    f(Slot{"exp_avg", "exp_avg"});
    f(Slot{"exp_avg_sq", "exp_avg_sq"});
  }
};

// torch.optim.RAdam: Adam whose adaptive step is rectified for the variance
// of its early steps, plain momentum steps until that variance is tractable.
// Options of torch 2 (decoupled_weight_decay, maximize) included;
// docs/optimizers.md.
struct SHARDOPT_API RAdam {
  double lr = 1e-3;
  std::pair<double, double> betas = {0.9, 0.999};
  double eps = 1e-8;
  double weight_decay = 0.0;
  bool decoupled_weight_decay = false;  // p *= 1 - lr * weight_decay instead of L2
  bool maximize = false;

  static constexpr const char* name = "RAdam";
  static constexpr const char* key = "radam";
  static constexpr bool counts_steps = true;
  template <class F>
  static constexpr void fields(F&& f) {
    f("lr", &RAdam::lr, "learning rate (lr)", Check::non_neg);
    f("betas", &RAdam::betas, "beta parameter", Check::unit_open);
    f("eps", &RAdam::eps, "epsilon value (eps)", Check::non_neg);
    f("weight_decay", &RAdam::weight_decay, "weight_decay value", Check::non_neg);
    f("decoupled_weight_decay", &RAdam::decoupled_weight_decay, "decoupled_weight_decay",
      Check::none);
    f("maximize", &RAdam::maximize, "maximize", Check::none);
  }
  template <class F>
  constexpr void slots(F&& f) const {
    f(Slot{"exp_avg", "exp_avg"});
    f(Slot{"exp_avg_sq", "exp_avg_sq"});
  }
};

// Every optimizer, in the order of OptimizerConfig's alternatives (checkpoints
// name optimizers by key, so the order is free). kernels/meson.build reads
// this list: one name per line, each as X(Name).
#define SHARDOPT_OPTIMIZERS(X) \
  X(SGD)                       \
  X(Adam)                      \
  X(AdamW)                     \
  X(Adagrad)                   \
  X(RMSprop)                   \
  X(Lion)                      \
  X(Lamb)                      \
  X(NAdam)                     \
  X(RAdam)

// ------------------------------------------------------------------------
// What the descriptors give, for generic code.

template <class... O>
struct OptimizerList {
  static constexpr std::size_t size = sizeof...(O);
  // Calls f.template operator()<O>() for each optimizer, in order.
  template <class F>
  static constexpr void each(F&& f) {
    (f.template operator()<O>(), ...);
  }
};

#define SHARDOPT_OPTIMIZER_TYPE_(O) , O
namespace detail {
template <class... O>
OptimizerList<O...> optimizer_list_of(void (*)(int, O...));
}  // namespace detail
// OptimizerList<SGD, Adam, ...>: every optimizer of SHARDOPT_OPTIMIZERS.
using Optimizers = decltype(detail::optimizer_list_of(
    static_cast<void (*)(int SHARDOPT_OPTIMIZERS(SHARDOPT_OPTIMIZER_TYPE_))>(nullptr)));
#undef SHARDOPT_OPTIMIZER_TYPE_

// Whether O is one of the optimizers.
template <class O, class List = Optimizers>
inline constexpr bool is_optimizer = false;
template <class O, class... All>
inline constexpr bool is_optimizer<O, OptimizerList<All...>> = (std::is_same_v<O, All> || ...);

// Whether O's step is element-wise (functional::step); LAMB's is not.
template <class O>
inline constexpr bool is_elementwise = is_optimizer<O> && !requires {
  O::per_tensor_norms;
};

// The number of state slots of O (used or not).
template <class O>
constexpr int slot_count() {
  int n = 0;
  O{}.slots([&n](const Slot&) { ++n; });
  return n;
}

}  // namespace shardopt
