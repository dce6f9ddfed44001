#!/usr/bin/env python3
"""transformers' torch_chunk_gated_delta_rule (the pure-torch path Qwen3.5's GatedDeltaNet runs on
CPU) on bench_gated_delta's shapes and inputs, next to ours (bench/bench_gated_delta.sh runs both).

Reads our rows ("gated_delta fwd|fwd+bwd  DxL tok, HKa HVb dkc dvd  X ms ...") from a file and the
inputs bench_gated_delta --inputs DIR wrote (q, k [T, HK, dk] already L2-normalized, v [T, HV, dv],
g, beta [T, HV], dout [T, HV, dv]); times torch the same way (median of R runs after one warm-up)
and prints both with ratio = torch time / our time (>= 1: ours faster).

Same work on both sides: fp32; q and k arrive normalized, so use_qk_l2norm_in_kernel=False (our op
takes them normalized too); q and k go in with HK heads, as modeling_qwen3_5 passes them, and the
function's own repeat_interleave to HV heads (GVA) is part of torch's time; scale dk^-0.5 (the
function's fixed one). Layout [1, L, H, d] per document: the torch fallback has no cu_seqlens, so
the documents run one after another. fwd: under no_grad. fwd+bwd: q, k, v, g and beta require
grad, backward with dout (our side: the same five gradients through the autograd engine).

  bench_gated_delta_torch.py OURS_OUTPUT INPUTS_DIR [--reps R] [--threads N] [--flush-denormal]
"""
import argparse
import os
import re
import sys
import warnings

import torch
from safetensors.torch import load_file
from transformers.utils import logging as hf_logging
from transformers.models.qwen3_5.modeling_qwen3_5 import torch_chunk_gated_delta_rule

from bench_attention_torch import median_seconds  # (bench/, the script's folder)
import records  # bench/records.py: the common benchmark record

ROW = re.compile(r"gated_delta (fwd\+bwd|fwd)\s+(\d+)x(\d+) tok, HK(\d+) HV(\d+) dk(\d+) dv(\d+)"
                 r"\s+([\d.]+) ms")


def read_ours(path):
    ours = {}
    for line in open(path):
        m = ROW.search(line)
        if m:
            ours[(m.group(1), tuple(int(x) for x in m.groups()[1:7]))] = float(m.group(8)) / 1e3
    if not ours:
        sys.exit("no gated_delta rows in " + path)
    return ours


def load_inputs(inputs_dir, hk, hv, dk, dv):
    name = "gated_delta_HK%d_HV%d_dk%d_dv%d.safetensors" % (hk, hv, dk, dv)
    path = os.path.join(inputs_dir, name)
    t = load_file(path)
    # [T, H, d] -> [1, T, H, d] (transformers' layout, B = 1)
    return {name: x.unsqueeze(0) for name, x in t.items()}


def time_shape(reps, docs, length, inp):
    """(forward, forward + backward) median seconds over the documents run one after another."""
    names = ("q", "k", "v", "g", "beta")
    assert inp["q"].shape[1] == docs * length, (inp["q"].shape, docs, length)

    def run(tensors):
        outs = []
        for d in range(docs):
            q, k, v, g, beta = (x[:, d * length:(d + 1) * length] for x in tensors)
            out, _ = torch_chunk_gated_delta_rule(q, k, v, g=g, beta=beta,
                                                  use_qk_l2norm_in_kernel=False)
            outs.append(out)
        return outs

    def fwd():
        with torch.no_grad():
            run([inp[n] for n in names])

    def both():
        leaves = [inp[n].detach().requires_grad_() for n in names]
        outs = run(leaves)
        douts = [inp["dout"][:, d * length:(d + 1) * length] for d in range(docs)]
        torch.autograd.backward(outs, douts)

    return median_seconds(reps, fwd), median_seconds(reps, both)


def main():
    p = argparse.ArgumentParser()
    p.add_argument("ours")
    p.add_argument("inputs")
    p.add_argument("--reps", type=int, default=5)
    p.add_argument("--threads", type=int, default=0, help="torch threads (0: torch's default)")
    p.add_argument("--flush-denormal", action="store_true",
                   help="torch.set_flush_denormal(True) (our kernels flush subnormals while "
                        "they run)")
    args = p.parse_args()
    if args.threads > 0:
        torch.set_num_threads(args.threads)
    if args.flush_denormal:
        torch.set_flush_denormal(True)
    hf_logging.set_verbosity_error()  # the "falling back to its reference PyTorch" notice
    warnings.filterwarnings("ignore")
    ours = read_ours(args.ours)
    print("%-8s %-38s %10s %10s %7s" % ("", "shape", "ours ms", "torch ms", "ratio"))
    worst = {}
    cache = {}
    for docs, length, hk, hv, dk, dv in sorted({k for _, k in ours}, key=lambda s: s[2:] + s[:2]):
        heads = (hk, hv, dk, dv)
        if heads not in cache:
            cache.clear()
            cache[heads] = load_inputs(args.inputs, *heads)
        t_fwd, t_both = time_shape(args.reps, docs, length, cache[heads])
        for kind, t_torch in (("fwd", t_fwd), ("fwd+bwd", t_both)):
            key = (docs, length, hk, hv, dk, dv)
            if (kind, key) not in ours:
                continue
            t_ours = ours[(kind, key)]
            ratio = t_torch / t_ours
            worst[kind] = min(worst.get(kind, 1e9), ratio)
            shape = "%dx%d tok, HK%d HV%d dk%d dv%d" % key
            print("%-8s %-38s %10.1f %10.1f %7.2f" % (kind, shape, t_ours * 1e3, t_torch * 1e3,
                                                      ratio), flush=True)
            records.emit("bench_gated_delta.sh", "gated_delta %s %s vs transformers' chunked rule"
                         % (kind, shape), 1, "cpu", "ms", t_ours * 1e3, t_torch * 1e3)
    print("gated delta rule vs transformers' torch_chunk_gated_delta_rule, worst ratio: fwd %.2f, "
          "fwd+bwd %.2f (target >= 2); torch %s, %d threads%s"
          % (worst.get("fwd", 0), worst.get("fwd+bwd", 0), torch.__version__,
             torch.get_num_threads(), ", flush denormal" if args.flush_denormal else ""))


if __name__ == "__main__":
    main()
