#!/usr/bin/env bash
# Runs tests/repro/finalize_after_death.c (Open MPI alone) N times at 3
# ranks and counts the runs whose survivors never return from MPI_Finalize
# (killed after 30 s). Usage: finalize_after_death.sh [N]
set -u
n=${1:-200}
dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT
mpicc -O2 -o "$dir/repro" "$(dirname "$0")/finalize_after_death.c" || exit 1
[ "$(id -u)" -ne 0 ] || export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
hangs=0
for i in $(seq 1 "$n"); do
  timeout 30 mpirun -n 3 --oversubscribe --mca orte_abort_on_non_zero_status 0 "$dir/repro" "$i" \
    >"$dir/out" 2>&1
  if [ $? -eq 124 ]; then
    hangs=$((hangs + 1))
    echo "run $i: MPI_Finalize did not return in 30 s:"
    grep '^rank' "$dir/out" | sed 's/^/  /'
  fi
done
echo "finalize_after_death: $hangs of $n runs hung in MPI_Finalize"
