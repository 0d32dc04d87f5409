#!/usr/bin/env bash
# scripts/device-check --simulate against this build: the GPU run's steps,
# in its order, through its runner, on the simulated device. Its table must
# list every step PASS or SKIP, none "not reached": the GPU kernels' tests
# and benchmark SKIP (no GPU), the main job, the step and communication
# benchmarks and the device suites PASS; and the logs' archive must exist,
# be under 16 MiB and hold the other ranks' logs of a multi-rank suite. A
# --logs folder (or the archive beside it) that it did not write is refused
# first, untouched.
# SKIP (77) when the build has no CUDA parts.
# Usage: test_device_check.sh SOURCE_ROOT BUILD_ROOT
set -u
source_root=$1
build_root=$(cd "$2" && pwd -P)
carry="$build_root/device-check-sim"
out="$build_root/device-check-sim.out"

failed=0
fail() {
  echo "FAILED: $*"
  failed=$((failed + 1))
}

# A --logs folder or an archive beside it that device-check did not write is
# refused at once, with exit status 2, and left as it was.
guard="$build_root/device-check-guard"
rm -rf "$guard"
mkdir -p "$guard/mine" "$guard/arch/logs"
echo "a user's log" >"$guard/mine/job.log"
echo "a user's archive" >"$guard/arch/device-check-logs.tar.xz"
for case in "mine:refusing to delete its logs:$guard/mine/job.log:a user's log" \
  "arch/logs:refusing to replace it:$guard/arch/device-check-logs.tar.xz:a user's archive"; do
  IFS=: read -r logs why file content <<<"$case"
  grc=0
  g=$(BUILD_DIR=$build_root "$source_root/scripts/device-check" --simulate --no-build \
    --dir "$guard/carry" --logs "$guard/$logs" 2>&1) || grc=$?
  if [ "$grc" -ne 2 ] || ! grep -q "$why" <<<"$g" || [ "$(cat "$file")" != "$content" ] ||
    [ -e "$guard/carry" ]; then
    fail "--logs $logs: exit $grc, '$g'; $file holds '$(cat "$file")'"
  else
    echo "--logs $logs refused: $g"
  fi
done
rm -rf "$guard"

rc=0
BUILD_DIR=$build_root "$source_root/scripts/device-check" --simulate --no-build --dir "$carry" \
  >"$out" 2>&1 || rc=$?
cat "$out"
if [ "$rc" -eq 77 ]; then exit 77; fi
[ "$rc" -eq 0 ] || fail "scripts/device-check --simulate exited with $rc"

# The table: "(part) step result seconds limit note", after its header.
table=$(awk '/^part +step +result/ { on = 1; next } on && /^\([a-f]\) / { print }' "$out")
[ -n "$table" ] || fail "no table in the output"
result_of() { awk -v s="$1" '$2 == s { print $3 }' <<<"$table"; }

skips=(gpu-memory gpu-adam gpu-optim gpu-multi gpu-cast bench-optim-gpu-smoke
  shardopt-bench-optim-gpu)
passes=(train-device-np1 bench-step-device-np1 bench-step-device-np2 bench-comm-device-np2
  gpu-device-suites-nccl-np1 gpu-device-suites-staged-np2 gpu-device-suites-staged-np3
  gpu-device-suites-staged-np4 train-device-np2)
order=(gpu-memory gpu-adam gpu-optim gpu-multi gpu-cast bench-optim-gpu-smoke train-device-np1
  shardopt-bench-optim-gpu bench-step-device-np1 bench-step-device-np2 bench-comm-device-np2
  gpu-device-suites-nccl-np1 gpu-device-suites-staged-np2 gpu-device-suites-staged-np3
  gpu-device-suites-staged-np4 train-device-np2)
listed=$(awk '{ print $2 }' <<<"$table" | tr '\n' ' ')
[ "$listed" = "${order[*]} " ] || fail "the table's steps, in order, are '$listed'," \
  "not '${order[*]} '"
for s in "${skips[@]}"; do
  r=$(result_of "$s")
  [ "$r" = SKIP ] || fail "$s: '$r', not SKIP (no GPU here)"
done
for s in "${passes[@]}"; do
  r=$(result_of "$s")
  [ "$r" = PASS ] || fail "$s: '$r', not PASS"
done
if grep -q 'not reached' <<<"$table"; then fail "a step was not reached"; fi
bad=$(awk '$3 != "PASS" && $3 != "SKIP"' <<<"$table")
[ -z "$bad" ] || fail "steps neither PASS nor SKIP: $bad"
# The step benchmark's rows, one per stage and dtype at each rank count.
rows=$(awk '/^stage +dtype +params/ { on = 1; next } on && /^[0-2] / { n++ } END { print n + 0 }' "$out")
[ "$rows" -eq 12 ] || fail "$rows step rows in the table, not 12"

archive="$carry/device-check-logs.tar.xz"
if [ ! -f "$archive" ]; then
  fail "no logs' archive at $archive"
else
  size=$(stat -c %s "$archive")
  [ "$size" -lt $((16 * 1048576)) ] || fail "the logs' archive is $size bytes, not under 16 MiB"
  grep -q "all of them in $archive" "$out" || fail "the output does not name $archive"
  names=$(tar -tJf "$archive")
  for want in summary.txt gpu-device-suites-staged-np3.log test_device_suites_gpu.np3.rank1.log \
    test_device_suites_gpu.np3.rank2.log train-device-np1.log; do
    grep -q "/$want\$" <<<"$names" || fail "the archive does not hold $want"
  done
fi

if [ "$failed" -gt 0 ]; then
  echo "device-check-simulate: $failed checks failed"
  exit 1
fi
echo "device-check-simulate: the table and the logs' archive as expected"
