#!/usr/bin/env bash
# Runs tests/repro/exit_while_waiting.c (Open MPI alone) N times at 3 ranks
# and counts how mpirun ended. MODE exit: a rank exits with status 86 while
# the others wait; hang: a rank sleeps while the others wait, and mpirun is
# sent SIGTERM after 0.5-1.5 s. Clean: mpirun reports and ends (non-zero);
# crashed: mpirun itself died of a signal other than the TERM it was sent,
# or printed a segmentation fault; hung: not ended within 60 s.
# Usage: exit_while_waiting.sh [exit|hang] [N]
set -u
mode=${1:-exit}
n=${2:-200}
dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT
mpicc -O2 -o "$dir/repro" "$(dirname "$0")/exit_while_waiting.c" || exit 1
[ "$(id -u)" -ne 0 ] || export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
clean=0 crashed=0 hung=0
for i in $(seq 1 "$n"); do
  timeout 60 mpirun -n 3 --oversubscribe "$dir/repro" "$mode" "$i" >"$dir/out" 2>&1 &
  pid=$!
  if [ "$mode" = hang ]; then
    ms=$((500 + RANDOM % 1000))
    sleep "$((ms / 1000)).$(printf '%03d' $((ms % 1000)))"
    pkill -TERM -P "$pid" -x mpirun 2>/dev/null
  fi
  wait "$pid"
  rc=$?
  if [ $rc -eq 124 ]; then
    hung=$((hung + 1))
    echo "run $i: mpirun did not end in 60 s"
  elif { [ $rc -gt 128 ] && [ $rc -ne 143 ]; } ||
    grep -q 'Segmentation fault\|Signal: Segmentation' "$dir/out"; then
    crashed=$((crashed + 1))
    echo "run $i: mpirun ended with status $rc:"
    sed 's/^/  /' "$dir/out" | head -20
  else
    clean=$((clean + 1))
  fi
done
echo "exit_while_waiting $mode: $clean of $n runs ended cleanly, $crashed with mpirun crashing, $hung hung"
