// shardopt internal: parsing of SHARDOPT_* variables, separate from the
// process-wide cache so it can be tested with any environment.
#pragma once

#include <functional>
#include <string>

#include "shardopt/config.hpp"

namespace shardopt::detail {

// Looks a variable up; returns nullptr when it is not set.
using EnvLookup = std::function<const char*(const char* name)>;

// Reads every SHARDOPT_* variable through `lookup`. Throws ConfigError naming
// the first variable with a bad value and the values it accepts.
Settings parse_settings(const EnvLookup& lookup);

}  // namespace shardopt::detail
