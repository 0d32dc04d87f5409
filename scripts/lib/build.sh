# shardopt: configure and build, shared by scripts/test and scripts/demo.
# Source this file; it defines functions and sets nothing else.
#
#   shardopt_build [meson setup args...]
#       Configures $BUILD_DIR (default: build, relative to the repository root)
#       with -Dwerror=true, adding --native-file scripts/meson-cuda.ini when
#       /usr/local/cuda/bin/nvcc exists, then compiles it. Must be called from
#       the repository root.
#   shardopt_mpi_env
#       Exports the environment shardopt's MPI programs are run with.

SHARDOPT_NVCC=/usr/local/cuda/bin/nvcc

shardopt_build() {
  : "${BUILD_DIR:=build}"
  local -a args=(-Dwerror=true)
  if [ -x "$SHARDOPT_NVCC" ]; then
    args+=(--native-file scripts/meson-cuda.ini)
  else
    echo "build: $SHARDOPT_NVCC not found, building without CUDA"
  fi
  args+=("$@")

  if [ -f "$BUILD_DIR/meson-private/coredata.dat" ]; then
    if ! meson setup --reconfigure "${args[@]}" "$BUILD_DIR"; then
      echo "build: reconfigure of $BUILD_DIR failed; wiping it and configuring from scratch"
      shardopt_wipe_build_dir
      meson setup "${args[@]}" "$BUILD_DIR"
    fi
  else
    meson setup "${args[@]}" "$BUILD_DIR"
  fi

  meson compile -C "$BUILD_DIR"
}

# Removes $BUILD_DIR, but only when it is a Meson build directory.
shardopt_wipe_build_dir() {
  local real
  real=$(cd "$BUILD_DIR" && pwd -P)
  if [ ! -d "$BUILD_DIR/meson-private" ] || [ "$real" = "$(pwd -P)" ] || [ "$real" = / ]; then
    echo "build: error: refusing to remove $BUILD_DIR (not a Meson build directory)" >&2
    return 1
  fi
  rm -rf -- "$BUILD_DIR"
}

shardopt_mpi_env() {
  # Open MPI refuses to run as root unless told that it is intended.
  if [ "$(id -u)" -eq 0 ]; then
    export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
  fi
  # glibc 2.35+: let malloc use transparent huge pages; with small pages the
  # page faults of large buffers are slow on many machines.
  export GLIBC_TUNABLES=glibc.malloc.hugetlb=1
}
