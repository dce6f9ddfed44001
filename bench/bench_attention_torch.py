#!/usr/bin/env python3
"""torch's scaled_dot_product_attention on the attention shapes of bench_ops_cpu's output, next to
ours (bench/bench_ops_cpu.sh runs both). Reads our rows ("attention fwd|bwd causal  BxL tok, HqN
HkvM DK  T ms ...") from a file, times torch on each shape the same way (median of R runs after one
warm-up; fp32; causal per document, documents run one after another; backward = forward +
backward minus forward) and prints both with ratio = torch time / our time (>= 1: ours faster).

  bench_attention_torch.py OURS_OUTPUT [--reps R] [--threads N]
"""
import argparse
import re
import statistics
import sys
import time

import torch
import torch.nn.functional as F


def median_seconds(reps, fn):
    fn()
    times = []
    for _ in range(reps):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def main():
    p = argparse.ArgumentParser()
    p.add_argument("ours")
    p.add_argument("--reps", type=int, default=5)
    p.add_argument("--threads", type=int, default=0, help="torch threads (0: torch's default)")
    args = p.parse_args()
    if args.threads > 0:
        torch.set_num_threads(args.threads)
    row = re.compile(r"attention (fwd|bwd) causal\s+(\d+)x(\d+) tok, Hq(\d+) Hkv(\d+) D(\d+)\s+"
                     r"([\d.]+) ms\s+([\d.]+) GFLOP/s")
    ours = {}
    for line in open(args.ours):
        m = row.search(line)
        if m:
            key = tuple(int(x) for x in m.groups()[1:6])
            ours[(m.group(1), key)] = (float(m.group(7)) / 1e3, float(m.group(8)))
    if not ours:
        sys.exit("no attention rows in " + args.ours)
    torch.manual_seed(0)
    print("%-4s %-30s %10s %10s %10s %10s %7s" % ("", "shape", "ours ms", "torch ms", "ours GF/s",
                                                 "torch GF/s", "ratio"))
    worst = 1e9
    for (docs, length, hq, hkv, d) in sorted({k for _, k in ours}):
        q = torch.randn(docs, hq, length, d)
        k = torch.randn(docs, hkv, length, d)
        v = torch.randn(docs, hkv, length, d)
        dout = torch.randn(docs, hq, length, d)

        def fwd():
            with torch.no_grad():
                return F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=hkv != hq)

        def both():
            ql, kl, vl = (t.detach().requires_grad_() for t in (q, k, v))
            out = F.scaled_dot_product_attention(ql, kl, vl, is_causal=True, enable_gqa=hkv != hq)
            out.backward(dout)

        t_fwd = median_seconds(args.reps, fwd)
        t_bwd = max(median_seconds(args.reps, both) - t_fwd, 1e-9)
        flops = docs * hq * 4.0 * length * length * d / 2.0
        for kind, t_torch, f in (("fwd", t_fwd, flops), ("bwd", t_bwd, 2.5 * flops)):
            if (kind, (docs, length, hq, hkv, d)) not in ours:
                continue
            t_ours, _ = ours[(kind, (docs, length, hq, hkv, d))]
            ratio = t_torch / t_ours
            worst = min(worst, ratio)
            print("%-4s %-30s %10.1f %10.1f %10.1f %10.1f %7.2f" % (
                kind, "%dx%d tok, Hq%d Hkv%d D%d" % (docs, length, hq, hkv, d), t_ours * 1e3,
                t_torch * 1e3, f / t_ours / 1e9, f / t_torch / 1e9, ratio))
    print("attention vs torch SDPA, worst ratio: %.2f (target >= 1.0); torch %s, %d threads"
          % (worst, torch.__version__, torch.get_num_threads()))


if __name__ == "__main__":
    main()
