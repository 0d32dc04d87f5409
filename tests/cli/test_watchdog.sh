#!/usr/bin/env bash
# The watchdog (SHARDOPT_TIMEOUT): one rank stops taking part after 3
# steps (tests/fault_job.cpp) while the others wait for it in step 4.
# At 2 and 3 ranks, with the last rank and with rank 0 stalling:
# - the whole job ends within SHARDOPT_TIMEOUT + 5 seconds of the stall,
#   with the watchdog's exit status (86), no rank left running;
# - every waiting rank prints the message: the operation waited for, step
#   4, the timeout, the exit status, and the rank it waits for: the stalled
#   one, by rank, host and pid, as not inside any shardopt operation; at 3
#   ranks the other waiting rank as waiting in the same operation.
# The same stall with the others in a blocking broadcast that auto's
# transport hands to MPI's blocking call (1 MiB, 2 and 3 ranks): the job
# ends in the same time, and a waiting rank's message names the broadcast
# and says the other ranks could not be asked (the watchdog's backstop).
# Then every rank inside a shardopt operation, but not the same one (rank R
# in a barrier, the others in step 4): the messages name the other rank's
# operation, and no rank as silent.
# And desync detection (SHARDOPT_DESYNC_CHECK=1): one rank calls an
# allreduce where the others call an allgather; every rank exits with
# status 1 and the DesyncError naming both calls and their ranks.
# And on device parameters (the simulated device, tests/fault_device_job.cpp):
# one rank's device stalls after 3 steps, the hosts only enqueue step 4 and
# then wait for its verdict: every rank's watchdog ends the job naming the
# wait for the device and step 4, within SHARDOPT_TIMEOUT + 5 seconds; with
# the simulated device's collectives and with the staged backend.
# Usage: test_watchdog.sh MPIEXEC PROGRAM DEVICE-PROGRAM
set -u
mpiexec=$1
program=$2
device_program=$3
# shellcheck source=lib.sh
. "$(dirname "$0")/lib.sh"
require pgrep:procps pkill:procps
timeout_s=3

# Kills and reports the job's processes still running (by MODE and RANK on
# their command line); returns 1 when there were any.
left_running() {  # MODE RANK WHAT OUTPUT
  if pgrep -f -- "$program $1 $2" >/dev/null; then
    pkill -9 -f -- "$program $1 $2"
    fail "$3: processes left running" "$4"
    return 1
  fi
}

# Runs the fault job in MODE (with its RANK) at RANKS ranks, the watchdog
# armed, its output in OUTPUT; sets rc to its exit status.
watched_job() {  # RANKS MODE RANK OUTPUT
  SHARDOPT_TIMEOUT=$timeout_s timeout 120 "$mpiexec" -n "$1" --oversubscribe "$program" "$2" "$3" \
    >"$4" 2>&1
  rc=$?
}

# Reports (and returns 1) unless the job ended with the watchdog's status.
watchdog_status() {  # WHAT OUTPUT
  if [ "$rc" -ne 86 ]; then
    fail "$1: exit status $rc, not the watchdog's 86 (124: a hang)" "$2"
    return 1
  fi
}

# For a job that just ended (status rc, output OUTPUT with its "stalled at"
# line): sets took to the seconds since the stall; reports (and returns 1)
# unless the job stalled, ended with the watchdog's status, and did so
# within SHARDOPT_TIMEOUT + 5 seconds.
ended_in_time() {  # WHAT OUTPUT
  local ended stalled
  ended=$(date +%s.%N)
  stalled=$(sed -n 's/^stalled at \([0-9.]*\)$/\1/p' "$2")
  if [ -z "$stalled" ]; then
    fail "$1: it never stalled (exit status $rc)" "$2"
    return 1
  fi
  took=$(python3 -c "print(f'{$ended - $stalled:.1f}')")
  watchdog_status "$1" "$2" || return 1
  if ! python3 -c "import sys; sys.exit(0 if $took <= $timeout_s + 5 else 1)"; then
    fail "$1: the job ended $took s after the stall (limit $((timeout_s + 5)))" "$2"
    return 1
  fi
}

stall_case() {  # RANKS STALL-RANK
  local n=$1 stall=$2 out="$tmp/stall-$1-$2.out" rc took
  watched_job "$n" stall "$stall" "$out"
  ended_in_time "$n ranks, rank $stall stalls" "$out" || return
  local r waiting=0
  for r in $(seq 0 $((n - 1))); do
    [ "$r" -eq "$stall" ] && continue
    if grep -q "shardopt watchdog on rank $r .*\[SHARDOPT_ERR_TIMEOUT\]: .* has not completed after .* s (SHARDOPT_TIMEOUT=$timeout_s); the library was at: step 4: " "$out"; then
      waiting=$((waiting + 1))
    fi
  done
  # Each waiting rank prints, unless mpirun ended it first (after the first
  # one exited): at least one, naming the step.
  if [ $waiting -lt 1 ] || ! grep -q "ending the job: exit status 86" "$out"; then
    fail "$n ranks, rank $stall stalls: no waiting rank printed the watchdog's message" "$out"
    return
  fi
  # The stalled rank, and only it, named as the one waited for.
  local silent named_others
  silent=$(grep -c "^  waiting for: rank $stall on [^ ]* (pid [0-9]*): no answer within [0-9.]* s, so not inside any shardopt operation" "$out")
  named_others=$(grep "^  waiting for: " "$out" | grep -vc "^  waiting for: rank $stall on [^;]*: no answer")
  if [ "$silent" -ne $waiting ] || [ "$named_others" -ne 0 ]; then
    fail "$n ranks, rank $stall stalls: $silent of $waiting messages name rank $stall as the one waited for; $named_others name another" "$out"
    return
  fi
  if [ "$n" -gt 2 ] && ! grep -q "^  waiting in the same operation: rank [0-9]" "$out"; then
    fail "$n ranks, rank $stall stalls: no message names the other waiting rank" "$out"
    return
  fi
  left_running stall "$stall" "$n ranks, rank $stall stalls" "$out" || return
  ok "$n ranks, rank $stall stalls: the job ended $took s after the stall, exit status 86, $waiting rank(s) said why"
}

bcast_case() {  # RANKS STALL-RANK
  local n=$1 stall=$2 out="$tmp/bcast-$1-$2.out" rc took what
  what="$n ranks, rank $stall stalls, the others in a broadcast through MPI"
  watched_job "$n" bcast "$stall" "$out"
  ended_in_time "$what" "$out" || return
  if ! grep -q "^shardopt watchdog on rank [0-9]* .*: broadcast of 262144 f32 over $n rank(s) has not completed" "$out" ||
     ! grep -q "the other ranks could not be asked from inside this blocking call" "$out"; then
    fail "$what: no waiting rank printed the backstop's message naming the broadcast" "$out"
    return
  fi
  left_running bcast "$stall" "$what" "$out" || return
  ok "$what: the job ended $took s after the stall, exit status 86, named the broadcast"
}

apart_case() {  # RANKS ODD-RANK
  local n=$1 odd=$2 out="$tmp/apart-$1-$2.out" rc
  watched_job "$n" apart "$odd" "$out"
  watchdog_status "$n ranks, rank $odd in a barrier" "$out" || return
  # The odd rank sees the others in step(); the others see it in barrier.
  local seen=0
  if grep -q "^shardopt watchdog on rank $odd .*: barrier over $n rank(s) has not completed" "$out"; then
    grep -q "^  in another shardopt operation: rank [0-9]* on [^ ]* (pid [0-9]*): .*, at: step 4: " "$out" &&
      seen=$((seen + 1))
  fi
  if grep -q "^  in another shardopt operation: rank $odd on [^ ]* (pid [0-9]*): barrier, at: " "$out"; then
    seen=$((seen + 1))
  fi
  if [ $seen -lt 1 ] || grep -q "no answer within" "$out"; then
    fail "$n ranks, rank $odd in a barrier: the messages do not name the other operation, or call a rank silent" "$out"
    return
  fi
  left_running apart "$odd" "$n ranks, rank $odd in a barrier" "$out" || return
  ok "$n ranks, rank $odd in a barrier, the others in step(): every rank is named in its operation, exit status 86"
}

desync_case() {  # RANKS ODD-RANK
  local n=$1 odd=$2 out="$tmp/desync-$1-$2.out"
  SHARDOPT_DESYNC_CHECK=1 timeout 60 "$mpiexec" -n "$n" --oversubscribe "$program" desync "$odd" \
    >"$out" 2>&1
  local rc=$?
  if [ $rc -ne 1 ]; then
    fail "desync at $n ranks: exit status $rc (expected 1; 124 is a hang)" "$out"
    return
  fi
  local others="" r
  for r in $(seq 0 $((n - 1))); do
    [ "$r" -eq "$odd" ] && continue
    others+="${others:+, }$r"
  done
  local ranks_word=ranks
  [ $((n - 1)) -eq 1 ] && ranks_word=rank
  local said=0
  for r in $(seq 0 $((n - 1))); do
    # Each call with its ranks, in the order of the lowest rank making it.
    local line
    line=$(grep -F "fault_job: rank $r: shardopt error on rank $r [SHARDOPT_ERR_DESYNC]:" "$out")
    if grep -q "ranks disagree: collective #[0-9]* " <<<"$line" &&
       grep -qF "allgather(count=3, dtype=f64) on $ranks_word $others" <<<"$line" &&
       grep -qF "allreduce(count=3, dtype=f64, op=sum) on rank $odd" <<<"$line"; then
      said=$((said + 1))
    fi
  done
  if [ $said -ne "$n" ]; then
    fail "desync at $n ranks: $said of $n ranks printed the DesyncError naming both calls" "$out"
    return
  fi
  ok "desync at $n ranks (rank $odd calls allreduce, the others allgather): every rank says so, exit status 1"
}

# Each case at 2 ranks with the last rank as the odd one, and at 3 ranks
# with rank 0: the odd rank on either side of the others.
for case in stall_case bcast_case apart_case desync_case; do
  "$case" 2 1
  "$case" 3 0
done

device_case() {  # RANKS STALL-RANK TRANSPORT
  local n=$1 stall=$2 out="$tmp/device-$1-$2.out" rc took per_rank=0
  # NCCL takes a device per rank: each rank on a simulated device of its own.
  [ "$3" = nccl ] && per_rank=1
  SHARDOPT_SIM_DEVICES=$n SHARDOPT_SIM_DEVICE_PER_RANK=$per_rank SHARDOPT_DEVICE_COMM=$3 \
    SHARDOPT_TIMEOUT=$timeout_s timeout 120 "$mpiexec" -n "$n" --oversubscribe \
    "$device_program" stall "$stall" >"$out" 2>&1
  rc=$?
  ended_in_time "device ($3), $n ranks, rank $stall's device stalls" "$out" || return
  if ! grep -q "^rank [0-9]*: step 4 enqueued" "$out" ||
     ! grep -q "shardopt watchdog on rank [0-9]* .*\[SHARDOPT_ERR_TIMEOUT\]: a wait for the device (its kernels and collectives) over $n rank(s) has not completed after .* s (SHARDOPT_TIMEOUT=$timeout_s); the library was at: step 4: " "$out"; then
    fail "device, $n ranks: no rank enqueued step 4 without waiting, or no watchdog message names the wait for the device at step 4" "$out"
    return
  fi
  if [ "$3" = nccl ] && ! grep -q "^simulated device: its collectives aborted" "$out"; then
    fail "device, $n ranks: the device's collectives were not aborted before the exit" "$out"
    return
  fi
  if pgrep -f -- "$device_program stall $stall" >/dev/null; then
    pkill -9 -f -- "$device_program stall $stall"
    fail "device, $n ranks: processes left running" "$out"
    return
  fi
  ok "device ($3), $n ranks, rank $stall's device stalls: step 4 enqueued, then the wait for its verdict ended by the watchdog $took s after the stall, exit status 86"
}

device_case 2 1 nccl
device_case 3 0 staged

echo "watchdog: $passed passed, $failed failed"
[ $failed -eq 0 ]
