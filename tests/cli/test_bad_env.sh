#!/usr/bin/env bash
# A bad SHARDOPT_* value stops a real MPI program on every rank with an error
# that names the variable and its accepted values, quickly and without a hang.
# Usage: test_bad_env.sh MPIEXEC PROGRAM
set -u
mpiexec=$1
program=$2
ranks=2
failed=0
passed=0

expect_rejected() {  # VAR VALUE ACCEPTED-TEXT
  local var=$1 value=$2 accepted=$3 out rc
  out=$(env "$var=$value" timeout 60 "$mpiexec" -n $ranks --oversubscribe "$program" -b 1K -e 1K 2>&1)
  rc=$?
  local ok=1
  if [ $rc -eq 0 ] || [ $rc -eq 124 ]; then
    echo "FAILED: $var=$value: exit code $rc (expected a failure, not success or a hang)"; ok=0
  fi
  for r in $(seq 0 $((ranks - 1))); do
    if ! grep -q "on rank $r \[SHARDOPT_ERR_INVALID_CONFIG\]: $var='$value'" <<<"$out"; then
      echo "FAILED: $var=$value: rank $r did not report the bad value"; ok=0
    fi
  done
  if ! grep -qF "$accepted" <<<"$out"; then
    echo "FAILED: $var=$value: the accepted values ($accepted) are not named"; ok=0
  fi
  if [ $ok -eq 1 ]; then
    passed=$((passed + 1)); echo "ok: $var=$value rejected on every rank"
  else
    failed=$((failed + 1)); echo "--- output ---"; echo "$out"; echo "--------------"
  fi
}

expect_rejected SHARDOPT_DEBUG LOUD "NONE, WARN, INFO, TRACE"
expect_rejected SHARDOPT_HUGE_PAGES maybe "1, 0"
expect_rejected SHARDOPT_COMM_MAX_CHUNK 0 "1 to 2147483647"
expect_rejected SHARDOPT_CHECK_ARGS maybe "1, 0"
expect_rejected SHARDOPT_BUCKET_MB 0 "a number of MiB > 0"
expect_rejected SHARDOPT_BUCKET_MB 25MB "a number of MiB > 0"
expect_rejected SHARDOPT_CHECK_SYNC -1 "0 to 2147483647"
expect_rejected SHARDOPT_TIMEOUT 10s "a number of seconds >= 0"
expect_rejected SHARDOPT_DESYNC_CHECK maybe "1, 0"
expect_rejected SHARDOPT_STATS_EVERY often "0 to 2147483647"

# And a good value runs.
if out=$(SHARDOPT_DEBUG=INFO timeout 60 "$mpiexec" -n $ranks --oversubscribe "$program" -b 1K -e 1K 2>&1) &&
   grep -q "SHARDOPT INFO" <<<"$out"; then
  passed=$((passed + 1)); echo "ok: SHARDOPT_DEBUG=INFO runs and logs"
else
  failed=$((failed + 1)); echo "FAILED: SHARDOPT_DEBUG=INFO"; echo "$out"
fi

# SHARDOPT_DEBUG_FILE with %r: one log file per rank, each with that rank's lines.
logdir=$(mktemp -d)
if SHARDOPT_DEBUG=INFO SHARDOPT_DEBUG_FILE="$logdir/shardopt.%r.log" timeout 60 \
     "$mpiexec" -n $ranks --oversubscribe "$program" -b 1K -e 1K >/dev/null 2>&1 &&
   grep -q "\[0\] SHARDOPT INFO" "$logdir/shardopt.0.log" 2>/dev/null &&
   grep -q "\[1\] SHARDOPT INFO" "$logdir/shardopt.1.log" 2>/dev/null; then
  passed=$((passed + 1)); echo "ok: SHARDOPT_DEBUG_FILE writes one log per rank"
else
  failed=$((failed + 1)); echo "FAILED: SHARDOPT_DEBUG_FILE=$logdir/shardopt.%r.log"; ls -l "$logdir"
fi
rm -rf "$logdir"

echo "bad env: $passed passed, $failed failed"
[ $failed -eq 0 ]
