// shardopt: optimizer spec strings (hparams.hpp).
#include "hparams.hpp"

#include <cerrno>
#include <cmath>
#include <cstdlib>
#include <optional>
#include <type_traits>
#include <utility>
#include <variant>
#include <vector>

#include "common/check.hpp"
#include "shardopt/optim.hpp"

namespace shardopt::capi {
namespace {

std::vector<std::string_view> split_words(std::string_view s) {
  std::vector<std::string_view> words;
  std::size_t i = 0;
  while (i < s.size()) {
    while (i < s.size() && (s[i] == ' ' || s[i] == '\t' || s[i] == '\n')) ++i;
    std::size_t j = i;
    while (j < s.size() && s[j] != ' ' && s[j] != '\t' && s[j] != '\n') ++j;
    if (j > i) words.push_back(s.substr(i, j - i));
    i = j;
  }
  return words;
}

std::string keys() {
  std::string k;
  Optimizers::each([&]<class O>() { k += (k.empty() ? "" : " ") + std::string(O::key); });
  return k;
}

template <class O>
std::string field_names() {
  std::string names;
  O::fields([&](const char* name, auto member, const char*, Check) {
    using T = std::remove_cvref_t<decltype(O{}.*member)>;
    names += (names.empty() ? "" : " ") + std::string(name);
    if constexpr (std::is_same_v<T, bool>)
      names += "=true|false";
    else if constexpr (std::is_same_v<T, std::pair<double, double>>)
      names += "=a,b";
  });
  return names;
}

std::optional<double> parse_number(std::string_view text) {
  const std::string s(text);
  if (s.empty()) return std::nullopt;
  char* end = nullptr;
  errno = 0;
  const double v = std::strtod(s.c_str(), &end);
  if (end != s.c_str() + s.size() || errno == ERANGE) return std::nullopt;
  return v;
}

template <class O>
void set_field(O& o, std::string_view name, std::string_view value) {
  bool found = false;
  O::fields([&](const char* field, auto member, const char*, Check) {
    if (name != field) return;
    found = true;
    auto& v = o.*member;
    using T = std::remove_cvref_t<decltype(v)>;
    const std::string where =
        std::string(O::key) + ": " + std::string(name) + "=" + std::string(value);
    if constexpr (std::is_same_v<T, bool>) {
      if (value == "true" || value == "1")
        v = true;
      else if (value == "false" || value == "0")
        v = false;
      else
        SHARDOPT_THROW(invalid_argument, where + " is not a flag",
                       "write " + std::string(name) + "=true or " + std::string(name) + "=false");
    } else if constexpr (std::is_same_v<T, std::pair<double, double>>) {
      const auto comma = value.find(',');
      const auto a =
          comma == std::string_view::npos ? std::nullopt : parse_number(value.substr(0, comma));
      const auto b =
          comma == std::string_view::npos ? std::nullopt : parse_number(value.substr(comma + 1));
      if (!a || !b)
        SHARDOPT_THROW(invalid_argument, where + " is not a pair of numbers",
                       "write two numbers separated by a comma, no space: " + std::string(name) +
                           "=0.9,0.999");
      v = {*a, *b};
    } else {
      const auto x = parse_number(value);
      if (!x)
        SHARDOPT_THROW(invalid_argument, where + " is not a number",
                       "write a number as C's strtod reads it: " + std::string(name) + "=1e-3");
      v = *x;
    }
  });
  if (!found)
    SHARDOPT_THROW(invalid_argument,
                   std::string(O::key) + " has no hyper-parameter '" + std::string(name) + "'",
                   "its hyper-parameters are: " + field_names<O>());
}

template <class O>
void apply_words(O& o, const std::vector<std::string_view>& words, std::size_t first) {
  for (std::size_t i = first; i < words.size(); ++i) {
    const auto eq = words[i].find('=');
    if (eq == std::string_view::npos || eq == 0)
      SHARDOPT_THROW(
          invalid_argument,
          std::string(O::key) + ": '" + std::string(words[i]) + "' is not a name=value pair",
          "write the hyper-parameters as name=value separated by spaces, e.g. "
          "\"lr=1e-3\"; " +
              std::string(O::key) + " takes: " + field_names<O>());
    set_field(o, words[i].substr(0, eq), words[i].substr(eq + 1));
  }
  functional::check_options(o);
}

}  // namespace

OptimizerConfig parse_spec(std::string_view spec) {
  const auto words = split_words(spec);
  if (words.empty())
    SHARDOPT_THROW(
        invalid_argument, "the optimizer spec is empty",
        "begin it with the optimizer's key, one of: " + keys() + " (e.g. \"adamw lr=1e-3\")");
  std::optional<OptimizerConfig> config;
  Optimizers::each([&]<class O>() {
    if (words[0] != O::key) return;
    O o;
    apply_words(o, words, 1);
    config = o;
  });
  if (!config)
    SHARDOPT_THROW(invalid_argument, "unknown optimizer '" + std::string(words[0]) + "'",
                   "use one of: " + keys() + " (lower case), then name=value pairs");
  return *config;
}

void apply_pairs(OptimizerConfig& config, std::string_view pairs) {
  const auto words = split_words(pairs);
  std::visit(
      [&](auto& o) {
        using O = std::remove_cvref_t<decltype(o)>;
        if constexpr (is_optimizer<O>) {
          O copy = o;
          apply_words(copy, words, 0);
          o = copy;
        } else {
          SHARDOPT_THROW(unsupported, "a custom optimizer has no named hyper-parameters",
                         "set its learning rate with set_lr");
        }
      },
      config);
}

double field_value(const OptimizerConfig& config, std::string_view name) {
  std::optional<double> value;
  std::visit(
      [&](const auto& o) {
        using O = std::remove_cvref_t<decltype(o)>;
        if constexpr (is_optimizer<O>) {
          O::fields([&](const char* field, auto member, const char*, Check) {
            const std::string_view f = field;
            using T = std::remove_cvref_t<decltype(o.*member)>;
            if constexpr (std::is_same_v<T, std::pair<double, double>>) {
              if (name == f || name == std::string(f) + ".0") value = (o.*member).first;
              if (name == std::string(f) + ".1") value = (o.*member).second;
            } else if (name == f) {
              value = static_cast<double>(o.*member);
            }
          });
          if (!value)
            SHARDOPT_THROW(
                invalid_argument,
                std::string(O::key) + " has no hyper-parameter '" + std::string(name) + "'",
                "its hyper-parameters are: " + field_names<O>() +
                    " (a pair's values as name.0 and name.1)");
        } else {
          if (name == "lr") value = o.lr;
          if (!value)
            SHARDOPT_THROW(invalid_argument,
                           "a custom optimizer has no hyper-parameter '" + std::string(name) + "'",
                           "ask for lr");
        }
      },
      config);
  return *value;
}

}  // namespace shardopt::capi
