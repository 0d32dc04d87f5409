#!/usr/bin/env bash
# SHARDOPT_* variables that change what the ranks do together must be the
# same on every rank: ranks launched with different values (mpirun's MPMD
# form, one environment per rank, as ranks on nodes that mpirun did not
# pass a variable to) all stop at the first Communicator with an error that
# names the variable, its value on rank 0 and on the first rank that
# differs, and the host, and exit with status 1, no hang. A bad value on one
# rank only stops every rank too. Variables of one rank's own (SHARDOPT_DEBUG,
# SHARDOPT_STATS_EVERY, SHARDOPT_CPU_ISA) may differ, and values spelled
# differently but equal (1 and true) agree; such a job runs, and at
# SHARDOPT_DEBUG=INFO rank 0 logs the ranks' nodes.
# The job: fault_job with no rank stalling (stall -1), 4 ZeRO steps.
# Usage: test_env_agree.sh MPIEXEC FAULT_JOB
set -euo pipefail
mpiexec=$1
job=$2
host=$(hostname)
passed=0
failed=0

# Runs the job, one app context per rank: run_job "ENV-ARGS-0" "ENV-ARGS-1" ...
# (each the arguments of env(1) for that rank). Sets out and rc.
run_job() {
  local cmd=(timeout 60 "$mpiexec" --oversubscribe) first=1 e
  for e in "$@"; do
    [ $first -eq 1 ] || cmd+=(:)
    first=0
    # shellcheck disable=SC2206  # the env arguments are words on purpose
    cmd+=(-n 1 env $e "$job" stall -1)
  done
  rc=0
  out=$("${cmd[@]}" 2>&1) || rc=$?
}

# report NAME OK: counts a result (OK 1 or 0), prints the output on failure.
report() {
  local name=$1 ok=$2
  if [ "$ok" -eq 1 ]; then
    passed=$((passed + 1))
    echo "ok: $name"
  else
    failed=$((failed + 1))
    echo "FAILED: $name"
    echo "--- output (exit status $rc) ---"
    echo "$out"
    echo "--------------"
  fi
}

# expect_error NAME RANKS NEEDLE...: the job failed with status 1 (not a
# hang), and every rank's error holds every NEEDLE (fixed strings; %r is
# the rank).
expect_error() {
  local name=$1 ranks=$2 ok=1 r needle
  shift 2
  if [ $rc -ne 1 ]; then
    echo "exit status $rc, expected 1 (124: a hang)"
    ok=0
  fi
  for r in $(seq 0 $((ranks - 1))); do
    local line
    line=$(grep -F "fault_job: rank $r: shardopt error on rank $r [SHARDOPT_ERR_INVALID_CONFIG]" \
      <<<"$out" || true)
    if [ -z "$line" ]; then
      echo "rank $r printed no ConfigError"
      ok=0
      continue
    fi
    for needle in "$@"; do
      needle=${needle//%r/$r}
      if ! grep -qF -- "$needle" <<<"$out"; then
        echo "missing: $needle"
        ok=0
      fi
    done
  done
  report "$name" $ok
}

# Different values: both ranks name the variable, both values and hosts,
# and how to pass it.
run_job "SHARDOPT_BUCKET_MB=25" "SHARDOPT_BUCKET_MB=50"
expect_error "SHARDOPT_BUCKET_MB 25 on rank 0, 50 on rank 1: every rank stops" 2 \
  "SHARDOPT_BUCKET_MB must be the same on every rank, and is not: SHARDOPT_BUCKET_MB is '25' on rank 0 (host $host) but '50' on rank 1 (host $host) (1 of 2 ranks differ from rank 0: rank 1)" \
  "fix: set SHARDOPT_BUCKET_MB the same on every rank: export it before srun" \
  "mpirun -x SHARDOPT_BUCKET_MB"
if [ "$(grep -cF 'must be the same on every rank, and is not' <<<"$out")" -ne 2 ]; then
  rc=0 report "each of 2 ranks says it once" 0
fi

# Set on ranks 1 and 2 only, the watchdog, which would add collectives to
# the communicator's construction on those ranks alone.
run_job "-u SHARDOPT_TIMEOUT" "SHARDOPT_TIMEOUT=60" "SHARDOPT_TIMEOUT=60"
expect_error "SHARDOPT_TIMEOUT unset on rank 0, 60 on ranks 1 and 2: every rank stops" 3 \
  "SHARDOPT_TIMEOUT is unset (default 600) on rank 0 (host $host) but '60' on rank 1 (host $host) (2 of 3 ranks differ from rank 0: ranks 1, 2)"

# Two variables at once: both named, each passed with -x.
run_job "SHARDOPT_CHECK_ARGS=0 SHARDOPT_STAGED_CHUNK_KB=64" "SHARDOPT_CHECK_ARGS=1 SHARDOPT_STAGED_CHUNK_KB=64" \
  "SHARDOPT_CHECK_ARGS=0 SHARDOPT_STAGED_CHUNK_KB=128"
expect_error "SHARDOPT_CHECK_ARGS and SHARDOPT_STAGED_CHUNK_KB differ: both named" 3 \
  "SHARDOPT_CHECK_ARGS must be the same on every rank, and is not: SHARDOPT_CHECK_ARGS is '0' on rank 0 (host $host) but '1' on rank 1" \
  "(2 of 3 ranks differ from rank 0: ranks 1, 2)"
run_job "SHARDOPT_CHECK_ARGS=0 SHARDOPT_STAGED_CHUNK_KB=64" "SHARDOPT_CHECK_ARGS=1 SHARDOPT_STAGED_CHUNK_KB=128"
expect_error "two variables differ on one rank: both named, both passed with -x" 2 \
  "SHARDOPT_CHECK_ARGS and SHARDOPT_STAGED_CHUNK_KB must be the same on every rank, and are not: SHARDOPT_CHECK_ARGS is '0' on rank 0" \
  "SHARDOPT_STAGED_CHUNK_KB is '64' on rank 0 (host $host) but '128' on rank 1" \
  "mpirun -x SHARDOPT_CHECK_ARGS -x SHARDOPT_STAGED_CHUNK_KB"

# A bad value on rank 1 only: rank 1 names its value, rank 0 names rank 1.
run_job "" "SHARDOPT_CHECK_ARGS=maybe"
expect_error "SHARDOPT_CHECK_ARGS=maybe on rank 1 only: every rank stops" 2 \
  "fault_job: rank 1: shardopt error on rank 1 [SHARDOPT_ERR_INVALID_CONFIG]: SHARDOPT_CHECK_ARGS='maybe' is not a valid value" \
  "fault_job: rank 0: shardopt error on rank 0 [SHARDOPT_ERR_INVALID_CONFIG]: a SHARDOPT_* variable is not valid on rank 1 of 2; on rank 1 (host $host): SHARDOPT_CHECK_ARGS='maybe' is not a valid value"

# Per-rank variables may differ, equal values may be spelled differently:
# the job runs; rank 0 alone logs at INFO, the nodes among it.
run_job "SHARDOPT_DEBUG=INFO SHARDOPT_STATS_EVERY=1 SHARDOPT_CPU_ISA=avx2 SHARDOPT_CHECK_ARGS=1" \
  "SHARDOPT_DEBUG=WARN SHARDOPT_STATS_EVERY=0 SHARDOPT_CHECK_ARGS=true"
ok=1
[ $rc -eq 0 ] || { echo "exit status $rc, expected 0"; ok=0; }
grep -q "\[0\] SHARDOPT INFO Communicator of 2 ranks on 1 node (2 per node)$" <<<"$out" ||
  { echo "no node layout from the Communicator"; ok=0; }
grep -q "\[0\] SHARDOPT INFO ZeRO engine: stage 2, 1 parameter in 1 bucket, 2 ranks on 1 node (2 per node); rank 0 allocated .* MiB (memory_report(), per rank: a node of 2 ranks holds about 2 x that)$" <<<"$out" ||
  { echo "no node layout from the ZeRO engine"; ok=0; }
grep -q "\[1\] SHARDOPT INFO" <<<"$out" && { echo "rank 1 logged at INFO"; ok=0; }
report "per-rank variables differ, 1 and true agree: the job runs and logs its nodes" $ok

echo "env agreement: $passed passed, $failed failed"
[ $failed -eq 0 ]
