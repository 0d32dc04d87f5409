#!/usr/bin/env bash
# shardopt-ckpt on checkpoints of the main job (shardopt-train --checkpoint):
# - info: exit 0, the key lines of the summary and the tensor table; --json
#   parses and names the step; a plain safetensors file has no shardopt
#   metadata;
# - verify: ok at 1 and 2 ranks, also with windows smaller than a chunk;
# - export at 2 ranks: bitwise the file the trainer's --export writes
#   (ZeroRedundancyOptimizer::export_params), identical to the checkpoint's
#   master tensors for diff --params-only; bf16 within 2^-8 of them;
# - diff: a checkpoint against itself exits 0, against one of one more
#   step 1 (naming the step);
# - a copy with one data byte flipped, a truncated copy, one with garbage in
#   its header, a missing file, a file without checksums: verify exits 1
#   with a message naming the problem (the tensor, for the flipped byte),
#   each alone and all among good files, without mpirun and at 2 ranks, no
#   hang; diff of such a file exits 2; bad command lines exit 2, without
#   mpirun and at 2 ranks.
# Usage: test_ckpt.sh MPIEXEC CKPT-PROGRAM TRAIN-PROGRAM
set -u
mpiexec=$1
ckpt=$2
train=$3
# shellcheck source=lib.sh
. "$(dirname "$0")/lib.sh"

# Runs shardopt-ckpt at RANKS ranks, its output (stdout and stderr) into
# $tmp/out; returns its exit status (124: it hung). RANKS 0: one process
# started without mpirun (an MPI singleton), as a user runs the tool on a
# login node.
tool() {  # RANKS ARGS...
  local n=$1
  shift
  if [ "$n" -eq 0 ]; then
    timeout 60 "$ckpt" "$@" >"$tmp/out" 2>&1
  else
    timeout 60 "$mpiexec" -n "$n" --oversubscribe "$ckpt" "$@" >"$tmp/out" 2>&1
  fi
}

# Expects exit status RC and every TEXT in the output.
expect() {  # WHAT RC RANKS ARGS... -- TEXT...
  local what=$1 want=$2 n=$3
  shift 3
  local args=()
  while [ $# -gt 0 ] && [ "$1" != -- ]; do args+=("$1"); shift; done
  [ $# -gt 0 ] && shift
  tool "$n" "${args[@]}"
  local rc=$? where="np$n"
  [ "$n" -eq 0 ] && where="no mpirun"
  if [ $rc -ne "$want" ]; then
    fail "$what ($where): exit status $rc, expected $want (124: a hang)" "$tmp/out"; return
  fi
  local text
  for text in "$@"; do
    if ! grep -qF -- "$text" "$tmp/out"; then
      fail "$what ($where): the output does not say '$text'" "$tmp/out"; return
    fi
  done
  ok "$what ($where)"
}

# Two checkpoints of a small model (16 -> 64 -> 64 -> 4: 5,508 parameters)
# 20 and 21 steps in, and the trainer's own export of the first.
small=(--hidden 64 --layers 3 --log-every 100000)
for steps in 20 21; do
  extra=()
  [ "$steps" = 20 ] && extra=(--export "$tmp/lib_export.st")
  if ! timeout 120 "$mpiexec" -n 2 --oversubscribe "$train" "${small[@]}" --steps "$steps" \
       --checkpoint "$tmp/c$steps.st" "${extra[@]}" >"$tmp/out" 2>&1; then
    fail "shardopt-train --steps $steps --checkpoint" "$tmp/out"
    echo "ckpt: $passed passed, $failed failed"
    exit 1
  fi
done
a=$tmp/c20.st
b=$tmp/c21.st
bytes=$((5508 * 3 * 4))  # master weights and AdamW's two states, fp32

# info
expect "info" 0 1 info "$a" -- "format version:      1" "content:             checkpoint" \
  "step:                20" "optimizer:           adamw" "ranks saved at:      2" \
  "dtype:               f32" "groups:              [{" "layers.1.weight.exp_avg_sq" \
  "total: 18 tensors, $bytes bytes"
if tool 2 info --json "$a" && python3 - "$tmp/out" "$bytes" <<'EOF'
import json, sys
j = json.loads(open(sys.argv[1]).read())
assert j["step"] == 20 and j["content"] == "checkpoint" and j["optimizer"] == "adamw", j
assert j["total_tensors"] == 18 and j["total_bytes"] == int(sys.argv[2]), j
assert j["groups"][0]["betas"] == [0.9, 0.999], j["groups"]
assert [t["name"] for t in j["tensors"]][:2] == ["layers.0.weight", "layers.0.bias"]
EOF
then ok "info --json (np2)"; else fail "info --json (np2)" "$tmp/out"; fi

# verify
for n in 1 2; do
  expect "verify" 0 "$n" verify "$a" "$b" -- "$a: ok (18 tensors, $bytes bytes, 18 chunks verified)" \
    "verify: 2 of 2 files ok"
done

# export, and diff against the checkpoint and the trainer's export
expect "export" 0 2 export "$a" "$tmp/e.st" -- "6 parameters (5508 elements, f32"
if cmp -s "$tmp/e.st" "$tmp/lib_export.st"; then
  ok "export is bitwise the file export_params writes"
else
  fail "export differs from the file export_params writes"
fi
expect "diff --params-only of the checkpoint and its export" 0 2 diff --params-only "$a" \
  "$tmp/e.st" -- "summary: identical: 6 tensors compared: 6 identical"
# Small chunks and windows: cuts inside tensors, windows on every rank.
expect "export bf16, small chunks" 0 3 export -d bf16 --chunk-bytes 1K -w 2K "$a" "$tmp/e16.st" \
  -- "bf16"
expect "verify with windows of 4K" 0 3 verify -w 4K "$tmp/e16.st" -- "$tmp/e16.st: ok"
expect "diff of the bf16 export, bitwise" 1 2 diff --params-only "$a" "$tmp/e16.st" \
  -- "different (dtype F32 vs BF16)"
expect "diff of the bf16 export within 2^-8" 0 2 diff --params-only --rtol 0.00390625 -w 1K "$a" \
  "$tmp/e16.st" -- "equal within tolerances"

# diff
expect "diff of a checkpoint and itself" 0 2 diff "$a" "$a" -- "summary: identical: 18 tensors"
expect "diff of checkpoints 20 and 21 steps in" 1 2 diff "$a" "$b" -- "shardopt.step:" \
  "A: 20" "B: 21" "18 different"
expect "diff of checkpoints 20 and 21 steps in" 1 0 diff -q "$a" "$b" -- "summary: different"

# Bad files.
python3 - "$a" "$tmp" <<'EOF'
import json, shutil, struct, sys
src, tmp = sys.argv[1], sys.argv[2]
raw = bytearray(open(src, "rb").read())
n = struct.unpack_from("<Q", raw)[0]
header = json.loads(raw[8:8 + n])
begin = header["layers.1.weight"]["data_offsets"][0]
flipped = bytearray(raw)
flipped[8 + n + begin + 100] ^= 0x01
open(f"{tmp}/flipped.st", "wb").write(flipped)
open(f"{tmp}/truncated.st", "wb").write(raw[:len(raw) - 1000])
garbage = bytearray(raw)
garbage[8 + 40:8 + 48] = b"#garbage"
open(f"{tmp}/garbage.st", "wb").write(garbage)
# A plain safetensors file: no shardopt metadata, no checksums.
h = json.dumps({"w": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]}}).encode()
h += b" " * (-(8 + len(h)) % 8)
open(f"{tmp}/plain.st", "wb").write(struct.pack("<Q", len(h)) + h + struct.pack("<2f", 1, 2))
EOF
# One file at a time without mpirun, where a failure costs no job teardown.
expect "verify of a flipped byte" 1 0 verify "$tmp/flipped.st" -- \
  "shardopt-ckpt: $tmp/flipped.st:" "checksum mismatch in tensor 'layers.1.weight'" "fix:"
expect "verify of a truncated file" 1 0 verify "$tmp/truncated.st" -- \
  "shardopt-ckpt: $tmp/truncated.st:" "truncated" "fix:"
expect "verify of garbage in the header" 1 0 verify "$tmp/garbage.st" -- \
  "shardopt-ckpt: $tmp/garbage.st:" "not valid JSON" "fix:"
expect "verify of a missing file" 1 0 verify "$tmp/missing.st" -- \
  "shardopt-ckpt: $tmp/missing.st: cannot open" "fix:"
expect "verify of a file without checksums" 1 0 verify "$tmp/plain.st" -- \
  "has no checksums" "--allow-unchecksummed"
# Every one of them among good files, without mpirun and at 2 ranks: each
# bad file is named with its problem, the good ones still pass, the status
# is 1.
for n in 0 2; do
  expect "verify of good and bad files" 1 "$n" verify "$a" "$tmp/flipped.st" \
    "$tmp/truncated.st" "$tmp/garbage.st" "$tmp/missing.st" "$tmp/plain.st" "$b" -- \
    "$a: ok" "$b: ok" "verify: 2 of 7 files ok" \
    "checksum mismatch in tensor 'layers.1.weight'" "$tmp/truncated.st:" "truncated" \
    "$tmp/garbage.st:" "not valid JSON" "$tmp/missing.st: cannot open" "has no checksums"
  expect "diff with a corrupted file" 2 "$n" diff "$a" "$tmp/flipped.st" -- \
    "checksum mismatch in tensor 'layers.1.weight'"
  expect "export of a missing file" 1 "$n" export "$tmp/missing.st" "$tmp/x.st" -- "cannot open"
done
expect "info of a plain safetensors file" 0 1 info "$tmp/plain.st" -- \
  "0: a plain safetensors file, no shardopt metadata" "total: 1 tensors, 8 bytes"
expect "verify --allow-unchecksummed" 0 2 verify --allow-unchecksummed "$tmp/plain.st" -- \
  "ok (1 tensors, 8 bytes read; no checksums"
expect "export of an export" 1 2 export "$tmp/e.st" "$tmp/x.st" -- "not a checkpoint"
[ -e "$tmp/x.st" ] && fail "a failed export left $tmp/x.st behind"

# Bad command lines: exit status 2 on every rank, a message naming the problem.
expect "no command" 2 2 -- "no command given"
expect "an unknown command" 2 0 frobnicate -- "unknown command 'frobnicate'"
expect "a bad --dtype" 2 2 export "$a" "$tmp/x.st" --dtype f64 -- \
  "bad value 'f64' for -d (--dtype); accepted: f32 bf16 f16"
expect "verify without a file" 2 0 verify -- "expected FILE..."
expect "an unknown option" 2 0 info --bogus "$a" -- "unknown option '--bogus'"

echo "ckpt: $passed passed, $failed failed"
[ $failed -eq 0 ]
