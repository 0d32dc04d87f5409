#!/usr/bin/env bash
# The job scripts of scripts/slurm/ on a real Slurm: Debian's munged,
# slurmctld and slurmd, started once for all cases by scripts/slurm-local
# in a temporary directory (one node of 32 CPUs on this machine's cores),
# the jobs submitted with sbatch, their ranks started by srun --mpi=pmix.
# - Each script run outside Slurm stops with a message and exit status 1.
# - cpu.sbatch runs shardopt-train at 4 and at 2 tasks to the README's loss
#   threshold (the 2-task run is the reference below); its tasks get
#   OMP_NUM_THREADS and the OpenMP binding from --cpus-per-task. gpu.sbatch
#   gives each of 4 tasks a GPU of its own (CUDA_VISIBLE_DEVICES; stand-in
#   device files where the machine has no GPU).
# - train-requeue.sbatch: a job that gets USR1 mid-run, as
#   --signal=B:USR1@N sends it (to the batch shell: scancel --batch
#   --signal=USR1), stops at a checkpoint, requeues itself, resumes, and
#   ends with parameters bitwise equal to the uninterrupted run's
#   (--save-params files compared with cmp); so does a job requeued by
#   scontrol requeue (SIGTERM to the tasks).
# - TERM to the batch shell alone (scancel --batch --signal=TERM) stops
#   the run at a checkpoint too (the script passes it on as USR1, since srun
#   would kill its tasks on TERM), and the job ends, not requeued.
# - A job one of whose tasks is killed (SIGKILL) ends within 30 s (its time
#   limit is 10 min) as FAILED, not requeued, its output naming the killed
#   task and saying that the job is not requeued; submitted again, it
#   resumes from the checkpoint left and ends bitwise equal too.
# - A requeued job whose checkpoint is gone (removed while the job was
#   held) fails with a message and exit status 1 instead of starting from
#   step 0; so do a missing checkpoint directory and --resume among the
#   arguments.
# - After scripts/slurm-local down, no process of the cluster or of its
#   jobs is left.
# SKIP (77) when not root or without Debian's slurmctld, slurmd,
# slurm-client and munge (scripts/setup installs them).
# Usage: test_slurm.sh SOURCE_ROOT PROGRAM
set -u
src=$1
# Absolute: the jobs run in the directory sbatch ran in, and the kill case
# finds the ranks by their executable.
program=$(realpath "$2")
# shellcheck source=lib.sh
. "$(dirname "$0")/lib.sh"
require pgrep:procps python3:python3

skip_unless_root "the Slurm test runs its own munged, slurmctld and slurmd, which needs root"
skip_without munged:munge slurmctld:slurmctld slurmd:slurmd sbatch:slurm-client

scripts=$src/scripts/slurm
# Nothing of a Slurm this test may itself run in reaches its jobs.
while read -r v; do unset "$v"; done < <(compgen -e | grep -E '^(SLURM|SBATCH|SRUN|SALLOC)_')

# (a) Outside Slurm: a message and exit status 1, before anything runs.
for s in cpu gpu train-requeue; do
  out=$(bash "$scripts/$s.sbatch" "$tmp/ckpt" "$program" 2>&1)
  rc=$?
  if [ $rc -eq 1 ] && grep -qF "$s.sbatch: error: not in a Slurm job (SLURM_JOB_ID is not set)" <<<"$out"; then
    ok "$s.sbatch outside Slurm: exit status 1, '${out:0:100}...'"
  else
    fail "$s.sbatch outside Slurm: exit status $rc (expected 1 and a message): $out"
  fi
done

# The cluster, once. Stand-in GPUs only where this machine can make device
# files (mknod needs CAP_MKNOD) or has NVIDIA devices.
cluster=$tmp/slurm
gpus=()
if [ -c /dev/nvidia3 ] || mknod "$tmp/probe-dev" c 1 3 2>/dev/null; then
  gpus=(--gpus 4)
fi
rm -f "$tmp/probe-dev"
# The cluster goes down however the test ends. Ended by a signal (meson's
# timeout: TERM, then KILL soon after), the test leaves that to a process
# of its own session, which the KILL of the test's process group misses.
trap '"$src/scripts/slurm-local" down "$cluster" >/dev/null 2>&1; rm -rf "$tmp"' EXIT
trap 'trap - EXIT
      setsid bash -c '\''"$0" down "$1"; rm -rf "$2"'\'' "$src/scripts/slurm-local" "$cluster" "$tmp" \
        </dev/null >/dev/null 2>&1 &
      exit 1' TERM INT
if ! "$src/scripts/slurm-local" up "$cluster" --cpus 32 "${gpus[@]}" >"$tmp/up.out" 2>&1; then
  fail "scripts/slurm-local up failed" "$tmp/up.out"
  exit 1
fi
ok "$(head -n 1 "$tmp/up.out")"
export SLURM_CONF=$cluster/slurm.conf
# The jobs take this environment (sbatch --export=ALL). 2 cores run up to
# 20 ranks here: a rank waiting in MPI yields its core. Open MPI's session
# directories go into the cluster's directory.
export OMPI_MCA_mpi_yield_when_idle=1
export TMPDIR=$cluster/tmp

# Submits a job from a script of scripts/slurm/: one node, 10 minutes, its
# output in $tmp/NAME.out, USR1 from Slurm no earlier than the test ends;
# prints its id.
submit() {  # NAME [SBATCH-OPTIONS...] SCRIPT [ARGS...]
  local name=$1
  shift
  sbatch --parsable -J "$name" -N 1 -t 10 --signal=B:USR1@10 -o "$tmp/$name.out" "$@"
}

# job_info, wait_job.
# shellcheck source=lib/slurm.sh
. "$(dirname "$0")/lib/slurm.sh"

# The trainer's options: a small model that reaches the threshold in 300
# steps; the jobs that are stopped run 6000 steps and checkpoint every 50,
# so that the test can stop them after their first checkpoint, well before
# their end, also on a slow or busy machine (at 1200 steps, a run on a
# loaded machine once ended before its scontrol requeue came).
model=(--hidden 64 --lr 2e-2 --log-every 1000)
long_steps=6000
long=(--steps "$long_steps")

# A program that prints what each task sees.
cat >"$tmp/probe" <<'EOF'
#!/bin/sh
echo "task $SLURM_PROCID cpus $SLURM_CPUS_PER_TASK OMP_NUM_THREADS=$OMP_NUM_THREADS OMP_PROC_BIND=${OMP_PROC_BIND:-} CUDA_VISIBLE_DEVICES=${CUDA_VISIBLE_DEVICES:-}"
EOF
chmod +x "$tmp/probe"

# Every job is submitted at once; the node has room for all.
for c in usr1 requeue kill held batchterm; do mkdir -p "$tmp/$c"; done
j_np4=$(submit np4 --ntasks-per-node=4 --cpus-per-task=1 "$scripts/cpu.sbatch" "$program" \
  "${model[@]}" --steps 300)
j_ref=$(submit ref --ntasks-per-node=2 --cpus-per-task=1 "$scripts/cpu.sbatch" "$program" \
  "${model[@]}" "${long[@]}" --save-params "$tmp/ref.params")
requeue_job() {  # NAME
  submit "$1" --ntasks-per-node=2 --cpus-per-task=1 "$scripts/train-requeue.sbatch" "$tmp/$1" \
    "$program" "${model[@]}" "${long[@]}" --checkpoint-every 50 --save-params "$tmp/$1/params"
}
j_usr1=$(requeue_job usr1)
j_requeue=$(requeue_job requeue)
j_kill=$(requeue_job kill)
j_held=$(requeue_job held)
j_batchterm=$(requeue_job batchterm)
j_nodir=$(submit nodir -n 1 "$scripts/train-requeue.sbatch" "$tmp/no/such/dir" "$program")
j_resume=$(submit resume-arg -n 1 "$scripts/train-requeue.sbatch" "$tmp" "$program" \
  --resume "$tmp/x")
j_cpus=$(submit cpus --ntasks-per-node=2 --cpus-per-task=2 "$scripts/cpu.sbatch" "$tmp/probe")
j_gpus=""
if [ ${#gpus[@]} -gt 0 ]; then
  j_gpus=$(submit gpus --ntasks-per-node=4 --cpus-per-task=1 "$scripts/gpu.sbatch" "$tmp/probe")
fi
jobs=("$j_np4" "$j_ref" "$j_usr1" "$j_requeue" "$j_kill" "$j_held" "$j_batchterm" "$j_nodir"
      "$j_resume" "$j_cpus")
[ -z "$j_gpus" ] || jobs+=("$j_gpus")
for j in "${jobs[@]}"; do
  if ! [[ "$j" =~ ^[0-9]+$ ]]; then
    fail "sbatch did not submit a job: '$j'"
    exit 1
  fi
done
ok "submitted ${#jobs[@]} jobs at once"

# (e) Rank 1 of the kill job killed with SIGKILL (called with the job).
# Looked for again for up to 10 s: on a loaded machine the scan can come
# while /proc shows the task in a passing state.
kill_start=""
kill_rank1() {  # JOB
  local victim="" pid
  for _ in $(seq 100); do
    for pid in $(pgrep -f -- "$tmp/kill/ckpt.safetensors"); do
      if [ "$(readlink "/proc/$pid/exe" 2>/dev/null)" = "$(readlink -f "$program")" ] &&
         tr '\0' '\n' <"/proc/$pid/environ" 2>/dev/null | grep -qx "SLURM_PROCID=1"; then
        victim=$pid
      fi
    done
    [ -z "$victim" ] || break
    sleep 0.1
  done
  if [ -n "$victim" ]; then
    kill -9 "$victim"
    kill_start=$SECONDS
  else
    fail "kill: no task with SLURM_PROCID=1 found (job $1: $(job_info "$1"))" "$tmp/kill.out"
  fi
}

# (c) USR1 to the batch shell, (d) scontrol requeue, TERM to the batch
# shell alone, (e) the kill and (f) the held job's requeue and hold, each
# as soon as its job's first checkpoint is there: one loop for them all,
# so that none waits on another's (the jobs share the node's two CPUs:
# one may run from start to end while the test waits for another).
declare -A stop_cmd=([usr1]="scancel --batch --signal=USR1" [requeue]="scontrol requeue"
                     [batchterm]="scancel --batch --signal=TERM" [kill]=kill_rank1
                     [held]="scontrol requeuehold")
declare -A stop_job=([usr1]=$j_usr1 [requeue]=$j_requeue [batchterm]=$j_batchterm
                     [kill]=$j_kill [held]=$j_held)
waiting=(usr1 requeue batchterm kill held)
end=$((SECONDS + 60))
while [ ${#waiting[@]} -gt 0 ] && [ $SECONDS -lt $end ]; do
  still=()
  for c in "${waiting[@]}"; do
    if [ -e "$tmp/$c/ckpt.safetensors" ]; then
      ${stop_cmd[$c]} "${stop_job[$c]}"
    else
      still+=("$c")
    fi
  done
  waiting=("${still[@]}")
  [ ${#waiting[@]} -eq 0 ] || sleep 0.1
done
for c in "${waiting[@]}"; do
  fail "$c: no checkpoint while the job ran (60 s)" "$tmp/$c.out"
done

# (f) The held job, requeued and held after its first checkpoint: once it
# is pending and its processes are gone, its checkpoint is removed, as if
# the next node did not see the directory, and the job released.
held_stopped=1
for c in "${waiting[@]}"; do [ "$c" != held ] || held_stopped=0; done
if [ $held_stopped = 1 ]; then
  end=$((SECONDS + 60))
  while { [ "$(job_info "$j_held" | cut -d' ' -f1)" != PENDING ] ||
          pgrep -f -- "$tmp/held/" >/dev/null; } && [ $SECONDS -lt $end ]; do
    sleep 0.2
  done
  rm -f "$tmp/held/ckpt.safetensors"*
  scontrol release "$j_held"
fi

# The kill job: ended soon after the kill, failed, not requeued, its
# output naming the task and the script's verdict.
if [ -n "$kill_start" ]; then
  info=$(wait_job "$j_kill" 60)
  took=$((SECONDS - kill_start))
  read -r state restarts code <<<"$info"
  if [ "$state" != FAILED ] || [ "$restarts" != 0 ] || [ "$code" = 0:0 ] || [ $took -gt 30 ]; then
    fail "kill: job ended as '$info' $took s after the kill (expected FAILED, 0 restarts, \
within 30 s)" "$tmp/kill.out"
  elif ! grep -q "^srun: error: shardopt1: task 1: Killed" "$tmp/kill.out" ||
       ! grep -qF "train-requeue.sbatch: error: job $j_kill: $program failed with exit status" \
         "$tmp/kill.out" || ! grep -qF "the job is not requeued" "$tmp/kill.out"; then
    fail "kill: the output does not name the killed task and the script's verdict" "$tmp/kill.out"
  else
    ok "kill: a task killed with SIGKILL: the job ended $took s later, FAILED ($code), \
not requeued, its output naming 'task 1: Killed'"
    # Submitted again: it resumes from the checkpoint the failed run left.
    # (Its output goes on in kill.out: --open-mode=append.)
    j_again=$(requeue_job kill)
  fi
fi

# Checks a train-requeue job that was stopped once and resumed: its state,
# its output's lines for the stop (STOP: an extended regular expression)
# and the resume, and its parameters against the reference.
check_resumed() {  # NAME JOB STOP WHAT
  local name=$1 job=$2 stop=$3 what=$4
  local out="$tmp/$name.out"
  stopped_and_resumed "$name" "$(wait_job "$job" 120)" "$out" "$stop" "$long_steps" || return 1
  local at=$stopped_at
  if ! grep -qF "# train-requeue.sbatch: job $job run 2: 2 tasks on 1 node(s) (shardopt1), \
resuming from $tmp/$name/ckpt.safetensors" "$out" ||
       ! grep -qE "^# resumed from .* at 2 ranks: step $at," "$out"; then
    fail "$name: run 2 did not resume from the step-$at checkpoint" "$out"
  elif ! cmp -s "$tmp/ref.params" "$tmp/$name/params"; then
    fail "$name: stopped at step $at and resumed, the parameters differ from the uninterrupted \
run's" "$out"
  else
    ok "$name: $what at step $at, requeued, resumed: parameters bitwise those of the \
uninterrupted run"
    return 0
  fi
  return 1
}

# (b) cpu.sbatch to the threshold, at 4 and 2 tasks.
threshold_run() {  # NAME JOB TASKS
  local out="$tmp/$1.out" info
  info=$(wait_job "$2" 120)
  if [ "$info" != "COMPLETED 0 0:0" ]; then
    fail "$1: job ended as '$info' (expected COMPLETED 0 0:0)" "$out"
  elif ! grep -qF "# cpu.sbatch: job $2: $3 tasks on 1 node(s) (shardopt1), 1 CPU(s) and \
OMP_NUM_THREADS=1 per task" "$out" || ! grep -q "^# ranks $3 " "$out"; then
    fail "$1: not $3 ranks" "$out"
  elif ! grep -qE "^# final loss [0-9.e+-]+: below 0\.01," "$out"; then
    fail "$1: the held-out loss did not fall below 0.01" "$out"
  else
    ok "cpu.sbatch at $3 tasks: $(grep -oE '^# final loss [0-9.e+-]+: below 0\.01' "$out" | cut -c3-)"
  fi
}
threshold_run np4 "$j_np4" 4
threshold_run ref "$j_ref" 2
if [ ! -s "$tmp/ref.params" ]; then
  fail "ref: no parameter file" "$tmp/ref.out"
fi

check_resumed usr1 "$j_usr1" SIGUSR1 "USR1 to the batch shell: stopped"
if ! grep -qF "# train-requeue.sbatch: job $j_usr1: stopped with the checkpoint \
$tmp/usr1/ckpt.safetensors written; requeued" "$tmp/usr1.out"; then
  fail "usr1: the script did not say that it requeued the job" "$tmp/usr1.out"
fi
# The ranks get Slurm's TERM and the script's USR1 (which it sends on the
# TERM it gets too): either may be the one they note first.
check_resumed requeue "$j_requeue" "SIG(TERM|USR1)" "scontrol requeue: stopped"
if ! grep -qF "# train-requeue.sbatch: job $j_requeue: stopped by SIGTERM with the checkpoint \
$tmp/requeue/ckpt.safetensors written; Slurm ends this run" "$tmp/requeue.out"; then
  fail "requeue: the script did not say that TERM stopped the run" "$tmp/requeue.out"
fi

if [ -n "${j_again:-}" ]; then
  info=$(wait_job "$j_again" 120)
  if [ "$info" != "COMPLETED 0 0:0" ]; then
    fail "kill, submitted again: job ended as '$info'" "$tmp/kill.out"
  elif ! grep -qF "run 1: 2 tasks on 1 node(s) (shardopt1), resuming from \
$tmp/kill/ckpt.safetensors" "$tmp/kill.out"; then
    fail "kill, submitted again: it did not resume from the checkpoint left" "$tmp/kill.out"
  elif ! cmp -s "$tmp/ref.params" "$tmp/kill/params"; then
    fail "kill, submitted again: the parameters differ from the uninterrupted run's" \
      "$tmp/kill.out"
  else
    ok "kill, submitted again: resumed from the checkpoint the killed job left, parameters \
bitwise those of the uninterrupted run"
  fi
fi

info=$(wait_job "$j_batchterm" 120)
if [ "$info" != "COMPLETED 0 0:0" ] ||
   ! grep -qE "^# stopped by SIGUSR1 at step [0-9]+ of $long_steps" "$tmp/batchterm.out" ||
   ! grep -qF "# train-requeue.sbatch: job $j_batchterm: stopped by SIGTERM with the checkpoint \
$tmp/batchterm/ckpt.safetensors written; Slurm ends this run" "$tmp/batchterm.out"; then
  fail "batchterm: TERM to the batch shell: job '$info', no stop at a checkpoint" \
    "$tmp/batchterm.out"
else
  ok "batchterm: TERM to the batch shell alone: $(grep -oE '^# stopped by SIGUSR1 at step [0-9]+' \
"$tmp/batchterm.out" | cut -c3-) with the checkpoint written, the job ended (COMPLETED, not \
requeued)"
fi

# Checks a job that the script stops with an error: FAILED, exit status 1,
# the message, and no training started in the run that failed.
expect_script_error() {  # NAME JOB RESTARTS MESSAGE TRAINER-BANNERS
  local out="$tmp/$1.out" info
  info=$(wait_job "$2" 120)
  if [ "$info" != "FAILED $3 1:0" ]; then
    fail "$1: job ended as '$info' (expected FAILED $3 1:0)" "$out"
  elif ! grep -qF "train-requeue.sbatch: error: $4" "$out"; then
    fail "$1: no message '$4'" "$out"
  elif [ "$(grep -c '^# shardopt-train: ' "$out")" -ne "$5" ]; then
    fail "$1: the trainer ran $(grep -c '^# shardopt-train: ' "$out") time(s), expected $5" "$out"
  else
    ok "$1: FAILED with exit status 1: '$(grep -F "train-requeue.sbatch: error: $4" "$out" | cut -c1-120)...'"
  fi
}
expect_script_error held "$j_held" 1 "job $j_held was requeued (1 time(s)) but its checkpoint \
'$tmp/held/ckpt.safetensors' is not there" 1
expect_script_error nodir "$j_nodir" 0 "the checkpoint directory '$tmp/no/such/dir' does not \
exist: create it" 0
expect_script_error resume-arg "$j_resume" 0 "--resume: the script gives $program --checkpoint, \
--resume and --stop-on itself" 0

# What the tasks see: OpenMP from --cpus-per-task; a GPU each.
info=$(wait_job "$j_cpus" 60)
lines=$(grep -c "^task [01] cpus 2 OMP_NUM_THREADS=2 OMP_PROC_BIND=close " "$tmp/cpus.out")
if [ "$info" = "COMPLETED 0 0:0" ] && [ "$lines" -eq 2 ]; then
  ok "cpu.sbatch --cpus-per-task=2: OMP_NUM_THREADS=2 and OMP_PROC_BIND=close in both tasks"
else
  fail "cpu.sbatch --cpus-per-task=2: job '$info', $lines task(s) with the settings" "$tmp/cpus.out"
fi
if [ -n "$j_gpus" ]; then
  info=$(wait_job "$j_gpus" 60)
  seen=$(grep -oE '^task [0-3] .*CUDA_VISIBLE_DEVICES=[0-9]+$' "$tmp/gpus.out" |
         grep -oE '[0-9]+$' | sort | paste -sd' ')
  if [ "$info" = "COMPLETED 0 0:0" ] && [ "$seen" = "0 1 2 3" ]; then
    ok "gpu.sbatch at 4 tasks: one GPU each (CUDA_VISIBLE_DEVICES 0, 1, 2, 3)"
  else
    fail "gpu.sbatch: job '$info', the tasks' GPUs: '$seen' (expected 0 1 2 3)" "$tmp/gpus.out"
  fi
else
  echo "SKIP: gpu.sbatch: no NVIDIA devices and mknod is not allowed here (stand-in GPUs)"
fi

# (g) The cluster down: its daemons and every process of its jobs gone.
daemons=$(cat "$cluster/slurmctld.pid" "$cluster/slurmd.pid" "$cluster/munge/munged.pid" \
  2>/dev/null | paste -sd' ')
if ! "$src/scripts/slurm-local" down "$cluster" >"$tmp/down.out" 2>&1; then
  fail "scripts/slurm-local down failed" "$tmp/down.out"
fi
left=$("$src/scripts/slurm-local" procs "$cluster")
for pid in $daemons; do
  if [ -e "/proc/$pid" ] && ! grep -q '^State:.*Z' "/proc/$pid/status" 2>/dev/null; then
    left="$left daemon $pid"
  fi
done
left="$left $(pgrep -f -- "$tmp/" | grep -vx "$$" | paste -sd' ')"
if [ -n "${left// /}" ] || [ -z "$daemons" ]; then
  fail "after slurm-local down: left running: '$left' (daemons were '$daemons')"
else
  ok "slurm-local down: munged, slurmctld, slurmd ($daemons) and every job process ended"
fi

echo "slurm: $passed passed, $failed failed"
[ $failed -eq 0 ]
