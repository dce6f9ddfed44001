#!/usr/bin/env python3
"""Compares two resumable checkpoints of `vlmtrain train` (checkpoint.format = "hdf5") through
Debian's python3-h5py: every tensor under /model and /optim, and the /state counters.

  compare_checkpoints.py A B [--tol T] [--metrics]

A, B: step_N folders, or output_dirs (their `latest`). Without --tol the tensors must be
bit-identical (same dtype, shape and bytes); with it, ||a - b|| / ||b|| <= T per tensor (runs that
differ in summation order, e.g. another number of ranks). --metrics also requires the two
output_dirs' metrics.jsonl to hold the same training losses and token counts for every step
(exactly, or within T relative). Exits 1 with the differences named.
"""
import argparse
import json
import os
import sys

import h5py
import numpy as np


def folder(path):
    latest = os.path.join(path, "latest")
    return os.path.realpath(latest if os.path.exists(latest) else path)


def tensors(f):
    out = {}
    f.visititems(lambda name, obj: out.__setitem__(name, obj)
                 if isinstance(obj, h5py.Dataset) and name.split("/")[0] in ("model", "optim")
                 else None)
    return out


def state(f):
    s = json.loads(f["state"][()])
    return {k: s[k] for k in ("step", "tokens", "padded_tokens", "skipped_steps", "rng",
                              "optimizer_steps")}


def steps(run):
    out = {}
    with open(os.path.join(run, "metrics.jsonl")) as f:
        for line in f:
            r = json.loads(line)
            if "loss" in r:
                out[r["step"]] = (r["loss"], r["tokens"])
    return out


def main():
    p = argparse.ArgumentParser()
    p.add_argument("a")
    p.add_argument("b")
    p.add_argument("--tol", type=float, default=None)
    p.add_argument("--metrics", action="store_true")
    args = p.parse_args()
    problems = []
    da, db = folder(args.a), folder(args.b)
    with h5py.File(os.path.join(da, "state.h5"), "r") as fa, \
            h5py.File(os.path.join(db, "state.h5"), "r") as fb:
        ta, tb = tensors(fa), tensors(fb)
        if set(ta) != set(tb):
            problems.append("different tensors: only in A %s, only in B %s"
                            % (sorted(set(ta) - set(tb))[:5], sorted(set(tb) - set(ta))[:5]))
        worst = 0.0
        for name in sorted(set(ta) & set(tb)):
            a, b = ta[name], tb[name]
            if a.shape != b.shape or a.dtype != b.dtype:
                problems.append("%s: %s %s vs %s %s" % (name, a.dtype, a.shape, b.dtype, b.shape))
                continue
            if args.tol is None:
                if a[()].tobytes() != b[()].tobytes():
                    problems.append("%s differs" % name)
                continue
            x, y = a.astype("f8")[()], b.astype("f8")[()]
            err = np.linalg.norm(x - y) / max(np.linalg.norm(y), 1e-30)
            worst = max(worst, err)
            if err > args.tol:
                problems.append("%s: relative L2 error %.3g > %g" % (name, err, args.tol))
        sa, sb = state(fa), state(fb)
        if args.tol is None and sa != sb:
            problems.append("/state differs: %s vs %s" % (sa, sb))
        elif sa["step"] != sb["step"] or sa["tokens"] != sb["tokens"]:
            problems.append("/state step or tokens differ: %s vs %s" % (sa, sb))
    if args.metrics:
        ma, mb = steps(args.a), steps(args.b)
        if sorted(ma) != sorted(mb):
            problems.append("metrics: steps %s vs %s" % (sorted(ma), sorted(mb)))
        for s in sorted(set(ma) & set(mb)):
            (la, ka), (lb, kb) = ma[s], mb[s]
            bad = la != lb if args.tol is None else abs(la - lb) > args.tol * abs(lb)
            if bad or ka != kb:
                problems.append("metrics step %d: loss %r vs %r, tokens %d vs %d"
                                % (s, la, lb, ka, kb))
    label = "bit-identical" if args.tol is None else "within %g (worst %.3g)" % (args.tol, worst)
    if problems:
        print("FAIL: %s vs %s:\n  %s" % (da, db, "\n  ".join(problems[:20])))
        return 1
    print("checkpoints %s: %s and %s (%d tensors)" % (label, da, db, len(ta)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
