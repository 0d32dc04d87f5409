// The library's cap on the CPU kernels' vector unit (kernels/cpu/isa.hpp):
// SHARDOPT_CPU_ISA, from the settings. The kernels ask for it; they read no
// setting themselves.
#include "kernels/cpu/isa.hpp"
#include "shardopt/config.hpp"

namespace shardopt::kernels::cpu::detail {

Isa configured_isa_cap() { return static_cast<Isa>(static_cast<int>(settings().cpu_isa)); }

}  // namespace shardopt::kernels::cpu::detail
