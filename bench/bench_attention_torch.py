#!/usr/bin/env python3
"""torch's scaled_dot_product_attention on the attention shapes of bench_ops_cpu's output, next to
ours (bench/bench_ops_cpu.sh runs both). Reads our rows ("attention fwd|bwd causal  BxL tok, HqN
HkvM DK  T ms ...") from a file, times torch on each shape the same way (median of R runs after one
warm-up; fp32; causal per document, documents run one after another; backward = forward +
backward minus forward) and prints both with ratio = torch time / our time (>= 1: ours faster).

  bench_attention_torch.py OURS_OUTPUT [--reps R] [--threads N]

GPU mode (bench_gpu_ops runs it in the same run as its own attention rows, on the same shapes):
bf16, one causal document of T tokens, layout [1, H, T, D] (the kv heads repeated to H); the
forward and the backward (forward + backward minus forward) timed with CUDA events, median of R
runs after a warm-up; SDPA picks its backend (flash / cuDNN / efficient; the line names the ones
enabled), or only cuDNN with --sdpa-backend cudnn (torch's choice where cuDNN refuses the shape,
said in "sdpa_backend"). One JSON line per shape: {"T", "hq", "hkv", "d", "fwd_ms", "bwd_ms",
"torch", "device", "sdpa_backend", "sdpa_backends"}, or {"skipped": reason} when torch or its CUDA device is missing
(exit status 0).

  bench_attention_torch.py --device cuda --shapes T:HQ:HKV:D [T:HQ:HKV:D ...] [--reps R]
                           [--sdpa-backend auto|cudnn|flash]
"""
import argparse
import json
import re
import statistics
import sys
import time
import records  # bench/records.py: the common benchmark record

try:
    import torch
    import torch.nn.functional as F
except ImportError as e:  # the GPU mode reports it; the CPU mode needs torch
    torch = None
    _torch_error = str(e)


def median_seconds(reps, fn):
    fn()
    times = []
    for _ in range(reps):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def cuda_median_ms(reps, fn):
    """Median milliseconds of reps runs of fn after one warm-up, timed with CUDA events."""
    fn()
    torch.cuda.synchronize()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    times = []
    for _ in range(reps):
        start.record()
        fn()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end))
    return statistics.median(times)


def forced_backend(name):
    """A context that limits SDPA to one backend ("cudnn", "flash"), or nothing for "auto"."""
    import contextlib
    if name == "auto":
        return contextlib.nullcontext()
    from torch.nn.attention import SDPBackend, sdpa_kernel
    return sdpa_kernel({"cudnn": SDPBackend.CUDNN_ATTENTION,
                        "flash": SDPBackend.FLASH_ATTENTION}[name])


def gpu_main(args):
    if torch is None:
        print(json.dumps({"skipped": "torch cannot be imported (%s)" % _torch_error}), flush=True)
        return
    if not torch.cuda.is_available():
        print(json.dumps({"skipped": "torch %s sees no CUDA device" % torch.__version__}),
              flush=True)
        return
    dev = torch.device(args.device if ":" in args.device else "cuda:0")
    torch.manual_seed(0)
    backends = [name for name, on in (
        ("flash", torch.backends.cuda.flash_sdp_enabled()),
        ("cudnn", getattr(torch.backends.cuda, "cudnn_sdp_enabled", lambda: False)()),
        ("efficient", torch.backends.cuda.mem_efficient_sdp_enabled()),
        ("math", torch.backends.cuda.math_sdp_enabled())) if on]
    for spec in args.shapes:
        t, hq, hkv, d = (int(x) for x in spec.split(":"))
        q = torch.randn(1, hq, t, d, device=dev, dtype=torch.bfloat16)
        # GQA as the kv heads repeated to Hq before the timing: every SDPA backend takes that
        # (enable_gqa is not supported by all of them), the same FLOPs as ours.
        k = torch.randn(1, hkv, t, d, device=dev, dtype=torch.bfloat16).repeat_interleave(
            hq // hkv, dim=1)
        v = torch.randn(1, hkv, t, d, device=dev, dtype=torch.bfloat16).repeat_interleave(
            hq // hkv, dim=1)
        dout = torch.randn(1, hq, t, d, device=dev, dtype=torch.bfloat16)

        def fwd():
            with torch.no_grad():
                return F.scaled_dot_product_attention(q, k, v, is_causal=True)

        def both():
            ql, kl, vl = (x.detach().requires_grad_() for x in (q, k, v))
            F.scaled_dot_product_attention(ql, kl, vl, is_causal=True).backward(dout)

        # --sdpa-backend cudnn: torch's cuDNN SDPA only (the yardstick); where it refuses
        # the shape, torch's own choice, and the line says so.
        used = args.sdpa_backend
        try:
            with forced_backend(used):
                fwd_ms = cuda_median_ms(args.reps, fwd)
                bwd_ms = max(cuda_median_ms(args.reps, both) - fwd_ms, 1e-6)
        except Exception as first:
            try:
                used = "auto (%s refused: %s)" % (used, str(first).splitlines()[0][:120])
                fwd_ms = cuda_median_ms(args.reps, fwd)
                bwd_ms = max(cuda_median_ms(args.reps, both) - fwd_ms, 1e-6)
            except Exception as e:  # out of memory, an unsupported shape: reported, no traceback
                print(json.dumps({"T": t, "hq": hq, "hkv": hkv, "d": d,
                                  "error": "%s: %s" % (type(e).__name__, e)}), flush=True)
                continue
        print(json.dumps({"T": t, "hq": hq, "hkv": hkv, "d": d, "fwd_ms": fwd_ms,
                          "bwd_ms": bwd_ms, "torch": torch.__version__,
                          "device": torch.cuda.get_device_name(dev),
                          "sdpa_backend": used, "sdpa_backends": backends}), flush=True)
        del q, k, v, dout
        torch.cuda.empty_cache()


def main():
    p = argparse.ArgumentParser()
    p.add_argument("ours", nargs="?", help="bench_ops_cpu's output (CPU mode)")
    p.add_argument("--reps", type=int, default=5)
    p.add_argument("--threads", type=int, default=0, help="torch threads (0: torch's default)")
    p.add_argument("--device", default="cpu", help="cpu (compare with OURS) or cuda[:N]")
    p.add_argument("--shapes", nargs="*", default=[], help="GPU mode: T:HQ:HKV:D per shape")
    p.add_argument("--sdpa-backend", default="auto", choices=["auto", "cudnn", "flash"],
                   help="GPU mode: the SDPA backend torch may use (auto: torch's choice)")
    args = p.parse_args()
    if args.device.startswith("cuda"):
        gpu_main(args)
        return
    if args.ours is None:
        p.error("OURS_OUTPUT is needed on the CPU")
    if torch is None:
        sys.exit("torch cannot be imported: " + _torch_error)
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
            shape = "%dx%d tok, Hq%d Hkv%d D%d" % (docs, length, hq, hkv, d)
            print("%-4s %-30s %10.1f %10.1f %10.1f %10.1f %7.2f" % (
                kind, shape, t_ours * 1e3, t_torch * 1e3, f / t_ours / 1e9, f / t_torch / 1e9,
                ratio))
            records.emit("bench_ops_cpu.sh", "attention %s causal %s vs torch SDPA" % (kind, shape),
                         1, "cpu", "GFLOPs", f / t_ours / 1e9, f / t_torch / 1e9)
    print("attention vs torch SDPA, worst ratio: %.2f (target >= 1.0); torch %s, %d threads"
          % (worst, torch.__version__, torch.get_num_threads()))


if __name__ == "__main__":
    main()
