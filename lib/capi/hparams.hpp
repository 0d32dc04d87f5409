// shardopt internal: optimizers as spec strings ("adamw lr=1e-3 betas=0.9,0.999"),
// the C API's and the Fortran module's way to name an optimizer and its
// hyper-parameters (shardopt.h). The field names, ranges and defaults are
// those of shardopt/optimizers.hpp.
#pragma once

#include <string>
#include <string_view>

#include "shardopt/zero.hpp"

namespace shardopt::capi {

// The optimizer of `spec`: its key, then name=value pairs separated by
// spaces; unset fields keep their defaults; checked as torch checks them.
// Throws InvalidArgument naming the unknown key or field, the malformed or
// out-of-range value, and what is accepted.
OptimizerConfig parse_spec(std::string_view spec);

// Sets the fields named in `pairs` ("name=value ...") of config, checked as
// a whole; on an error config is unchanged.
void apply_pairs(OptimizerConfig& config, std::string_view pairs);

// Field `name` as a number: a flag 0 or 1; a pair's first value for
// "betas", either one for "betas.0" / "betas.1".
double field_value(const OptimizerConfig& config, std::string_view name);

}  // namespace shardopt::capi
