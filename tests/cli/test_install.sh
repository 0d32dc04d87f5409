#!/usr/bin/env bash
# Installs shardopt into a scratch directory, then builds the README's usage
# example against the installed headers and library through pkg-config alone
# (as a user's code would), and runs it under mpirun at 2 ranks; the same
# for the README's C and Fortran examples (with the system's gcc and
# gfortran, so not when a sanitizer build passes its own compiler).
# Usage: test_install.sh SOURCE_ROOT BUILD_ROOT MPIEXEC [COMPILER [FLAG...]]
# COMPILER and its flags default to g++; a sanitizer build passes its own
# compiler and -fsanitize flags, which a program linking it needs too.
set -u
src=$1
build=$2
mpiexec=$3
shift 3
cxx=("$@")
own_compiler=${#cxx[@]}
[ ${#cxx[@]} -gt 0 ] || cxx=(g++)
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

fail() { echo "FAILED: $*"; echo "install: 0 passed, 1 failed"; exit 1; }

meson install -C "$build" --destdir "$work/root" --no-rebuild >"$work/install.log" 2>&1 ||
  { cat "$work/install.log"; fail "meson install"; }

pc=$(find "$work/root" -name shardopt.pc | head -n 1)
[ -n "$pc" ] || fail "no shardopt.pc installed"
header=$(find "$work/root" -path '*/include/shardopt/shardopt.hpp' | head -n 1)
[ -n "$header" ] || fail "headers not installed under include/shardopt/"
for h in cast.hpp communicator.hpp error.hpp status.h version.hpp; do
  [ -f "$(dirname "$header")/$h" ] || fail "include/shardopt/$h not installed"
done

# The first C++ block of the README is the usage example.
awk '/^```cpp$/ { on = 1; next } /^```$/ { if (on) exit } on' "$src/README.md" >"$work/example.cpp"
[ -s "$work/example.cpp" ] || fail "no C++ example found in README.md"

# A copy of the installed .pc whose prefix is the scratch copy of the prefix
# (Open MPI's own .pc is found where the system keeps it).
prefix=$(pkg-config --variable=prefix "$pc")
mkdir -p "$work/pc"
for f in "$(dirname "$pc")"/*.pc; do
  sed "s|^prefix=.*|prefix=$work/root$prefix|" "$f" >"$work/pc/$(basename "$f")"
done
export PKG_CONFIG_PATH="$work/pc"
flags=$(pkg-config --cflags --libs shardopt) || fail "pkg-config --cflags --libs shardopt"
# shellcheck disable=SC2086
"${cxx[@]}" -std=c++20 -Wall -Wextra -Werror "$work/example.cpp" $flags -o "$work/example" \
  >"$work/cc.log" 2>&1 || { cat "$work/cc.log"; fail "compiling the README example with: $flags"; }

libdir=$(dirname "$(find "$work/root" -name 'libshardopt.so' | head -n 1)")
LD_LIBRARY_PATH="$libdir" timeout 60 "$mpiexec" -n 2 --oversubscribe "$work/example" \
  >"$work/run.log" 2>&1 || { cat "$work/run.log"; fail "running the README example under mpirun"; }

echo "ok: installed, built the README example with pkg-config ($flags), ran it at 2 ranks"

# A consumer's machine with no .pc file but shardopt's and its MPI's (no
# xxhash, nlohmann-json, OpenBLAS or CUDA ones): pkg-config still answers,
# and neither answer names the library's own dependencies or a path of
# this build machine (the static one names them only by -l).
ompi_pc=$(pkg-config --variable=pcfiledir ompi-c)/ompi-c.pc
mkdir -p "$work/bare"
cp "$work/pc/shardopt.pc" "$ompi_pc" "$work/bare/"
dyn=$(PKG_CONFIG_PATH='' PKG_CONFIG_LIBDIR="$work/bare" pkg-config --cflags --libs shardopt 2>&1) ||
  fail "pkg-config with only shardopt.pc and ompi-c.pc present: $dyn"
static=$(PKG_CONFIG_PATH='' PKG_CONFIG_LIBDIR="$work/bare" pkg-config --static --libs shardopt 2>&1) ||
  fail "pkg-config --static with only shardopt.pc and ompi-c.pc present: $static"
for word in xxhash nlohmann json openblas cuda nccl gomp; do
  if grep -qi -- "$word" <<<"$dyn"; then fail "pkg-config --cflags --libs shardopt names $word: $dyn"; fi
done
mpi_libdir=$(pkg-config --variable=libdir ompi-c)
for path in $static; do
  case "$path" in
    -L"$work"/* | -I"$work"/* | -L"$mpi_libdir" | -L"$mpi_libdir"/*) ;;
    -L* | -I* | /*)
      fail "pkg-config --static --libs shardopt writes a path of this machine: $path ($static)"
      ;;
  esac
done
echo "ok: pkg-config with only shardopt.pc and ompi-c.pc: $dyn; --static: $static"

# A plain make project, as an outside code builds one: pkg-config for the
# flags, the compiler and MPI's library, nothing else.
mkdir -p "$work/make"
cp "$work/example.cpp" "$work/make/main.cpp"
# shellcheck disable=SC2016
printf '%b\n' \
  'CXXFLAGS += -std=c++20 -Wall -Wextra -Werror $(shell pkg-config --cflags shardopt)' \
  'LDLIBS += $(shell pkg-config --libs shardopt)' \
  'main: main.cpp' \
  '\t$(CXX) $(CXXFLAGS) $< $(LDLIBS) -o $@' >"$work/make/Makefile"
make -C "$work/make" CXX="${cxx[*]}" >"$work/make.log" 2>&1 ||
  { cat "$work/make.log"; fail "make with pkg-config"; }
LD_LIBRARY_PATH="$libdir" timeout 60 "$mpiexec" -n 2 --oversubscribe "$work/make/main" \
  >"$work/run2.log" 2>&1 || { cat "$work/run2.log"; fail "running the make-built example"; }
echo "ok: a make project built the README example with pkg-config and ran it at 2 ranks"

# By hand, with MPI's own flags and -lshardopt, no definition of ours (the
# README's example includes shardopt's header first): the public headers
# keep mpi.h's C++ bindings, which need libmpi_cxx, out.
incdir=$(dirname "$(dirname "$header")")
# shellcheck disable=SC2046
"${cxx[@]}" -std=c++20 -Wall -Wextra -Werror -I"$incdir" $(pkg-config --cflags ompi-c) \
  "$work/example.cpp" -L"$libdir" -lshardopt $(pkg-config --libs ompi-c) -o "$work/hand" \
  >"$work/hand.log" 2>&1 || { cat "$work/hand.log"; fail "compiling by hand with MPI's flags"; }
LD_LIBRARY_PATH="$libdir" timeout 60 "$mpiexec" -n 2 --oversubscribe "$work/hand" \
  >"$work/run3.log" 2>&1 || { cat "$work/run3.log"; fail "running the hand-built example"; }
echo "ok: built by hand with MPI's flags and -lshardopt alone, ran at 2 ranks"
passed=4

# The README's C and Fortran examples (its first c and fortran blocks),
# through pkg-config's shardopt and shardopt-fortran.
if [ "$own_compiler" -eq 0 ]; then
  awk '/^```c$/ { on = 1; next } /^```$/ { if (on) exit } on' "$src/README.md" >"$work/example.c"
  [ -s "$work/example.c" ] || fail "no C example found in README.md"
  # shellcheck disable=SC2046
  gcc -std=c11 -Wall -Wextra -pedantic -Werror "$work/example.c" \
    $(pkg-config --cflags --libs shardopt) -o "$work/example_c" >"$work/c.log" 2>&1 ||
    { cat "$work/c.log"; fail "compiling the README's C example"; }
  LD_LIBRARY_PATH="$libdir" timeout 60 "$mpiexec" -n 2 --oversubscribe "$work/example_c" \
    >"$work/run_c.log" 2>&1 || { cat "$work/run_c.log"; fail "running the README's C example"; }
  grep -q '^w\[0\] = ' "$work/run_c.log" || { cat "$work/run_c.log"; fail "the C example printed no result"; }
  echo "ok: the README's C example built with pkg-config shardopt and ran at 2 ranks"
  passed=$((passed + 1))
  if [ -f "$work/pc/shardopt-fortran.pc" ]; then
    awk '/^```fortran$/ { on = 1; next } /^```$/ { if (on) exit } on' "$src/README.md" \
      >"$work/example.f90"
    [ -s "$work/example.f90" ] || fail "no Fortran example found in README.md"
    # shellcheck disable=SC2046
    gfortran -std=f2008 -Wall -Werror "$work/example.f90" \
      $(pkg-config --cflags --libs shardopt-fortran) -o "$work/example_f" >"$work/f.log" 2>&1 ||
      { cat "$work/f.log"; fail "compiling the README's Fortran example"; }
    LD_LIBRARY_PATH="$libdir" timeout 60 "$mpiexec" -n 2 --oversubscribe "$work/example_f" \
      >"$work/run_f.log" 2>&1 || { cat "$work/run_f.log"; fail "running the README's Fortran example"; }
    grep -q 'w(1,1) =' "$work/run_f.log" ||
      { cat "$work/run_f.log"; fail "the Fortran example printed no result"; }
    echo "ok: the README's Fortran example built with pkg-config shardopt-fortran and ran at 2 ranks"
    passed=$((passed + 1))
  else
    echo "SKIP: no shardopt-fortran.pc installed (built without the Fortran module)"
  fi
fi
echo "install: $passed passed, 0 failed"
