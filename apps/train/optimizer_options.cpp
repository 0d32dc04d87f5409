// shardopt-train: the optimizer on the command line (optimizer_options.hpp).
#include "optimizer_options.hpp"

#include <algorithm>
#include <iterator>
#include <variant>

#include "options.hpp"

namespace train {
namespace {

struct OptimizerEntry {
  OptimizerKind kind;
  const char* name;
  double default_lr;  // tuned on the default problem
};

constexpr OptimizerEntry kOptimizers[] = {
    {OptimizerKind::sgd, "sgd", 0.2},          {OptimizerKind::adam, "adam", 5e-3},
    {OptimizerKind::adamw, "adamw", 5e-3},     {OptimizerKind::adagrad, "adagrad", 1e-2},
    {OptimizerKind::rmsprop, "rmsprop", 1e-3}, {OptimizerKind::lion, "lion", 3e-4},
    {OptimizerKind::lamb, "lamb", 2e-2},
};

const OptimizerEntry& entry_of(OptimizerKind k) {
  for (const OptimizerEntry& e : kOptimizers) {
    if (e.kind == k) return e;
  }
  return kOptimizers[0];
}

constexpr cli::OptionSpec kOptimizerOptionSpecs[] = {
    {'o', "optimizer", true},
    {0, "lr", true},
};

}  // namespace

const char* OptimizerOptions::name() const { return entry_of(kind).name; }

double OptimizerOptions::learning_rate() const { return lr.value_or(entry_of(kind).default_lr); }

std::span<const cli::OptionSpec> optimizer_option_specs() { return kOptimizerOptionSpecs; }

bool apply_optimizer_option(OptimizerOptions& o, const cli::OptionSpec& spec,
                            const std::string& label, std::string_view v) {
  const std::string_view name = spec.long_name;
  if (name == "optimizer") {
    const auto it = std::find_if(std::begin(kOptimizers), std::end(kOptimizers),
                                 [&](const OptimizerEntry& e) { return v == e.name; });
    if (it == std::end(kOptimizers)) {
      cli::bad_value(label, v, "sgd adam adamw adagrad rmsprop lion lamb");
    }
    o.kind = it->kind;
  } else if (name == "lr") {
    o.lr = parse_number(label, v, false);
  } else {
    return false;
  }
  return true;
}

shardopt::OptimizerConfig optimizer_config(const OptimizerOptions& o) {
  const double lr = o.learning_rate();
  switch (o.kind) {
    case OptimizerKind::sgd: {
      shardopt::SGD c;
      c.lr = lr;
      c.momentum = 0.9;
      return c;
    }
    case OptimizerKind::adam: {
      shardopt::Adam c;
      c.lr = lr;
      return c;
    }
    case OptimizerKind::adamw: {
      shardopt::AdamW c;
      c.lr = lr;
      return c;
    }
    case OptimizerKind::adagrad: {
      shardopt::Adagrad c;
      c.lr = lr;
      return c;
    }
    case OptimizerKind::rmsprop: {
      shardopt::RMSprop c;
      c.lr = lr;
      return c;
    }
    case OptimizerKind::lion: {
      shardopt::Lion c;
      c.lr = lr;
      return c;
    }
    case OptimizerKind::lamb: {
      shardopt::Lamb c;
      c.lr = lr;
      return c;
    }
  }
  return shardopt::AdamW{};
}

double state_bytes(const shardopt::OptimizerConfig& config) {
  struct Visitor {
    double operator()(const shardopt::SGD& c) const { return c.momentum != 0.0 ? 4.0 : 0.0; }
    double operator()(const shardopt::Adam& c) const { return c.amsgrad ? 12.0 : 8.0; }
    double operator()(const shardopt::AdamW& c) const { return c.amsgrad ? 12.0 : 8.0; }
    double operator()(const shardopt::Adagrad&) const { return 4.0; }
    double operator()(const shardopt::RMSprop& c) const {
      return 4.0 + (c.centered ? 4.0 : 0.0) + (c.momentum != 0.0 ? 4.0 : 0.0);
    }
    double operator()(const shardopt::Lion&) const { return 4.0; }
    double operator()(const shardopt::Lamb&) const { return 8.0; }
    double operator()(const shardopt::CustomOptimizer& c) const {
      return 4.0 * static_cast<double>(c.state_names.size());
    }
  };
  return std::visit(Visitor{}, config);
}

}  // namespace train
