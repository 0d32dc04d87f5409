# shardopt: what the command-line tests share (sourced, not run).
# Sets $tmp (a fresh directory, removed on exit), the counters $passed and
# $failed, and fail MESSAGE [OUTPUT-FILE] and ok MESSAGE to count results;
# require PROGRAM:PACKAGE... stops the test when a program is missing.

# More ranks than cores here: one OpenMP thread per rank, or the optimizer
# kernels' threads of different ranks spin against each other.
export OMP_NUM_THREADS=1
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
failed=0
passed=0

fail() {  # MESSAGE [OUTPUT-FILE]
  failed=$((failed + 1))
  echo "FAILED: $1"
  if [ $# -gt 1 ] && [ -f "$2" ]; then
    echo "--- output ---"; cat "$2"; echo "--------------"
  fi
}
ok() {
  passed=$((passed + 1))
  echo "ok: $1 (at ${SECONDS} s)"
}

# Exits with a failure naming the package when a program the test runs is
# missing (without pgrep, a check for leftover processes would find none).
require() {  # PROGRAM:DEBIAN-PACKAGE...
  local p
  for p in "$@"; do
    if ! command -v "${p%%:*}" >/dev/null 2>&1; then
      echo "FAILED: ${p%%:*} not found (Debian: apt-get install ${p#*:}; scripts/setup installs it)"
      exit 1
    fi
  done
}
