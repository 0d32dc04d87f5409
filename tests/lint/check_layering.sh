#!/usr/bin/env bash
# Fails if a source includes a header of a layer above its own (the layering
# rules of docs/design.md), or if a directory of lib/ has no rule:
#   include/shardopt/  public headers: no internal header at all
#   lib/common/        nothing of device/, comm/, ckpt/, zero/, optim/, kernels/,
#                      capi/
#   lib/device/        nothing of comm/, ckpt/, zero/, optim/, kernels/, capi/:
#                      the device runtime, its CUDA and NCCL implementations
#   (comm/, optim/ and zero/ may include device/; no other directory may)
#   lib/comm/          nothing of ckpt/, zero/, optim/, capi/, and of
#                      kernels/ only kernels/reduce.hpp (the reductions its
#                      shared-memory collectives run)
#   lib/ckpt/          nothing of zero/, optim/, kernels/, capi/, and of comm/
#                      only comm/agree.hpp
#   lib/optim/         nothing of comm/, ckpt/, zero/, capi/
#   lib/zero/          nothing of capi/, and of comm/ only comm/agree.hpp and
#                      comm/node_access.hpp (the Communicator's node access)
#   lib/capi/          nothing of comm/, ckpt/, zero/, optim/, kernels/: the C
#                      API is a layer on the public C++ API (and common/'s
#                      errors)
#   lib/fortran/,      nothing internal (the Fortran module is a layer on the
#   lib/cmake/         C API; the CMake package files)
#   kernels/           nothing of common/, comm/, ckpt/, zero/, optim/, capi/
#   apps/              public headers (and its own) only: nothing of common/,
#                      comm/, ckpt/, zero/, optim/, kernels/, capi/, except
#                      comm/mpi/mpi_types.hpp (shardopt-bench-op times the
#                      bf16/f16 MPI ops it declares) and kernels/cpu/isa.hpp
#                      (shardopt-bench-optim's limit kernels run on the
#                      optimizer kernels' vector unit)
# Before checking the tree, it checks itself on a small tree with one
# violation of each rule, which must all be found.
# Usage: check_layering.sh SOURCE_ROOT
set -u

# dir;forbidden include path (extended regex);except (regex, or empty);what it may include
rules=(
  'include/shardopt;(common|device|comm|ckpt|zero|optim|kernels|capi)/;;the standard library, <mpi.h> and shardopt/ headers'
  'lib/common;(device|comm|ckpt|zero|optim|kernels|capi)/;;common/ and shardopt/ headers'
  'lib/device;(comm|ckpt|zero|optim|kernels|capi)/;;device/, common/ and shardopt/ headers'
  'lib/comm;(ckpt|zero|optim|kernels|capi)/;kernels/reduce\.hpp;comm/, device/, common/, shardopt/ headers and kernels/reduce.hpp'
  'lib/ckpt;(device|comm|zero|optim|kernels|capi)/;comm/agree\.hpp;ckpt/, common/, shardopt/ headers and comm/agree.hpp'
  'lib/optim;(comm|ckpt|zero|capi)/;;optim/, kernels/, device/, common/ and shardopt/ headers'
  'lib/zero;(comm|capi)/;comm/(agree|node_access)\.hpp;zero/, ckpt/, optim/, kernels/, device/, common/, shardopt/ headers, comm/agree.hpp and comm/node_access.hpp'
  'lib/capi;(device|comm|ckpt|zero|optim|kernels)/;;capi/, common/ and shardopt/ headers'
  'lib/fortran;(common|device|comm|ckpt|zero|optim|kernels|capi)/;;shardopt/ headers'
  'lib/cmake;(common|device|comm|ckpt|zero|optim|kernels|capi)/;;shardopt/ headers'
  'kernels;(common|device|comm|ckpt|zero|optim|capi)/;;kernels/ and shardopt/ headers'
  'apps;(common|device|comm|ckpt|zero|optim|kernels|capi)/;(comm/mpi/mpi_types|kernels/cpu/isa)\.hpp;shardopt/ headers, its own, comm/mpi/mpi_types.hpp and kernels/cpu/isa.hpp'
)

# Prints a line for each directory of ROOT/lib without a rule.
check_dirs() {
  local root=$1 d rule found
  for d in "$root"/lib/*/; do
    [ -d "$d" ] || continue
    d=lib/$(basename "$d")
    found=0
    for rule in "${rules[@]}"; do [ "${rule%%;*}" = "$d" ] && found=1; done
    [ "$found" -eq 1 ] || echo "layering: $d has no rule: add one to tests/lint/check_layering.sh"
  done
}

# Prints one line per forbidden include under ROOT.
check_tree() {
  local root=$1 rule dir pattern except allowed line
  for rule in "${rules[@]}"; do
    IFS=';' read -r dir pattern except allowed <<<"$rule"
    [ -d "$root/$dir" ] || continue
    local matches
    matches=$(cd "$root" && grep -rEn --include='*.c' --include='*.cpp' --include='*.hpp' --include='*.h' \
      --include='*.cu' --include='*.cuh' --include='*.in' \
      "^[[:space:]]*#[[:space:]]*include[[:space:]]*[\"<]${pattern}" "$dir" 2>&1)
    if [ $? -gt 1 ]; then  # grep failed: report it as a failure of the check
      echo "layering: cannot search $dir: $matches"
      continue
    fi
    while IFS= read -r line; do
      [ -z "$line" ] && continue
      if [ -n "$except" ] && grep -Eq "include[[:space:]]*[\"<]${except}[\">]" <<<"$line"; then
        continue
      fi
      echo "layering: $line: $dir may include only $allowed"
    done <<<"$matches"
  done
}

# Counts the lines of $1 (0 for none).
count_lines() { [ -z "$1" ] && echo 0 || wc -l <<<"$1"; }

# The self-check: a clean tree passes, and each rule finds its violation.
self_check() {
  local tmp
  tmp=$(mktemp -d) || return 1
  mkdir -p "$tmp"/{include/shardopt,lib/common,lib/device,lib/comm,lib/ckpt,lib/optim,lib/zero} \
    "$tmp"/{lib/capi,lib/fortran,lib/cmake,kernels/cpu,apps}
  printf '#include "shardopt/types.hpp"\n#include <mpi.h>\n' >"$tmp/include/shardopt/a.hpp"
  printf '#include "common/check.hpp"\n' >"$tmp/lib/common/a.cpp"
  printf '#include "common/check.hpp"\n#include "device/device.hpp"\n' >"$tmp/lib/device/a.cpp"
  printf '#include "comm/agree.hpp"\n#include "common/log.hpp"\n' >"$tmp/lib/comm/a.cpp"
  printf '#include "kernels/reduce.hpp"\n' >>"$tmp/lib/comm/a.cpp"
  printf '#include "comm/agree.hpp"\n#include "ckpt/format.hpp"\n' >"$tmp/lib/ckpt/a.cpp"
  printf '#include "kernels/adam.hpp"\n' >"$tmp/lib/optim/a.cpp"
  printf '#include "comm/agree.hpp"\n#include "comm/node_access.hpp"\n' >"$tmp/lib/zero/a.cpp"
  printf '#include "ckpt/format.hpp"\n#include "kernels/norm.hpp"\n' >>"$tmp/lib/zero/a.cpp"
  printf '#include "common/check.hpp"\n#include "shardopt/zero.hpp"\n' >"$tmp/lib/capi/a.cpp"
  printf '#include "shardopt/shardopt.h"\n' >"$tmp/lib/fortran/a.c"
  printf '#include "kernels/cpu/isa.hpp"\n#include "shardopt/half.hpp"\n' \
    >"$tmp/kernels/cpu/a.hpp"
  printf '#include "shardopt/shardopt.hpp"\n#include "cli.hpp"\n' >"$tmp/apps/a.cpp"
  local out
  out=$(check_tree "$tmp"; check_dirs "$tmp")
  if [ -n "$out" ]; then
    echo "layering: self-check: a clean tree was rejected:"
    echo "$out"
    rm -rf -- "$tmp"
    return 1
  fi
  # One violation per rule (comm, ckpt, zero and the kernels get two: a
  # layer they may not see, and another such layer or a header of an
  # allowed layer other than the one they may include), and a lib/
  # directory without a rule.
  printf '// a comment: #include "zero/engine.hpp" is fine here\n#include "common/log.hpp"\n' \
    >>"$tmp/include/shardopt/a.hpp"
  printf '#include "comm/backend.hpp"\n' >>"$tmp/lib/common/a.cpp"
  printf '#include "comm/backend.hpp"\n' >>"$tmp/lib/device/a.cpp"
  printf '#include "kernels/cpu/isa.hpp"\n#include "zero/engine.hpp"\n' >>"$tmp/lib/comm/a.cpp"
  printf '  #  include "zero/engine.hpp"\n#include "comm/backend.hpp"\n' >>"$tmp/lib/ckpt/a.cpp"
  printf '#include "zero/engine.hpp"\n' >>"$tmp/lib/optim/a.cpp"
  printf '#include "comm/shm/shm_segment.hpp"\n#include "capi/capi.hpp"\n' >>"$tmp/lib/zero/a.cpp"
  printf '#include "zero/engine.hpp"\n' >>"$tmp/lib/capi/a.cpp"
  printf '#include "capi/capi.hpp"\n' >>"$tmp/lib/fortran/a.c"
  printf '#include "common/check.hpp"\n' >"$tmp/lib/cmake/a.in"
  printf '#include "optim/step_checks.hpp"\n#include "common/check.hpp"\n' \
    >>"$tmp/kernels/cpu/a.hpp"
  printf '#include "common/check.hpp"\n' >>"$tmp/apps/a.cpp"
  mkdir -p "$tmp/lib/newdir"
  out=$(check_tree "$tmp"; check_dirs "$tmp")
  local found
  found=$(count_lines "$out")
  rm -rf -- "$tmp"
  if [ "$found" -ne 17 ]; then
    echo "layering: self-check: found $found of the 17 violations planted:"
    echo "$out"
    return 1
  fi
  return 0
}

root=${1:?usage: check_layering.sh SOURCE_ROOT}
self_check || exit 1
out=$(check_tree "$root"; check_dirs "$root")
bad=$(count_lines "$out")
[ -n "$out" ] && echo "$out"
echo "layering: $bad forbidden include(s)"
[ "$bad" -eq 0 ]
