// shardopt-train: the optimizer on the command line: the optimizers the
// trainer knows, the options that choose one and set its hyper-parameters
// (-o, --lr), and the shardopt::OptimizerConfig they make. All of it is in
// optimizer_options.cpp, apart from the lines of -o and --lr in the usage
// text (options.cpp).
#pragma once

#include <optional>
#include <span>
#include <string>
#include <string_view>

#include "../cli.hpp"
#include "shardopt/shardopt.hpp"

namespace train {

enum class OptimizerKind { sgd, adam, adamw, adagrad, rmsprop, lion, lamb };

// What the command line says of the optimizer.
struct OptimizerOptions {
  OptimizerKind kind = OptimizerKind::adamw;
  std::optional<double> lr;

  // The name -o takes ("adamw").
  const char* name() const;
  // --lr, or the optimizer's default.
  double learning_rate() const;
};

// The options of the optimizer and its hyper-parameters.
std::span<const cli::OptionSpec> optimizer_option_specs();

// Applies an option of optimizer_option_specs() to `o` and returns true;
// false for any other option. Throws cli::UsageError for a bad value.
bool apply_optimizer_option(OptimizerOptions& o, const cli::OptionSpec& spec,
                            const std::string& label, std::string_view value);

// The optimizer's configuration, at learning_rate().
shardopt::OptimizerConfig optimizer_config(const OptimizerOptions& o);

// fp32 optimizer-state bytes per parameter, for the ZeRO formula.
double state_bytes(const shardopt::OptimizerConfig& config);

}  // namespace train
