#!/usr/bin/env bash
# shardopt-plan against real runs and by hand:
# - memory: for stages 0, 1 and 2 (streamed, owned and the user's
#   gradients), the plan's categories equal the memory report of
#   shardopt-bench-step's real runs at 1 and 3 ranks, byte for byte (each
#   field of the memory report);
# - -f: a shardopt checkpoint (its parameters, dtype and optimizer; not its
#   states) and a plain safetensors file (every tensor, its dtype);
# - time: with rates given, each phase is the two-hop formula of docs/plan.md
#   computed here; with bench files, the hops are fitted and the step grows
#   with the model;
# - --memory: the largest model that fits at each stage does fit, and 0.5%
#   more does not; a model that fits at no stage is an error (exit 1);
# - no --threads: OMP_NUM_THREADS, as the library counts threads (stage 2
#   with OMP_NUM_THREADS=2 equals --threads 2, not --threads 1);
# - bad inputs: a malformed bench file, a file that is not safetensors, zero
#   ranks, an unknown option: a message naming the problem, exit 1 or 2.
# Usage: test_plan.sh MPIEXEC PLAN-PROGRAM BENCH-STEP-PROGRAM SOURCE-DIR
set -u
mpiexec=$1
plan=$2
step=$3
src=$4
# shellcheck source=lib.sh
. "$(dirname "$0")/lib.sh"
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1

# Memory: shardopt-bench-step's memory report against the plan.
for n in 1 3; do
  for g in stream owned user; do
    out=$tmp/step-$n-$g.json
    if ! timeout 120 "$mpiexec" -n "$n" --oversubscribe "$step" -s 0,1,2 -p 300K -g "$g" \
      -b 0.3 -w 0 -n 1 --json >"$out" 2>"$tmp/step.err"; then
      fail "shardopt-bench-step at $n ranks, -g $g" "$tmp/step.err"
      continue
    fi
    if python3 - "$plan" "$out" "$n" >"$tmp/mem.out" 2>&1 <<'EOF'; then
import json, subprocess, sys
plan, path, n = sys.argv[1:]
fields = [('mem_master', 'master_params'), ('mem_state', 'optimizer_state'),
          ('mem_grad_shard', 'grad_shard'), ('mem_reduced_grads', 'reduced_grads'),
          ('mem_owned_grads', 'owned_grads'), ('mem_buckets', 'bucket_bytes'),
          ('mem_user_params', 'user_params'), ('mem_user_grads', 'user_grads')]
rows = [json.loads(l) for l in open(path) if l.startswith('{')]
assert len(rows) == 3, 'expected 3 rows, got %d' % len(rows)
bad = 0
for r in rows:
    cmd = [plan, '-t', r['numels'], '-d', r['dtype'], '-o', 'adam', '-s', str(r['stage']),
           '-b', str(r['bucket_mb']), '-g', r['grads'], '-n', n, '--threads', '1', '--json']
    e = json.loads(subprocess.run(cmd, capture_output=True, text=True, check=True).stdout)
    for a, b in fields:
        if r[a] != e[b]:
            print('stage %d, %s: bench-step %s %d, plan %s %d' % (r['stage'], r['grads'], a, r[a], b, e[b]))
            bad += 1
    assert r[fields[0][0]] + r['mem_state'] > 0
sys.exit(1 if bad else 0)
EOF
      ok "memory at $n ranks, gradients $g: the plan equals memory_report for stages 0-2"
    else
      fail "memory at $n ranks, gradients $g" "$tmp/mem.out"
    fi
  done
done

# -f: a checkpoint of four parameters (37 + 100 + 5 + 64) with Adam states.
if "$plan" -f "$src/tests/data/ckpt-v1/adam.safetensors" -s 1 -n 2 --json >"$tmp/f.json" 2>&1 &&
  python3 -c "
import json, sys
e = json.loads(open(sys.argv[1]).read())
assert (e['params'], e['tensors'], e['dtype'], e['optimizer']) == (206, 4, 'f32', 'adam'), e
" "$tmp/f.json" 2>>"$tmp/f.json"; then
  ok "-f: a checkpoint's parameters (206 in 4), dtype and optimizer"
else
  fail "-f on a checkpoint" "$tmp/f.json"
fi
python3 - "$tmp/model.safetensors" <<'EOF'
import json, struct, sys
tensors = {'embed': [1000, 64], 'layer.weight': [64, 64], 'layer.bias': [64], 'step': []}
header, offset = {}, 0
for name, shape in tensors.items():
    dtype = 'I64' if name == 'step' else 'BF16'
    n = 1
    for d in shape:
        n *= d
    size = n * (8 if dtype == 'I64' else 2)
    header[name] = {'dtype': dtype, 'shape': shape, 'data_offsets': [offset, offset + size]}
    offset += size
text = json.dumps(header).encode()
with open(sys.argv[1], 'wb') as f:
    f.write(struct.pack('<Q', len(text)) + text + bytes(offset))
EOF
if "$plan" -f "$tmp/model.safetensors" -s 2 --json >"$tmp/g.json" 2>&1 &&
  python3 -c "
import json, sys
e = json.loads(open(sys.argv[1]).read())
assert (e['params'], e['tensors'], e['dtype']) == (64000 + 4096 + 64, 3, 'bf16'), e
assert e['master_params'] == 4 * e['params'], e
" "$tmp/g.json" 2>>"$tmp/g.json"; then
  ok "-f: a plain safetensors file's floating-point tensors and dtype"
else
  fail "-f on a plain safetensors file" "$tmp/g.json"
fi

# Time from given rates: 16M f32 parameters (64 MiB), 4 ranks on one node,
# one bucket; stage 1: a reduce-scatter and an allgather of the gradients,
# Adam's 28 bytes per parameter on the shard, the parameters' allgather.
if "$plan" -p 16M -s 1 -n 4 -b 1000 --node-gbps 10 --node-latency-us 3 --mem-gbps 20 --json \
  >"$tmp/t.json" 2>&1 &&
  python3 -c "
import json, sys
e = json.loads(open(sys.argv[1]).read())
B = 16 * 2**20 * 4.0
coll = 3 * 3e-6 + 0.75 * B / 10e9
want = {'reduce_ms': 2 * coll * 1e3, 'update_ms': 4 * 2**20 * 28 / 20e9 * 1e3, 'gather_ms': coll * 1e3}
for k, v in want.items():
    assert abs(e[k] - v) <= 1e-3 * v, (k, e[k], v)
assert abs(e['step_ms'] - sum(want.values())) <= 1e-3 * e['step_ms']
" "$tmp/t.json" 2>>"$tmp/t.json"; then
  ok "time from given rates: reduce, update, gather and the step as docs/plan.md's formula"
else
  fail "time from given rates" "$tmp/t.json"
fi

# The hops fitted to bench files (written here, of a machine whose node hop
# is 2 us + B / 20 GB/s at 2 ranks), the update's rate from a bench-optim
# row; twice the model takes longer.
python3 - "$tmp/comm.json" "$tmp/optim.json" <<'EOF'
import json, sys
with open(sys.argv[1], 'w') as f:
    for op in ('reduce_scatter', 'allgather'):
        for inplace in (False, True):
            for b in (65536, 1 << 20, 16 << 20, 64 << 20):
                t = 2.0 + 0.5 * b / 20e9 * 1e6 * 2
                f.write(json.dumps({'op': op, 'bytes': b, 'ranks': 2, 'inplace': inplace,
                                    'time_us': t, 'memory': 'host', 'nodes': 1,
                                    'local_ranks': 2}) + '\n')
with open(sys.argv[2], 'w') as f:
    f.write(json.dumps({'optimizer': 'adam', 'precision': 'fp32', 'numel': 1 << 24,
                        'threads': 2, 'gbps': 40.0}) + '\n')
EOF
if "$plan" -p 8M -s 2 -n 2 -g owned -b 1000 -c "$tmp/comm.json" -u "$tmp/optim.json" --json \
  >"$tmp/c1.json" 2>&1 &&
  "$plan" -p 16M -s 2 -n 2 -g owned -b 1000 -c "$tmp/comm.json" -u "$tmp/optim.json" --json \
    >"$tmp/c2.json" 2>&1 &&
  python3 -c "
import json, sys
a = json.loads(open(sys.argv[1]).read()); b = json.loads(open(sys.argv[2]).read())
# Fused at 2 ranks: no separate reduction; the update reads both ranks' gradients
# (28 - 4 + 2 * 4 = 32 bytes a parameter) at 40 / 2 GB/s per rank.
assert a['fused'] and a['reduce_ms'] == 0, a
assert abs(a['update_ms'] - 4 * 2**20 * 32 / 20e9 * 1e3) < 1e-3 * a['update_ms'], a
# The gather: 2 us + B / 20 GB/s (the fit recovers the rows' line).
B = 8 * 2**20 * 4.0
assert abs(a['gather_ms'] - (2e-3 + B / 20e9 * 1e3)) < 2e-3 * a['gather_ms'], a
assert 1.9 < b['step_ms'] / a['step_ms'] < 2.1, (a['step_ms'], b['step_ms'])
" "$tmp/c1.json" "$tmp/c2.json" 2>>"$tmp/c2.json"; then
  ok "time from bench files: the fitted hop, the update's rate, twice the model"
else
  fail "time from bench files" "$tmp/c2.json"
fi

# --memory: the largest model fits; 0.5% more does not.
if "$plan" -p 1M -d bf16 -n 8 -m 512M --json >"$tmp/m.json" 2>&1 &&
  python3 - "$plan" "$tmp/m.json" <<'EOF' >>"$tmp/m.json" 2>&1; then
import json, subprocess, sys
plan = sys.argv[1]
for line in open(sys.argv[2]):
    e = json.loads(line)
    n = e['largest_params']
    def total(p):
        cmd = [plan, '-p', str(p), '-d', 'bf16', '-n', '8', '-s', str(e['stage']), '--json']
        return json.loads(subprocess.run(cmd, capture_output=True, text=True, check=True).stdout)['per_rank_bytes']
    assert total(n) <= 512 << 20 < total(int(n * 1.005)), (e['stage'], n)
EOF
  ok "--memory: each stage's largest model fits and 0.5% more does not"
else
  fail "--memory" "$tmp/m.json"
fi

# Errors: the message and the exit status.
expect_error() {  # STATUS PATTERN WHAT ARGS...
  local want=$1 pattern=$2 what=$3 rc
  shift 3
  "$plan" "$@" >"$tmp/e.out" 2>&1
  rc=$?
  if [ "$rc" -eq "$want" ] && grep -q -- "$pattern" "$tmp/e.out"; then
    ok "$what: exit $rc, $(head -c 100 "$tmp/e.out" | tr '\n' ' ')"
  else
    fail "$what: exit $rc (expected $want with '$pattern')" "$tmp/e.out"
  fi
}
echo '{"op":"reduce_scatter","bytes":' >"$tmp/broken.json"
head -c 4096 /dev/urandom >"$tmp/random.bin"
expect_error 1 "does not fit in 1.0 MiB per rank at any stage" "a model that fits nowhere" \
  -p 7e9 -n 8 -m 1M
expect_error 1 "line 1 is not a JSON object" "a malformed bench-comm file" \
  -p 1M -n 2 -c "$tmp/broken.json"
expect_error 1 "is not a safetensors file" "a file that is not safetensors" -f "$tmp/random.bin"
expect_error 1 "cannot open" "a missing file" -f "$tmp/nothing.safetensors"
expect_error 2 "bad value '0' for -N (--nodes)" "zero nodes" -p 1M -N 0
expect_error 2 "bad value '0' for -n (--ranks-per-node)" "zero ranks" -p 1M -n 0
expect_error 2 "no model" "no model" -n 2
expect_error 2 "unknown option '--stage'" "an unknown option" -p 1M --stage 1
python3 - "$tmp" <<'EOF'
import json, struct, sys
d = sys.argv[1]
row = {'op': 'reduce_scatter', 'bytes': 1 << 20, 'ranks': 2, 'inplace': False, 'time_us': 50.0,
       'memory': 'host'}
with open(d + '/old.json', 'w') as f:  # no "nodes": an older bench-comm
    f.write(json.dumps(row) + '\n')
with open(d + '/one.json', 'w') as f:  # measured at 1 rank
    f.write(json.dumps(dict(row, ranks=1, nodes=1, local_ranks=1)) + '\n')
with open(d + '/few.json', 'w') as f:  # one row: too few to fit
    f.write(json.dumps(dict(row, nodes=1, local_ranks=2)) + '\n')
with open(d + '/sgd.json', 'w') as f:  # bench-optim rows of another optimizer
    f.write(json.dumps({'optimizer': 'sgd', 'precision': 'fp32', 'numel': 1 << 20,
                        'threads': 1, 'gbps': 10.0}) + '\n')
text = json.dumps({'step': {'dtype': 'I64', 'shape': [], 'data_offsets': [0, 8]}}).encode()
with open(d + '/ints.safetensors', 'wb') as f:  # no floating-point tensor
    f.write(struct.pack('<Q', len(text)) + text + bytes(8))
EOF
expect_error 1 "bad shape '4096xq'" "a bad shape" -t 4096x4096,4096xq
expect_error 1 "holds no F32, BF16 or F16 tensor" "a file without parameters" \
  -f "$tmp/ints.safetensors"
expect_error 1 'no "nodes"' "a bench-comm file without nodes" -p 1M -n 2 -c "$tmp/old.json"
expect_error 1 "measured at 1 rank" "a bench-comm file of 1 rank" -p 1M -n 2 -c "$tmp/one.json"
expect_error 1 "fewer than two reduce_scatter rows" "too few rows to fit" \
  -p 1M -n 2 -c "$tmp/few.json"
expect_error 1 "no row of device memory" "host rows for a device plan" \
  -p 1M -n 2 --device -c "$tmp/few.json"
expect_error 1 "no row of optimizer adam at precision fp32" \
  "a bench-optim file without the optimizer" -p 1M -n 2 --node-gbps 10 -u "$tmp/sgd.json"
expect_error 1 "the rates within a node" "ranks on a node without its rates" \
  -p 1M -n 2 --mem-gbps 10
expect_error 1 "the network's rates" "several nodes without the network's rates" \
  -p 1M -N 2 --mem-gbps 10

# No --threads: the threads the run's ranks would use, OMP_NUM_THREADS, as
# the library counts them (MemoryPlan::threads = 0). Stage 2's fused update
# at 2 ranks on a node keeps a block per thread: the plan with
# OMP_NUM_THREADS=2 equals --threads 2's and is not --threads 1's.
threads_plan() {  # NAME OMP_NUM_THREADS [OPTION...]
  local name=$1 omp=$2
  shift 2
  OMP_NUM_THREADS=$omp "$plan" -p 1M -s 2 -n 2 --json "$@" >"$tmp/threads-$name.json" \
    2>"$tmp/threads.err" || cat "$tmp/threads.err" >>"$tmp/threads-$name.json"
}
threads_plan default 2
threads_plan two 1 --threads 2
threads_plan one 2 --threads 1
if python3 - "$tmp" >"$tmp/threads.out" 2>&1 <<'EOF'; then
import json, sys
d = sys.argv[1]
plans = {n: json.loads(open('%s/threads-%s.json' % (d, n)).read()) for n in ('default', 'two', 'one')}
keys = ('threads', 'buckets', 'bucket_bytes', 'allocated', 'per_rank_bytes', 'fused')
for n, e in plans.items():
    print(n + ': ' + ', '.join('%s %s' % (k, e.get(k)) for k in keys))
default, two, one = plans['default'], plans['two'], plans['one']
assert two['fused'] and two['bucket_bytes'] != one['bucket_bytes'], \
    'the stage-2 plan does not depend on the threads: no test of the default'
for k in keys:
    assert default.get(k) == two.get(k), 'OMP_NUM_THREADS=2 without --threads: %s %s, ' \
        '--threads 2: %s' % (k, default.get(k), two.get(k))
EOF
  ok "no --threads: OMP_NUM_THREADS=2 plans stage 2 as --threads 2 does ($(grep '^default' "$tmp/threads.out")), not as --threads 1 ($(grep '^one' "$tmp/threads.out"))"
else
  fail "no --threads with OMP_NUM_THREADS=2: the plan of --threads 2" "$tmp/threads.out"
fi

echo "plan: $passed passed, $failed failed"
[ "$failed" -eq 0 ]
