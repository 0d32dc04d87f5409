# shellcheck shell=bash
# Sourced by the example codes' tests (test_example_c.sh,
# test_example_fortran.sh), after lib.sh (ok, fail). Each example takes
# STAGE STEPS FILE, writes its coefficients to FILE, exits 1 when it misses
# its threshold ("NOT reached") and 2 with a usage line for bad arguments.
# $mpiexec and $tmp are the caller's.

# The coefficient files of stages 0, 1 and 2 at N ranks are byte-identical.
example_stages_identical() {
  local n=$1
  if cmp -s "$tmp/coeffs-np$n-stage0.txt" "$tmp/coeffs-np$n-stage1.txt" &&
    cmp -s "$tmp/coeffs-np$n-stage0.txt" "$tmp/coeffs-np$n-stage2.txt"; then
    ok "$n ranks: stages 0, 1 and 2 wrote byte-identical coefficients"
  else
    fail "$n ranks: the stages' coefficient files differ"
  fi
}

# STEPS steps are far from enough: the threshold is missed, exit status 1.
example_too_few_steps() {
  local program=$1 steps=$2 status
  timeout 120 "$mpiexec" -n 2 --oversubscribe "$program" 1 "$steps" "$tmp/short.txt" \
    >"$tmp/short.log" 2>&1
  status=$?
  if [ "$status" -eq 1 ] && grep -q 'NOT reached' "$tmp/short.log"; then
    ok "$steps steps miss the threshold: exit status 1"
  else
    fail "$steps steps: exit status $status, expected 1 with 'NOT reached'" "$tmp/short.log"
  fi
}

# Bad arguments (stage 3; no file): a usage message and exit status 2.
example_bad_arguments() {
  local program=$1 steps=$2 args status
  for args in "3 $steps $tmp/x.txt" "1 $steps"; do
    # shellcheck disable=SC2086
    timeout 60 "$mpiexec" -n 2 --oversubscribe "$program" $args >"$tmp/bad.log" 2>&1
    status=$?
    if [ "$status" -eq 2 ] && grep -q '^usage:' "$tmp/bad.log"; then
      ok "arguments '$args': usage and exit status 2"
    else
      fail "arguments '$args': exit status $status, expected 2 with a usage line" "$tmp/bad.log"
    fi
  done
}
