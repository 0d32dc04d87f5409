#!/usr/bin/env bash
# One message per job: an error every rank meets (a bad setting, a failure
# the ranks agreed on) is printed once, by the lowest rank that holds it,
# at 4 ranks, by shardopt-train and shardopt-ckpt; with SHARDOPT_DEBUG=INFO
# every rank prints its own. A failure of one rank alone is still printed
# by that rank.
# Usage: test_messages.sh MPIEXEC TRAIN CKPT
set -u
mpiexec=$1
train=$2
ckpt=$3
export OMP_NUM_THREADS=1
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
failed=0
passed=0
small=(--hidden 64 --layers 2 --log-every 100000)

# expect NAME WANT-STATUS LINES PATTERN: the job's last run ended with
# WANT-STATUS and printed PATTERN (an extended regular expression) on
# exactly LINES lines.
expect() {
  local name=$1 want=$2 lines=$3 pattern=$4 got
  got=$(grep -cE -- "$pattern" "$tmp/out")
  if [ "$rc" -ne "$want" ] || [ "$got" -ne "$lines" ]; then
    failed=$((failed + 1))
    echo "FAILED: $name: exit status $rc (expected $want), $got line(s) matching '$pattern' (expected $lines)"
    sed 's/^/  | /' "$tmp/out"
    return
  fi
  passed=$((passed + 1))
  echo "ok: $name: exit status $rc, $got line(s)"
}

run() {  # run ENV-ARGS... -- PROGRAM ARGS...: 4 ranks
  local envs=()
  while [ "$1" != -- ]; do
    envs+=("$1")
    shift
  done
  shift
  rc=0
  env "${envs[@]}" timeout 120 "$mpiexec" -n 4 --oversubscribe "$@" >"$tmp/out" 2>&1 || rc=$?
}

# A bad setting: every rank rejects it.
run SHARDOPT_BUCKET_MB=lots -- "$train" "${small[@]}" --steps 2
expect "a bad setting, 4 ranks" 1 1 "^shardopt-train: rank 0: .*SHARDOPT_BUCKET_MB"
expect "a bad setting: nobody else prints it" 1 1 "SHARDOPT_ERR_INVALID_CONFIG"

# A failure the ranks agree on in the library: resuming from a checkpoint
# of another model.
rc=0
timeout 120 "$mpiexec" -n 2 "$train" --hidden 32 --layers 2 --log-every 100000 --steps 2 \
  --checkpoint "$tmp/other" >"$tmp/out" 2>&1 || rc=$?
[ "$rc" -eq 0 ] || { echo "FAILED: writing a checkpoint: exit status $rc"; cat "$tmp/out"; exit 1; }
run -- "$train" "${small[@]}" --steps 4 --resume "$tmp/other"
expect "resuming another model's checkpoint, 4 ranks" 1 1 "^shardopt-train: rank [0-3]: "
expect "its fix names the trainer's options, not C++ fields" 1 1 "fix: resume with the model .*--hidden"
expect "no C++ field in it" 1 0 "::"
run SHARDOPT_DEBUG=INFO -- "$train" "${small[@]}" --steps 4 --resume "$tmp/other"
expect "the same with SHARDOPT_DEBUG=INFO: every rank prints its own" 1 4 \
  "^shardopt-train: rank [0-3]: "

# shardopt-ckpt on a file that is not there: every rank fails alike.
run -- "$ckpt" info "$tmp/missing.safetensors"
expect "shardopt-ckpt info of a missing file, 4 ranks" 1 1 "missing\.safetensors"

echo "cli-messages: $passed passed, $failed failed"
[ "$failed" -eq 0 ]
