# shellcheck shell=bash
# shardopt: what the trainer tests share (sourced, not run): checks of
# shardopt-train --json output and the step count of a checkpoint.

# Checks a --json output: each EXPR (Python) must hold, with start, resume,
# stopped,
# summary (the objects of those types, None if absent), steps, checkpoints
# (lists of the objects of those types) and isfinite in scope.
expect() {  # OUT EXPR...
  python3 - "$@" <<'EOF'
import json, math, sys
path, exprs = sys.argv[1], sys.argv[2:]
objs = [json.loads(l) for l in open(path) if l.startswith("{")]
def first(t):
    return next((o for o in objs if o["type"] == t), None)
scope = {"start": first("start"), "resume": first("resume"), "summary": first("summary"),
         "stopped": first("stopped"),
         "steps": [o for o in objs if o["type"] == "step"],
         "checkpoints": [o for o in objs if o["type"] == "checkpoint"],
         "isfinite": lambda x: x is not None and math.isfinite(x)}
for e in exprs:
    try:
        good = eval(e, scope)
    except Exception as ex:
        sys.exit(f"{e}: {type(ex).__name__}: {ex}")
    if not good:
        sys.exit(f"not true: {e}")
EOF
}

# The step count in a checkpoint's header (safetensors: a little-endian u64
# length, then the JSON header), read without shardopt.
ckpt_step() {  # FILE
  python3 - "$1" <<'EOF'
import json, struct, sys
with open(sys.argv[1], "rb") as f:
    n, = struct.unpack("<Q", f.read(8))
    print(json.loads(f.read(n))["__metadata__"]["shardopt.step"])
EOF
}
