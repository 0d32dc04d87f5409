#!/usr/bin/env python3
"""Writes the seed corpus of the header fuzzer (tests/fuzz/corpus/header/).

Each file is a whole checkpoint file: valid ones as shardopt and other
safetensors writers lay them out, invalid ones with one defect each. The
checksums are placeholders: the header parser does not read the data.
Usage: make_corpus.py [DIR] (default: the corpus directory next to this
script).
"""
import json
import os
import struct
import sys


def header(obj, pad=True):
    text = json.dumps(obj, separators=(",", ":"), ensure_ascii=False).encode()
    if pad:
        text += b" " * ((8 - len(text) % 8) % 8)
    return text


def file(text, data_bytes, length=None):
    n = len(text) if length is None else length
    return struct.pack("<Q", n) + text + bytes(i % 251 for i in range(data_bytes))


def shardopt_header(tensors, chunk, extra=None):
    """tensors: [(name, dtype, shape, nbytes)] laid out back to back."""
    obj, begin = {}, 0
    for name, dtype, shape, nbytes in tensors:
        obj[name] = {"dtype": dtype, "shape": shape, "data_offsets": [begin, begin + nbytes]}
        begin += nbytes
    md = {"format": "pt", "shardopt.format_version": "1", "shardopt.version": "0.1.0",
          "shardopt.content": "checkpoint"}
    md.update(extra or {})
    if chunk:
        md["shardopt.checksum"] = "xxh3-64"
        md["shardopt.chunk_bytes"] = str(chunk)
        for i, (name, _, _, nbytes) in enumerate(tensors):
            count = (nbytes + chunk - 1) // chunk
            md["shardopt.xxh3." + name] = "".join("%016x" % (i * 1000 + k) for k in range(count))
    obj["__metadata__"] = md
    return obj, begin


def main():
    out = sys.argv[1] if len(sys.argv) > 1 else os.path.join(
        os.path.dirname(os.path.abspath(__file__)), "corpus", "header")
    os.makedirs(out, exist_ok=True)
    files = {}

    ckpt = [("w", "F32", [2, 3], 24), ("b", "F32", [3], 12), ("w.exp_avg", "F32", [2, 3], 24),
            ("empty", "F32", [0, 4], 0), ("shardopt.loss_scaler", "F64", [3], 24)]
    obj, size = shardopt_header(ckpt, 16, {"shardopt.step": "7", "shardopt.states": "[\"exp_avg\"]"})
    files["valid_checkpoint"] = file(header(obj), size)
    obj, size = shardopt_header([("emb", "BF16", [4, 2], 16), ("s", "I64", [], 8)], 8,
                                {"shardopt.content": "export", "shardopt.dtype": "bf16"})
    files["valid_export"] = file(header(obj), size)
    obj, size = shardopt_header([("x", "U8", [5], 5)], 0)
    files["valid_no_checksums"] = file(header(obj), size)
    # Another writer: no metadata, keys not in file order, no padding.
    files["valid_plain"] = file(header({
        "b": {"dtype": "I32", "shape": [1], "data_offsets": [6, 10]},
        "a": {"dtype": "F16", "shape": [3], "data_offsets": [0, 6]}}, pad=False), 10)
    files["valid_empty"] = file(header({}), 0)

    files["bad_truncated"] = file(header(obj), 0, length=4096)
    files["bad_garbage"] = bytes([0x10, 0, 0, 0, 0, 0, 0, 0]) + bytes(range(200, 216))
    files["bad_json"] = file(b'{"a":{"dtype":"F32","shape":[1],', 0)
    files["bad_overlap"] = file(header({
        "a": {"dtype": "U8", "shape": [4], "data_offsets": [0, 4]},
        "b": {"dtype": "U8", "shape": [4], "data_offsets": [2, 6]}}), 6)
    files["bad_gap"] = file(header({
        "a": {"dtype": "U8", "shape": [4], "data_offsets": [0, 4]},
        "b": {"dtype": "U8", "shape": [4], "data_offsets": [5, 9]}}), 9)
    files["bad_duplicate"] = file(
        b'{"a":{"dtype":"U8","shape":[1],"data_offsets":[0,1]},'
        b'"a":{"dtype":"U8","shape":[1],"data_offsets":[1,2]}}', 2)
    obj, size = shardopt_header([("w", "F32", [4], 16)], 8)
    obj["__metadata__"]["shardopt.xxh3.w"] = obj["__metadata__"]["shardopt.xxh3.w"][:-1]
    files["bad_checksum_length"] = file(header(obj), size)
    obj, size = shardopt_header([("w", "F32", [4], 16)], 0, {"shardopt.format_version": "2"})
    files["bad_newer_version"] = file(header(obj), size)
    files["bad_metadata_type"] = file(header({"__metadata__": {"step": 3}}), 0)

    for name, data in sorted(files.items()):
        with open(os.path.join(out, name + ".safetensors"), "wb") as f:
            f.write(data)
    print("wrote %d files to %s" % (len(files), out))


if __name__ == "__main__":
    main()
