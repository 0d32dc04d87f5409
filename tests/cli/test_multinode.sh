#!/usr/bin/env bash
# Test suites across two nodes (the programs given): scripts/netns-cluster
# makes 2 nodes (network namespaces with their own hostnames, joined by
# veth links limited to 1 Gbit/s), and each Catch2 program runs at 2 nodes
# x 2 ranks, its traffic between the nodes over TCP. Then the nodes are
# removed, and no namespace, link or file of theirs may be left. SKIP (77)
# where network namespaces cannot be made (not root, a container without
# the capability).
# Usage: test_multinode.sh SOURCE_ROOT MPIEXEC PROGRAM...
set -u
src=$1
mpiexec=$2
shift 2
cluster=mn$((RANDOM % 100000))
script="$src/scripts/netns-cluster"
passed=0
failed=0
fail() { echo "FAILED: $*"; failed=$((failed + 1)); }

if [ "$(id -u)" -ne 0 ]; then
  echo "SKIP: network namespaces need root"
  exit 77
fi
if ! out=$("$script" up "$cluster" --nodes 2 --rate 1gbit 2>&1); then
  echo "$out"
  if grep -q 'cannot create network namespaces' <<<"$out"; then
    echo "SKIP: this machine cannot create network namespaces"
    exit 77
  fi
  echo "FAILED: scripts/netns-cluster up"
  echo "multinode: 0 passed, 1 failed"
  exit 1
fi
trap '"$script" down "$cluster"' EXIT
echo "ok: $out"

for prog in "$@"; do
  name=$(basename "$prog")
  log=$(mktemp)
  if timeout 240 "$script" run "$cluster" -- "$mpiexec" -n 4 "$prog" -w NoAssertions \
    >"$log" 2>&1; then
    echo "ok: $name at 2 nodes x 2 ranks"
    passed=$((passed + 1))
  else
    cat "$log"
    fail "$name at 2 nodes x 2 ranks"
  fi
  rm -f "$log"
done

# The ranks ran on two hosts: each node's hostname seen by MPI, two ranks each.
log=$(mktemp)
if timeout 60 "$script" run "$cluster" -- "$mpiexec" -n 4 hostname >"$log" 2>&1 &&
  [ "$(sort "$log" | uniq -c | awk '{print $1 " " $2}' | tr '\n' ' ')" = "2 ${cluster}1 2 ${cluster}2 " ]; then
  echo "ok: ranks 0-1 on ${cluster}1, 2-3 on ${cluster}2"
  passed=$((passed + 1))
else
  cat "$log"
  fail "the ranks' hostnames"
fi
rm -f "$log"

trap - EXIT
"$script" down "$cluster"
if ip netns list | grep -q "^$cluster" || ip link show "$cluster-br" >/dev/null 2>&1 ||
  [ -e "/run/shardopt-netns/$cluster" ]; then
  fail "scripts/netns-cluster down left namespaces, links or files of $cluster"
else
  echo "ok: the nodes, their links and files are gone"
  passed=$((passed + 1))
fi
echo "multinode: $passed passed, $failed failed"
[ "$failed" -eq 0 ]
