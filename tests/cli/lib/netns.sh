# shellcheck shell=bash
# shardopt: what the tests on nodes of this machine share (sourced, after
# lib.sh): bringing the nodes up.

# Brings up scripts/netns-cluster's two nodes NAME, joined at 1 Gbit/s, and
# passes that (ok, with what the script printed). Where this machine cannot
# make network namespaces the test is skipped (exit status 77); any other
# failure ends it, its summary line naming TEST.
netns_up() {  # NETNS-CLUSTER NAME TEST
  local out
  if ! out=$("$1" up "$2" --nodes 2 --rate 1gbit 2>&1); then
    echo "$out"
    if grep -q 'cannot create network namespaces' <<<"$out"; then
      echo "SKIP: this machine cannot create network namespaces"
      exit 77
    fi
    echo "FAILED: scripts/netns-cluster up"
    echo "$3: 0 passed, 1 failed"
    exit 1
  fi
  ok "$out"
}
