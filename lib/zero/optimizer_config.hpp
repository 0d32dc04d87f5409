// shardopt: what the engine reads of a parameter group's OptimizerConfig,
// from the optimizers' descriptors (shardopt/optimizers.hpp): its name and
// checkpoint key, its hyper-parameters as "key=value" lines and as JSON, and
// its state slots. A CustomOptimizer describes itself (name, state names).
#pragma once

#include <cstddef>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>
#include <type_traits>
#include <variant>
#include <vector>

#include "shardopt/zero.hpp"

namespace shardopt::detail {

// OptimizerConfig's alternative index: the kind of optimizer.
using OptKind = std::size_t;
inline constexpr OptKind kCustomKind = std::variant_size_v<OptimizerConfig> - 1;
static_assert(
    std::is_same_v<std::variant_alternative_t<kCustomKind, OptimizerConfig>, CustomOptimizer>);

// The kind of an optimizer type.
template <class O>
constexpr OptKind kind_of() {
  return OptimizerConfig(std::in_place_type<O>).index();
}

// torch's class name ("RMSprop"), or "custom".
inline const char* kind_name(const OptimizerConfig& c) {
  return std::visit(
      [](const auto& o) -> const char* {
        if constexpr (requires { o.key; })
          return std::remove_cvref_t<decltype(o)>::name;
        else
          return "custom";
      },
      c);
}

// The checkpoint's optimizer key ("rmsprop"), or "custom".
inline const char* kind_key(const OptimizerConfig& c) {
  return std::visit(
      [](const auto& o) -> const char* {
        if constexpr (requires { o.key; })
          return std::remove_cvref_t<decltype(o)>::key;
        else
          return "custom";
      },
      c);
}

// Calls f(name, value&) for every hyper-parameter of o: each field of its
// descriptor (double, bool or a pair of doubles), or a custom optimizer's lr.
template <class O, class F>
void each_hyper(O& o, F&& f) {
  if constexpr (is_optimizer<std::remove_cvref_t<O>>) {
    std::remove_cvref_t<O>::fields(
        [&](const char* name, auto member, const char*, Check) { f(name, o.*member); });
  } else {
    f("lr", o.lr);
  }
}

inline std::string format_number(double v) {
  std::ostringstream s;
  s.precision(17);
  s << v;
  return s.str();
}

// "<prefix>name=value" lines of every hyper-parameter (and a custom
// optimizer's name and state names).
inline std::string describe_hypers(const OptimizerConfig& c, const std::string& prefix) {
  std::ostringstream s;
  std::visit(
      [&](const auto& o) {
        each_hyper(o, [&](const char* name, const auto& v) {
          using T = std::remove_cvref_t<decltype(v)>;
          s << prefix << name << "=";
          if constexpr (std::is_same_v<T, std::pair<double, double>>)
            s << "(" << format_number(v.first) << ", " << format_number(v.second) << ")";
          else if constexpr (std::is_same_v<T, bool>)
            s << v;
          else
            s << format_number(v);
          s << "\n";
        });
        if constexpr (std::is_same_v<std::remove_cvref_t<decltype(o)>, CustomOptimizer>) {
          s << prefix << "name=" << o.name << "\n" << prefix << "state_names=";
          for (const auto& n : o.state_names) s << n << ",";
          s << "\n";
        }
      },
      c);
  return s.str();
}

// Every hyper-parameter as a JSON object keyed by field name (pairs as
// arrays of two), and a custom optimizer's name and state names.
inline nlohmann::ordered_json hypers_json(const OptimizerConfig& c) {
  nlohmann::ordered_json j = nlohmann::ordered_json::object();
  std::visit(
      [&](const auto& o) {
        if constexpr (std::is_same_v<std::remove_cvref_t<decltype(o)>, CustomOptimizer>) {
          j["name"] = o.name;
          j["state_names"] = o.state_names;
        }
        each_hyper(o, [&](const char* name, const auto& v) {
          using T = std::remove_cvref_t<decltype(v)>;
          if constexpr (std::is_same_v<T, std::pair<double, double>>)
            j[name] = {v.first, v.second};
          else
            j[name] = v;
        });
      },
      c);
  return j;
}

// The inverse of hypers_json for a group of the same kind: each field
// present in j is taken, the others kept; a custom optimizer takes its lr
// only. Throws json exceptions on a field of the wrong type.
template <class J>
void apply_hypers_json(OptimizerConfig& c, const J& j) {
  std::visit(
      [&](auto& o) {
        each_hyper(o, [&](const char* name, auto& v) {
          if (!j.contains(name)) return;
          using T = std::remove_cvref_t<decltype(v)>;
          if constexpr (std::is_same_v<T, std::pair<double, double>>)
            v = {j.at(name).at(0).template get<double>(), j.at(name).at(1).template get<double>()};
          else
            v = j.at(name).template get<T>();
        });
      },
      c);
}

// The state slots of a group's optimizer, in order (a custom optimizer's
// state names, each used, starting at 0).
inline std::vector<Slot> slots_of(const OptimizerConfig& c) {
  std::vector<Slot> v;
  std::visit(
      [&](const auto& o) {
        if constexpr (requires { o.key; }) {
          o.slots([&v](const Slot& s) { v.push_back(s); });
        } else {
          for (const std::string& n : o.state_names) v.push_back(Slot{n.c_str(), n.c_str()});
        }
      },
      c);
  return v;
}

}  // namespace shardopt::detail
