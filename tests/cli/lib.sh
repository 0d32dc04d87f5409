# shardopt: what the command-line tests share (sourced, not run).
# Sets $tmp (a fresh directory, removed on exit), the counters $passed and
# $failed, and fail MESSAGE [OUTPUT-FILE] and ok MESSAGE to count results;
# require PROGRAM:PACKAGE... stops the test when a program is missing,
# skip_without PROGRAM:PACKAGE... and skip_unless_root MESSAGE skip it.

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

# Exits with STATUS and a message that starts with WORD and names the
# package when one of the programs is missing.
exit_if_missing() {  # STATUS WORD PROGRAM:DEBIAN-PACKAGE...
  local status=$1 word=$2 p
  shift 2
  for p in "$@"; do
    if ! command -v "${p%%:*}" >/dev/null 2>&1; then
      echo "$word: ${p%%:*} not found (Debian: apt-get install ${p#*:}; scripts/setup installs it)"
      exit "$status"
    fi
  done
}

# A failure when a program the test runs is missing (without pgrep, a check
# for leftover processes would find none).
require() {  # PROGRAM:DEBIAN-PACKAGE...
  exit_if_missing 1 FAILED "$@"
}

# A skip (exit status 77) instead, for what only some machines have
# (Slurm's daemons).
skip_without() {  # PROGRAM:DEBIAN-PACKAGE...
  exit_if_missing 77 SKIP "$@"
}

# Skips the test (exit status 77) unless it runs as root; the message says
# what needs root.
skip_unless_root() {  # MESSAGE
  if [ "$(id -u)" -ne 0 ]; then
    echo "SKIP: $1"
    exit 77
  fi
}
