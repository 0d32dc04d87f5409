#!/usr/bin/env bash
# A rank killed with SIGKILL in the middle of training, under mpirun:
# - the whole job ends within 30 seconds of the kill, and no rank of it is
#   left running;
# - the last checkpoint it completed (--checkpoint-every, written
#   atomically) is a good file, and shardopt-train --resume from it, at the
#   same rank count, ends with parameters bitwise identical to a run that
#   was never interrupted (--save-params files compared with cmp).
# Done at 2 ranks killing rank 1, and at 3 ranks killing rank 0.
# Usage: test_fault_kill.sh MPIEXEC PROGRAM
set -u
mpiexec=$1
program=$2
# shellcheck source=lib.sh
. "$(dirname "$0")/lib.sh"
require pgrep:procps pkill:procps

steps=200
# The default model (606,724 parameters): a few ms a step, so the kill
# lands while steps are running. The constant schedule: the cosine one
# depends on --steps only, but the constant one keeps the comparison simple.
args=(--schedule constant --steps $steps --log-every 1000000 --progress off)

# The uninterrupted run, once per rank count.
reference() {  # RANKS
  local out="$tmp/ref$1.out"
  if ! timeout 300 "$mpiexec" -n "$1" --oversubscribe "$program" "${args[@]}" \
         --save-params "$tmp/ref$1.bin" >"$out" 2>&1; then
    fail "the uninterrupted run at $1 ranks failed" "$out"
    return 1
  fi
}

# The pids of the job's ranks: processes running PROGRAM with MARKER in
# their command line (mpirun's own command line holds it too: left out).
rank_pids() {  # MARKER
  pgrep -f -- "$1" | while read -r pid; do
    if [ "$(readlink "/proc/$pid/exe" 2>/dev/null)" = "$(readlink -f "$program")" ]; then
      echo "$pid"
    fi
  done
}

killed_run() {  # RANKS VICTIM-RANK
  local n=$1 victim=$2
  local d="$tmp/kill-$n-$victim"
  mkdir -p "$d"
  local ckpt="$d/ckpt.safetensors"
  # The job in the background; its ranks are found by the checkpoint path.
  "$mpiexec" -n "$n" --oversubscribe "$program" "${args[@]}" --checkpoint "$ckpt" \
    --checkpoint-every 25 --keep-last 2 >"$d/job.out" 2>&1 &
  local job=$!
  # Wait for the second checkpoint (step 50; the first is then PATH.1):
  # steps are running by then.
  local waited=0
  while [ ! -f "$ckpt.1" ] && kill -0 "$job" 2>/dev/null && [ $waited -lt 1200 ]; do
    sleep 0.05
    waited=$((waited + 1))
  done
  local pids
  mapfile -t pids < <(rank_pids "$ckpt")
  if [ "${#pids[@]}" -ne "$n" ]; then
    kill -9 "$job" 2>/dev/null
    fail "$n ranks, kill rank $victim: found ${#pids[@]} rank processes, not $n" "$d/job.out"
    return
  fi
  # The victim by its rank: Open MPI puts it in each process's environment.
  local target=""
  for pid in "${pids[@]}"; do
    if tr '\0' '\n' <"/proc/$pid/environ" 2>/dev/null | grep -qx "OMPI_COMM_WORLD_RANK=$victim"; then
      target=$pid
    fi
  done
  if [ -z "$target" ]; then
    kill -9 "$job" 2>/dev/null
    fail "$n ranks: no process has OMPI_COMM_WORLD_RANK=$victim" "$d/job.out"
    return
  fi
  local start=$SECONDS
  kill -9 "$target"
  local ended=0
  for _ in $(seq 1 300); do
    if ! kill -0 "$job" 2>/dev/null; then
      ended=1
      break
    fi
    sleep 0.1
  done
  local took=$((SECONDS - start))
  if [ $ended -eq 0 ]; then
    kill -9 "$job" 2>/dev/null
    pkill -9 -f -- "$ckpt" 2>/dev/null
    fail "$n ranks, kill rank $victim: the job still runs 30 s after the kill" "$d/job.out"
    return
  fi
  wait "$job"
  local rc=$?
  sleep 0.5
  local left
  left=$(rank_pids "$ckpt" | wc -l)
  if [ "$rc" -eq 0 ] || [ "$left" -ne 0 ]; then
    fail "$n ranks, kill rank $victim: exit status $rc, $left rank(s) left running" "$d/job.out"
    return
  fi
  ok "$n ranks, kill rank $victim: the job ended in ${took} s (exit status $rc), no rank left"

  # The last complete checkpoint: resume from it, at the same rank count.
  if [ ! -f "$ckpt" ]; then
    fail "$n ranks, kill rank $victim: no checkpoint was written before the kill" "$d/job.out"
    return
  fi
  if ls "$d" | grep -q '\.tmp-'; then
    ok "$n ranks, kill rank $victim: a temporary file of an interrupted save is left (safe)"
  fi
  if ! timeout 300 "$mpiexec" -n "$n" --oversubscribe "$program" "${args[@]}" --json \
         --resume "$ckpt" --save-params "$d/resumed.bin" >"$d/resume.out" 2>&1; then
    fail "$n ranks, kill rank $victim: the resumed run failed" "$d/resume.out"
    return
  fi
  # It went on from the checkpoint (not from step 0): steps from+1 to $steps.
  local from applied
  from=$(grep -o '"type":"resume"[^}]*"step":[0-9]*' "$d/resume.out" | grep -o '[0-9]*$')
  applied=$(grep -o '"type":"summary".*"applied":[0-9]*' "$d/resume.out" | grep -o '[0-9]*$')
  if [ -z "$from" ] || [ "$from" -lt 50 ] || [ "$from" -ge $steps ] ||
     [ "${applied:-0}" -ne $((steps - from)) ]; then
    fail "$n ranks, kill rank $victim: resumed from step '${from}', applied '${applied}' steps" \
      "$d/resume.out"
    return
  fi
  if ! cmp -s "$tmp/ref$n.bin" "$d/resumed.bin"; then
    fail "$n ranks, kill rank $victim: resumed from step ${from:-?}, the parameters differ from \
the uninterrupted run's" "$d/resume.out"
    return
  fi
  ok "$n ranks, kill rank $victim: resumed from step ${from:-?} to $steps, parameters bitwise \
those of the uninterrupted run"
}

reference 2 && killed_run 2 1
reference 3 && killed_run 3 0

echo "fault-kill: $passed passed, $failed failed"
[ $failed -eq 0 ]
