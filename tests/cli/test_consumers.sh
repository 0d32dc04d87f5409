#!/usr/bin/env bash
# shardopt as an outside project uses it: installs the build into a scratch
# prefix (tests/cli/lib/prefix.sh), then builds the user projects of
# tests/consumers/ against it with Meson (dependency('shardopt') through
# pkg-config), CMake (find_package(shardopt CONFIG): one project with C,
# C++ and Fortran, one with C++ alone that also checks the version rules)
# and make with pkg-config. Each builds a C, a C++ and (when shardopt has
# its Fortran module) a Fortran program that steps a ZeRO optimizer and
# checks the result itself; each runs at 2 ranks. And every installed
# public header compiles alone (C headers as C11 and C++20, C++ headers as
# C++20, warnings as errors) with only the prefix and MPI's flags, opening
# no header but the prefix's, MPI's and the compiler's and C library's.
# The CMake projects set no C++ standard (shardopt::shardopt brings C++20).
# Last, the prefix is moved elsewhere: its programs and libraries find
# their libraries there without LD_LIBRARY_PATH, and shardopt-train,
# shardopt-ckpt and shardopt-plan run from it.
#
# With --subproject, instead: the Meson project with shardopt as a
# subproject (subprojects/shardopt links to this source tree, beside
# docs/shardopt.wrap), which compiles the whole library (minutes; the
# package-slow suite).
#
# Usage: test_consumers.sh [--subproject] SOURCE_ROOT BUILD_ROOT MPIEXEC fortran|no-fortran
set -u
subproject=0
if [ "${1:-}" = --subproject ]; then
  subproject=1
  shift
fi
src=$1
build=$2
mpiexec=$3
fortran=$4
# shellcheck source=lib.sh
. "$(dirname "$0")/lib.sh"
# shellcheck source=lib/prefix.sh
. "$(dirname "$0")/lib/prefix.sh"
require pkg-config:pkg-config cmake:cmake make:make ninja:ninja-build cc:gcc c++:g++
[ "$fortran" = fortran ] && require gfortran:gfortran
name=consumers
[ "$subproject" = 1 ] && name=consumers-subproject

finish() {
  echo "$name: $passed passed, $failed failed"
  [ "$failed" -eq 0 ]
  exit
}

no_fortran_reason="shardopt was built without its Fortran module (-Dfortran=disabled, or no gfortran)"

# copy_project DIR BUILD-SYSTEM: a fresh copy of a consumer project and the
# programs it builds.
copy_project() {
  rm -rf "$1"
  mkdir -p "$1"
  cp "$src/tests/consumers/$2"/* "$src/tests/consumers/src"/* "$1/"
}

# setup_and_build DIR SETUP-COMMAND...: sets up the project copied into DIR
# (the output in DIR/setup.log) and builds it with ninja in DIR/build
# (DIR/build.log). Where either fails, setup.log ends with the build's
# output too: the one file a failure shows.
setup_and_build() {
  local d=$1
  shift
  if "$@" >"$d/setup.log" 2>&1 && ninja -C "$d/build" >"$d/build.log" 2>&1; then
    return 0
  fi
  cat "$d/build.log" >>"$d/setup.log" 2>/dev/null
  return 1
}

# run_programs WHAT DIR [ENV-ARGS...]: runs DIR's consumer programs at 2
# ranks, under `env ENV-ARGS`.
run_programs() {
  local what=$1 dir=$2 prog
  shift 2
  local progs=(consumer_c consumer_cpp)
  [ "$fortran" = fortran ] && progs+=(consumer_fortran)
  for prog in "${progs[@]}"; do
    if [ ! -x "$dir/$prog" ]; then
      fail "$what: $prog was not built"
      continue
    fi
    if env "$@" timeout 60 "$mpiexec" -n 2 --oversubscribe "$dir/$prog" >"$dir/$prog.log" 2>&1; then
      ok "$what: $prog at 2 ranks: $(grep -m 1 '^consumer' "$dir/$prog.log")"
    else
      fail "$what: $prog at 2 ranks" "$dir/$prog.log"
    fi
  done
  [ "$fortran" = fortran ] || echo "SKIP: $what: the Fortran program: $no_fortran_reason"
}

# ---------------------------------------------------------------------------
if [ "$subproject" = 1 ]; then
  # Nothing installed, no pkg-config: the library comes from the subproject.
  unset PKG_CONFIG_PATH
  d=$tmp/subproject
  copy_project "$d" meson
  mkdir -p "$d/subprojects"
  ln -s "$(cd "$src" && pwd)" "$d/subprojects/shardopt"
  cp "$src/docs/shardopt.wrap" "$d/subprojects/"
  if meson setup "$d/build" "$d" --force-fallback-for=shardopt,shardopt-fortran \
    -Dshardopt:tests=false -Dshardopt:apps=false -Dshardopt:cuda=disabled \
    "-Dfortran=$([ "$fortran" = fortran ] && echo true || echo false)" >"$d/setup.log" 2>&1; then
    if nice ninja -C "$d/build" >"$d/build.log" 2>&1; then
      ok "Meson, shardopt as a subproject (docs/shardopt.wrap): built in ${SECONDS} s"
      run_programs "Meson subproject" "$d/build"
    else
      fail "Meson subproject: ninja" "$d/build.log"
    fi
  else
    fail "Meson subproject: meson setup" "$d/setup.log"
  fi
  finish
fi

install_prefix "$build" "$tmp" >"$tmp/prefix.log" 2>&1 || { fail "meson install" "$tmp/prefix.log"; finish; }
libdir=$SHARDOPT_LIBDIR
incdir=$PREFIX/include
cmake_dir=$libdir/cmake/shardopt

# What the packages need is there.
missing=()
for f in "$cmake_dir/shardoptConfig.cmake" "$cmake_dir/shardoptConfigVersion.cmake" \
  "$libdir/libshardopt.so" "$incdir/shardopt/version.h"; do
  [ -f "$f" ] || missing+=("${f#"$PREFIX"/}")
done
for f in "$src"/include/shardopt/*.h "$src"/include/shardopt/*.hpp; do
  [ -f "$incdir/shardopt/$(basename "$f")" ] || missing+=("include/shardopt/$(basename "$f")")
done
if [ "$fortran" = fortran ]; then
  for f in "$libdir/libshardopt_fortran.so" "$incdir/shardopt/fortran/shardopt.mod" \
    "$PKG_CONFIG_PATH/shardopt-fortran.pc"; do
    [ -f "$f" ] || missing+=("${f#"$PREFIX"/}")
  done
fi
if [ ${#missing[@]} -eq 0 ]; then
  ok "installed: the CMake package in ${cmake_dir#"$PREFIX"/}, the headers$(
    [ "$fortran" = fortran ] && echo ", the Fortran module and shardopt-fortran.pc")"
else
  fail "not installed: ${missing[*]}"
fi

# --- The public headers alone ----------------------------------------------
# MPI's compile flags, as a code that uses MPI has them.
mpi_cflags=$(pkg-config --cflags ompi-c 2>/dev/null || mpicc --showme:compile)
# Where a header may come from: the prefix, MPI's include folders, and the
# compilers' own search folders (their headers, libc's, libstdc++'s).
allowed=("$(realpath -m "$incdir")")
for flag in $mpi_cflags; do
  case "$flag" in -I*) allowed+=("$(realpath -m "${flag#-I}")") ;; esac
done
for compiler in "cc -x c" "c++ -x c++"; do
  # shellcheck disable=SC2086
  while read -r dir; do allowed+=("$(realpath -m "$dir")"); done < <(
    $compiler -E -v /dev/null 2>&1 >/dev/null |
      sed -n '/#include <...> search starts here:/,/End of search list./p' | sed '1d;$d')
done
# Headers of shardopt's own dependencies, which a user's build may not
# have: none of them may be reached from a public header.
forbidden='nlohmann|xxhash|cuda|nccl|cblas|openblas|lapack|/omp\.h$|catch2|torch'

# check_header LANG HEADER: compiles a file that includes HEADER alone;
# prints nothing when fine, the problem otherwise.
check_header() {
  local lang=$1 header=$2 out=$tmp/headers/$1-${2//\//_}
  local -a cmd
  if [ "$lang" = c ]; then
    cmd=(cc -x c -std=c11 -Wall -Wextra -pedantic -Werror)
  else
    cmd=(c++ -x c++ -std=c++20 -Wall -Wextra -pedantic -Werror)
  fi
  # (A declaration after it: a header of macros alone would leave ISO C's
  # empty translation unit.)
  printf '#include <%s>\ntypedef int shardopt_header_check;\n' "$header" >"$out.src"
  # shellcheck disable=SC2086
  if ! "${cmd[@]}" -fsyntax-only -H -I"$incdir" $mpi_cflags "$out.src" 2>"$out.log"; then
    echo "$header does not compile alone as $lang (${cmd[*]} -I<prefix>/include $mpi_cflags):"
    grep -v '^\.' "$out.log" | head -n 20
    return
  fi
  local opened file root
  mapfile -t opened < <(grep '^\.\+ ' "$out.log" | sed 's/^\.* //' | sort -u)
  [ ${#opened[@]} -gt 0 ] || { echo "$header as $lang: the compiler listed no header (-H)"; return; }
  # The first header opened that is not allowed, if any.
  while read -r file; do
    if [[ ${file,,} =~ $forbidden ]]; then
      echo "$header as $lang opens $file, a header of a dependency of shardopt"
      return
    fi
    case "$file" in
      "${allowed[0]}"/*) continue ;;
      */shardopt/*)
        echo "$header as $lang opens $file, a shardopt header outside the prefix"
        return
        ;;
    esac
    for root in "${allowed[@]}"; do
      case "$file" in "$root"/*) continue 2 ;; esac
    done
    echo "$header as $lang opens $file, outside the prefix, MPI and the compiler"
    return
  done < <(realpath -m -- "${opened[@]}")
}

mkdir -p "$tmp/headers"
jobs_list=()
while read -r f; do
  case "$f" in
    *.h) jobs_list+=("c ${f#"$incdir"/}" "c++ ${f#"$incdir"/}") ;;
    *) jobs_list+=("c++ ${f#"$incdir"/}") ;;
  esac
done < <(find "$incdir/shardopt" -type f \( -name '*.h' -o -name '*.hpp' \) | sort)
i=0
for job in "${jobs_list[@]}"; do
  # shellcheck disable=SC2086
  check_header $job >"$tmp/headers/result-$i" &
  i=$((i + 1))
  [ $((i % 2)) -eq 0 ] && wait
done
wait
bad=$(cat "$tmp"/headers/result-* 2>/dev/null)
if [ -z "$bad" ] && [ ${#jobs_list[@]} -gt 0 ]; then
  ok "${#jobs_list[@]} header compilations (every installed header alone: C headers as C11 and C++20, C++ ones as C++20, -Werror): only the prefix's, MPI's and the compiler's headers opened"
else
  fail "the installed headers alone: ${bad:-no header found in $incdir/shardopt}"
fi

# --- Meson: dependency('shardopt') through pkg-config ----------------------
d=$tmp/meson
copy_project "$d" meson
if setup_and_build "$d" meson setup "$d/build" "$d" \
  "-Dfortran=$([ "$fortran" = fortran ] && echo true || echo false)"; then
  ok "Meson: dependency('shardopt') built the consumers"
  run_programs "Meson" "$d/build"
else
  fail "Meson: building the consumers" "$d/setup.log"
fi

# --- CMake: find_package(shardopt CONFIG) ----------------------------------
d=$tmp/cmake
copy_project "$d" cmake
if setup_and_build "$d" cmake -S "$d" -B "$d/build" -G Ninja \
  "-DCONSUMER_FORTRAN=$([ "$fortran" = fortran ] && echo ON || echo OFF)"; then
  ok "CMake: find_package(shardopt CONFIG) and shardopt::shardopt built the consumers"
  # CMake's build tree records where the libraries are (run path): no
  # LD_LIBRARY_PATH, as a CMake user runs them.
  run_programs "CMake (no LD_LIBRARY_PATH)" "$d/build" -u LD_LIBRARY_PATH
else
  fail "CMake: building the consumers" "$d/setup.log"
fi

# A project with C++ alone (MPI::MPI_CXX), which checks the version rules.
d=$tmp/cmake-cxx
copy_project "$d" cmake-cxx
version=$(sed -n 's/^set(PACKAGE_VERSION "\(.*\)")$/\1/p' "$cmake_dir/shardoptConfigVersion.cmake")
if setup_and_build "$d" cmake -S "$d" -B "$d/build" -G Ninja "-DVERSION=$version"; then
  ok "CMake, C++ alone: $(grep -c 'as expected' "$d/setup.log") version requests accepted or refused as the rules say (shardopt $version); $(grep -m 1 'COMPONENTS Fortran' "$d/setup.log" | sed 's/^-- //')"
  if env -u LD_LIBRARY_PATH timeout 60 "$mpiexec" -n 2 --oversubscribe "$d/build/consumer_cpp" \
    >"$d/run.log" 2>&1; then
    ok "CMake, C++ alone: consumer_cpp at 2 ranks"
  else
    fail "CMake, C++ alone: consumer_cpp at 2 ranks" "$d/run.log"
  fi
else
  fail "CMake, C++ alone (and the version rules)" "$d/setup.log"
fi

# --- make and pkg-config ---------------------------------------------------
d=$tmp/make
copy_project "$d" make
if make -C "$d" "FORTRAN=$([ "$fortran" = fortran ] && echo 1 || echo 0)" >"$d/build.log" 2>&1; then
  ok "make: pkg-config --cflags --libs shardopt$([ "$fortran" = fortran ] && echo " and shardopt-fortran") built the consumers"
  run_programs "make" "$d"
else
  fail "make with pkg-config" "$d/build.log"
fi

# --- The installed programs, the prefix moved ------------------------------
# The prefix moved elsewhere as a whole, as a user copies or relocates an
# installation: every program of its bin/ and every library of its libdir
# finds its libraries with no LD_LIBRARY_PATH (their run path is relative
# to themselves, $ORIGIN), libshardopt in the moved prefix itself.
moved=$tmp/elsewhere/shardopt
mkdir -p "$(dirname "$moved")"
rel_libdir=${libdir#"$PREFIX"/}
if mv "$PREFIX" "$moved"; then
  unset PKG_CONFIG_PATH CMAKE_PREFIX_PATH
  bad=()
  mapfile -t elves < <(find "$moved/bin" "$moved/$rel_libdir" -maxdepth 1 -type f \
    \( -perm -u+x -o -name '*.so*' \) -exec sh -c 'head -c 4 "$1" | grep -q ELF' _ {} \; -print |
    sort)
  for f in "${elves[@]}"; do
    runpath=$(readelf -d "$f" | sed -n 's/.*(\(RUNPATH\|RPATH\)).*\[\(.*\)\]/\2/p')
    deps=$(env -u LD_LIBRARY_PATH ldd "$f" 2>&1)
    if grep -q 'not found' <<<"$deps"; then
      bad+=("${f#"$moved"/} (run path '${runpath}'): $(grep 'not found' <<<"$deps" | tr -s '\t\n' '  ')")
    elif grep -q 'libshardopt' <<<"$deps" && grep 'libshardopt' <<<"$deps" | grep -qv "=> $moved/"; then
      bad+=("${f#"$moved"/} (run path '${runpath}') takes libshardopt from outside the prefix: $(grep 'libshardopt' <<<"$deps" | tr -s '\t\n' '  ')")
    fi
  done
  if [ ${#elves[@]} -lt 4 ]; then
    fail "the moved prefix: ${#elves[@]} programs and libraries found in bin/ and ${rel_libdir}/"
  elif [ ${#bad[@]} -eq 0 ]; then
    ok "the prefix moved: ${#elves[@]} programs and libraries of bin/ and ${rel_libdir}/ find their libraries without LD_LIBRARY_PATH (run path $(readelf -d "$moved/bin/shardopt-plan" | sed -n 's/.*(\(RUNPATH\|RPATH\)).*\[\(.*\)\]/\2/p'))"
  else
    printf '%s\n' "${bad[@]}" >"$tmp/moved.log"
    fail "the prefix moved: ${#bad[@]} of ${#elves[@]} programs and libraries miss a library" \
      "$tmp/moved.log"
  fi
  # Run, not only loaded: shardopt-train's help, shardopt-ckpt's, and a
  # plan (stage 2 of 1M parameters at 2 ranks).
  for cmd in "shardopt-train --help" "shardopt-ckpt --help" "shardopt-plan -p 1M -s 2 -n 2 --json"; do
    # shellcheck disable=SC2086
    if (cd "$tmp" && env -u LD_LIBRARY_PATH timeout 60 "$moved/bin/"$cmd) >"$tmp/moved-run.log" 2>&1 &&
      [ -s "$tmp/moved-run.log" ]; then
      ok "the prefix moved: $cmd ran: $(head -n 1 "$tmp/moved-run.log" | cut -c 1-80)"
    else
      fail "the prefix moved: $cmd" "$tmp/moved-run.log"
    fi
  done
else
  fail "moving the prefix $PREFIX to $moved"
fi

finish
