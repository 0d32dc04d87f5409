#!/bin/sh
# Builds a fuzz target with clang's libFuzzer, AddressSanitizer and
# UndefinedBehaviorSanitizer, and runs it for a bounded time over a copy of
# its seed corpus. Targets: header (the checkpoint header parser,
# tests/fuzz/fuzz_header.cpp, the default) and env (the SHARDOPT_*
# environment parser, tests/fuzz/fuzz_env.cpp).
#
#   tests/fuzz/run.sh [--target header|env] SOURCE_ROOT BUILD_DIR [SECONDS] [LIBFUZZER_OPTION...]
#
# SOURCE_ROOT is the shardopt checkout, BUILD_DIR a directory of its own for
# the binary, the working corpus and any crash reproducer (nothing is written
# under SOURCE_ROOT). SECONDS defaults to 60; further arguments go to
# libFuzzer (-jobs=4, -max_len=65536, ...). Exit status: 0 when the run found
# nothing, 1 on a crash, a sanitizer report or a broken invariant (the
# reproducer is named in the output), 77 (skip) without clang, libFuzzer or
# MPI's compiler flags. CXX_FUZZ selects the compiler (default: the first
# clang++ found).
set -u

target=header
if [ "${1:-}" = --target ]; then
  target=${2:-}
  shift 2 || exit 2
fi
case $target in
  header) max_len=8192 ;;
  env) max_len=4096 ;;
  *)
    echo "$0: unknown target '$target' (header or env)" >&2
    exit 2
    ;;
esac
if [ $# -lt 2 ]; then
  echo "usage: $0 [--target header|env] SOURCE_ROOT BUILD_DIR [SECONDS] [LIBFUZZER_OPTION...]" >&2
  exit 2
fi
src=$(cd "$1" && pwd) || exit 2
out=$2
seconds=${3:-60}
shift 2
[ $# -gt 0 ] && shift
case $seconds in
  '' | *[!0-9]*)
    echo "$0: SECONDS must be a whole number of seconds, not '$seconds'" >&2
    exit 2
    ;;
esac

cxx=${CXX_FUZZ:-}
if [ -z "$cxx" ]; then
  for c in clang++ clang++-19 clang++-18 clang++-17 clang++-16 clang++-15 clang++-14; do
    if command -v "$c" >/dev/null 2>&1; then
      cxx=$c
      break
    fi
  done
fi
if [ -z "$cxx" ]; then
  echo "SKIP: no clang++ found (Debian: apt-get install clang libclang-rt-dev)"
  exit 77
fi

mkdir -p "$out" || exit 2
out=$(cd "$out" && pwd) || exit 2

# libFuzzer's runtime ships separately from clang on Debian (libclang-rt-dev).
probe="$out/probe.cpp"
printf '%s\n' '#include <cstddef>' '#include <cstdint>' \
  'extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t*, std::size_t) { return 0; }' \
  >"$probe"
if ! "$cxx" -fsanitize=fuzzer,address,undefined "$probe" -o "$out/probe" >"$out/probe.log" 2>&1
then
  echo "SKIP: $cxx cannot link -fsanitize=fuzzer,address,undefined (Debian: apt-get install" \
    "libclang-rt-dev; see $out/probe.log)"
  exit 77
fi

# The parser throws through the library's error code, which reports the MPI
# rank: compile and link against MPI.
if pkg-config --exists ompi-c 2>/dev/null; then
  mpi_cflags=$(pkg-config --cflags ompi-c)
  mpi_libs=$(pkg-config --libs ompi-c)
elif command -v mpicxx >/dev/null 2>&1 && mpicxx --showme:compile >/dev/null 2>&1; then
  mpi_cflags=$(mpicxx --showme:compile)
  mpi_libs=$(mpicxx --showme:link)
elif command -v mpicxx >/dev/null 2>&1 && mpicxx -compile_info >/dev/null 2>&1; then
  # MPICH: "c++ -I... -L... -lmpicxx -lmpi"; the flags after the compiler.
  mpi_cflags=$(mpicxx -compile_info | cut -d' ' -f2-)
  mpi_libs=$(mpicxx -link_info | cut -d' ' -f2-)
else
  echo "SKIP: no MPI compiler flags (pkg-config ompi-c or mpicxx)"
  exit 77
fi

# nlohmann-json (headers only) and libxxhash, as the library finds them.
dep_cflags=$(pkg-config --cflags nlohmann_json libxxhash 2>/dev/null)
dep_libs=$(pkg-config --libs libxxhash 2>/dev/null || echo -lxxhash)

common="$src/lib/common/error.cpp $src/lib/common/log.cpp $src/lib/common/settings.cpp"
if [ "$target" = header ]; then
  sources="$src/tests/fuzz/fuzz_header.cpp $src/lib/ckpt/format.cpp $src/lib/ckpt/header_writer.cpp $common"
else
  sources="$src/tests/fuzz/fuzz_env.cpp $common"
fi
bin="$out/fuzz_$target"
# Rebuilt when any source or header of the library is newer than the binary.
stale=1
if [ -x "$bin" ] && [ -z "$(find "$src/lib" "$src/include" "$src/tests/fuzz" \
  -newer "$bin" \( -name '*.cpp' -o -name '*.hpp' -o -name '*.h' \) -print 2>/dev/null)" ]
then
  stale=0
fi
if [ "$stale" = 1 ]; then
  # shellcheck disable=SC2086  # the flag lists are word lists
  if ! "$cxx" -std=c++20 -O1 -g -fno-omit-frame-pointer \
    -fsanitize=fuzzer,address,undefined -fno-sanitize-recover=all \
    -DOMPI_SKIP_MPICXX=1 -DMPICH_SKIP_MPICXX=1 \
    -I"$src/include" -I"$src/lib" -I"$src/lib/common" $mpi_cflags $dep_cflags \
    $sources -o "$bin.tmp" $mpi_libs $dep_libs >"$out/build.log" 2>&1
  then
    cat "$out/build.log" >&2
    echo "fuzz-$target: FAILED to build the fuzzer ($cxx)" >&2
    exit 1
  fi
  mv "$bin.tmp" "$bin"
fi

# A fresh copy of the seeds: libFuzzer adds what it finds to the corpus.
work="$out/corpus"
rm -rf "$work" && mkdir -p "$work" "$out/artifacts" || exit 2
cp "$src/tests/fuzz/corpus/$target"/* "$work"/ || exit 2
seeds=$(find "$work" -type f | wc -l)

log="$out/fuzz.log"
"$bin" -max_total_time="$seconds" -print_final_stats=1 -timeout=20 -rss_limit_mb=4096 \
  -max_len=$max_len -dict="$src/tests/fuzz/$target.dict" -artifact_prefix="$out/artifacts/" \
  "$@" "$work" >"$log" 2>&1
rc=$?
# libFuzzer exits 77 on a crash by default, which meson would take for a
# skip: every failure becomes exit 1 below.

execs=$(sed -n 's/^stat::number_of_executed_units: *//p' "$log" | tail -n 1)
secs=$(sed -n 's/^Done [0-9]* runs in \([0-9]*\) second.*/\1/p' "$log" | tail -n 1)
cov=$(grep -o 'cov: [0-9]*' "$log" | tail -n 1 | cut -d' ' -f2)
found=$(find "$work" -type f | wc -l)
if [ "$rc" -ne 0 ]; then
  tail -n 60 "$log" >&2
  repro=$(find "$out/artifacts" -type f | head -n 1)
  echo "fuzz-$target: FAILED (libFuzzer exit $rc) after ${execs:-?} runs;" \
    "reproducer: ${repro:-none saved} (replay: $bin FILE); log: $log"
  exit 1
fi
echo "fuzz-$target: ok, ${execs:-?} runs in ${secs:-$seconds} s, coverage ${cov:-?} edges," \
  "corpus $seeds seeds -> $found inputs, no crash ($log)"
exit 0
