// shardopt internal: how the caller numbers parameters and groups, for
// messages that name one by its index.
#pragma once

#include <string>

namespace shardopt::detail {

// The index a caller gives the first parameter (and the first group): 0 for
// C++ and C, 1 for Fortran, whose module numbers them as Fortran arrays.
// Process-wide; the C API's shardopt_set_language sets it, once, before
// any optimizer exists.
int index_base() noexcept;
void set_index_base(int base) noexcept;

// Index i (0-based inside the library) as the caller numbers it: every
// message that names a parameter or a group by index spells it with this.
std::string index_text(long long i);

}  // namespace shardopt::detail
