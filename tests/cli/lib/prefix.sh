# shellcheck shell=bash
# Sourced by the tests that build code against the installed package, as an
# outside project would. install_prefix BUILD WORK runs `meson install` of
# BUILD into WORK/root and sets:
#   PREFIX        the installed prefix (WORK/root/<configured prefix>)
#   SHARDOPT_LIBDIR  the folder of libshardopt.so
#   PKG_CONFIG_PATH  a folder with copies of the installed .pc files whose
#                 prefix is PREFIX (MPI's own .pc files are found where the
#                 system keeps them)
#   CMAKE_PREFIX_PATH  PREFIX (find_package(shardopt CONFIG) finds it there)
#   LD_LIBRARY_PATH    SHARDOPT_LIBDIR first
# and returns non-zero, with the install log on stdout, when the install fails.
install_prefix() {
  local build=$1 work=$2
  meson install -C "$build" --destdir "$work/root" --no-rebuild >"$work/install.log" 2>&1 ||
    { cat "$work/install.log"; return 1; }
  local pc
  pc=$(find "$work/root" -name shardopt.pc | head -n 1)
  [ -n "$pc" ] || { echo "no shardopt.pc installed"; return 1; }
  local configured
  configured=$(pkg-config --variable=prefix "$pc")
  PREFIX="$work/root$configured"
  SHARDOPT_LIBDIR=$(dirname "$(find "$work/root" -name 'libshardopt.so' | head -n 1)")
  mkdir -p "$work/pc"
  local f
  for f in "$(dirname "$pc")"/*.pc; do
    sed "s|^prefix=.*|prefix=$PREFIX|" "$f" >"$work/pc/$(basename "$f")"
  done
  export PKG_CONFIG_PATH="$work/pc"
  export CMAKE_PREFIX_PATH="$PREFIX"
  export LD_LIBRARY_PATH="$SHARDOPT_LIBDIR${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
  export PREFIX SHARDOPT_LIBDIR
}
