#!/usr/bin/env bash
# Runs tests/repro/exit_while_waiting.c (Open MPI alone) N times at 3 ranks
# and counts how mpirun ended: with the rank's status as it should (86, or
# Open MPI's own non-zero status with its "exited on signal" report), by a
# signal of its own (a crash: status above 128), or not within 60 s.
# Usage: exit_while_waiting.sh [N]
set -u
n=${1:-200}
dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT
mpicc -O2 -o "$dir/repro" "$(dirname "$0")/exit_while_waiting.c" || exit 1
[ "$(id -u)" -ne 0 ] || export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
clean=0 crashed=0 hung=0
for i in $(seq 1 "$n"); do
  timeout 60 mpirun -n 3 --oversubscribe "$dir/repro" "$i" >"$dir/out" 2>&1
  rc=$?
  if [ $rc -eq 124 ]; then
    hung=$((hung + 1))
    echo "run $i: mpirun did not end in 60 s"
  elif [ $rc -gt 128 ] || grep -q 'Segmentation fault\|Signal: Segmentation' "$dir/out"; then
    crashed=$((crashed + 1))
    echo "run $i: mpirun ended with status $rc:"
    sed 's/^/  /' "$dir/out" | head -20
  else
    clean=$((clean + 1))
  fi
done
echo "exit_while_waiting: $clean of $n runs ended cleanly, $crashed with mpirun crashing, $hung hung"
