#!/usr/bin/env bash
# shardopt-train end to end under mpirun: at 1, 2 and 3 ranks and in several
# configurations (optimizers, stages, precisions, micro-batches, clipping,
# scattered buffers) its held-out loss falls below the threshold README.md
# states for the demo, and --save-params writes a file of the size
# docs/train.md documents whose values are finite. A bad option or an
# unwritable --save-params file stops every rank with an error, not a hang.
# Usage: test_train.sh MPIEXEC PROGRAM
set -u
mpiexec=$1
program=$2
threshold=0.01
# More ranks than cores here: one OpenMP thread per rank, or the optimizer
# kernels' threads of different ranks spin against each other.
export OMP_NUM_THREADS=1
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
failed=0
passed=0

fail() {  # MESSAGE [OUTPUT]
  failed=$((failed + 1))
  echo "FAILED: $1"
  if [ $# -gt 1 ]; then echo "--- output ---"; echo "$2"; echo "--------------"; fi
}

# Checks the summary line of a --json run: held-out loss below the
# threshold and lower than at the start, every step applied, the rank count.
check_summary() {  # OUTPUT-FILE RANKS
  python3 - "$1" "$2" "$threshold" <<'EOF'
import json, math, sys
path, ranks, threshold = sys.argv[1], int(sys.argv[2]), float(sys.argv[3])
start = summary = None
for line in open(path):
    if line.startswith("{"):
        obj = json.loads(line)
        if obj["type"] == "start":
            start = obj
        elif obj["type"] == "summary":
            summary = obj
if start is None or summary is None:
    sys.exit("no start or summary line")
if start["ranks"] != ranks:
    sys.exit(f"ran at {start['ranks']} ranks, expected {ranks}")
final, initial = summary["final_loss"], summary["initial_loss"]
if final is None or not math.isfinite(final) or final >= threshold:
    sys.exit(f"final loss {final} is not below {threshold}")
if not final < initial / 20:
    sys.exit(f"final loss {final} is not well below the initial loss {initial}")
if summary["applied"] + summary["skipped"] != summary["steps"]:
    sys.exit("applied and skipped steps do not add up")
print(f"loss {initial:.4g} -> {final:.4g} in {summary['steps']} steps")
EOF
}

# Checks a --save-params file against docs/train.md: the header, one record
# per tensor (names, shapes, offsets end to end), the size, finite values.
check_params_file() {  # FILE DTYPE TENSORS NUMEL
  python3 - "$@" <<'EOF'
import math, struct, sys
path, dtype, tensors, numel = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
codes = {"f32": (0, 4), "bf16": (2, 2), "f16": (3, 2)}
code, esize = codes[dtype]
raw = open(path, "rb").read()
magic, version, dt, es, t, n, steps, data_offset = struct.unpack_from("<8sIIIIQQQ", raw, 0)
if magic != b"SOPARAMS" or version != 1:
    sys.exit(f"bad magic {magic!r} or version {version}")
if (dt, es, t, n) != (code, esize, tensors, numel):
    sys.exit(f"header says dtype {dt}, {es} B, {t} tensors, {n} elements")
if any(raw[48:64]):
    sys.exit("reserved header bytes are not zero")
expected = 64 + 64 * tensors + numel * esize
if len(raw) != expected or data_offset != 64 + 64 * tensors:
    sys.exit(f"size {len(raw)} (data at {data_offset}), expected {expected}")
at = 0
for i in range(tensors):
    name, ndim, d0, d1, reserved, offset = struct.unpack_from("<40sIIIIQ", raw, 64 + 64 * i)
    name = name.rstrip(b"\0").decode()
    want = f"layers.{i // 2}.{'weight' if i % 2 == 0 else 'bias'}"
    count = d0 * (d1 if ndim == 2 else 1)
    if name != want or ndim != (2 if i % 2 == 0 else 1) or offset != at or reserved != 0:
        sys.exit(f"record {i}: {name} ndim {ndim} offset {offset}, expected {want} at {at}")
    at += count
if at != numel:
    sys.exit(f"records cover {at} elements, expected {numel}")
data = raw[data_offset:]
if dtype == "f32":
    values = struct.unpack(f"<{numel}f", data)
elif dtype == "f16":
    values = struct.unpack(f"<{numel}e", data)
else:
    values = [struct.unpack("<f", struct.pack("<I", h << 16))[0]
              for h in struct.unpack(f"<{numel}H", data)]
bad = sum(1 for v in values if not math.isfinite(v))
if bad:
    sys.exit(f"{bad} values are not finite")
if all(v == 0 for v in values):
    sys.exit("every value is zero")
print(f"{path}: {len(raw)} bytes, {tensors} tensors, {numel} {dtype} values, all finite")
EOF
}

# Runs the trainer at RANKS ranks; checks its loss and, with FILE, the file.
train_case() {  # RANKS FILE|- DTYPE TENSORS NUMEL ARGS...
  local n=$1 file=$2 dtype=$3 tensors=$4 numel=$5
  shift 5
  local save=() out rc msg
  [ "$file" != - ] && save=(--save-params "$file")
  out=$(timeout 120 "$mpiexec" -n "$n" --oversubscribe "$program" --json --log-every 100000 \
        "${save[@]}" "$@" 2>&1)
  rc=$?
  local what="np$n $*"
  if [ $rc -ne 0 ]; then fail "$what: exit code $rc" "$out"; return; fi
  printf '%s\n' "$out" >"$tmp/out.txt"
  if ! msg=$(check_summary "$tmp/out.txt" "$n" 2>&1); then fail "$what: $msg" "$out"; return; fi
  if [ "$file" != - ]; then
    local fmsg
    if [ -e "$file.tmp" ]; then fail "$what: $file.tmp was left behind"; return; fi
    if ! fmsg=$(check_params_file "$file" "$dtype" "$tensors" "$numel" 2>&1); then
      fail "$what: $fmsg"; return
    fi
    msg="$msg; $fmsg"
  fi
  passed=$((passed + 1))
  echo "ok: $what: $msg (at ${SECONDS} s)"
}

# The demo itself (the defaults: adamw, stage 2, f32, 16 -> 768 -> 768 -> 4).
train_case 2 "$tmp/demo.bin" f32 6 606724
# Smaller models for the other configurations, to keep the test short.
small=(--hidden 256 --layers 3)  # 16 -> 256 -> 256 -> 4: 71,172 parameters
train_case 1 - - 6 71172 "${small[@]}" -o lamb -s 1 -p bf16 --steps 200 --clip 1 -m 2 --scattered
# f16: a dynamic loss scale.
train_case 3 "$tmp/adam.bin" f16 6 71172 "${small[@]}" -o adam -s 0 -p f16 --steps 400 -m 3
train_case 2 "$tmp/adamw.bin" bf16 6 71172 "${small[@]}" -o adamw -s 2 -p bf16 \
  --param-remainders --steps 400 --bucket-mb 0.25
# Stage 3: each layer a unit, gathered for its passes (the first and last
# layers, below 64 KiB, stay whole).
train_case 3 "$tmp/s3.bin" bf16 6 71172 "${small[@]}" -o adamw -s 3 -p bf16 --steps 400 -m 2

# Stage 3 gives stage 2's parameters bitwise.
if out=$(timeout 60 "$mpiexec" -n 2 --oversubscribe "$program" --json "${small[@]}" --steps 20 \
           -s 2 --save-params "$tmp/two.bin" 2>&1) &&
   out2=$(timeout 60 "$mpiexec" -n 2 --oversubscribe "$program" --json "${small[@]}" --steps 20 \
           -s 3 --save-params "$tmp/three.bin" 2>&1) &&
   cmp -s "$tmp/two.bin" "$tmp/three.bin"; then
  passed=$((passed + 1)); echo "ok: stages 2 and 3 give the same parameters"
else
  fail "stages 2 and 3 give different parameters (or a run failed)" "$out $out2"
fi

# One buffer for all tensors or one per tensor: the engine packs the
# scattered gradients into its buckets, and the parameters must come out
# bitwise the same.
if out=$(timeout 60 "$mpiexec" -n 2 --oversubscribe "$program" --json "${small[@]}" --steps 20 \
           --save-params "$tmp/again.bin" 2>&1) &&
   out2=$(timeout 60 "$mpiexec" -n 2 --oversubscribe "$program" --json "${small[@]}" --steps 20 \
           --scattered --save-params "$tmp/again2.bin" 2>&1) &&
   cmp -s "$tmp/again.bin" "$tmp/again2.bin"; then
  passed=$((passed + 1)); echo "ok: contiguous and scattered buffers give the same parameters"
else
  fail "contiguous and scattered buffers give different parameters (or a run failed)" "$out $out2"
fi

# A bad option: exit code 2 on every rank, a message naming it, no hang.
expect_usage_error() {  # TEXT ARGS...
  local text=$1 out rc
  shift
  out=$(timeout 60 "$mpiexec" -n 2 --oversubscribe "$program" "$@" 2>&1)
  rc=$?
  if [ $rc -ne 2 ]; then
    fail "$*: exit code $rc (expected 2; 124 is a hang)" "$out"
  elif ! grep -qF -- "$text" <<<"$out"; then
    fail "$*: the message does not say '$text'" "$out"
  else
    passed=$((passed + 1)); echo "ok: $* rejected"
  fi
}
expect_usage_error "bad value 'adamx' for -o (--optimizer); accepted: sgd adam adamw" -o adamx
expect_usage_error "--param-remainders needs -p (--precision) bf16" -p f16 --param-remainders
expect_usage_error "unknown option '--bogus'" --bogus
expect_usage_error "--scattered is a host layout: --device cuda keeps the parameters" \
  --device cuda --scattered
expect_usage_error "-s 3 trains on the host" -s 3 --device cuda
expect_usage_error "bad value 'gpu' for --device; accepted: host cuda" --device gpu

# --device cuda where this process sees no CUDA device (this test runs
# without one; scripts/device-check trains on a GPU): exit code 1 on every
# rank before training, saying why and what to do once, no hang.
if [ "${SHARDOPT_TEST_HAS_GPU:-0}" = 0 ]; then
  out=$(timeout 60 "$mpiexec" -n 2 --oversubscribe "$program" "${small[@]}" --device cuda 2>&1)
  rc=$?
  if [ $rc -eq 1 ] && [ "$(grep -c -- "--device cuda: this" <<<"$out")" -eq 1 ]; then
    passed=$((passed + 1)); echo "ok: --device cuda without a device is an error on every rank, said once"
  else
    fail "--device cuda without a device: exit code $rc (expected 1 and the reason once)" "$out"
  fi
fi

# --checkpoint on an existing file without --resume: every rank refuses
# before training (exit code 2), rank 0 alone says why: the file, the step
# it holds and the two ways on; the file is left byte for byte. A file that
# is not a checkpoint is refused too, saying so. --overwrite replaces it.
ow="$tmp/overwrite"
mkdir -p "$ow"
ckpt_step() {  # FILE
  python3 -c 'import json, struct, sys
f = open(sys.argv[1], "rb"); n, = struct.unpack("<Q", f.read(8))
print(json.loads(f.read(n))["__metadata__"]["shardopt.step"])' "$1"
}
expect_refusal() {  # FILE TEXT
  local file=$1 text=$2 out rc
  cp "$file" "$file.before"
  out=$(timeout 60 "$mpiexec" -n 3 --oversubscribe "$program" --json "${small[@]}" --steps 5 \
          --checkpoint "$file" 2>&1)
  rc=$?
  if [ $rc -ne 2 ]; then
    fail "--checkpoint $file existing, no --resume: exit code $rc (expected 2)" "$out"
  elif [ "$(grep -cF -- "$text" <<<"$out")" -ne 1 ]; then
    fail "--checkpoint $file existing: the message is not printed once: '$text'" "$out"
  elif grep -q '"type":"step"' <<<"$out"; then
    fail "--checkpoint $file existing: training started" "$out"
  elif ! cmp -s "$file" "$file.before"; then
    fail "--checkpoint $file existing: the file changed" "$out"
  else
    passed=$((passed + 1)); echo "ok: an existing --checkpoint $(basename "$file") is refused, left as it was"
  fi
  rm -f "$file.before"
}
if ! out=$(timeout 60 "$mpiexec" -n 2 --oversubscribe "$program" "${small[@]}" --steps 20 \
             --checkpoint "$ow/C" 2>&1); then
  fail "the 20-step run with --checkpoint failed" "$out"
else
  expect_refusal "$ow/C" "shardopt-train: rank 0: --checkpoint $ow/C exists and holds a \
checkpoint at step 20; this run, without --resume, would replace it: go on from it with --resume \
$ow/C, or replace it with --overwrite"
  echo "not a checkpoint" >"$ow/T"
  expect_refusal "$ow/T" "--checkpoint $ow/T exists and holds a file that is not a readable \
checkpoint ("
  if ! out=$(timeout 60 "$mpiexec" -n 2 --oversubscribe "$program" "${small[@]}" --steps 5 \
               --checkpoint "$ow/C" --overwrite 2>&1); then
    fail "--overwrite: the run failed" "$out"
  elif [ "$(ckpt_step "$ow/C")" != 5 ]; then
    fail "--overwrite: the checkpoint holds step $(ckpt_step "$ow/C"), not 5" "$out"
  else
    passed=$((passed + 1)); echo "ok: --overwrite replaces an existing --checkpoint file"
  fi
fi
expect_usage_error "--overwrite needs --checkpoint PATH" --overwrite
expect_usage_error "bad value 'mean' for --grad-reduction; accepted: avg sum" --grad-reduction mean

# An unwritable --save-params file: exit code 1 before training, no hang.
out=$(timeout 60 "$mpiexec" -n 2 --oversubscribe "$program" --save-params "$tmp/no/such/dir/p.bin" \
        2>&1)
rc=$?
if [ $rc -eq 1 ] && grep -qF "cannot write '$tmp/no/such/dir/p.bin.tmp'" <<<"$out"; then
  passed=$((passed + 1)); echo "ok: an unwritable --save-params file is an error"
else
  fail "unwritable --save-params: exit code $rc" "$out"
fi

# SHARDOPT_CHECK_SYNC=10: the parameters are checked after steps 10 and 20
# on every rank, found identical, and the run ends as usual. And
# SHARDOPT_STATS_EVERY=10 at SHARDOPT_DEBUG=INFO: each rank logs its phase
# times, bytes and bus bandwidths after steps 10 and 20 (3 ranks, stage 1:
# the reduction moves the gradients twice, 2 x 71,172 x 4 bytes and
# padding; the gather once).
out=$(SHARDOPT_CHECK_SYNC=10 SHARDOPT_STATS_EVERY=10 SHARDOPT_DEBUG=INFO timeout 60 \
        "$mpiexec" -n 3 --oversubscribe "$program" "${small[@]}" -s 1 --steps 20 2>&1)
rc=$?
checks=$(grep -c "check_sync after step [12]0: the 6 parameters are identical on every rank" \
           <<<"$out")
stats=$(grep -cE "step [12]0: mean of the last 10 steps \(ms\): reduce [0-9.]+ \(span [0-9.]+, 0\.57 MB, busbw [0-9.]+ GB/s\), update [0-9.]+, gather [0-9.]+ \(0\.28 MB, busbw [0-9.]+ GB/s\), exposed communication [0-9.]+" <<<"$out")
if [ $rc -eq 0 ] && [ "$checks" -eq 6 ] && [ "$stats" -eq 6 ]; then
  passed=$((passed + 1))
  echo "ok: SHARDOPT_CHECK_SYNC=10 and SHARDOPT_STATS_EVERY=10 log steps 10 and 20 on 3 ranks"
else
  fail "SHARDOPT_CHECK_SYNC/STATS_EVERY=10: exit code $rc, $checks of 6 check lines, $stats of 6 \
stats lines" "$out"
fi

echo "train: $passed passed, $failed failed"
[ $failed -eq 0 ]
