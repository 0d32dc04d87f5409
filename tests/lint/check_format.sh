#!/usr/bin/env bash
# Fails if any C, C++ or CUDA source of the project differs from what
# clang-format makes of it with the project's .clang-format.
# Usage: check_format.sh SOURCE_ROOT
set -u
root=$1
cd "$root" || exit 1
if ! command -v clang-format >/dev/null; then
  echo "SKIP: clang-format is not installed (scripts/setup installs it)"
  exit 77
fi
mapfile -t files < <(find include lib kernels apps tests \
  -type f \( -name '*.cpp' -o -name '*.hpp' -o -name '*.h' -o -name '*.c' -o -name '*.cu' -o -name '*.cuh' \) | sort)
bad=0
for f in "${files[@]}"; do
  if ! clang-format --dry-run -Werror "$f" >/dev/null 2>&1; then
    echo "not formatted: $f (run: clang-format -i $f)"
    bad=$((bad + 1))
  fi
done
echo "format: $((${#files[@]} - bad)) passed, $bad failed"
[ "$bad" -eq 0 ]
