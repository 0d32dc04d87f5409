#!/usr/bin/env bash
# A long run of shardopt-train at 2 ranks, a checkpoint every EVERY steps,
# its resident memory watched from outside (VmRSS of both ranks from
# /proc/PID/status, every 0.2 s):
# - the job exits 0, the loss fell (the --json summary), every checkpoint
#   was written, the final one is at step STEPS and verifies
#   (shardopt-ckpt verify), and no temporary file is left beside it;
# - memory is flat after warm-up: warm-up ends with the save that closes
#   the first 20% of the run (at least the second save); from there to the
#   end, each rank's largest RSS exceeds its RSS at the end of warm-up by
#   at most max(2 MiB, 2% of it).
# Why that bound: a rank that repeats the same steps allocates the same
# memory every step, so its RSS moves only with what the allocator and MPI
# keep or give back (page-sized amounts, a few arenas: here at most
# 112 KiB in a run of 10,000 steps); 2 MiB or 2% is far above that noise
# and far below a leak of the realistic kind, a save that keeps one
# checkpoint's buffers. Each rank's buffers for a save hold its share of
# the file (its shard of the master weights and the optimizer state: what
# a device model stages in host memory for every save), here
# 3,284,472 / 2 = 1.6 MB a save. At 1000 steps, a save every 100, 8 saves
# follow warm-up, 7 of them sure to be sampled (the last may come just
# before the exit): such a leak adds 11 MiB to a rank of about 192 MiB
# whose bound is 3.8 MiB; at 10,000 steps, every 500, 15 sampled saves:
# 23.5 MiB. The test computes this (its share of the file times those
# saves) and fails when STEPS and EVERY leave it at or under the bound,
# since the run could then not show such a leak. Seen to fail: with an
# MPI_File_open preloaded (LD_PRELOAD) that keeps 1.6 MB at each call,
# once per save and rank, both ranks grew by 11,240 KiB after warm-up,
# and the test said so.
# The model is larger than the other tests' (16 -> 512 -> 512 -> 4,
# 273,412 parameters, a 3.3 MB checkpoint) for that reason, with 32
# samples per rank and step to keep the steps short.
# Usage: test_soak.sh MPIEXEC TRAIN CKPT-TOOL STEPS EVERY
set -u
mpiexec=$1
program=$2
ckpt_tool=$3
steps=$4
every=$5
# shellcheck source=lib.sh
. "$(dirname "$0")/lib.sh"
require pgrep:procps
# expect, ckpt_step.
# shellcheck source=lib/train_json.sh
. "$(dirname "$0")/lib/train_json.sh"

model=(--hidden 512 --layers 3 -b 32 --log-every 100000 --progress off --json)
saves=$((steps / every))
# Warm-up: the saves of the first 20% of the run, at least two.
warm=$(((saves + 4) / 5))
[ "$warm" -ge 2 ] || warm=2
if [ "$saves" -lt $((warm + 2)) ] || [ $((steps % every)) -ne 0 ]; then
  echo "FAILED: STEPS $steps and EVERY $every: $saves saves leave too few after the $warm of \
warm-up (EVERY must divide STEPS, 4 saves at least)"
  exit 1
fi

ckpt="$tmp/C"
out="$tmp/job.out"
samples="$tmp/rss"
# A few ms a step here: the limit leaves room for a machine ten times slower.
limit=$((60 + steps / 20))
start=$SECONDS
timeout "$limit" "$mpiexec" -n 2 --oversubscribe "$program" "${model[@]}" --steps "$steps" \
  --checkpoint "$ckpt" --checkpoint-every "$every" >"$out" 2>&1 &
job=$!

# The ranks: processes of the trainer's executable with the checkpoint's
# path (unique to this test) in their command line; mpirun's own command
# line holds it too and is left out by the executable.
exe=$(readlink -f "$program")
rank_pids() {
  pgrep -f -- "$ckpt" | while read -r pid; do
    [ "$(readlink "/proc/$pid/exe" 2>/dev/null)" = "$exe" ] && echo "$pid"
  done
}
# The rank of PID in MPI_COMM_WORLD, from the variables mpirun sets (Open
# MPI, then MPICH's Hydra).
world_rank() {  # PID
  tr '\0' '\n' <"/proc/$1/environ" 2>/dev/null |
    sed -n 's/^OMPI_COMM_WORLD_RANK=//p; s/^PMI_RANK=//p' | head -1
}
rss_kib() {  # PID
  awk '/^VmRSS:/ {print $2}' "/proc/$1/status" 2>/dev/null
}

# One line a sample: the saves logged so far, rank 0's and rank 1's RSS in
# KiB; a sample is kept only when both ranks were read.
pids=()
while kill -0 "$job" 2>/dev/null; do
  if [ "${#pids[@]}" -ne 2 ]; then
    pids=()
    for pid in $(rank_pids); do
      r=$(world_rank "$pid")
      [ -n "$r" ] && [ "$r" -lt 2 ] && pids[r]=$pid
    done
    [ "${#pids[@]}" -eq 2 ] || pids=()
  fi
  if [ "${#pids[@]}" -eq 2 ]; then
    done_saves=$(grep -c '"type":"checkpoint"' "$out")
    a=$(rss_kib "${pids[0]}")
    b=$(rss_kib "${pids[1]}")
    [ -n "$a" ] && [ -n "$b" ] && echo "$done_saves $a $b" >>"$samples"
  fi
  sleep 0.2
done
wait "$job"
rc=$?
took=$((SECONDS - start))

if [ $rc -ne 0 ]; then
  fail "$steps steps at 2 ranks, a save every $every: exit status $rc (124: past $limit s)" "$out"
elif ! msg=$(expect "$out" "summary['final_step'] == $steps" "summary['applied'] == $steps" \
               "len(checkpoints) == $saves" "summary['checkpoints'] == $saves" \
               'isfinite(summary["initial_loss"]) and isfinite(summary["final_loss"])' \
               'summary["final_loss"] < summary["initial_loss"]' 2>&1); then
  fail "$steps steps at 2 ranks: $msg" "$out"
else
  ok "$steps steps at 2 ranks, $saves saves, in $took s: exit status 0, the loss fell \
($(python3 -c 'import json, sys
s = next(json.loads(l) for l in open(sys.argv[1]) if l.startswith("{\"type\":\"summary\""))
print("%.4g -> %.4g" % (s["initial_loss"], s["final_loss"]))' "$out"))"
fi

if [ ! -f "$ckpt" ]; then
  fail "no checkpoint at $ckpt" "$out"
elif ! "$ckpt_tool" verify "$ckpt" >"$tmp/verify.out" 2>&1; then
  fail "the final checkpoint does not verify" "$tmp/verify.out"
elif [ "$(ckpt_step "$ckpt")" != "$steps" ]; then
  fail "the final checkpoint is at step $(ckpt_step "$ckpt" 2>&1), not $steps"
else
  ok "the final checkpoint (step $steps) verifies: $(cat "$tmp/verify.out")"
fi
left=$(find "$tmp" -name 'C.tmp-*' | head -3)
[ -z "$left" ] || fail "temporary files left beside the checkpoint: $left"

# Flat memory after warm-up, per rank, and whether a leak of the rank's
# share of each save's file would have shown.
if [ ! -s "$samples" ]; then
  fail "no sample of the ranks' memory was taken" "$out"
else
  share=$(($(stat -c %s "$ckpt" 2>/dev/null || echo 0) / 2))
  verdict=$(python3 - "$samples" "$warm" "$saves" "$share" 2>&1 <<'EOF'
import sys
path, warm, saves, share = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
rows = [tuple(map(int, l.split())) for l in open(path)]
after = [r for r in rows if r[0] >= warm]
MiB = 1024 * 1024
if len(after) < 5:
    print(f"FAILED: {len(after)} memory samples after warm-up (save {warm} of {saves}), "
          f"{len(rows)} in all: too few to tell")
    sys.exit()
for rank in (0, 1):
    base = after[0][1 + rank] * 1024
    top = max(r[1 + rank] for r in after) * 1024
    warm_top = max([r[1 + rank] for r in rows if r[0] < warm] + [0]) * 1024
    bound = max(2 * MiB, 0.02 * base)
    leak = share * (saves - warm - 1)
    line = (f"rank {rank}: RSS {base / MiB:.2f} MiB at the end of warm-up (save {warm} of "
            f"{saves}; {warm_top / MiB:.2f} MiB at most before), {top / MiB:.2f} MiB at most "
            f"after it: +{(top - base) / 1024:.0f} KiB, bound {bound / MiB:.2f} MiB "
            f"({len(after)} of {len(rows)} samples after warm-up); a leak of its share of each "
            f"save ({share / MiB:.2f} MiB) would add {leak / MiB:.1f} MiB")
    if top - base > bound:
        print("FAILED: memory grows after warm-up: " + line)
    elif leak <= bound:
        print("FAILED: the run is too short to show a leak of one save's buffers: " + line)
    else:
        print("ok: flat: " + line)
EOF
  )
  echo "$verdict"
  passed=$((passed + $(grep -c '^ok:' <<<"$verdict")))
  failed=$((failed + $(grep -c '^FAILED:' <<<"$verdict")))
  # A Python error prints neither.
  grep -q '^ok:\|^FAILED:' <<<"$verdict" || failed=$((failed + 1))
fi

echo "soak: $passed passed, $failed failed (${SECONDS} s)"
[ $failed -eq 0 ]
