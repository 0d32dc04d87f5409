#!/usr/bin/env bash
# The LibTorch example (apps/examples/torch, docs/libtorch.md), built as an
# outside project builds it: shardopt installed into a scratch prefix, the
# example configured with CMake (find_package(Torch) and
# find_package(shardopt CONFIG)) and built there. Then:
#   - torch::optim::AdamW alone (--reference) reaches the loss threshold;
#   - at 1 rank, shardopt's parameters equal the reference's bit for bit,
#     at stages 0, 1, 2 and 3 (each layer a unit gathered in its forward
#     and backward);
#   - at 2 and 3 ranks (the global batch of 100 split 50+50 and 33+33+34),
#     stages 0 to 3 give bitwise the same parameters, every run reaches
#     the threshold, and --check finds them within the example's tolerance
#     of the reference (3 D from the float32 reference, 2 D from a float64
#     one, D the float32 reference's own distance from the float64 one);
#   - --device cuda without CUDA, a bad --stage and --check past the steps
#     it holds for fail with a message.
# Exits 77 (skipped) when CMake or a Torch CMake package (Debian:
# libtorch-dev) is missing.
# Usage: test_example_torch.sh SOURCE_ROOT BUILD_ROOT MPIEXEC
set -u
src=$1
build=$2
mpiexec=$3
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

passed=0
failed=0
ok() { echo "ok: $*"; passed=$((passed + 1)); }
bad() { echo "FAILED: $*"; failed=$((failed + 1)); }
finish() {
  echo "example-torch: $passed passed, $failed failed"
  [ "$failed" -eq 0 ]
  exit
}
fatal() { bad "$@"; finish; }

command -v cmake >/dev/null || { echo "SKIP: cmake not found (Debian: apt-get install cmake)"; exit 77; }

# shellcheck source=tests/cli/lib/prefix.sh
. "$src/tests/cli/lib/prefix.sh"
install_prefix "$build" "$work" || fatal "meson install"
[ -n "$(find "$SHARDOPT_LIBDIR" -name shardoptConfig.cmake)" ] ||
  fatal "no shardoptConfig.cmake installed under $SHARDOPT_LIBDIR"

# Configure and build as a user would (CMAKE_PREFIX_PATH from
# install_prefix; Release, the CMakeLists' default), warnings as errors.
if ! cmake -S "$src/apps/examples/torch" -B "$work/cmake" -DCMAKE_CXX_FLAGS="-Wall -Wextra -Werror" \
  >"$work/configure.log" 2>&1; then
  if grep -q 'provided by "Torch"' "$work/configure.log"; then
    echo "SKIP: no Torch CMake package found (Debian: apt-get install libtorch-dev; a"
    echo "      downloaded LibTorch: put its folder in CMAKE_PREFIX_PATH)"
    exit 77
  fi
  cat "$work/configure.log"
  fatal "cmake configure of apps/examples/torch"
fi
start=$SECONDS
nice cmake --build "$work/cmake" >"$work/build.log" 2>&1 ||
  { cat "$work/build.log"; fatal "cmake --build of apps/examples/torch"; }
ok "configured with find_package(Torch) and find_package(shardopt CONFIG), built in $((SECONDS - start)) s"
exe=$work/cmake/torch_example

# run LOG COMMAND...: runs it (60 s at most), keeps its output in LOG, and
# fails unless it exits 0 and reached the loss threshold.
run() {
  local log=$1
  shift
  if ! timeout 60 "$@" >"$log" 2>&1; then
    cat "$log"
    bad "exit status $? from: $*"
    return 1
  fi
  if ! grep -q 'reached threshold' "$log"; then
    cat "$log"
    bad "no 'reached threshold' from: $*"
    return 1
  fi
}

run "$work/ref.log" "$exe" --reference --save-params "$work/ref.bin" &&
  ok "torch::optim::AdamW reference: $(grep -o 'final loss.*' "$work/ref.log")"
size=$(stat -c %s "$work/ref.bin" 2>/dev/null || echo 0)
[ "$size" -eq $((2632 * 4)) ] || bad "ref.bin holds $size bytes, not 2632 float32"

for n in 1 2 3; do
  for stage in 0 1 2 3; do
    check=()
    [ "$stage" -eq 2 ] && check=(--check)
    run "$work/n$n-s$stage.log" "$mpiexec" -n "$n" --oversubscribe "$exe" --stage "$stage" \
      --save-params "$work/n$n-s$stage.bin" "${check[@]}" || continue
    if [ "$stage" -eq 2 ]; then
      if grep -q '^check: .*\(equal to\|within\)' "$work/n$n-s$stage.log"; then
        ok "$n rank(s): $(grep '^check:' "$work/n$n-s$stage.log")"
      else
        cat "$work/n$n-s$stage.log"
        bad "$n rank(s): --check found no agreement with torch::optim::AdamW"
      fi
    fi
  done
  if cmp -s "$work/n$n-s0.bin" "$work/n$n-s1.bin" && cmp -s "$work/n$n-s0.bin" "$work/n$n-s2.bin" &&
    cmp -s "$work/n$n-s0.bin" "$work/n$n-s3.bin"; then
    ok "$n rank(s): stages 0, 1, 2 and 3 give bitwise the same parameters"
  else
    bad "$n rank(s): the parameters differ between stages 0 to 3"
  fi
done
if cmp -s "$work/ref.bin" "$work/n1-s0.bin"; then
  ok "1 rank: the parameters equal torch::optim::AdamW's bit for bit"
else
  bad "1 rank: the parameters differ from torch::optim::AdamW's (cmp: $(cmp "$work/ref.bin" "$work/n1-s0.bin" 2>&1))"
fi

# Bad input: a clear message and a failing status, no hang.
timeout 60 "$exe" --device cuda >"$work/cuda.log" 2>&1
status=$?
if [ "$status" -eq 1 ] && grep -q 'is_available() is false' "$work/cuda.log"; then
  ok "--device cuda without CUDA: exit 1, $(head -c 80 "$work/cuda.log")..."
elif [ "$status" -eq 0 ]; then
  ok "--device cuda ran: this LibTorch has CUDA"
else
  cat "$work/cuda.log"
  bad "--device cuda: exit status $status"
fi
# A wrong use: the example with ARGS exits 2 and prints MESSAGE (its
# output in $work/LOG.log); SAYS tells what the message gives the user.
wrong_use() {  # LOG MESSAGE SAYS ARGS...
  local log="$work/$1.log" message=$2 says=$3 status
  shift 3
  timeout 60 "$exe" "$@" >"$log" 2>&1
  status=$?
  if [ "$status" -eq 2 ] && grep -q -- "$message" "$log"; then
    ok "$*: exit 2, $says"
  else
    cat "$log"
    bad "$*: exit status $status"
  fi
}
wrong_use usage '--stage takes an integer from 0 to 3' \
  "the message names the option and its range" --stage 4
wrong_use usage2 'use --steps 1000 or fewer with --check' \
  "the message says why and what to use" --check --steps 5000
finish
