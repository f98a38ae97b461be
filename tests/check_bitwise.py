#!/usr/bin/env python3
"""Stricter than check_replay.py: every expected param.*/state.* tensor of a
conformance case, and its sched.* (learning-rate schedule) and grad_norm.*
(clip_grad_norm totals) tensors, must be byte-identical in the replay output
(torch's own values, not a tolerance). Standard library only.

  check_bitwise.py CASE_DIR PRODUCED.safetensors
"""
import json, struct, sys, pathlib


def read(path):
    data = pathlib.Path(path).read_bytes()
    (n,) = struct.unpack("<Q", data[:8])
    header = json.loads(data[8:8 + n])
    base = 8 + n
    out = {}
    for k, v in header.items():
        if k == "__metadata__":
            continue
        b, e = v["data_offsets"]
        out[k] = (v["dtype"], tuple(v["shape"]), data[base + b:base + e])
    return out


def main():
    if len(sys.argv) != 3:
        print(__doc__, file=sys.stderr)
        return 2
    expected = read(pathlib.Path(sys.argv[1]) / "tensors.safetensors")
    produced = read(sys.argv[2])
    keys = [k for k in expected if k.startswith(("param.", "state.", "sched.", "grad_norm."))]
    bad = [k for k in keys if produced.get(k) != expected[k]]
    for k in bad[:20]:
        print(f"not bitwise identical: {k}")
    print(f"bitwise: {len(keys) - len(bad)} of {len(keys)} tensors identical to torch")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
