#!/usr/bin/env python3
"""shardopt-train's checkpoints and exports read with the reference safetensors
package (safetensors.safe_open, framework="numpy"), independently of shardopt:

- the export's tensors equal the --save-params file's values, bitwise, with
  the shapes docs/train.md gives;
- the checkpoint's master tensors equal the export's; every optimizer state
  "<param>.<state>" of "shardopt.states" is there, of the parameter's shape,
  finite; nothing else is (but the loss scaler's state, with a scaler);
- the metadata keys of docs/checkpoint-format.md are there and parse
  (format_version "1", the step count of the run, the groups, params and
  states JSON);
- each tensor's chunk checksums, recomputed with the xxhash package
  (xxh3_64_hexdigest of every chunk of shardopt.chunk_bytes bytes of its
  raw bytes), equal "shardopt.xxh3.<name>";
- the files are laid out as the format says: the header padded to a
  multiple of 8 bytes, the tensors back to back in the order of the header.

Runs at 2 ranks: an fp32 model big enough for tensors of several checksum
chunks, and a bf16 model with a loss scaler. Exits 77 (skip) without the
Python packages; scripts/setup installs them into .venv.

Usage: test_safetensors.py MPIEXEC PROGRAM
"""
import json
import math
import os
import re
import struct
import subprocess
import sys
import tempfile

try:
    import numpy as np
    import xxhash
    from safetensors import safe_open
except ImportError:
    print("SKIP: the Python safetensors package is not installed "
          "(scripts/setup installs it into .venv from PyPI)")
    sys.exit(77)

STEPS = 20
failures = []


def check(ok, what):
    if not ok:
        failures.append(what)
        print(f"FAILED: {what}")
    return ok


def read_params(path):
    """The --save-params file (docs/train.md): {name: array}, steps."""
    record = np.dtype([("name", "S40"), ("ndim", "<u4"), ("dims", "<u4", 2),
                       ("reserved", "<u4"), ("offset", "<u8")])
    raw = np.fromfile(path, dtype=np.uint8)
    if bytes(raw[:8]) != b"SOPARAMS":
        raise ValueError(f"{path}: not a shardopt-train parameter file")
    version, dtype, _esize, tensors = raw[8:24].view("<u4")
    _numel, steps, data_offset = raw[24:48].view("<u8")
    if version != 1:
        raise ValueError(f"{path}: format version {version}")
    records = raw[64:64 + 64 * int(tensors)].view(record)
    data = raw[int(data_offset):]
    if dtype == 0:
        values = data.view("<f4")
    elif dtype == 2:  # bf16: the high half of a float32
        values = (data.view("<u2").astype(np.uint32) << 16).view(np.float32)
    else:
        raise ValueError(f"{path}: element type {dtype} not handled here")
    params = {}
    for r in records:
        shape = tuple(int(d) for d in r["dims"][:r["ndim"]])
        first = int(r["offset"])
        params[r["name"].decode()] = values[first:first + int(np.prod(shape))].reshape(shape)
    return params, int(steps)


def read_layout(path):
    """The header of a safetensors file parsed by hand: its length, the JSON,
    and the file's bytes."""
    with open(path, "rb") as f:
        raw = f.read()
    n, = struct.unpack_from("<Q", raw, 0)
    header = json.loads(raw[8:8 + n])
    return n, header, raw


def check_layout(path, label):
    """The byte layout of docs/checkpoint-format.md; returns {name: raw bytes}."""
    n, header, raw = read_layout(path)
    check((8 + n) % 8 == 0, f"{label}: the data section starts at {8 + n}, not a multiple of 8")
    check(raw[8:9] == b"{", f"{label}: the header does not start with '{{'")
    names = [k for k in header if k != "__metadata__"]
    check(list(header)[-1] == "__metadata__", f"{label}: __metadata__ is not the last key")
    at = 0
    tensors = {}
    for name in names:
        begin, end = header[name]["data_offsets"]
        check(begin == at, f"{label}: {name} starts at {begin}, expected {at} (file order)")
        at = end
        tensors[name] = raw[8 + n + begin:8 + n + end]
    check(8 + n + at == len(raw), f"{label}: the tensors end at {8 + n + at}, the file at {len(raw)}")
    return tensors


def check_checksums(label, meta, raw_tensors):
    """Recomputes every tensor's chunk checksums with xxhash."""
    check(meta.get("shardopt.checksum") == "xxh3-64", f"{label}: shardopt.checksum is not xxh3-64")
    chunk = int(meta.get("shardopt.chunk_bytes", "0"))
    if not check(chunk > 0, f"{label}: shardopt.chunk_bytes missing or 0"):
        return
    keys = {k[len("shardopt.xxh3."):] for k in meta if k.startswith("shardopt.xxh3.")}
    check(keys == set(raw_tensors),
          f"{label}: checksum keys for {sorted(keys ^ set(raw_tensors))} do not match the tensors")
    chunks = 0
    most = 0
    for name, data in raw_tensors.items():
        expected = "".join(xxhash.xxh3_64_hexdigest(data[k:k + chunk])
                           for k in range(0, len(data), chunk))
        chunks += len(expected) // 16
        most = max(most, len(expected) // 16)
        check(meta.get("shardopt.xxh3." + name) == expected,
              f"{label}: the checksums of {name} differ from xxhash's")
    print(f"ok: {label}: {len(raw_tensors)} tensors, {chunks} chunks of up to {chunk} bytes, "
          "checksums equal to xxhash's")
    return most


def run_trainer(mpiexec, program, tmp, name, args):
    paths = {k: os.path.join(tmp, f"{name}.{k}") for k in ("ckpt", "export", "params")}
    cmd = [mpiexec, "-n", "2", "--oversubscribe", program, "--json", "--log-every", "100000",
           "--steps", str(STEPS), "--checkpoint", paths["ckpt"], "--export", paths["export"],
           "--save-params", paths["params"]] + args
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=300,
                       env=dict(os.environ, OMP_NUM_THREADS="1"))
    if p.returncode != 0:
        print(p.stdout + p.stderr)
        check(False, f"{name}: {' '.join(cmd)}: exit status {p.returncode}")
        return None
    return paths


def check_run(name, paths, dtype, optimizer, states, stage, scaler, min_chunks=1):
    params, steps = read_params(paths["params"])
    check(steps == STEPS, f"{name}: --save-params says {steps} steps")

    # The export against the --save-params file.
    with safe_open(paths["export"], framework="numpy") as f:
        emeta = f.metadata()
        export = {k: f.get_tensor(k) for k in f.keys()}
    check(set(export) == set(params),
          f"{name}: the export's tensors {sorted(export)} are not the parameters {sorted(params)}")
    for k, v in params.items():
        e = export.get(k)
        if e is None:
            continue
        check(e.dtype == np.float32, f"{name}: export {k} is {e.dtype}, not float32")
        check(e.shape == v.shape, f"{name}: export {k} has shape {e.shape}, the model {v.shape}")
        if dtype == "f32":
            check(e.shape == v.shape and e.tobytes() == v.tobytes(),
                  f"{name}: export {k} differs from the --save-params values")
        else:
            # The bf16 parameters are the fp32 master rounded to bf16.
            close = e.shape == v.shape and np.all(np.abs(v - e) <= np.abs(e) * 2.0**-8)
            check(close, f"{name}: the bf16 parameters of {k} are not the export's values rounded")
    check(emeta.get("shardopt.content") == "export", f"{name}: the export's content is not export")
    check(emeta.get("shardopt.format_version") == "1", f"{name}: the export's format_version")
    check(emeta.get("shardopt.step") == str(STEPS), f"{name}: the export's step")
    check(emeta.get("shardopt.dtype") == dtype, f"{name}: the export's dtype")
    check_checksums(f"{name} export", emeta, check_layout(paths["export"], f"{name} export"))
    how = "equal" if dtype == "f32" else "rounded to bf16 are"
    print(f"ok: {name}: the export's {len(export)} tensors {how} the --save-params values")

    # The checkpoint.
    with safe_open(paths["ckpt"], framework="numpy") as f:
        meta = f.metadata()
        ckpt = {k: f.get_tensor(k) for k in f.keys()}
    raw = check_layout(paths["ckpt"], f"{name} checkpoint")
    for k in ("format", "shardopt.format_version", "shardopt.version", "shardopt.content",
              "shardopt.checksum", "shardopt.chunk_bytes", "shardopt.step", "shardopt.optimizer",
              "shardopt.groups", "shardopt.params", "shardopt.states", "shardopt.stage",
              "shardopt.ranks", "shardopt.dtype", "shardopt.param_remainders",
              "shardopt.layout_fingerprint"):
        check(k in meta, f"{name}: metadata key {k} missing")
    check(meta.get("format") == "pt", f"{name}: format is {meta.get('format')!r}")
    check(meta.get("shardopt.format_version") == "1", f"{name}: format_version")
    check(re.fullmatch(r"\d+\.\d+\.\d+.*", meta.get("shardopt.version", "")) is not None,
          f"{name}: shardopt.version {meta.get('shardopt.version')!r}")
    check(meta.get("shardopt.content") == "checkpoint", f"{name}: content")
    check(meta.get("shardopt.step") == str(STEPS),
          f"{name}: step {meta.get('shardopt.step')}, expected {STEPS}")
    check(meta.get("shardopt.optimizer") == optimizer, f"{name}: optimizer")
    check(meta.get("shardopt.stage") == str(stage), f"{name}: stage")
    check(meta.get("shardopt.ranks") == "2", f"{name}: ranks")
    check(meta.get("shardopt.dtype") == dtype, f"{name}: dtype")
    check(meta.get("shardopt.param_remainders") in ("true", "false"), f"{name}: param_remainders")
    check(re.fullmatch(r"[0-9a-f]{16}", meta.get("shardopt.layout_fingerprint", "")) is not None,
          f"{name}: layout_fingerprint")
    groups = json.loads(meta.get("shardopt.groups", "null"))
    check(isinstance(groups, list) and len(groups) == 1 and
          isinstance(groups[0].get("lr"), (int, float)), f"{name}: groups {groups}")
    plist = json.loads(meta.get("shardopt.params", "null"))
    check([(p["name"], p["numel"], p["group"]) for p in plist or []] ==
          [(k, v.size, 0) for k, v in params.items()], f"{name}: shardopt.params {plist}")
    state_names = json.loads(meta.get("shardopt.states", "null"))
    check(state_names == states, f"{name}: shardopt.states {state_names}, expected {states}")

    expected = list(params) + [f"{p}.{s}" for s in state_names or [] for p in params]
    if scaler:
        expected.append("shardopt.loss_scaler")
    n, header, _ = read_layout(paths["ckpt"])
    order = [k for k in header if k != "__metadata__"]
    check(order == expected, f"{name}: the checkpoint's tensors, in file order, are {order}, "
          f"expected {expected}")
    for p in params:
        m = ckpt.get(p)
        if check(m is not None and m.dtype == np.float32, f"{name}: master {p} missing or not F32"):
            check(m.tobytes() == export[p].tobytes(),
                  f"{name}: the checkpoint's master {p} differs from the export")
        for s in state_names or []:
            t = ckpt.get(f"{p}.{s}")
            if check(t is not None, f"{name}: state {p}.{s} missing"):
                check(t.dtype == np.float32 and t.shape == params[p].shape,
                      f"{name}: state {p}.{s} is {t.dtype} {t.shape}, expected float32 "
                      f"{params[p].shape}")
                check(bool(np.all(np.isfinite(t))), f"{name}: state {p}.{s} is not finite")
    if scaler:
        ls = ckpt.get("shardopt.loss_scaler")
        if check(ls is not None and ls.dtype == np.float64 and ls.shape == (3,),
                 f"{name}: shardopt.loss_scaler missing or not F64 [3]"):
            check(math.isfinite(ls[0]) and ls[0] > 0, f"{name}: loss scale {ls[0]}")
    most = check_checksums(f"{name} checkpoint", meta, raw)
    if most is not None:
        check(most >= min_chunks, f"{name}: the largest tensor has {most} checksum chunks, "
              f"expected {min_chunks}")
    print(f"ok: {name}: the checkpoint's {len(ckpt)} tensors and metadata as specified")


def main():
    mpiexec, program = sys.argv[1], sys.argv[2]
    with tempfile.TemporaryDirectory() as tmp:
        # The default model (16 -> 768 -> 768 -> 4): layers.1.weight is
        # 2.25 MiB, three checksum chunks of 1 MiB.
        paths = run_trainer(mpiexec, program, tmp, "f32", ["-s", "2", "-o", "adamw"])
        if paths:
            check_run("f32", paths, "f32", "adamw", ["exp_avg", "exp_avg_sq"], 2, False,
                      min_chunks=3)
        paths = run_trainer(mpiexec, program, tmp, "bf16",
                            ["--hidden", "256", "-s", "1", "-o", "sgd", "-p", "bf16",
                             "--loss-scale", "dynamic"])
        if paths:
            check_run("bf16", paths, "bf16", "sgd", ["momentum_buffer"], 1, True)
    print(f"safetensors: {len(failures)} failed")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
