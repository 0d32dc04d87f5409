#!/usr/bin/env bash
# Installs shardopt into a scratch directory, then builds the README's usage
# example against the installed headers and library through pkg-config alone
# (as a user's code would), and runs it under mpirun at 2 ranks.
# Usage: test_install.sh SOURCE_ROOT BUILD_ROOT MPIEXEC [COMPILER [FLAG...]]
# COMPILER and its flags default to g++; a sanitizer build passes its own
# compiler and -fsanitize flags, which a program linking it needs too.
set -u
src=$1
build=$2
mpiexec=$3
shift 3
cxx=("$@")
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
sed "s|^prefix=.*|prefix=$work/root$prefix|" "$pc" >"$work/pc/shardopt.pc"
export PKG_CONFIG_PATH="$work/pc"
flags=$(pkg-config --cflags --libs shardopt) || fail "pkg-config --cflags --libs shardopt"
# shellcheck disable=SC2086
"${cxx[@]}" -std=c++20 -Wall -Wextra -Werror "$work/example.cpp" $flags -o "$work/example" \
  >"$work/cc.log" 2>&1 || { cat "$work/cc.log"; fail "compiling the README example with: $flags"; }

libdir=$(dirname "$(find "$work/root" -name 'libshardopt.so' | head -n 1)")
LD_LIBRARY_PATH="$libdir" timeout 60 "$mpiexec" -n 2 --oversubscribe "$work/example" \
  >"$work/run.log" 2>&1 || { cat "$work/run.log"; fail "running the README example under mpirun"; }

echo "ok: installed, built the README example with pkg-config ($flags), ran it at 2 ranks"
echo "install: 1 passed, 0 failed"
