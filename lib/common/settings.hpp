// shardopt internal: parsing of SHARDOPT_* variables, separate from the
// process-wide cache so it can be tested with any environment.
#pragma once

#include <functional>
#include <string>
#include <vector>

#include "shardopt/config.hpp"

namespace shardopt::detail {

// Looks a variable up; returns nullptr when it is not set.
using EnvLookup = std::function<const char*(const char* name)>;

// Reads every SHARDOPT_* variable through `lookup`. Throws ConfigError naming
// the first variable with a bad value and the values it accepts.
Settings parse_settings(const EnvLookup& lookup);

// A variable every rank must set alike (EnvVarInfo::same_on_every_rank).
struct AgreedSetting {
  std::string name;
  std::string raw;            // as set ("" unset or empty: the default)
  std::string default_value;  // as docs/env.md gives it
  std::string value;          // the value in force, parsed, as text: what ranks compare
};

// Each such variable, in table order, with its value in `s` and as
// `lookup` finds it set. Local.
std::vector<AgreedSetting> agreed_settings(const Settings& s, const EnvLookup& lookup);

}  // namespace shardopt::detail
