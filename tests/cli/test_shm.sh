#!/usr/bin/env bash
# The faults of the shared-memory collectives, under mpirun (as root: the
# small /dev/shm is a tmpfs mounted in a mount namespace of this test's own;
# SKIP (77) otherwise):
# - /dev/shm too small for a communicator's slots: SHARDOPT_HOST_COMM=shm
#   stops every rank with status 1 and an error naming the size it needs and
#   the fixes; auto warns once and trains through MPI, bitwise equal to
#   SHARDOPT_HOST_COMM=mpi;
# - names left in /dev/shm by a killed job: one whose creating process is
#   gone is removed by the next job, one whose creator still runs is left
#   alone; a job leaves no name of its own behind;
# - a rank that dies while the others wait for it in shared memory, with
#   mpirun told not to end the job for it: the others end within seconds,
#   each naming the rank and its pid (status 1); and with the watchdog
#   armed and mpirun's own abort, the job ends within the timeout;
# - stage 2's fused update: on owned gradients in shared memory, off, and
#   with a /dev/shm too small for them; on the user's gradients read from
#   the other ranks' memory, and where the kernel refuses that read: every
#   run bitwise the same parameters; a read that fails mid-step: the same
#   error on every rank;
# - stage 2's streamed gradients (stream_grads): their two bucket buffers in
#   shared memory, not there with SHARDOPT_FUSED_UPDATE=0, and with a /dev/shm
#   too small for them (a warning, buffers of each rank's own): bitwise the
#   owned-gradient step.
# Usage: test_shm.sh MPIEXEC TRAIN FAULT_JOB
set -u
mpiexec=$1
train=$2
fault_job=$3
# shellcheck source=lib.sh
. "$(dirname "$0")/lib.sh"
require unshare:util-linux setpriv:util-linux mount:mount pgrep:procps

if [ "$(id -u)" -ne 0 ] || ! unshare -m true 2>/dev/null; then
  echo "SKIP: needs root and mount namespaces (a small /dev/shm of the test's own)"
  exit 77
fi

args=(--steps 40 --log-every 1000000 --progress off --schedule constant)
# Open MPI's own shared memory stays out of the small /dev/shm.
export OMPI_MCA_btl_vader_backing_directory=/tmp

# COMMAND in a mount namespace of its own whose /dev/shm is a tmpfs of SIZE.
with_shm() {  # SIZE COMMAND...
  unshare -m sh -c 'mount -t tmpfs -o size="$0" tmpfs /dev/shm && exec "$@"' "$@"
}

# With a 64 KiB /dev/shm: RANKS, then variables for the job (NAME=VALUE...)
# and "--" and the trainer's extra arguments.
small_shm_run() {
  local n=$1; shift
  local envs=()
  while [ "$1" != "--" ]; do envs+=("$1"); shift; done
  shift
  with_shm 64k env "${envs[@]}" timeout 120 "$mpiexec" -n "$n" --oversubscribe "$train" \
    "${args[@]}" "$@"
}

# 1. A /dev/shm too small.
out=$tmp/forced.out
small_shm_run 3 SHARDOPT_HOST_COMM=shm -- >"$out" 2>&1
rc=$?
if [ $rc -ne 1 ]; then
  fail "SHARDOPT_HOST_COMM=shm with a 64 KiB /dev/shm: exit status $rc, expected 1" "$out"
elif [ "$(grep -c 'cannot reserve .* MiB of shared memory for the node.s ranks in /dev/shm' "$out")" -ne 1 ] ||
     ! grep -q '^shardopt-train: rank 0: .*cannot reserve' "$out" ||
     ! grep -q 'make /dev/shm larger' "$out"; then
  fail "SHARDOPT_HOST_COMM=shm with a 64 KiB /dev/shm: the size and the fix not said once, by rank 0" "$out"
else
  ok "SHARDOPT_HOST_COMM=shm with a 64 KiB /dev/shm stops every rank, naming the size needed"
fi
out=$tmp/auto.out
small_shm_run 3 SHARDOPT_HOST_COMM=auto -- --save-params "$tmp/auto.bin" >"$out" 2>&1
rc=$?
timeout 120 env SHARDOPT_HOST_COMM=mpi "$mpiexec" -n 3 --oversubscribe "$train" "${args[@]}" \
  --save-params "$tmp/mpi.bin" >"$tmp/mpi.out" 2>&1 || fail "the run on MPI failed" "$tmp/mpi.out"
if [ $rc -ne 0 ]; then
  fail "auto with a 64 KiB /dev/shm: exit status $rc" "$out"
elif [ "$(grep -c 'shared-memory collectives unavailable' "$out")" -lt 1 ] ||
     ! grep -q 'move through MPI instead' "$out"; then
  fail "auto with a 64 KiB /dev/shm: no warning of the fallback" "$out"
elif ! cmp -s "$tmp/auto.bin" "$tmp/mpi.bin"; then
  fail "auto with a 64 KiB /dev/shm: parameters differ from the run on MPI" "$out"
else
  ok "auto with a 64 KiB /dev/shm warns and trains through MPI, bitwise as SHARDOPT_HOST_COMM=mpi"
fi

# 1b. Stage 2 with owned gradients: the fused update keeps them in shared
# memory (node_shared > 0); off (SHARDOPT_FUSED_UPDATE=0), and with a 1 MiB
# /dev/shm that holds the collectives' slots (SHARDOPT_SHM_CHUNK_KB=4: 24 KiB
# per communicator at 3 ranks, and a page per process that LLVM's OpenMP
# runtime keeps there) but not 3 x 1.2 MB of gradients (a warning, the
# unfused step), the parameters are bitwise the same.
owned_run() {  # NAME, then the runner's words
  local name=$1; shift
  "$@" >"$tmp/$name.out" 2>&1 || fail "fault_job owned ($name) failed" "$tmp/$name.out"
  shared=$(awk '$1 == "node_shared" { print $2 }' "$tmp/$name.out")
  params=$(awk '$1 == "params" { print $2 }' "$tmp/$name.out")
}
owned_run fused timeout 120 "$mpiexec" -n 3 --oversubscribe "$fault_job" owned
fused_shared=$shared fused_params=$params
owned_run off timeout 120 env SHARDOPT_FUSED_UPDATE=0 "$mpiexec" -n 3 --oversubscribe \
  -x SHARDOPT_FUSED_UPDATE "$fault_job" owned
off_shared=$shared off_params=$params
owned_run small with_shm 1m env SHARDOPT_HOST_COMM=shm SHARDOPT_SHM_CHUNK_KB=4 \
  timeout 120 "$mpiexec" -n 3 --oversubscribe \
  "$fault_job" owned
if [ "${fused_shared:-0}" -lt 1200000 ] || [ "$off_shared" != 0 ] || [ "$shared" != 0 ]; then
  fail "node_shared: $fused_shared fused (expected the 1.2 MB of gradients), $off_shared with SHARDOPT_FUSED_UPDATE=0, $shared with a 1 MiB /dev/shm (expected 0)" "$tmp/fused.out"
elif ! grep -q 'the fused update is off' "$tmp/small.out"; then
  fail "a /dev/shm too small for the fused update's gradients: no warning" "$tmp/small.out"
elif [ -z "$fused_params" ] || [ "$off_params" != "$fused_params" ] || [ "$params" != "$fused_params" ]; then
  fail "fault_job owned: parameters fused $fused_params, unfused $off_params, /dev/shm too small $params: not all equal" "$tmp/small.out"
else
  ok "stage 2's fused update: shared gradients counted in node_shared, bitwise the unfused step and the fallback when /dev/shm is too small (with a warning)"
fi

# 1b'. The same gradients streamed (stream_grads, 256 KiB buckets): the two
# bucket buffers of every rank in shared memory (node_shared > 0), off with
# SHARDOPT_FUSED_UPDATE=0, and in each rank's own memory, with a warning, when
# the 1 MiB /dev/shm cannot hold 3 x (2 x 256 KiB); bitwise the owned step.
owned_run stream timeout 120 "$mpiexec" -n 3 --oversubscribe "$fault_job" stream
stream_shared=$shared stream_params=$params
owned_run stream-off timeout 120 env SHARDOPT_FUSED_UPDATE=0 "$mpiexec" -n 3 --oversubscribe \
  -x SHARDOPT_FUSED_UPDATE "$fault_job" stream
off_shared=$shared off_params=$params
owned_run stream-small with_shm 1m env SHARDOPT_HOST_COMM=shm SHARDOPT_SHM_CHUNK_KB=4 \
  timeout 120 "$mpiexec" -n 3 --oversubscribe \
  "$fault_job" stream
if [ "${stream_shared:-0}" -lt 524288 ] || [ "$off_shared" != 0 ] || [ "$shared" != 0 ]; then
  fail "streamed node_shared: $stream_shared shared (expected its 2 bucket buffers of 256 KiB or more), $off_shared with SHARDOPT_FUSED_UPDATE=0, $shared with a 1 MiB /dev/shm (expected 0)" "$tmp/stream.out"
elif [ "$(grep -c 'the bucket buffers stay in each rank.s own memory (copied to be reduced): cannot reserve' "$tmp/stream-small.out")" != 1 ]; then
  fail "a /dev/shm too small for the streamed bucket buffers: no warning (once)" "$tmp/stream-small.out"
elif [ -z "$stream_params" ] || [ "$stream_params" != "$fused_params" ] ||
     [ "$off_params" != "$fused_params" ] || [ "$params" != "$fused_params" ]; then
  fail "fault_job stream: parameters shared $stream_params, off $off_params, /dev/shm too small $params, owned $fused_params: not all equal" "$tmp/stream-small.out"
else
  ok "stage 2's streamed gradients: bucket buffers shared, off, and in each rank's memory when /dev/shm is too small (with a warning), all bitwise the owned step"
fi

# 1c. Stage 2 on the user's gradient buffers: the fused update reads the
# other ranks' slices from their memory (process_vm_readv; the info line
# says so, node_shared stays 0); with every rank not dumpable and without
# CAP_SYS_PTRACE (setpriv), the kernel refuses that read: a warning from the
# first rank refused, the unfused step; and the collectives' single copy
# (the same reads) is off too, with a warning of its own, once. Both
# bitwise the owned-gradient runs above (the same gradients).
owned_run user timeout 120 env SHARDOPT_DEBUG=INFO "$mpiexec" -n 3 --oversubscribe \
  -x SHARDOPT_DEBUG "$fault_job" user
user_shared=$shared user_params=$params
owned_run refused timeout 120 "$mpiexec" -n 3 --oversubscribe \
  setpriv --bounding-set -sys_ptrace "$fault_job" user nodump
if [ "$(grep -c 'reading the others. gradient slices from their buffers' "$tmp/user.out")" != 3 ] ||
  [ "$user_shared" != 0 ]; then
  fail "fault_job user: the fused update on the user's buffers did not run on every rank (node_shared $user_shared)" "$tmp/user.out"
elif [ "$(grep -c 'the fused update is off on every rank: rank 0: reading rank 1.s memory (process_vm_readv): Operation not permitted' "$tmp/refused.out")" != 1 ]; then
  fail "fault_job user nodump: no warning (once) that the other ranks' memory cannot be read" "$tmp/refused.out"
elif [ "$(grep -c 'the single copy is off on this node: local rank 0: reading local rank 1.s memory (process_vm_readv): Operation not permitted' "$tmp/refused.out")" != 1 ]; then
  fail "fault_job user nodump: no warning (once) that the collectives' single copy is off" "$tmp/refused.out"
elif [ -z "$user_params" ] || [ "$user_params" != "$fused_params" ] || [ "$params" != "$fused_params" ]; then
  fail "fault_job user: parameters $user_params fused, $params refused, $fused_params on owned gradients: not all equal" "$tmp/refused.out"
else
  ok "stage 2's fused update on the user's gradients (process_vm_readv), and its fallback and the collectives' where the kernel refuses the read (with a warning each): bitwise the owned-gradient step"
fi
# And a read that fails in the middle of a step (rank 1 makes the pages
# rank 0 reads inaccessible): every rank ends with status 1 and the same
# error naming rank 1's gradients, no hang.
timeout 60 "$mpiexec" -n 3 --oversubscribe "$fault_job" user protect >"$tmp/protect.out" 2>&1
status=$?
if [ "$status" = 124 ]; then
  fail "fault_job user protect hung" "$tmp/protect.out"
elif [ "$(grep -c "^fault_job: rank [012]: .*on rank 0: ZeRO stage 2, fused update: reading rank 1's gradients (process_vm_readv) failed" "$tmp/protect.out")" != 3 ]; then
  fail "fault_job user protect: not every rank reported rank 0's failed read of rank 1's gradients (status $status)" "$tmp/protect.out"
else
  ok "a failed read of another rank's gradients mid-step: the same error on every rank, no hang"
fi

# 2. Stale names. A pid that is surely gone: one past the kernel's maximum.
gone=$(( $(cat /proc/sys/kernel/pid_max) + 1 ))
stale=/dev/shm/shardopt-$(id -u)-$gone-00000000deadbeef
live=/dev/shm/shardopt-$(id -u)-$$-00000000cafef00d
printf x >"$stale"
printf x >"$live"
before=$(find /dev/shm -maxdepth 1 -name 'shardopt-*' | sort)
out=$tmp/stale.out
if ! timeout 120 "$mpiexec" -n 2 "$train" "${args[@]}" >"$out" 2>&1; then
  fail "a run with stale names in /dev/shm failed" "$out"
elif [ -e "$stale" ]; then
  fail "the name of a job whose process is gone was left in /dev/shm" "$out"
elif [ ! -e "$live" ]; then
  fail "the name of a running process was removed from /dev/shm" "$out"
elif [ "$(find /dev/shm -maxdepth 1 -name 'shardopt-*' | sort)" != "$(grep -v deadbeef <<<"$before")" ]; then
  fail "the job left names in /dev/shm: $(find /dev/shm -maxdepth 1 -name 'shardopt-*' | tr '\n' ' ')" "$out"
else
  ok "a stale name is removed, a live one kept, and the job leaves none of its own"
fi
rm -f "$stale" "$live"

# 3. A rank that dies while the others wait in shared memory. Without
# mpirun's abort, the others find it gone by themselves. They then end
# without MPI_Finalize (fault_job): Open MPI's MPI_Finalize waits for the
# dead rank in a fence and now and then never returns, shardopt or not
# (tests/repro/finalize_after_death.sh: 1 hang in about 40 runs here),
# which made this case time out once in a while.
out=$tmp/die.out
start=$SECONDS
timeout 60 "$mpiexec" -n 3 --oversubscribe --mca orte_abort_on_non_zero_status 0 \
  "$fault_job" die 1 >"$out" 2>&1
rc=$?
took=$((SECONDS - start))
if [ $rc -eq 124 ]; then
  fail "rank 1 died: the others still waited after 60 s" "$out"
elif [ "$(grep -c 'rank 1 of this node (pid [0-9]*) ended while the node.s other ranks waited' "$out")" -lt 2 ]; then
  fail "rank 1 died: ranks 0 and 2 did not both name it (exit status $rc, $took s)" "$out"
else
  ok "rank 1 died: ranks 0 and 2 ended by themselves, naming it ($took s)"
fi
out=$tmp/die-watchdog.out
start=$SECONDS
SHARDOPT_TIMEOUT=3 timeout 60 "$mpiexec" -n 3 --oversubscribe "$fault_job" die 2 >"$out" 2>&1
rc=$?
took=$((SECONDS - start))
if [ $rc -eq 0 ] || [ $rc -eq 124 ] || [ $took -gt 20 ]; then
  fail "rank 2 died under mpirun with SHARDOPT_TIMEOUT=3: exit status $rc after $took s" "$out"
else
  ok "rank 2 died under mpirun with SHARDOPT_TIMEOUT=3: the job ended in $took s (status $rc)"
fi
# The jobs' own processes (their command lines start with the program).
if pgrep -f "^$fault_job " >/dev/null; then
  fail "processes of the fault jobs are left: $(pgrep -af "^$fault_job ")"
  pkill -9 -f "^$fault_job "
fi

echo "test_shm: $passed passed, $failed failed"
[ "$failed" -eq 0 ]
