#!/usr/bin/env bash
# A shardopt call without ierr that fails must end the job: the failing
# rank stops (error stop) with the message and its hint, the others are
# ended by the launcher, nothing hangs. Runs fortran_error_stop with a
# mistake found by the module and one found by the C API.
# Usage: run_error_stop.sh MPIEXEC PROGRAM NRANKS
set -u
mpiexec=$1
prog=$2
n=$3
last=$((n - 1))
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
passed=0
failed=0
fail() { echo "FAILED: $*"; sed 's/^/  | /' "$work/out"; failed=$((failed + 1)); }

expect_stop() {
  local mode=$1 text=$2
  local status=0
  timeout 60 "$mpiexec" -n "$n" --oversubscribe "$prog" "$mode" >"$work/out" 2>&1 || status=$?
  if [ "$status" -eq 0 ]; then fail "$mode: the job exited 0"; return; fi
  if [ "$status" -eq 124 ]; then fail "$mode: the job hung (killed after 60 s)"; return; fi
  if ! grep -qF "ERROR STOP shardopt (rank $last): $text" "$work/out"; then
    fail "$mode: no 'ERROR STOP shardopt (rank $last): $text' in the output"
    return
  fi
  if ! grep -qF '(hint: ' "$work/out"; then fail "$mode: the message has no hint"; return; fi
  if grep -qF "rank $last went on" "$work/out"; then fail "$mode: rank $last went on after the error"; return; fi
  if grep -qF 'the job finished' "$work/out"; then fail "$mode: the job finished"; return; fi
  echo "ok: $mode at $n ranks: rank $last stopped with \"$text...\" (exit status $status)"
  passed=$((passed + 1))
}

expect_stop module "shardopt_grad_ready: parameter 1 ('w') has 10 elements but the gradient passed has 9"
expect_stop capi "shardopt_set_hparams: "

# An error every rank meets: printed by one rank, the others stop quietly.
status=0
timeout 60 "$mpiexec" -n "$n" --oversubscribe "$prog" agreed >"$work/out" 2>&1 || status=$?
lines=$(grep -c "ERROR STOP shardopt (rank [0-9]*): shardopt_optimizer_create: " "$work/out")
if [ "$status" -eq 0 ] || [ "$status" -eq 124 ]; then
  fail "agreed: exit status $status"
elif [ "$lines" -ne 1 ]; then
  fail "agreed: $lines ranks printed the error, expected 1"
elif ! grep -qF "parameter 1 ('w' on rank 0)" "$work/out"; then
  fail "agreed: the message does not name the parameter as Fortran numbers it (parameter 1)"
elif grep -F "ERROR STOP" "$work/out" | grep -qF '::'; then
  fail "agreed: the message has a C++ spelling ('::')"
elif grep -qF "went on" "$work/out"; then
  fail "agreed: a rank went on after the error"
else
  echo "ok: agreed at $n ranks: one rank printed the error (exit status $status)"
  passed=$((passed + 1))
fi
echo "fortran-error-stop: $passed passed, $failed failed"
[ "$failed" -eq 0 ]
