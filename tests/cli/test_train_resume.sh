#!/usr/bin/env bash
# shardopt-train's checkpoints end to end under mpirun:
# - at the same rank count, 40 steps in one run and 20 steps, a checkpoint,
#   then --resume for the other 20 give bitwise the same parameters
#   (--save-params files compared with cmp), at stages 0, 1 and 2, in fp32,
#   bf16 with a loss scaler (with and without remainders) and f16 (with
#   steps skipped before the checkpoint); with the cosine schedule, from a
#   checkpoint a 40-step run wrote on its way;
# - a checkpoint written at 2 ranks resumes at 1 and 3 ranks (and another
#   stage): the step count goes on from 20 and the loss keeps falling;
# - --checkpoint-every 10 --keep-last 3 leaves PATH, PATH.1 and PATH.2 of
#   steps 40, 30 and 20, and nothing else;
# - a missing, foreign, truncated or corrupted checkpoint, or one of another
#   model, stops every rank with a message and exit status 1, no hang;
# - a damaged newest checkpoint is never rotated over the last valid one;
# - on resume, an optimizer flag given applies (--weight-decay), and -o,
#   -p, --loss-scale and --grad-reduction unlike the checkpoint's are
#   refused with exit status 2 and one message;
# - --stop-on: SIGUSR1 to mpirun, or SIGTERM to one rank, stops every rank
#   at one step with the checkpoint written and exit status 3, and the run
#   resumed from it ends bitwise as a straight one.
# Usage: test_train_resume.sh MPIEXEC PROGRAM
set -u
mpiexec=$1
program=$2
# shellcheck source=lib.sh
. "$(dirname "$0")/lib.sh"

# A small model (16 -> 256 -> 256 -> 4, 71,172 parameters), as test_train.sh
# uses for everything but the demo, and few log lines.
small=(--hidden 256 --layers 3 --log-every 100000)

# Runs the trainer with --json at RANKS ranks, its output (stdout and
# stderr) into OUT; returns its exit status (124: it hung).
train() {  # RANKS OUT ARGS...
  local n=$1 out=$2
  shift 2
  timeout 120 "$mpiexec" -n "$n" --oversubscribe "$program" --json "${small[@]}" "$@" >"$out" 2>&1
}

# expect, ckpt_step.
# shellcheck source=lib/train_json.sh
. "$(dirname "$0")/lib/train_json.sh"

# The names of everything in DIR, sorted, each followed by a space.
listing() {  # DIR
  (cd "$1" && find . -mindepth 1 -printf '%P\n' | LC_ALL=C sort | tr '\n' ' ')
}

# (a), (b): 40 steps straight (A) against 20 steps, a checkpoint and 20 more
# resumed from it (B), at 2 ranks. The constant schedule: the cosine one
# spans --steps, which differs between a 20-step and a 40-step run.
resume_identical() {  # NAME ARGS...
  local name=$1
  shift
  local d="$tmp/$name"
  mkdir -p "$d"
  if ! train 2 "$d/a.out" "$@" --schedule constant --steps 40 --save-params "$d/A"; then
    fail "$name: the 40-step run failed" "$d/a.out"; return
  fi
  if ! train 2 "$d/c.out" "$@" --schedule constant --steps 20 --checkpoint "$d/C"; then
    fail "$name: the 20-step run failed" "$d/c.out"; return
  fi
  if ! train 2 "$d/b.out" "$@" --schedule constant --steps 40 --resume "$d/C" \
         --save-params "$d/B"; then
    fail "$name: the resumed run failed" "$d/b.out"; return
  fi
  local msg
  if ! msg=$(expect "$d/c.out" 'summary["final_step"] == 20' 'len(checkpoints) == 1' \
               'checkpoints[0]["step"] == 20' 'checkpoints[0]["seconds"] >= 0' 2>&1) ||
     ! msg=$(expect "$d/b.out" 'resume["step"] == 20' 'resume["saved_ranks"] == 2' \
               'summary["start_step"] == 20' 'summary["final_step"] == 40' \
               'steps[0]["step"] == 21' 'summary["applied"] == 20' 2>&1); then
    fail "$name: $msg" "$d/b.out"; return
  fi
  if ! cmp "$d/A" "$d/B"; then
    fail "$name: the resumed run's parameters differ from the straight run's" "$d/b.out"; return
  fi
  ok "$name: 40 steps = 20 steps + checkpoint + 20 resumed, bitwise"
}

resume_identical s2-f32 -s 2
resume_identical s1-f32 -s 1
resume_identical s0-f32 -s 0
resume_identical s2-bf16-scaler -s 2 -p bf16 --loss-scale dynamic
resume_identical s1-bf16-remainders -s 1 -p bf16 --param-remainders --loss-scale dynamic -m 2
resume_identical s2-f16 -s 2 -p f16 -o adam -m 2
# One sample a step: the first steps' gradients overflow f16 at the initial
# scale, so steps are skipped before the checkpoint and the scale it holds is
# not the initial one.
resume_identical s1-f16-skips -s 1 -p f16 -o adam -b 1 --outputs 1
if [ -f "$tmp/s1-f16-skips/a.out" ] &&
   ! msg=$(expect "$tmp/s1-f16-skips/a.out" 'summary["skipped"] >= 1' 2>&1); then
  fail "s1-f16-skips: no step was skipped, the case tests nothing ($msg)" "$tmp/s1-f16-skips/a.out"
fi

# (d) and the cosine schedule: a 40-step run that saves every 10 steps,
# keeping 3, leaves exactly C (step 40), C.1 (30) and C.2 (20); resumed from
# C.2 it ends as it did; and saving does not change the run.
d="$tmp/every"
mkdir -p "$d/ckpt"
if ! train 2 "$d/run.out" --steps 40 --checkpoint "$d/ckpt/C" --checkpoint-every 10 \
       --keep-last 3 --save-params "$d/A"; then
  fail "--checkpoint-every 10 --keep-last 3: the run failed" "$d/run.out"
else
  left=$(listing "$d/ckpt")
  steps_found="$(ckpt_step "$d/ckpt/C" 2>&1) $(ckpt_step "$d/ckpt/C.1" 2>&1) $(ckpt_step "$d/ckpt/C.2" 2>&1)"
  if [ "$left" != "C C.1 C.2 " ]; then
    fail "--checkpoint-every 10 --keep-last 3 left: $left(expected C C.1 C.2)" "$d/run.out"
  elif [ "$steps_found" != "40 30 20" ]; then
    fail "C, C.1, C.2 hold steps $steps_found (expected 40 30 20)" "$d/run.out"
  elif ! msg=$(expect "$d/run.out" 'len(checkpoints) == 4' \
                 '[c["step"] for c in checkpoints] == [10, 20, 30, 40]' \
                 'summary["checkpoints"] == 4' 2>&1); then
    fail "--checkpoint-every 10: $msg" "$d/run.out"
  else
    ok "--checkpoint-every 10 --keep-last 3 leaves C, C.1, C.2 of steps 40, 30, 20 and nothing else"
  fi
  if ! train 2 "$d/straight.out" --steps 40 --save-params "$d/S"; then
    fail "the 40-step run without checkpoints failed" "$d/straight.out"
  elif ! cmp "$d/A" "$d/S"; then
    fail "writing checkpoints changed the run's parameters" "$d/run.out"
  else
    ok "writing checkpoints leaves the run's parameters unchanged"
  fi
  if ! train 2 "$d/b.out" --steps 40 --resume "$d/ckpt/C.2" --save-params "$d/B"; then
    fail "resuming from C.2 failed" "$d/b.out"
  elif ! cmp "$d/A" "$d/B"; then
    fail "cosine schedule: resumed from step 20, the parameters differ" "$d/b.out"
  else
    ok "cosine schedule: resumed from the step-20 checkpoint of a 40-step run, bitwise"
  fi
  # The restart of a run that had finished: no step, the checkpoint left as
  # it is (not rotated).
  cp "$d/ckpt/C" "$d/C.before"
  msg=
  if ! train 2 "$d/again.out" --steps 40 --checkpoint "$d/ckpt/C" --checkpoint-every 10 \
         --keep-last 3 --resume "$d/ckpt/C"; then
    fail "resuming a finished run failed" "$d/again.out"
  elif ! msg=$(expect "$d/again.out" 'summary["applied"] == 0' 'summary["final_step"] == 40' \
                 'len(checkpoints) == 0' 2>&1) ||
       [ "$(listing "$d/ckpt")" != "C C.1 C.2 " ] ||
       ! cmp -s "$d/ckpt/C" "$d/C.before" || [ "$(ckpt_step "$d/ckpt/C.1")" != 30 ]; then
    fail "resuming a finished run: ${msg:-the checkpoints changed}" "$d/again.out"
  else
    ok "resuming a finished run takes no step and leaves the checkpoints"
  fi
fi

# (c) The checkpoint of s2-f32 (2 ranks, step 20) at 3 ranks in stage 1 and
# at 1 rank: the run goes on from step 20 and the loss keeps falling from
# where the checkpoint left it, well below a fresh model's.
c2="$tmp/s2-f32/C"
fresh="$tmp/s2-f32/a.out"
for case in "3 1" "1 2"; do
  read -r n stage <<<"$case"
  out="$tmp/np$n.out"
  if [ ! -f "$c2" ] || [ ! -f "$fresh" ]; then
    fail "np$n: no checkpoint from the s2-f32 case"; continue
  fi
  if ! train "$n" "$out" -s "$stage" --schedule constant --steps 40 --resume "$c2"; then
    fail "np$n stage $stage: resuming a 2-rank checkpoint failed" "$out"; continue
  fi
  initial=$(python3 -c 'import json, sys
print(next(json.loads(l) for l in open(sys.argv[1]) if l.startswith("{\"type\":\"summary\""))["initial_loss"])' "$fresh")
  if ! msg=$(expect "$out" 'resume["step"] == 20' 'resume["saved_ranks"] == 2' \
               "resume[\"ranks\"] == $n" "start[\"ranks\"] == $n" 'summary["start_step"] == 20' \
               'summary["final_step"] == 40' 'summary["applied"] == 20' 'steps[0]["step"] == 21' \
               'isfinite(summary["initial_loss"]) and isfinite(summary["final_loss"])' \
               'summary["final_loss"] < summary["initial_loss"]' \
               "summary[\"initial_loss\"] < 0.8 * $initial" 'summary["params_identical"]' 2>&1); then
    fail "np$n stage $stage from a 2-rank checkpoint: $msg" "$out"; continue
  fi
  ok "np$n stage $stage: resumed a 2-rank checkpoint at step 20 and trained on to 40"
done

# Reports (and returns 1) unless the 2-rank job in OUTPUT ended with exit
# status 1 (its status in rc), the error every rank met matching PATTERN and
# printed once, by rank 0.
every_rank_failed() {  # WHAT PATTERN OUTPUT
  if [ "$rc" -ne 1 ]; then
    fail "$1: exit status $rc (expected 1; 124 is a hang)" "$3"
  elif ! grep -q "^shardopt-train: rank 0: $2" "$3" ||
       [ "$(grep -c "^shardopt-train: rank [0-9]*: " "$3")" -ne 1 ]; then
    fail "$1: not said once, by rank 0: '$2'" "$3"
  else
    return 0
  fi
  return 1
}

# (e) Bad checkpoints: exit status 1 on every rank, each rank saying why.
expect_load_error() {  # WHAT TEXT ARGS...
  local what=$1 text=$2
  shift 2
  local out="$tmp/err.out" rc
  train 2 "$out" --steps 40 "$@"
  rc=$?
  if ! every_rank_failed "$what" ".*$text" "$out"; then
    :
  elif grep -q '"type":"step"' "$out"; then
    fail "$what: training started" "$out"
  else
    ok "$what: every rank stops with exit status 1"
  fi
}
bad="$tmp/bad"
mkdir -p "$bad"
expect_load_error "--resume of a missing file" "cannot resume from '$bad/none.safetensors'" \
  --resume "$bad/none.safetensors"
cp /etc/hostname "$bad/host.safetensors" 2>/dev/null || echo localhost >"$bad/host.safetensors"
expect_load_error "--resume of a file that is not a checkpoint" \
  "cannot resume from '$bad/host.safetensors'" --resume "$bad/host.safetensors"
for i in 1 2 3 4 5 6 7 8; do echo "line $i of a text file, not a checkpoint"; done >"$bad/text"
expect_load_error "--resume of a text file" "cannot resume from '$bad/text'" --resume "$bad/text"
if [ -f "$c2" ]; then
  head -c 3000 "$c2" >"$bad/truncated"
  expect_load_error "--resume of a truncated checkpoint" "cannot resume from" \
    --resume "$bad/truncated"
  # One byte of the last tensor's data changed: its checksum differs.
  cp "$c2" "$bad/corrupted"
  python3 - "$bad/corrupted" <<'EOF'
import os, sys
with open(sys.argv[1], "r+b") as f:
    f.seek(-5, os.SEEK_END)
    b = f.read(1)
    f.seek(-5, os.SEEK_END)
    f.write(bytes([b[0] ^ 0x40]))
EOF
  expect_load_error "--resume of a corrupted checkpoint" "checksum" --resume "$bad/corrupted"
  expect_load_error "--resume of another model's checkpoint" "cannot resume from" \
    --hidden 128 --resume "$c2"
  out="$tmp/past.out"
  train 2 "$out" --steps 10 --resume "$c2"
  rc=$?
  if [ $rc -eq 1 ] && grep -qF "is at step 20, past -n (--steps) 10" "$out"; then
    ok "--resume of a checkpoint past --steps is an error"
  else
    fail "--resume past --steps: exit status $rc" "$out"
  fi
fi

# A save that fails during training (PATH is a directory, so the finished
# file cannot be renamed to it): every rank stops with exit status 1 and no
# temporary file is left.
mkdir -p "$tmp/failsave/C"
expect_save_error() {
  local out="$tmp/failsave.out" rc
  train 2 "$out" --steps 20 --checkpoint "$tmp/failsave/C" --checkpoint-every 5
  rc=$?
  if ! every_rank_failed "a failed save" "cannot write the checkpoint '$tmp/failsave/C'" "$out"; then
    :
  elif [ "$(listing "$tmp/failsave")" != "C " ]; then
    fail "a failed save left: $(listing "$tmp/failsave")" "$out"
  else
    ok "a failed save stops every rank with exit status 1 and leaves no file"
  fi
}
expect_save_error

# A damaged newest checkpoint (truncated) with --keep-last 2: the run
# resumed from C.1 replaces C, and C.1 keeps the valid step-10 checkpoint
# rather than the damaged file.
d="$tmp/damaged"
mkdir -p "$d"
if ! train 2 "$d/a.out" --steps 20 --checkpoint "$d/C" --checkpoint-every 10 --keep-last 2; then
  fail "the run that writes C and C.1 failed" "$d/a.out"
else
  python3 -c 'import os, sys; os.truncate(sys.argv[1], os.path.getsize(sys.argv[1]) // 2)' "$d/C"
  if ! train 2 "$d/b.out" --steps 30 --resume "$d/C.1" --checkpoint "$d/C" --keep-last 2; then
    fail "resuming from C.1 beside a damaged C failed" "$d/b.out"
  elif [ "$(listing "$d")" != "C C.1 a.out b.out " ] || [ "$(ckpt_step "$d/C")" != 30 ] ||
       [ "$(ckpt_step "$d/C.1" 2>&1)" != 10 ]; then
    fail "a damaged C was rotated: $(listing "$d"); C.1 holds $(ckpt_step "$d/C.1" 2>&1)" "$d/b.out"
  elif ! train 2 "$d/c.out" --steps 10 --resume "$d/C.1"; then
    fail "C.1 no longer loads" "$d/c.out"
  else
    ok "--keep-last 2 never rotates a damaged checkpoint over the last valid one"
  fi
fi

# (g) What the command line gives on resume. The optimizer's hyper-parameter
# flags apply: the resumed run says so and its checkpoint holds the new
# value; left out, the checkpoint's stays. -o, -p, --loss-scale and
# --grad-reduction unlike the checkpoint's are refused before training
# (exit status 2, rank 0 says why once, naming both values and the option).
group_field() {  # FILE FIELD: the field of the checkpoint's first parameter group
  python3 - "$1" "$2" <<'EOF2'
import json, struct, sys
with open(sys.argv[1], "rb") as f:
    n, = struct.unpack("<Q", f.read(8))
    print(json.loads(json.loads(f.read(n))["__metadata__"]["shardopt.groups"])[0][sys.argv[2]])
EOF2
}
expect_refusal() {  # WHAT TEXT ARGS...
  local what=$1 text=$2 out="$tmp/refused.out" rc
  shift 2
  train 2 "$out" "$@"
  rc=$?
  if [ $rc -ne 2 ]; then
    fail "$what: exit status $rc (expected 2)" "$out"
  elif [ "$(grep -cF -- "$text" "$out")" -ne 1 ]; then
    fail "$what: the message is not printed once: '$text'" "$out"
  elif grep -q '"type":"step"' "$out"; then
    fail "$what: training started" "$out"
  else
    ok "$what: refused"
  fi
}
d="$tmp/hyper"
mkdir -p "$d"
if ! train 2 "$d/c.out" --steps 10 --weight-decay 0.01 --checkpoint "$d/C"; then
  fail "the run with --weight-decay 0.01 failed" "$d/c.out"
else
  if ! train 2 "$d/b.out" --steps 20 --weight-decay 0.1 --resume "$d/C" --checkpoint "$d/B"; then
    fail "resuming with --weight-decay 0.1 failed" "$d/b.out"
  elif ! msg=$(expect "$d/b.out" \
                 "resume['applied'] == [\"--weight-decay 0.1 (the checkpoint's 0.01)\"]" 2>&1); then
    fail "--weight-decay 0.1 on resume: $msg" "$d/b.out"
  elif [ "$(group_field "$d/B" weight_decay)" != 0.1 ]; then
    fail "--weight-decay 0.1 on resume: the next checkpoint holds $(group_field "$d/B" weight_decay)"
  else
    ok "--weight-decay 0.1 on resume replaces the checkpoint's 0.01"
  fi
  if ! train 2 "$d/k.out" --steps 20 --resume "$d/C" --checkpoint "$d/K"; then
    fail "resuming without --weight-decay failed" "$d/k.out"
  elif ! msg=$(expect "$d/k.out" "resume['applied'] == []" 2>&1) ||
       [ "$(group_field "$d/K" weight_decay)" != 0.01 ]; then
    fail "resumed without --weight-decay, the checkpoint's 0.01 did not stay: $msg" "$d/k.out"
  else
    ok "resumed without --weight-decay, the checkpoint's 0.01 stays"
  fi
  expect_refusal "-p bf16 from an f32 checkpoint" "shardopt-train: rank 0: --resume $d/C: the \
checkpoint was trained with -p f32, this run has -p bf16: the precision of the model does not \
change on resume; resume with -p f32, or start a new run without --resume" \
    --steps 20 -p bf16 --resume "$d/C"
  expect_refusal "-o sgd from an adamw checkpoint" "--resume $d/C: the checkpoint was trained \
with -o adamw, this run has -o sgd: its optimizer state is adamw's; resume with -o adamw" \
    --steps 20 -o sgd --resume "$d/C"
  expect_refusal "--loss-scale dynamic from a checkpoint without one" "--resume $d/C: the \
checkpoint was trained with --loss-scale none, this run has --loss-scale dynamic: it holds no \
loss scale to go on from; resume with --loss-scale none" \
    --steps 20 --loss-scale dynamic --resume "$d/C"
fi
if ! train 2 "$d/s.out" --steps 10 --grad-reduction sum --checkpoint "$d/S"; then
  fail "the run with --grad-reduction sum failed" "$d/s.out"
else
  expect_refusal "a --grad-reduction sum checkpoint resumed with the default" "--resume $d/S: \
the checkpoint was trained with --grad-reduction sum, this run has --grad-reduction avg (the \
default): its optimizer state belongs to gradients summed over the ranks" \
    --steps 20 --resume "$d/S"
  if ! train 2 "$d/s2.out" --steps 20 --grad-reduction sum --resume "$d/S"; then
    fail "a --grad-reduction sum checkpoint resumed with --grad-reduction sum failed" "$d/s2.out"
  else
    ok "a --grad-reduction sum checkpoint resumes with --grad-reduction sum"
  fi
fi

# (f) --stop-on: a signal mid-run stops every rank at the same step boundary
# with the checkpoint written and exit status 3; resumed to 20 steps past it,
# the run ends bitwise where a straight run of as many steps does. USR1 to
# mpirun (which forwards it to every rank), then TERM to one rank only (the
# ranks agree on the stop). The run is long; the signal goes out once it
# has logged its first step.
stop_and_resume() {  # NAME SIGNAL TARGET(mpirun|one-rank) ARGS...
  local name=$1 sig=$2 target=$3
  shift 3
  local d="$tmp/$name" pid rc step msg
  mkdir -p "$d"
  timeout 120 "$mpiexec" -n 2 --oversubscribe "$program" --json "${small[@]}" "$@" \
    --schedule constant --steps 1000000 --stop-on USR1,TERM --checkpoint "$d/C" \
    >"$d/stop.out" 2>&1 &
  pid=$!
  for _ in $(seq 300); do
    grep -q '"type":"step"' "$d/stop.out" && break
    sleep 0.1
  done
  # timeout's child is mpirun, whose children are the ranks.
  local launcher
  launcher=$(pgrep -P "$pid")
  if [ "$target" = mpirun ]; then
    kill -s "$sig" "$launcher"
  else
    kill -s "$sig" "$(pgrep -P "$launcher" | tail -1)"
  fi
  wait "$pid"
  rc=$?
  if [ "$rc" -ne 3 ]; then
    fail "$name: exit status $rc after SIG$sig (expected 3)" "$d/stop.out"; return
  fi
  step=$(ckpt_step "$d/C")
  if ! [ "$step" -ge 1 ] 2>/dev/null; then
    fail "$name: no checkpoint after the stop" "$d/stop.out"; return
  fi
  if ! msg=$(expect "$d/stop.out" "stopped['signal'] == 'SIG$sig'" "stopped['step'] == $step" \
               'stopped["exit_status"] == 3' 'summary is None' 2>&1); then
    fail "$name: $msg" "$d/stop.out"; return
  fi
  if ! train 2 "$d/b.out" "$@" --schedule constant --steps $((step + 20)) --stop-on USR1,TERM \
         --checkpoint "$d/C" --resume "$d/C" --save-params "$d/B" ||
     ! train 2 "$d/a.out" "$@" --schedule constant --steps $((step + 20)) --save-params "$d/A"; then
    fail "$name: the resumed or the straight run failed" "$d/b.out"; return
  fi
  if ! cmp "$d/A" "$d/B"; then
    fail "$name: stopped at step $step and resumed, the parameters differ from a straight run's" \
      "$d/b.out"
    return
  fi
  ok "$name: SIG$sig to $target stopped every rank at step $step (exit 3, checkpoint written); resumed, bitwise"
}
stop_and_resume usr1-mpirun USR1 mpirun -s 2
stop_and_resume term-one-rank TERM one-rank -s 1 -p bf16
out="$tmp/usage.out"
train 2 "$out" --stop-on USR1
rc=$?
if [ $rc -eq 2 ] && grep -qF -- "--stop-on needs --checkpoint PATH" "$out"; then
  ok "--stop-on without --checkpoint is a usage error"
else
  fail "--stop-on without --checkpoint: exit status $rc" "$out"
fi
train 2 "$out" --stop-on USR1,HUP --checkpoint "$tmp/C"
rc=$?
if [ $rc -eq 2 ] && grep -qF -- "bad value 'USR1,HUP' for --stop-on" "$out"; then
  ok "--stop-on with a signal it does not take is a usage error"
else
  fail "--stop-on USR1,HUP: exit status $rc" "$out"
fi

# Bad options: exit status 2 (usage) or 1 (an unwritable directory), at once.
out="$tmp/usage.out"
train 2 "$out" --checkpoint-every 10
rc=$?
if [ $rc -eq 2 ] && grep -qF -- "--checkpoint-every needs --checkpoint PATH" "$out"; then
  ok "--checkpoint-every without --checkpoint is a usage error"
else
  fail "--checkpoint-every without --checkpoint: exit status $rc" "$out"
fi
train 2 "$out" --checkpoint "$tmp/no/such/dir/C"
rc=$?
if [ $rc -eq 1 ] && grep -qF "cannot create files in '$tmp/no/such/dir'" "$out"; then
  ok "an unwritable --checkpoint directory is an error before training"
else
  fail "unwritable --checkpoint directory: exit status $rc" "$out"
fi

leftovers=$(find "$tmp" -name '*.tmp*' | head -5)
if [ -n "$leftovers" ]; then
  fail "temporary files left behind: $leftovers"
fi

echo "train-resume: $passed passed, $failed failed"
[ $failed -eq 0 ]
