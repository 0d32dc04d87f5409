#!/usr/bin/env bash
# shardopt-plan against real runs and by hand:
# - memory: for stages 0, 1 and 2 (streamed, owned and the user's
#   gradients), the plan's categories equal the memory report of
#   shardopt-bench-step's real runs at 1 and 3 ranks, byte for byte (each
#   field of the memory report); for stage 3, the plan of the tensors and
#   units shardopt-train -s 3 registers equals its memory report at 1 and 3
#   ranks (f32 in one flat buffer, bf16 in a buffer per tensor);
# - units (--units): they end buckets at every stage (counted here from the
#   engine's rule), a count N groups tensors as the list written by hand
#   does, and -p with N is N tensors; the stage-3 pool under
#   --gather-limit-mb and --persist-below-kb;
# - -f: a shardopt checkpoint (its parameters, dtype and optimizer; not its
#   states) and a plain safetensors file (every tensor, its dtype);
# - time: with rates given, each phase is the two-hop formula of docs/plan.md
#   computed here (stage 3: each unit gathered twice, the whole units once);
#   with bench files, the hops are fitted and the step grows with the model;
# - --memory: the largest model that fits at each stage does fit, and 0.5%
#   more does not (stage 3 too, cut into units); the advice names the
#   lowest stage that fits, and stage 3 when only it fits; a model that
#   fits at no stage is an error (exit 1);
# - no --threads: OMP_NUM_THREADS, as the library counts threads (stage 2
#   with OMP_NUM_THREADS=2 equals --threads 2, not --threads 1);
# - bad inputs: a malformed bench file, a file that is not safetensors, zero
#   ranks, an unknown option: a message naming the problem, exit 1 or 2.
# Usage: test_plan.sh MPIEXEC PLAN-PROGRAM BENCH-STEP-PROGRAM SOURCE-DIR TRAIN-PROGRAM
set -u
mpiexec=$1
plan=$2
step=$3
src=$4
train=$5
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

# Stage 3: shardopt-train -s 3 registers each layer (weight and bias) as a
# unit, with its own gradient buffers (-g user), in one flat buffer or one
# per tensor (--scattered: --separate); its "start" line gives the tensors,
# the units and memory_report(), which the plan of those must equal.
for run in "1:" "3:" "3:-p bf16 --scattered"; do
  n=${run%%:*}
  read -r -a extra <<<"${run#*:}"
  out=$tmp/train-$n-${#extra[@]}.json
  if ! timeout 120 "$mpiexec" -n "$n" --oversubscribe "$train" -s 3 --hidden 256 --layers 3 \
    --steps 2 --json "${extra[@]}" >"$out" 2>"$tmp/train.err"; then
    fail "shardopt-train -s 3 at $n rank(s)${extra[*]:+ with ${extra[*]}}" "$tmp/train.err"
    continue
  fi
  if python3 - "$plan" "$out" "$n" >"$tmp/mem3.out" 2>&1 <<'EOF'; then
import json, subprocess, sys
plan, path, n = sys.argv[1:]
start = [json.loads(l) for l in open(path) if l.startswith('{"type":"start"')][0]
numels = [int(x) for x in start['numels'].split(',')]
units = [int(x) for x in start['units'].split(',')]
# What the trainer says of its model: a weight and a bias per layer, each
# layer a unit, all of its parameters.
assert len(numels) == start['tensors'] == 2 * start['layers'] and sum(numels) == start['params'], start
assert units == [i // 2 for i in range(len(numels))], start['units']
cmd = [plan, '-t', start['numels'], '--units', start['units'], '-s', '3', '-n', n,
       '--threads', '1', '-d', start['precision'], '-o', start['optimizer'], '-g', 'user',
       '-b', str(start['bucket_mb']), '--json'] + (['--separate'] if start['scattered'] else [])
e = json.loads(subprocess.run(cmd, capture_output=True, text=True, check=True).stdout)
mem = start['memory']
fields = ['master_params', 'optimizer_state', 'grad_shard', 'reduced_grads', 'owned_grads',
          ('buckets', 'bucket_bytes'), 'user_params', 'user_grads', 'param_shard', 'gather_pool',
          'persistent_params', 'allocated']
bad = 0
for f in fields:
    a, b = f if isinstance(f, tuple) else (f, f)
    print('%s: train %d, plan %d' % (a, mem[a], e[b]))
    bad += mem[a] != e[b]
# The hidden layer is gathered, the others are under 64 KiB and kept whole.
assert mem['gather_pool'] > 0 and mem['persistent_params'] > 0 and e['units'] == 3, e
print(' '.join(cmd))
sys.exit(1 if bad else 0)
EOF
    ok "stage 3 at $n rank(s)${extra[*]:+ with ${extra[*]}}: the plan of shardopt-train's tensors and units equals its memory_report"
  else
    fail "stage 3 at $n rank(s)${extra[*]:+ with ${extra[*]}}: the plan against shardopt-train" "$tmp/mem3.out"
  fi
done

# Units end buckets at every stage: two tensors of 70000 f32 elements at 3
# ranks in buckets of 0.25 MiB (65520 elements: 65536 rounded down to 16 x 3)
# are 3 buckets as one run and 4 as two units (65520 + 4480 each); stage 3
# makes each tensor a unit without --units. A count of 2 units is the list
# 0,1, and for -t 100,100,100,100,400 the list 0,0,0,0,1 (each unit about
# half of 800).
units_json() {  # NAME ARGS...
  local name=$1
  shift
  "$plan" "$@" --threads 1 --json >"$tmp/u-$name.json" 2>&1 || echo "exit $?" >>"$tmp/u-$name.json"
}
units_json none -t 70000,70000 -n 3 -b 0.25 -s 2,3
units_json count -t 70000,70000 -n 3 -b 0.25 -s 2,3 --units 2
units_json list -t 70000,70000 -n 3 -b 0.25 -s 2,3 --units 0,1
units_json group -t 100,100,100,100,400 -s 0,3 --units 2
units_json group-list -t 100,100,100,100,400 -s 0,3 --units 0,0,0,0,1
units_json flat -p 1000 -n 2 -s 3 --units 3
if python3 - "$tmp" >"$tmp/units.out" 2>&1 <<'EOF'; then
import json, sys
d = sys.argv[1]
def rows(name):
    return {e['stage']: e for e in map(json.loads, open('%s/u-%s.json' % (d, name)))}
none, count, lst = rows('none'), rows('count'), rows('list')
B, align = (1 << 16) // 48 * 48, 48
pad = lambda x: (x + align - 1) // align * align
assert B == 65520
assert (none[2]['buckets'], none[3]['buckets']) == (3, 4), none
for r in (count, lst):
    assert (r[2]['buckets'], r[3]['buckets'], r[2]['units']) == (4, 4, 2), r
    # The shard: each bucket's padded elements over 3 ranks, 4 bytes each.
    assert r[3]['param_shard'] == 4 * 2 * (B + pad(70000 - B)) // 3, r[3]
for k in count[3]:
    assert count[3][k] == lst[3][k], (k, count[3][k], lst[3][k])
g, gl = rows('group'), rows('group-list')
for s in (0, 3):
    assert g[s]['units'] == 2 and g[s]['buckets'] == 2, g[s]
    for k in g[s]:
        assert g[s][k] == gl[s][k], (s, k, g[s][k], gl[s][k])
f = rows('flat')[3]
assert (f['tensors'], f['units'], f['params']) == (3, 3, 1000), f
print('buckets without units %d/%d, with 2 units %d/%d' % (none[2]['buckets'], none[3]['buckets'],
                                                          count[2]['buckets'], count[3]['buckets']))
EOF
  ok "--units: units end buckets at stages 2 and 3 ($(tail -n 1 "$tmp/units.out")), a count groups tensors as the list by hand, -p with N is N tensors"
else
  fail "--units" "$tmp/units.out"
fi

# The stage-3 pool: --gather-limit-mb 1 is a pool of 1 MiB; --persist-below-kb
# 0 gathers the small units too (nothing kept whole), 1000 keeps the 256 KiB
# layer whole as well (no pool at all).
pool_json() {  # NAME ARGS...
  local name=$1
  shift
  SHARDOPT_CHECK_ARGS=0 "$plan" -t 4096,256,65536,256,1024,4 --units 0,0,1,1,2,2 -s 3 -n 2 \
    --threads 1 --json "$@" >"$tmp/p-$name.json" 2>&1 || echo "exit $?" >>"$tmp/p-$name.json"
}
pool_json auto
pool_json limit --gather-limit-mb 1
pool_json none --persist-below-kb 0
pool_json all --persist-below-kb 1000
if python3 - "$tmp" >"$tmp/pool.out" 2>&1 <<'EOF'; then
import json, sys
d = sys.argv[1]
p = {n: json.loads(open('%s/p-%s.json' % (d, n)).read()) for n in ('auto', 'limit', 'none', 'all')}
# Units of 4352, 65792 and 1028 f32 elements; at 2 ranks a bucket pads to 32.
pad = lambda x: (x + 31) // 32 * 32
small = 4 * (pad(4352) + pad(1028))
assert p['auto']['persistent_params'] == small, p['auto']
# The automatic limit is the model's gathered units when they are under 64 MiB.
assert p['auto']['gather_pool'] == 4 * pad(65792), p['auto']
assert p['limit']['gather_pool'] == 1 << 20 and p['limit']['persistent_params'] == small, p['limit']
assert p['none']['persistent_params'] == 0, p['none']
assert p['all']['gather_pool'] == 0 and p['all']['persistent_params'] == small + 4 * pad(65792), p['all']
EOF
  ok "stage 3's pool: automatic, --gather-limit-mb 1, --persist-below-kb 0 and 1000"
else
  fail "stage 3's pool" "$tmp/pool.out"
fi

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

# Stage 3's time from given rates, on a device (no fused step): tensors of
# 70000, 70000 and 100 f32 elements as three units at 3 ranks, buckets of
# 65520 elements (0.25 MiB rounded down to 16 x 3). The reduction as stage
# 2's: a reduce-scatter per bucket; the update on the shard; the gather:
# each bucket of the two large units allgathered twice (forward, backward),
# the 400-byte unit (kept whole) once.
if "$plan" -t 70000,70000,100 --units 0,1,2 -s 3 -n 3 --device -b 0.25 --node-gbps 10 \
  --node-latency-us 3 --mem-gbps 20 --json >"$tmp/t3.json" 2>&1 &&
  python3 -c "
import json, sys
e = json.loads(open(sys.argv[1]).read())
pad = lambda x: (x + 47) // 48 * 48
coll = lambda elems: 2 * 3e-6 + 2 / 3 * elems * 4 / 10e9
big = [65520, pad(70000 - 65520)] * 2
small = [pad(100)]
shard = sum(big + small) // 3
want = {'reduce_ms': sum(map(coll, big + small)) * 1e3,
        'update_ms': shard * 28 / 20e9 * 1e3,
        'gather_ms': (2 * sum(map(coll, big)) + sum(map(coll, small))) * 1e3}
assert e['buckets'] == 5 and e['units'] == 3 and not e['fused'], e
for k, v in want.items():
    assert abs(e[k] - v) <= 1e-3 * v, (k, e[k], v)
assert abs(e['step_ms'] - sum(want.values())) <= 1e-3 * e['step_ms']
" "$tmp/t3.json" 2>>"$tmp/t3.json"; then
  ok "stage 3's time from given rates: two gathers of each unit, one of the whole ones"
else
  fail "stage 3's time from given rates" "$tmp/t3.json"
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
# Stage 3 cut into 10 units: the largest model, as 10 tensors, fits; 0.5%
# more does not.
if "$plan" -p 1M --units 10 -d bf16 -n 8 -s 3 -m 512M --json >"$tmp/m3.json" 2>&1 &&
  python3 - "$plan" "$tmp/m3.json" <<'EOF' >>"$tmp/m3.json" 2>&1; then
import json, subprocess, sys
plan = sys.argv[1]
e = json.loads(open(sys.argv[2]).read())
n = e['largest_params']
def total(p):
    cmd = [plan, '-p', str(p), '--units', '10', '-d', 'bf16', '-n', '8', '-s', '3', '--json']
    return json.loads(subprocess.run(cmd, capture_output=True, text=True, check=True).stdout)['per_rank_bytes']
assert total(n) <= 512 << 20 < total(int(n * 1.005)), n
print('%d parameters' % n)
EOF
  ok "--memory at stage 3 with --units 10: the largest model fits ($(tail -n 1 "$tmp/m3.json")), 0.5% more does not"
else
  fail "--memory at stage 3" "$tmp/m3.json"
fi

# The advice: the lowest stage that fits; stage 3 when only it fits; a model
# of one unit at stage 3 is named, with --units as the way out. 7.5e9 bf16
# parameters on 64 devices: 29988 MiB at stage 1, 16144 at stage 2, 2492 at
# stage 3 with 100 units.
advice() {  # PATTERN WHAT ARGS...
  local pattern=$1 what=$2
  shift 2
  if "$plan" "$@" --json >"$tmp/a.json" 2>&1 && grep -q -- "$pattern" "$tmp/a.json"; then
    ok "advice, $what: '$pattern'"
  else
    fail "advice, $what: no '$pattern'" "$tmp/a.json"
  fi
}
big=(-p 7.5e9 -d bf16 -N 8 -n 8 --device -g stream --units 100)
advice "Use stage 2: .*Stage 1 is the lowest that fits in 40000.0 MiB" "stage 1 the lowest" \
  "${big[@]}" -m 40000M
advice "Use stage 3: it is the only stage asked that fits in 2600.0 MiB (stage 2 needs" \
  "only stage 3 fits" "${big[@]}" -m 2600M
advice "At stage 3 the model is one unit (-p gives one tensor).*give --units N" "one unit" \
  -p 1M -n 2

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
expect_error 2 "bad value '4' for -s (--stages); accepted: 0, 1, 2, 3" "stage 4" -p 1M -s 1,4
expect_error 1 "--units gives 3 units for the model's 2 tensors: give one Param::unit per tensor (2 numbers)" \
  "--units of the wrong length" -t 10,10 --units 0,0,1
expect_error 2 "bad unit 'x' in --units '0,x'" "--units with a bad number" -t 10,10 --units 0,x
expect_error 2 "bad unit '-2' in --units '0,-2'" "--units with a unit below -1" -t 10,10 --units 0,-2
expect_error 2 "bad value '0' for --units" "--units 0" -t 10,10 --units 0
expect_error 1 "--units 3: the model has 2 tensors, and a unit never splits a tensor" \
  "--units past the tensors" -t 10,10 --units 3
expect_error 1 "--units 5 with 4 parameters" "--units past the parameters" -p 4 --units 5
expect_error 1 "--units: unit 0 is split (tensors 0 and 2" "a unit split" -t 10,10,10 --units 0,1,0
expect_error 1 "--gather-limit-mb 0.1 is below unit 1's" "a gather limit under a unit" \
  -t 1000,1000000 -s 3 --gather-limit-mb 0.1
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
