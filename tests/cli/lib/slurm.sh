# shellcheck shell=bash
# shardopt: what the Slurm tests share (sourced, not run): the state of a
# job and a wait for its end. $slurm_run (an array, empty by default) is
# put before each Slurm command: the multi-node test runs them in a node.
slurm_run=()

# "STATE RESTARTS EXITCODE" of a job.
job_info() {  # JOB
  "${slurm_run[@]}" scontrol -o show job "$1" 2>/dev/null | tr ' ' '\n' |
    awk -F= '$1 == "JobState" { s = $2 } $1 == "Restarts" { r = $2 } $1 == "ExitCode" { e = $2 }
             END { print s, r, e }'
}

# Waits until a job has ended for good (a requeued job is pending or
# running again in between); prints job_info. Returns 1 after LIMIT s.
wait_job() {  # JOB LIMIT
  local end=$((SECONDS + $2)) info
  while :; do
    info=$(job_info "$1")
    case ${info%% *} in
      COMPLETED | FAILED | CANCELLED | TIMEOUT | NODE_FAIL | OUT_OF_MEMORY | BOOT_FAIL | DEADLINE)
        echo "$info"
        return 0 ;;
    esac
    if [ $SECONDS -ge $end ]; then
      echo "$info after $2 s"
      return 1
    fi
    sleep 0.2
  done
}

# Whether a train-requeue.sbatch job of STEPS steps, its job_info INFO and
# its output OUT, completed after one restart, having stopped before its end
# by STOP (an extended regular expression: the signal's name). Sets
# $stopped_at to the step it stopped at; otherwise fails the case NAME
# (lib.sh's fail) and returns 1.
stopped_and_resumed() {  # NAME INFO OUT STOP STEPS
  local state restarts code
  read -r state restarts code <<<"$2"
  stopped_at=$(grep -oE "^# stopped by $4 at step [0-9]+ of $5" "$3" | grep -oE 'step [0-9]+' |
               cut -d' ' -f2 | head -n 1)
  if [ "$state" != COMPLETED ] || [ "$restarts" != 1 ] || [ "$code" != 0:0 ]; then
    fail "$1: job ended as '$2' (expected COMPLETED, 1 restart, 0:0)" "$3"
    return 1
  fi
  if [ -z "$stopped_at" ] || [ "$stopped_at" -ge "$5" ]; then
    fail "$1: the run did not stop by $4 before its end" "$3"
    return 1
  fi
}
