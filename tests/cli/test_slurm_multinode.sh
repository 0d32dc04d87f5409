#!/usr/bin/env bash
# The job scripts of scripts/slurm/ on a Slurm of two nodes on this
# machine: scripts/netns-cluster makes the nodes (network namespaces with
# their own hostnames, joined by veth links limited to 1 Gbit/s) and
# scripts/slurm-local up --netns runs a slurmd in each, slurmctld in the
# first, one munged for both; up once for all the cases below. The tasks'
# Open MPI uses TCP on the nodes' subnet (OMPI_MCA_btl_tcp_if_include in the
# environment sbatch and srun pass on).
# - srun -N 2 -n 4 --mpi=pmix hostname: the tasks print both nodes' names.
# - cpu.sbatch at 2 nodes x 2 tasks runs shardopt-train (ranks 4 on 2
#   nodes, 2 per node) to the README's loss threshold, and its parameters
#   (--save-params) are bitwise those of the same run under mpirun -n 4 on
#   this machine alone (both with SHARDOPT_HOST_COMM=mpi, whose sums do not
#   depend on the node layout); node 2's link carries the run's traffic.
# - train-requeue.sbatch at 2 nodes x 2 tasks: USR1 to the batch shell
#   after the first checkpoint (scancel --batch --signal=USR1, as
#   --signal=B:USR1@N sends it) stops the run at a checkpoint; the job
#   requeues itself, resumes on both nodes and ends bitwise equal to the
#   uninterrupted run.
# - Both taken down: no process is left in either node, none of the
#   cluster's, and no namespace or link of the nodes.
# Where a task of either job died of Open MPI's own crash in MPI_Init
# (init_crash below; docs/troubleshooting.md), both jobs run once more.
# SKIP (77) when not root, without Debian's slurmctld, slurmd, slurm-client
# and munge (scripts/setup installs them), or where network namespaces
# cannot be made.
# Usage: test_slurm_multinode.sh SOURCE_ROOT TRAIN [MPIEXEC]
set -u
src=$1
# Absolute: the jobs run in the directory sbatch ran in.
train=$(realpath "$2")
mpiexec=${3:-mpirun}
# shellcheck source=lib.sh
. "$(dirname "$0")/lib.sh"
# shellcheck source=lib/netns.sh
. "$(dirname "$0")/lib/netns.sh"
require pgrep:procps python3:python3

skip_unless_root "network namespaces and Slurm's daemons need root"
skip_without munged:munge slurmctld:slurmctld slurmd:slurmd sbatch:slurm-client

netns="$src/scripts/netns-cluster"
slurm="$src/scripts/slurm-local"
scripts=$src/scripts/slurm
# Ending in a letter, so that Slurm writes the nodes NAME1, NAME2 as
# NAME[1-2].
name=sm$((RANDOM % 10000))n
cluster=$tmp/slurm
# Nothing of a Slurm this test may itself run in reaches its jobs.
while read -r v; do unset "$v"; done < <(compgen -e | grep -E '^(SLURM|SBATCH|SRUN|SALLOC)_')

netns_up "$netns" "$name" slurm-multinode
# Both go down however the test ends. Ended by a signal (meson's timeout:
# TERM, then KILL soon after), the test leaves that to a process of its own
# session, which the KILL of the test's process group misses.
trap '"$slurm" down "$cluster" >/dev/null 2>&1; "$netns" down "$name" >/dev/null 2>&1
      rm -rf "$tmp"' EXIT
trap 'trap - EXIT
      setsid bash -c '\''"$0" down "$1"; "$2" down "$3"; rm -rf "$4"'\'' "$slurm" "$cluster" \
        "$netns" "$name" "$tmp" </dev/null >/dev/null 2>&1 &
      exit 1' TERM INT

if ! "$slurm" up "$cluster" --netns "$name" --cpus 4 >"$tmp/up.out" 2>&1; then
  fail "scripts/slurm-local up --netns $name failed" "$tmp/up.out"
  exit 1
fi
ok "$(head -n 1 "$tmp/up.out")"
sl() {  # COMMAND [ARGS...]: a Slurm command in the first node
  "$slurm" run "$cluster" "$@"
}

# The jobs take this environment (sbatch --export=ALL): Open MPI's TCP on
# the nodes' subnet, shared memory within a node; a rank waiting in MPI
# yields its core (8 ranks on this machine's cores); Open MPI's session
# directories (named by host) in $tmp.
export OMPI_MCA_btl=tcp,self,vader
export OMPI_MCA_btl_tcp_if_include=198.51.100.0/24
export OMPI_MCA_oob_tcp_if_include=198.51.100.0/24
export OMPI_MCA_mpi_yield_when_idle=1
export TMPDIR=$tmp/jobtmp
# Compared bitwise with a run on one node: MPI's own collectives, whose
# sums do not depend on the node layout (shardopt's default, hier at 2 x 2,
# sums each node first; tests/cli/test_multinode.sh runs it).
export SHARDOPT_HOST_COMM=mpi
mkdir -p "$TMPDIR"

# job_info, wait_job.
# shellcheck source=lib/slurm.sh
. "$(dirname "$0")/lib/slurm.sh"
slurm_run=(sl --)

# srun across the nodes: each node's name from its tasks.
if sl -- timeout 60 srun -N 2 -n 4 --mpi=pmix hostname >"$tmp/hostname.out" 2>&1 &&
   [ "$(wc -l <"$tmp/hostname.out")" -eq 4 ] &&
   [ "$(sort -u "$tmp/hostname.out" | paste -sd' ')" = "${name}1 ${name}2" ]; then
  ok "srun -N 2 -n 4 --mpi=pmix hostname: $(sort "$tmp/hostname.out" | uniq -c |
    awk '{ printf "%s%s task(s) on %s", sep, $1, $2; sep = ", " }')"
else
  fail "srun -N 2 -n 4 --mpi=pmix hostname: not 4 tasks on ${name}1 and ${name}2" \
    "$tmp/hostname.out"
fi

# The trainer's options: a small model that reaches the threshold; the run
# checkpoints every 50 of its 3000 steps, so that the test can stop it after its first
# checkpoint, well before its end.
steps=3000
model=(--hidden 64 --lr 2e-2 --log-every 1000 --steps "$steps")
link=/sys/class/net/$name-v2/statistics
bytes_before=$(($(cat "$link/rx_bytes") + $(cat "$link/tx_bytes")))

# Both jobs at once (2 of each node's 4 CPUs each), 2 nodes x 2 tasks.
submit() {  # NAME SCRIPT [ARGS...]
  local n=$1
  shift
  sl -- sbatch --parsable -J "$n" -N 2 --ntasks-per-node=2 --cpus-per-task=1 -t 5 \
    --signal=B:USR1@10 -o "$tmp/$n.out" "$@"
}
# Submits both, sends USR1 to the batch shell of train-requeue.sbatch after
# its first checkpoint (usr1_ckpt=1), runs the reference meanwhile (the
# first time) and waits for both; sets j_cpu, j_usr1, info_cpu, info_usr1.
ref_ok=""
round() {
  rm -rf "$tmp/usr1" "$tmp/cpu.out" "$tmp/usr1.out" "$tmp/cpu.params"
  mkdir -p "$tmp/usr1"
  j_cpu=$(submit cpu "$scripts/cpu.sbatch" "$train" "${model[@]}" --save-params "$tmp/cpu.params")
  j_usr1=$(submit usr1 "$scripts/train-requeue.sbatch" "$tmp/usr1" "$train" "${model[@]}" \
    --checkpoint-every 50 --save-params "$tmp/usr1/params")
  for j in "$j_cpu" "$j_usr1"; do
    if ! [[ "$j" =~ ^[0-9]+$ ]]; then
      fail "sbatch did not submit a job: '$j'"
      exit 1
    fi
  done
  local end=$((SECONDS + 60))
  while [ ! -e "$tmp/usr1/ckpt.safetensors" ] && [ $SECONDS -lt $end ]; do
    case $(job_info "$j_usr1" | cut -d' ' -f1) in
      PENDING | CONFIGURING | RUNNING) sleep 0.1 ;;
      *) break ;;
    esac
  done
  usr1_ckpt=0
  if [ -e "$tmp/usr1/ckpt.safetensors" ]; then
    usr1_ckpt=1
    sl -- scancel --batch --signal=USR1 "$j_usr1"
  fi
  # The reference: the same run at 4 ranks on this machine alone.
  if [ -z "$ref_ok" ]; then
    ref_ok=0
    if env -u OMPI_MCA_btl_tcp_if_include -u OMPI_MCA_oob_tcp_if_include \
         timeout 120 "$mpiexec" -n 4 --oversubscribe "$train" "${model[@]}" \
         --save-params "$tmp/ref.params" >"$tmp/ref.out" 2>&1 && [ -s "$tmp/ref.params" ]; then
      ref_ok=1
    else
      fail "the reference run, mpirun -n 4 on one node" "$tmp/ref.out"
    fi
  fi
  info_cpu=$(wait_job "$j_cpu" 120)
  info_usr1=$(wait_job "$j_usr1" 120)
}
# Open MPI's own crash in MPI_Init (tests/repro/srun_init.sh shows it
# without shardopt, about 1 step in 200 here: a task jumps to address 0
# from the TCP transport's receive handler, a fragment come before the
# handlers are registered): in OUT, a task's segmentation fault at address 0
# whose backtrace has no frame but libc's, in a run whose trainer printed
# nothing yet (no rank gets past the trainer's first collective while a
# task is still in MPI_Init). A crash in shardopt's code names its frames,
# or comes after the trainer's first line.
init_crash() {  # OUT
  awk '/^# (cpu|train-requeue)\.sbatch: job .*tasks on/ { run = 1; header = 0 }
       /^# shardopt-train:/ { header = 1 }
       /Failing at address: \(nil\)/ && run && !header { crash = 1 }
       /\] \[ 1\] / && crash { frames = 1 }
       END { exit !(crash && !frames) }' "$1"
}
round
if init_crash "$tmp/cpu.out" || init_crash "$tmp/usr1.out"; then
  cp "$tmp/cpu.out" "$tmp/cpu.first.out"
  cp "$tmp/usr1.out" "$tmp/usr1.first.out"
  echo "note: a task died in Open MPI's MPI_Init (a segmentation fault at address 0, before" \
    "the trainer's first line; docs/troubleshooting.md): both jobs once more"
  sed 's/^/  /' "$tmp/cpu.first.out" "$tmp/usr1.first.out" | grep -A8 'Process received signal'
  round
fi
[ "$usr1_ckpt" = 1 ] || fail "usr1: no checkpoint while the job ran" "$tmp/usr1.out"

# cpu.sbatch: to the threshold at 2 nodes x 2 ranks, bitwise the reference.
info=$info_cpu
out=$tmp/cpu.out
if [ "$info" != "COMPLETED 0 0:0" ]; then
  fail "cpu.sbatch: job ended as '$info' (expected COMPLETED 0 0:0)" "$out"
elif ! grep -qF "# cpu.sbatch: job $j_cpu: 4 tasks on 2 node(s) (${name}[1-2])" "$out" ||
     ! grep -q "^# ranks 4 on 2 nodes (2 per node)" "$out"; then
  fail "cpu.sbatch: not 4 ranks on 2 nodes, 2 per node" "$out"
elif ! grep -qE "^# final loss [0-9.e+-]+: below 0\.01," "$out"; then
  fail "cpu.sbatch: the held-out loss did not fall below 0.01" "$out"
elif [ $ref_ok -eq 1 ] && ! cmp -s "$tmp/ref.params" "$tmp/cpu.params"; then
  fail "cpu.sbatch: the parameters at 2 nodes x 2 tasks differ from mpirun -n 4's on one node" "$out"
else
  ok "cpu.sbatch at 2 nodes x 2 tasks: ranks 4 on 2 nodes, $(grep -oE \
'^# final loss [0-9.e+-]+: below 0\.01' "$out" | cut -c3-), parameters bitwise those of \
mpirun -n 4 on one node"
fi

# train-requeue.sbatch: stopped, requeued, resumed on both nodes.
out=$tmp/usr1.out
if stopped_and_resumed usr1 "$info_usr1" "$out" SIGUSR1 "$steps"; then
  at=$stopped_at
  if ! grep -qF "# train-requeue.sbatch: job $j_usr1: stopped with the checkpoint \
$tmp/usr1/ckpt.safetensors written; requeued" "$out"; then
    fail "usr1: the script did not say that it requeued the job" "$out"
  elif ! grep -qF "# train-requeue.sbatch: job $j_usr1 run 2: 4 tasks on 2 node(s) (${name}[1-2]), \
resuming from $tmp/usr1/ckpt.safetensors" "$out" ||
       ! grep -qE "^# resumed from .* at 4 ranks: step $at," "$out"; then
    fail "usr1: run 2 did not resume from the step-$at checkpoint on both nodes" "$out"
  elif [ $ref_ok -eq 1 ] && ! cmp -s "$tmp/ref.params" "$tmp/usr1/params"; then
    fail "usr1: stopped at step $at and resumed, the parameters differ from the uninterrupted \
run's" "$out"
  else
    ok "train-requeue.sbatch at 2 nodes x 2 tasks: USR1 to the batch shell stopped it at step \
$at, requeued, resumed on both nodes: parameters bitwise those of the uninterrupted run"
  fi
fi

# The runs' traffic between the nodes went over node 2's link.
bytes=$(($(cat "$link/rx_bytes") + $(cat "$link/tx_bytes") - bytes_before))
if [ "$bytes" -gt $((10 * 1024 * 1024)) ]; then
  ok "node 2's link carried $((bytes / 1024 / 1024)) MiB during the jobs"
else
  fail "node 2's link carried only $bytes bytes during the jobs: the ranks did not talk over it"
fi

# Down: no process of the cluster or in either node left, then no node.
daemons=$(cat "$cluster"/slurmd.*.pid "$cluster/slurmctld.pid" "$cluster/munge/munged.pid" \
  2>/dev/null | paste -sd' ')
if ! "$slurm" down "$cluster" >"$tmp/down.out" 2>&1; then
  fail "scripts/slurm-local down failed" "$tmp/down.out"
fi
left=$("$slurm" procs "$cluster")
for pid in $daemons $(ip netns pids "${name}1" 2>/dev/null) $(ip netns pids "${name}2" 2>/dev/null); do
  if [ -e "/proc/$pid" ] && ! grep -q '^State:.*Z' "/proc/$pid/status" 2>/dev/null; then
    left="$left $pid"
  fi
done
left="$left $(pgrep -f -- "$tmp/" | grep -vx "$$" | paste -sd' ')"
if [ -n "${left// /}" ] || [ "$(wc -w <<<"$daemons")" -ne 4 ]; then
  fail "after slurm-local down: left running: '$left' (daemons were '$daemons')"
else
  ok "slurm-local down: munged, slurmctld, both slurmd ($daemons) and every job process ended; \
nothing left in ${name}1 or ${name}2"
fi
"$netns" down "$name"
gone=$(ip netns list 2>/dev/null | awk '{print $1}' | grep -xE "${name}[12]" | paste -sd' ')
if [ -z "$gone" ] && ! ip link show "$name-br" >/dev/null 2>&1 && [ ! -e "/run/shardopt-netns/$name" ]; then
  ok "netns-cluster down: no namespace, bridge or file of $name left"
else
  fail "after netns-cluster down: left: namespaces '$gone', bridge or /run/shardopt-netns/$name"
fi

echo "slurm-multinode: $passed passed, $failed failed"
[ $failed -eq 0 ]
