// shardopt-train: the optimizer on the command line (optimizer_options.hpp).
#include "optimizer_options.hpp"

#include <algorithm>
#include <charconv>
#include <map>
#include <type_traits>
#include <variant>

#include "options.hpp"

namespace train {
namespace {

// Learning rates tuned on the default problem (and SGD's momentum); an
// optimizer without one starts from torch's default.
const std::map<std::string, double>& tuned_lr() {
  static const std::map<std::string, double> lr = {
      {"sgd", 0.2},   {"adam", 5e-3}, {"adamw", 5e-3}, {"adagrad", 1e-2}, {"rmsprop", 1e-3},
      {"lion", 3e-4}, {"lamb", 2e-2}, {"nadam", 5e-3}, {"radam", 1e-2},
  };
  return lr;
}

// "weight_decay" as a flag: "weight-decay".
std::string flag_of(const char* field) {
  std::string f = field;
  std::replace(f.begin(), f.end(), '_', '-');
  return f;
}

// Every field of every optimizer but lr, once: its flag and whether it takes a value.
struct FieldFlag {
  std::string flag;
  std::string field;
  bool takes_value;
};
const std::vector<FieldFlag>& field_flags() {
  static const std::vector<FieldFlag> flags = [] {
    std::vector<FieldFlag> v;
    shardopt::Optimizers::each([&]<class O>() {
      O::fields([&](const char* name, auto member, const char*, shardopt::Check) {
        using T = std::remove_cvref_t<decltype(O{}.*member)>;
        if (std::string_view(name) == "lr") return;
        if (std::none_of(v.begin(), v.end(), [&](const FieldFlag& f) { return f.field == name; }))
          v.push_back({flag_of(name), name, !std::is_same_v<T, bool>});
      });
    });
    return v;
  }();
  return flags;
}

std::string keys() {
  std::string k;
  shardopt::Optimizers::each([&]<class O>() { k += (k.empty() ? "" : " ") + std::string(O::key); });
  return k;
}

// The flags of O, as the usage and its errors list them.
template <class O>
std::string flags_of() {
  std::string f;
  O::fields([&](const char* name, auto, const char*, shardopt::Check) {
    f += (f.empty() ? "--" : " --") + flag_of(name);
  });
  return f;
}

// Sets field `name` of o from the text of its flag; false if O has no such field.
template <class O>
bool set_field(O& o, const std::string& name, const std::string& value) {
  bool found = false;
  O::fields([&](const char* field, auto member, const char*, shardopt::Check) {
    if (name != field) return;
    found = true;
    auto& v = o.*member;
    using T = std::remove_cvref_t<decltype(v)>;
    const std::string label = "--" + flag_of(field);
    if constexpr (std::is_same_v<T, bool>) {
      v = value != "0";
    } else if constexpr (std::is_same_v<T, std::pair<double, double>>) {
      const auto comma = value.find(',');
      if (comma == std::string::npos) cli::bad_value(label, value, "two numbers: A,B");
      v = {parse_number(label, std::string_view(value).substr(0, comma), true),
           parse_number(label, std::string_view(value).substr(comma + 1), true)};
    } else {
      v = parse_number(label, value, true);
    }
  });
  return found;
}

std::vector<cli::OptionSpec> make_specs() {
  std::vector<cli::OptionSpec> specs = {{'o', "optimizer", true}, {0, "lr", true}};
  for (const FieldFlag& f : field_flags()) specs.push_back({0, f.flag.c_str(), f.takes_value});
  return specs;
}

}  // namespace

double OptimizerOptions::learning_rate() const {
  if (lr) return *lr;
  const auto it = tuned_lr().find(key);
  if (it != tuned_lr().end()) return it->second;
  double fallback = 1e-3;
  shardopt::Optimizers::each([&]<class O>() {
    if (key == O::key) fallback = O{}.lr;
  });
  return fallback;
}

std::span<const cli::OptionSpec> optimizer_option_specs() {
  static const std::vector<cli::OptionSpec> specs = make_specs();
  return specs;
}

bool apply_optimizer_option(OptimizerOptions& o, const cli::OptionSpec& spec,
                            const std::string& label, std::string_view v) {
  const std::string_view name = spec.long_name;
  if (name == "optimizer") {
    bool known = false;
    shardopt::Optimizers::each([&]<class O>() { known = known || v == O::key; });
    if (!known) cli::bad_value(label, v, keys());
    o.key = v;
    return true;
  }
  if (name == "lr") {
    o.lr = parse_number(label, v, false);
    return true;
  }
  for (const FieldFlag& f : field_flags()) {
    if (name != f.flag) continue;
    o.fields.emplace_back(f.field, f.takes_value ? std::string(v) : std::string("1"));
    return true;
  }
  return false;
}

shardopt::OptimizerConfig optimizer_config(const OptimizerOptions& o) {
  std::optional<shardopt::OptimizerConfig> config;
  shardopt::Optimizers::each([&]<class O>() {
    if (o.key != O::key) return;
    O c{};
    if constexpr (std::is_same_v<O, shardopt::SGD>) c.momentum = 0.9;  // the tuned default
    for (const auto& [field, value] : o.fields)
      if (!set_field(c, field, value))
        throw cli::UsageError{"--" + flag_of(field.c_str()) + " is not an option of " + O::name +
                              ", whose options are " + flags_of<O>()};
    c.lr = o.learning_rate();
    config = c;
  });
  return *config;
}

std::string number_text(double v) {
  char b[32];
  const auto r = std::to_chars(b, b + sizeof b, v);
  return std::string(b, r.ptr);
}

namespace {

template <class T>
std::string field_text(const T& v) {
  if constexpr (std::is_same_v<T, bool>) {
    return v ? "on" : "off";
  } else if constexpr (std::is_same_v<T, std::pair<double, double>>) {
    return number_text(v.first) + "," + number_text(v.second);
  } else {
    return number_text(static_cast<double>(v));
  }
}

}  // namespace

std::vector<std::string> apply_given_fields(const OptimizerOptions& o,
                                            shardopt::OptimizerConfig& group) {
  const shardopt::OptimizerConfig given = optimizer_config(o);
  std::vector<std::string> changed;
  shardopt::Optimizers::each([&]<class O>() {
    O* to = std::get_if<O>(&group);
    const O* from = std::get_if<O>(&given);
    if (to == nullptr || from == nullptr) return;
    for (const auto& given_field : o.fields) {
      const std::string& field = given_field.first;
      O::fields([&](const char* name, auto member, const char*, shardopt::Check) {
        if (field != name || to->*member == from->*member) return;
        changed.push_back("--" + flag_of(name) + " " + field_text(from->*member) +
                          " (the checkpoint's " + field_text(to->*member) + ")");
        to->*member = from->*member;
      });
    }
  });
  return changed;
}

std::string optimizer_usage() {
  std::string u =
      "Optimizers (-o) and their hyper-parameters (torch's names and defaults, but the\n"
      "default --lr, in parentheses, tuned on the default problem; --betas takes A,B, flags\n"
      "like --amsgrad take no value; docs/optimizers.md):\n";
  shardopt::Optimizers::each([&]<class O>() {
    std::string line = "  " + std::string(O::key) + ":";
    line.resize(12, ' ');
    OptimizerOptions o;
    o.key = O::key;
    std::string flags = flags_of<O>();
    flags.insert(flags.find("--lr") + 4, " (" + number_text(o.learning_rate()) + ")");
    u += line + flags + "\n";
  });
  return u;
}

}  // namespace train
