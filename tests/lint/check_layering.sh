#!/usr/bin/env bash
# Fails if a source includes a header of a layer above its own (the layering
# rules of docs/design.md):
#   include/shardopt/  public headers: no internal header at all
#   lib/common/        nothing of comm/, ckpt/, zero/, optim/, kernels/
#   lib/comm/          nothing of ckpt/, zero/, optim/, kernels/
#   lib/ckpt/          nothing of zero/, optim/, kernels/
#   lib/optim/         nothing of comm/, ckpt/, zero/
#   kernels/           nothing of comm/, ckpt/, zero/, optim/, and of
#                      common/ only common/cpu_features.hpp
#   apps/              public headers (and its own) only: nothing of common/,
#                      comm/, ckpt/, zero/, optim/, kernels/, except
#                      comm/mpi/mpi_types.hpp (shardopt-bench-op times the
#                      bf16/f16 MPI ops it declares)
# Before checking the tree, it checks itself on a small tree with one
# violation of each rule, which must all be found.
# Usage: check_layering.sh SOURCE_ROOT
set -u

# dir;forbidden include path (extended regex);except (regex, or empty);what it may include
rules=(
  'include/shardopt;(common|comm|ckpt|zero|optim|kernels)/;;the standard library, <mpi.h> and shardopt/ headers'
  'lib/common;(comm|ckpt|zero|optim|kernels)/;;common/ and shardopt/ headers'
  'lib/comm;(ckpt|zero|optim|kernels)/;;comm/, common/ and shardopt/ headers'
  'lib/ckpt;(zero|optim|kernels)/;;ckpt/, comm/, common/ and shardopt/ headers'
  'lib/optim;(comm|ckpt|zero)/;;optim/, kernels/, common/ and shardopt/ headers'
  'kernels;(common|comm|ckpt|zero|optim)/;common/cpu_features\.hpp;kernels/, shardopt/ headers and common/cpu_features.hpp'
  'apps;(common|comm|ckpt|zero|optim|kernels)/;comm/mpi/mpi_types\.hpp;shardopt/ headers, its own and comm/mpi/mpi_types.hpp'
)

# Prints one line per forbidden include under ROOT.
check_tree() {
  local root=$1 rule dir pattern except allowed line
  for rule in "${rules[@]}"; do
    IFS=';' read -r dir pattern except allowed <<<"$rule"
    [ -d "$root/$dir" ] || continue
    local matches
    matches=$(cd "$root" && grep -rEn --include='*.cpp' --include='*.hpp' --include='*.h' \
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
  mkdir -p "$tmp"/{include/shardopt,lib/common,lib/comm,lib/ckpt,lib/optim,kernels/cpu,apps}
  printf '#include "shardopt/types.hpp"\n#include <mpi.h>\n' >"$tmp/include/shardopt/a.hpp"
  printf '#include "common/check.hpp"\n' >"$tmp/lib/common/a.cpp"
  printf '#include "comm/agree.hpp"\n#include "common/cpu_features.hpp"\n' >"$tmp/lib/comm/a.cpp"
  printf '#include "comm/agree.hpp"\n#include "ckpt/format.hpp"\n' >"$tmp/lib/ckpt/a.cpp"
  printf '#include "kernels/adam.hpp"\n' >"$tmp/lib/optim/a.cpp"
  printf '#include "common/cpu_features.hpp"\n#include "kernels/cpu/isa.hpp"\n' \
    >"$tmp/kernels/cpu/a.hpp"
  printf '#include "shardopt/shardopt.hpp"\n#include "cli.hpp"\n' >"$tmp/apps/a.cpp"
  local out
  out=$(check_tree "$tmp")
  if [ -n "$out" ]; then
    echo "layering: self-check: a clean tree was rejected:"
    echo "$out"
    rm -rf -- "$tmp"
    return 1
  fi
  # One violation per rule (the kernels get two: a library layer, and a
  # common/ header other than cpu_features.hpp).
  printf '// a comment: #include "zero/engine.hpp" is fine here\n#include "common/log.hpp"\n' \
    >>"$tmp/include/shardopt/a.hpp"
  printf '#include "comm/backend.hpp"\n' >>"$tmp/lib/common/a.cpp"
  printf '#include "kernels/cpu/isa.hpp"\n' >>"$tmp/lib/comm/a.cpp"
  printf '  #  include "zero/engine.hpp"\n' >>"$tmp/lib/ckpt/a.cpp"
  printf '#include "zero/engine.hpp"\n' >>"$tmp/lib/optim/a.cpp"
  printf '#include "optim/step_checks.hpp"\n#include "common/check.hpp"\n' \
    >>"$tmp/kernels/cpu/a.hpp"
  printf '#include "common/check.hpp"\n' >>"$tmp/apps/a.cpp"
  out=$(check_tree "$tmp")
  local found
  found=$(count_lines "$out")
  rm -rf -- "$tmp"
  if [ "$found" -ne 8 ]; then
    echo "layering: self-check: found $found of the 8 violations planted:"
    echo "$out"
    return 1
  fi
  return 0
}

root=${1:?usage: check_layering.sh SOURCE_ROOT}
self_check || exit 1
out=$(check_tree "$root")
bad=$(count_lines "$out")
[ -n "$out" ] && echo "$out"
echo "layering: $bad forbidden include(s)"
[ "$bad" -eq 0 ]
