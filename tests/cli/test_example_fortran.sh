#!/usr/bin/env bash
# The Fortran example (apps/examples/fortran/) as a user builds it:
# shardopt installed into a scratch prefix (the module file must land in
# <includedir>/shardopt/fortran/), the example's own Makefile run in a copy
# of its folder with pkg-config finding shardopt-fortran, and its
# CMakeLists.txt built with find_package(shardopt) where the CMake package
# is installed. At 2 and 3 ranks and stages 0, 1 and 2 it must reach its
# threshold (exit 0, the result line saying so), and at each rank count the
# three stages must write byte-identical coefficient files (ZeRO's stages
# give bitwise the same parameters). Too few steps must miss the threshold
# (exit 1), and bad arguments must be refused (exit 2). And the complete
# program of docs/fortran.md builds and gives the output the page shows.
# Usage: test_example_fortran.sh SOURCE_ROOT BUILD_ROOT MPIEXEC
set -u
src=$1
build=$2
mpiexec=$3
here=$(cd "$(dirname "$0")" && pwd)
# shellcheck source=lib.sh
. "$here/lib.sh"
# shellcheck source=lib/prefix.sh
. "$here/lib/prefix.sh"
# shellcheck source=lib/example.sh
. "$here/lib/example.sh"
require make:make pkg-config:pkg-config cmp:diffutils gfortran:gfortran

finish() {
  echo "example-fortran: $passed passed, $failed failed"
  [ "$failed" -eq 0 ]
  exit
}

install_prefix "$build" "$tmp" >"$tmp/prefix.log" 2>&1 ||
  { fail "meson install into a scratch prefix" "$tmp/prefix.log"; finish; }
mod=$PREFIX/include/shardopt/fortran/shardopt.mod
if [ -f "$mod" ]; then
  ok "installed into $PREFIX, the module at include/shardopt/fortran/shardopt.mod"
else
  find "$tmp/root" -name '*.mod' >"$tmp/mods.log"
  fail "no $mod installed (module files installed: see below)" "$tmp/mods.log"
  finish
fi
cflags=$(pkg-config --cflags shardopt-fortran 2>&1) ||
  { echo "$cflags" >"$tmp/pc.log"; fail "pkg-config --cflags shardopt-fortran" "$tmp/pc.log"; finish; }
case " $cflags " in
  *" -I$PREFIX/include/shardopt/fortran "*) ok "pkg-config --cflags shardopt-fortran: $cflags" ;;
  *) fail "pkg-config --cflags shardopt-fortran lacks -I$PREFIX/include/shardopt/fortran: $cflags" ;;
esac

cp -r "$src/apps/examples/fortran" "$tmp/example"
rm -f "$tmp/example/river_source" "$tmp/example/coefficients.txt"
if make -C "$tmp/example" FFLAGS="-O2 -Werror" >"$tmp/make.log" 2>&1; then
  ok "make built river_source with pkg-config --cflags --libs shardopt-fortran"
else
  fail "make in a copy of apps/examples/fortran" "$tmp/make.log"
  finish
fi
program=$tmp/example/river_source

# run PROGRAM RANKS STAGE STEPS OUT LOG: true when the threshold is reached.
run() {
  local prog=$1 n=$2 stage=$3 steps=$4 out=$5 log=$6
  if ! timeout 120 "$mpiexec" -n "$n" --oversubscribe "$prog" "$stage" "$steps" "$out" >"$log" 2>&1; then
    fail "$n ranks, stage $stage: exit status $? (the threshold missed, or an error)" "$log"
    return 1
  fi
  line=$(grep '^river_source:' "$log")
  case "$line" in
    *"$n ranks, stage $stage, $steps steps: misfit "*" reached") ;;
    *) fail "$n ranks, stage $stage: no result line saying the threshold was reached" "$log"
       return 1 ;;
  esac
  if [ "$(wc -l <"$out")" -ne 200 ]; then
    fail "$n ranks, stage $stage: $out does not hold 200 coefficients" "$log"
    return 1
  fi
}

for n in 2 3; do
  for stage in 0 1 2; do
    out=$tmp/coeffs-np$n-stage$stage.txt
    run "$program" "$n" "$stage" 400 "$out" "$tmp/run-np$n-stage$stage.log" &&
      ok "$n ranks, stage $stage: ${line#river_source: }"
  done
  example_stages_identical "$n"
done

example_too_few_steps "$program" 50
example_bad_arguments "$program" 400

# docs/fortran.md's complete program (its first Fortran block), built with
# pkg-config alone and run at 3 ranks: it converges (exit 0) and reports
# the misspelled hyper-parameter through ierr.
awk '/^```fortran$/ { on = 1; next } /^```$/ { if (on) exit } on' "$src/docs/fortran.md" \
  >"$tmp/quickstart.f90"
# shellcheck disable=SC2046
if gfortran -O2 -Wall -Wextra -Werror "$tmp/quickstart.f90" $(pkg-config --cflags --libs shardopt-fortran) \
  -o "$tmp/quickstart" >"$tmp/quickstart.log" 2>&1; then
  if timeout 60 "$mpiexec" -n 3 --oversubscribe "$tmp/quickstart" >"$tmp/quickstart.log" 2>&1 &&
    grep -q "^quickstart: 150 steps, w(1,1) =  2.00000, expected  2.00000" "$tmp/quickstart.log" &&
    grep -q "^shardopt_set_hparams: sgd has no hyper-parameter 'momentm' (hint: " "$tmp/quickstart.log"; then
    ok "docs/fortran.md's complete program: $(grep '^quickstart:' "$tmp/quickstart.log")"
  else
    fail "docs/fortran.md's complete program at 3 ranks: not the output the page shows" "$tmp/quickstart.log"
  fi
else
  fail "compiling docs/fortran.md's complete program with pkg-config shardopt-fortran" "$tmp/quickstart.log"
fi

# The CMake build, where shardopt's CMake package is installed.
config=$(find "$tmp/root" -name shardoptConfig.cmake | head -n 1)
if ! command -v cmake >/dev/null 2>&1; then
  echo "note: cmake not found (Debian: apt-get install cmake): the CMake build is not checked"
elif [ -z "$config" ]; then
  echo "note: no shardoptConfig.cmake installed: the CMake build is not checked"
else
  cp -r "$src/apps/examples/fortran" "$tmp/cmake-src"
  if cmake -S "$tmp/cmake-src" -B "$tmp/cmake-build" -DCMAKE_PREFIX_PATH="$PREFIX" \
    -DCMAKE_Fortran_COMPILER=gfortran >"$tmp/cmake.log" 2>&1 &&
    cmake --build "$tmp/cmake-build" >>"$tmp/cmake.log" 2>&1; then
    ok "cmake built river_source with find_package(shardopt) and shardopt::shardopt"
    run "$tmp/cmake-build/river_source" 3 2 400 "$tmp/cmake.txt" "$tmp/cmake-run.log" &&
      ok "the CMake build at 3 ranks, stage 2: ${line#river_source: }"
  else
    fail "cmake -S apps/examples/fortran with CMAKE_PREFIX_PATH=$PREFIX" "$tmp/cmake.log"
  fi
fi
finish
