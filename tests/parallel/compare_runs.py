#!/usr/bin/env python3
"""Compares two `vlmtrain train` runs: every step's loss (metrics.jsonl) and every tensor of the
final checkpoint (model.safetensors). Python's standard library only (CI has no numpy).

  compare_runs.py RUN_A RUN_B [--loss-tol 1e-6] [--l2-tol 1e-5] [--element-tol 1e-3]

RUN_* are checkpoint.output_dir folders. Losses: |a - b| / |b| per step. Tensors: ||a - b|| / ||b||
(L2) and max |a - b| / max |b| (element-wise); the key third of a vision attention's qkv.bias is
left out (its gradient is zero in exact arithmetic, so AdamW trains it on rounding noise; see
tests/parallel/test_fsdp_equivalence_mpi.cpp). Prints the worst errors; exits 1 when a bound is broken.
"""
import argparse
import array
import glob
import json
import math
import os
import struct
import sys


def losses(run):
    out = []
    with open(os.path.join(run, "metrics.jsonl")) as f:
        for line in f:
            record = json.loads(line)
            if "loss" in record and "eval_loss" not in record:
                out.append((record["step"], record["loss"], record.get("tokens")))
    return out


def tensors(run):
    ckpts = sorted(glob.glob(os.path.join(run, "checkpoint-step-*")),
                   key=lambda p: int(p.rsplit("-", 1)[1]))
    if not ckpts:
        sys.exit(f"compare_runs: no checkpoint-step-N folder in {run}")
    path = os.path.join(ckpts[-1], "model.safetensors")
    with open(path, "rb") as f:
        data = f.read()
    (n,) = struct.unpack("<Q", data[:8])
    header = json.loads(data[8:8 + n])
    out = {}
    for name, info in header.items():
        if name == "__metadata__":
            continue
        if info["dtype"] != "F32":
            sys.exit(f"compare_runs: {path}: {name} is {info['dtype']}, compare f32 runs")
        begin, end = info["data_offsets"]
        values = array.array("f")
        values.frombytes(data[8 + n + begin:8 + n + end])
        out[name] = values
    return ckpts[-1], out


def comparable(name, values):
    if name.endswith("attn.qkv.bias"):
        third = len(values) // 3
        return list(values[:third]) + list(values[2 * third:])
    return values


def main():
    p = argparse.ArgumentParser()
    p.add_argument("a")
    p.add_argument("b")
    p.add_argument("--loss-tol", type=float, default=1e-6)
    p.add_argument("--l2-tol", type=float, default=1e-5)
    p.add_argument("--element-tol", type=float, default=1e-3)
    args = p.parse_args()
    bad = []

    la, lb = losses(args.a), losses(args.b)
    if len(la) != len(lb) or not la:
        bad.append(f"{len(la)} vs {len(lb)} step records")
    worst_loss = 0.0
    for (sa, xa, ta), (sb, xb, tb) in zip(la, lb):
        if sa != sb or ta != tb:
            bad.append(f"step {sa} vs {sb}: {ta} vs {tb} tokens (not the same global batch)")
        e = abs(xa - xb) / max(abs(xb), 1e-30)
        worst_loss = max(worst_loss, e)
        if e > args.loss_tol:
            bad.append(f"step {sa}: loss {xa!r} vs {xb!r} ({e:.2e})")

    ca, ta = tensors(args.a)
    cb, tb = tensors(args.b)
    if set(ta) != set(tb):
        bad.append(f"tensor names differ: {sorted(set(ta) ^ set(tb))[:5]}")
    worst_l2 = worst_el = 0.0
    for name in sorted(set(ta) & set(tb)):
        a, b = comparable(name, ta[name]), comparable(name, tb[name])
        diff2 = sum((x - y) ** 2 for x, y in zip(a, b))
        norm2 = sum(y * y for y in b)
        l2 = math.sqrt(diff2 / norm2) if norm2 > 0 else math.sqrt(diff2)
        scale = max((abs(y) for y in b), default=0.0)
        el = max((abs(x - y) for x, y in zip(a, b)), default=0.0)
        el = el / scale if scale > 0 else el
        worst_l2, worst_el = max(worst_l2, l2), max(worst_el, el)
        if l2 > args.l2_tol or el > args.element_tol:
            bad.append(f"{name}: L2 error {l2:.2e}, element error {el:.2e}")

    print(f"compare_runs {args.a} vs {args.b}: {len(la)} steps, worst loss error {worst_loss:.2e}; "
          f"{len(ta)} tensors of {os.path.basename(ca)} vs {os.path.basename(cb)}, worst L2 error "
          f"{worst_l2:.2e}, worst element error {worst_el:.2e}")
    for line in bad[:20]:
        print("  MISMATCH " + line)
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
