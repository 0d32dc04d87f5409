// shardopt-train: the optimizer on the command line, from the optimizers'
// descriptors (shardopt/optimizers.hpp): -o takes any optimizer's key, --lr
// its learning rate, and every hyper-parameter of every optimizer is a flag
// named after its field (--weight-decay, --betas 0.9,0.99, --amsgrad, ...),
// accepted for the optimizers that have it. Nothing here names an optimizer
// but the learning rates tuned on the default problem.
#pragma once

#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "../support/cli.hpp"
#include "shardopt/shardopt.hpp"

namespace train {

// What the command line says of the optimizer.
struct OptimizerOptions {
  std::string key = "adamw";
  std::optional<double> lr;
  // Hyper-parameter flags in the order given: (field name, value; "1" for a flag without one).
  std::vector<std::pair<std::string, std::string>> fields;

  // The name -o takes ("adamw").
  const char* name() const { return key.c_str(); }
  // --lr, or the learning rate tuned for the optimizer on the default problem
  // (its torch default where none was tuned).
  double learning_rate() const;
};

// The options of the optimizer and its hyper-parameters.
std::span<const cli::OptionSpec> optimizer_option_specs();

// Applies an option of optimizer_option_specs() to `o` and returns true;
// false for any other option. Throws cli::UsageError for a bad value.
bool apply_optimizer_option(OptimizerOptions& o, const cli::OptionSpec& spec,
                            const std::string& label, std::string_view value);

// The optimizer's configuration: torch's defaults, the trainer's tuned ones,
// then the flags, at learning_rate(). Throws cli::UsageError for a flag the
// optimizer does not have, or a value of the wrong form.
shardopt::OptimizerConfig optimizer_config(const OptimizerOptions& o);

// On resume, after load() restored the checkpoint's hyper-parameters into
// `group`: sets over them those the command line gives (its flags; not the
// defaults of those it leaves out). Returns one line for each that changed,
// "--weight-decay 0.1 (the checkpoint's 0.01)".
std::vector<std::string> apply_given_fields(const OptimizerOptions& o,
                                            shardopt::OptimizerConfig& group);

// "0.01", the shortest text that reads back as the same double.
std::string number_text(double v);

// The usage text of the optimizers: each one's flags.
std::string optimizer_usage();

}  // namespace train
