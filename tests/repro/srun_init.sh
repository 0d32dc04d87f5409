#!/usr/bin/env bash
# Runs tests/repro/srun_init.c (Open MPI alone) N times as a job step of
# 2 nodes x 2 tasks (srun --mpi=pmix) on a private Slurm of two network-
# namespace nodes (scripts/netns-cluster, scripts/slurm-local: the
# slurm-multinode test's cluster and its Open MPI settings, TCP between the
# nodes), and counts the steps in which a task died of a signal. With
# FENCE (SLURM_PMIX_FENCE: tree, ring or mixed, Slurm's default) each step
# uses that fence algorithm. Run as root; core files land where
# /proc/sys/kernel/core_pattern says (ulimit -c is raised).
# Usage: srun_init.sh [N] [FENCE]
set -u
n=${1:-500}
fence=${2:-}
src=$(cd "$(dirname "$0")/../.." && pwd)
dir=$(mktemp -d)
name=ri$((RANDOM % 1000))n
mpicc -O2 -o "$dir/srun_init" "$src/tests/repro/srun_init.c" || exit 1
chmod 755 "$dir"
"$src/scripts/netns-cluster" up "$name" --nodes 2 --rate 1gbit || exit 1
trap '"$src/scripts/slurm-local" down "$dir/slurm" >/dev/null 2>&1
      "$src/scripts/netns-cluster" down "$name" >/dev/null 2>&1; rm -rf "$dir"' EXIT
"$src/scripts/slurm-local" up "$dir/slurm" --netns "$name" --cpus 4 >"$dir/up.out" 2>&1 ||
  { cat "$dir/up.out"; exit 1; }
export OMPI_MCA_btl=tcp,self,vader OMPI_MCA_btl_tcp_if_include=198.51.100.0/24 \
  OMPI_MCA_oob_tcp_if_include=198.51.100.0/24 OMPI_MCA_mpi_yield_when_idle=1
ulimit -c unlimited
env=()
[ -z "$fence" ] || env=(SLURM_PMIX_FENCE="$fence")
clean=0 crashed=0 other=0
for i in $(seq 1 "$n"); do
  "$src/scripts/slurm-local" run "$dir/slurm" -- env "${env[@]}" timeout 60 \
    srun -N 2 --ntasks-per-node=2 --mpi=pmix "$dir/srun_init" >"$dir/out" 2>&1
  if grep -q 'srun_init: 4 ranks' "$dir/out"; then
    clean=$((clean + 1))
  elif grep -q 'Signal: Segmentation\|Segmentation fault' "$dir/out"; then
    crashed=$((crashed + 1))
    echo "step $i: a task crashed:"
    sed 's/^/  /' "$dir/out" | head -12
  else
    other=$((other + 1))
    echo "step $i: failed:"
    sed 's/^/  /' "$dir/out" | head -12
  fi
done
echo "srun_init${fence:+ (SLURM_PMIX_FENCE=$fence)}: $clean of $n steps ran cleanly, $crashed with a task crashing, $other failed otherwise"
