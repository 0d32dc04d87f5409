#!/usr/bin/env bash
# Every tool accepts every optimizer and runs that one, not a default. The
# optimizers are read from SHARDOPT_OPTIMIZERS in
# include/shardopt/optimizers.hpp (the list the build reads too), so a new
# descriptor is tested here without touching this file. For each key:
# - shardopt-train -o KEY at 2 ranks: the checkpoint it writes names KEY and
#   the engine's state slots (shardopt-ckpt info);
# - shardopt-bench-step -o KEY at 2 ranks: every row names KEY as the
#   engine reports it (ZeroRedundancyOptimizer::param_group), and its
#   optimizer state is the checkpoint's slots (4 bytes each per element);
# - shardopt-bench-optim -o KEY: its rows name KEY and count the bytes of
#   those slots (fp32: 12 + 8 per slot; LAMB's second pass 12 more);
# - shardopt-plan -o KEY: the plan names KEY and holds those slots.
# (LAMB, the one optimizer that is not element-wise, keeps its update
# direction beside its slots and reads it in a second pass.)
# The slots differ between optimizers (SGD with momentum 1, Adam 2, Adam
# with amsgrad off 2, ...), so a tool that fell back to another optimizer
# fails where its state differs, and bench-step fails on the name for any.
# Usage: test_every_optimizer.sh MPIEXEC SOURCE-DIR TRAIN BENCH-STEP BENCH-OPTIM PLAN CKPT
set -u
mpiexec=$1
src=$2
# The programs by absolute path: the trainer runs in a folder of its own.
train=$(realpath "$3")
step=$(realpath "$4")
optim=$(realpath "$5")
plan=$(realpath "$6")
ckpt=$(realpath "$7")
# shellcheck source=lib.sh
. "$(dirname "$0")/lib.sh"
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1

# X(SGD) ... X(RAdam): a descriptor's key is its name in lower case.
keys=$(sed -n '/^#define SHARDOPT_OPTIMIZERS(X)/,/^$/p' "$src/include/shardopt/optimizers.hpp" |
  grep -o 'X([A-Za-z0-9_]*)' | sed 's/^X(\(.*\))$/\1/' | tr '[:upper:]' '[:lower:]')
if [ "$(wc -w <<<"$keys")" -lt 9 ]; then
  fail "SHARDOPT_OPTIMIZERS read from optimizers.hpp: '$keys' (expected at least 9 optimizers)"
  exit 1
fi

# The rows of one tool's JSON output (one object per line), checked for KEY
# with SLOTS state slots. LAMB's state holds its update direction too (one
# more per element), and its second pass reads p and the direction and
# writes p (12 bytes a parameter more).
cat >"$tmp/check.py" <<'PY'
import json, sys
tool, path, key, slots = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4])
rows = [json.loads(l) for l in open(path) if l.startswith('{')]
want_rows = {'step': 2, 'optim': 1, 'plan': 1}[tool]
assert len(rows) == want_rows, 'expected %d rows, got %d' % (want_rows, len(rows))
state = 4 * (slots + (key == 'lamb'))  # bytes per element
for r in rows:
    assert r['optimizer'] == key, 'a row ran %s' % r['optimizer']
    if tool == 'step' and r['stage'] == 0:  # every rank holds every element's state
        assert r['mem_state'] == state * r['params'], 'state %d bytes' % r['mem_state']
    if tool == 'plan':
        assert r['optimizer_state'] == state * r['params'], 'state %d bytes' % r['optimizer_state']
    if tool == 'optim':  # read p, g and each slot; write p and each slot
        want = 12 + 8 * slots + (12 if key == 'lamb' else 0)
        assert r['bytes_per_param'] == want, 'B_pp %d, expected %d' % (r['bytes_per_param'], want)
PY

# run_tool NAME WHAT-IT-CHECKS COMMAND...: runs one tool for $key into
# $d/NAME.json and checks its rows.
run_tool() {
  local name=$1 what=$2
  shift 2
  if ! timeout 120 "$@" >"$d/$name.json" 2>"$d/$name.err"; then
    fail "$name -o $key" "$d/$name.err"
  elif python3 "$tmp/check.py" "$name" "$d/$name.json" "$key" "$slots" >"$d/$name.check" 2>&1; then
    ok "$name -o $key: $what"
  else
    fail "$name -o $key: $what" "$d/$name.check"
  fi
}

for key in $keys; do
  d=$tmp/$key
  mkdir -p "$d"
  if ! (cd "$d" && timeout 120 "$mpiexec" -n 2 "$train" -o "$key" --steps 2 \
    --checkpoint ck.safetensors) >"$d/train.out" 2>&1; then
    fail "shardopt-train -o $key" "$d/train.out"
    continue
  fi
  if ! "$ckpt" info "$d/ck.safetensors" >"$d/info.out" 2>&1; then
    fail "shardopt-ckpt info on shardopt-train -o $key's checkpoint" "$d/info.out"
    continue
  fi
  if ! grep -Eq "^optimizer: +$key\$" "$d/info.out"; then
    fail "shardopt-train -o $key: its checkpoint names another optimizer" "$d/info.out"
    continue
  fi
  # The engine's state slots: states: ["exp_avg","exp_avg_sq"].
  slots=$(sed -n 's/^states: *//p' "$d/info.out" |
    python3 -c 'import json,sys; print(len(json.load(sys.stdin)))')
  ok "shardopt-train -o $key: the checkpoint names $key, $slots state slots"

  run_tool step "the engine ran $key, with its state" \
    "$mpiexec" -n 2 "$step" -o "$key" -s 0,2 -p 64K -w 0 -n 1 --json
  run_tool optim "$key's row and bytes" "$optim" -o "$key" -s 64K -t 1 -p fp32 -n 1 -w 0 --json
  run_tool plan "$key's state" "$plan" -p 1M -o "$key" -s 0 -n 1 --json
done

echo "$passed passed, $failed failed"
[ "$failed" -eq 0 ]
