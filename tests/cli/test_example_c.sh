#!/usr/bin/env bash
# The C example (apps/examples/c/) as a user builds it: shardopt installed
# into a scratch prefix, the example's own Makefile run in a copy of its
# folder with pkg-config finding the installed package. At 2 and 3 ranks
# and stages 0, 1 and 2 it must reach its threshold (exit 0, the result line
# saying so), and at each rank count the three stages must write
# byte-identical coefficient files (ZeRO's stages give bitwise the same
# parameters). Too few steps must miss the threshold (exit 1), and bad
# arguments must be refused (exit 2). And docs/c-api.md, which walks
# through the program, must show all of it as it is.
# Usage: test_example_c.sh SOURCE_ROOT BUILD_ROOT MPIEXEC [COMPILER [FLAG...]]
# COMPILER and its flags (the C compiler; a sanitizer build passes its own
# and its -fsanitize flags) default to the Makefile's cc.
set -u
src=$1
build=$2
mpiexec=$3
shift 3
cc=("$@")
here=$(cd "$(dirname "$0")" && pwd)
# shellcheck source=lib.sh
. "$here/lib.sh"
# shellcheck source=lib/prefix.sh
. "$here/lib/prefix.sh"
# shellcheck source=lib/example.sh
. "$here/lib/example.sh"
require make:make pkg-config:pkg-config cmp:diffutils

finish() {
  echo "example-c: $passed passed, $failed failed"
  [ "$failed" -eq 0 ]
  exit
}

# docs/c-api.md walks through the whole program: its C blocks between the
# markers, joined by blank lines, must be the file.
awk '/<!-- heat_inverse.c begins -->/ { on = 1; next }
     /<!-- heat_inverse.c ends -->/ { on = 0 }
     on && /^```c$/ { inblock = 1; if (n++) print ""; next }
     on && inblock && /^```$/ { inblock = 0; next }
     on && inblock' "$src/docs/c-api.md" >"$tmp/from-doc.c"
if cmp -s "$tmp/from-doc.c" "$src/apps/examples/c/heat_inverse.c"; then
  ok "docs/c-api.md shows the whole of heat_inverse.c"
else
  diff "$tmp/from-doc.c" "$src/apps/examples/c/heat_inverse.c" >"$tmp/doc.diff"
  fail "docs/c-api.md's walk-through is not apps/examples/c/heat_inverse.c (update its blocks)" \
    "$tmp/doc.diff"
fi

install_prefix "$build" "$tmp" >"$tmp/prefix.log" 2>&1 ||
  { fail "meson install into a scratch prefix" "$tmp/prefix.log"; finish; }
ok "installed into $PREFIX"

cp -r "$src/apps/examples/c" "$tmp/example"
make_args=(-C "$tmp/example" CFLAGS="-O2 -Werror")
[ ${#cc[@]} -gt 0 ] && make_args+=(CC="${cc[*]}")
if make "${make_args[@]}" >"$tmp/make.log" 2>&1; then
  ok "make built heat_inverse with pkg-config --cflags --libs shardopt"
else
  fail "make in a copy of apps/examples/c" "$tmp/make.log"
  finish
fi
program=$tmp/example/heat_inverse

for n in 2 3; do
  for stage in 0 1 2; do
    out=$tmp/coeffs-np$n-stage$stage.txt
    log=$tmp/run-np$n-stage$stage.log
    if timeout 120 "$mpiexec" -n "$n" --oversubscribe "$program" "$stage" 300 "$out" \
      >"$log" 2>&1; then
      line=$(grep '^heat_inverse:' "$log")
      case "$line" in
        *"$n ranks, stage $stage, 300 steps: misfit "*"reached"*) ;;
        *) fail "$n ranks, stage $stage: no result line saying the threshold was reached" "$log"
           continue ;;
      esac
      if [ "$(wc -l <"$out")" -ne 256 ]; then
        fail "$n ranks, stage $stage: $out does not hold 256 coefficients" "$log"
        continue
      fi
      ok "$n ranks, stage $stage: ${line#heat_inverse: }"
    else
      fail "$n ranks, stage $stage: exit status $? (the threshold missed, or an error)" "$log"
    fi
  done
  example_stages_identical "$n"
done

example_too_few_steps "$program" 10
example_bad_arguments "$program" 300
finish
