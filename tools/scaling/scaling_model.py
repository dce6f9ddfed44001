#!/usr/bin/env python3
"""The scaling model: step time, exposed communication and MFU of a training step on N nodes for
a (dp_replicate, dp_shard, tp) layout, from per-GPU compute and collective bandwidths.

    scaling_model.py predict [--hardware mn5|jupiter] [--model qwen3-vl-8b|qwen3.5-9b] [--seq S]
                             [--micro-batches M] [--nodes 1,2,4,...] [--markdown]
    scaling_model.py validate RECORDS.jsonl [--markdown]   (tools/scaling/validate_cpu.sh)

The step of one GPU (what vlmtrain's FSDP / HSDP / DDP and tensor parallelism issue, parallel/):
  compute    M micro-batches of S tokens: FLOPs per token x S x M x (4/3 with full activation
             checkpointing) / tp, at peak x compute efficiency;
  FSDP       per micro-batch: every unit all-gathered for the forward, the blocks again for the
             backward (reshard after forward), the gradients reduce-scattered in f32 (units: one
             per decoder layer, the embedding and an untied head each their own, the vision tower
             as blocks); dp_replicate > 1: one all-reduce of the f32 gradient shard per step;
  TP         per micro-batch: two activation all-reduces per layer forward and two backward
             (sequence parallelism turns each into an all-gather + reduce-scatter: the same
             bytes), the embedding's and the loss's;
  exposed    the TP collectives, and what the data-parallel ones do not hide behind compute:
             max(0, dp - overlap x compute).
A collective of B bytes over n ranks takes latency + f x B / busbw, f = (n-1)/n for all-gather and
reduce-scatter and 2(n-1)/n for all-reduce (nccl-tests' bus bandwidth); busbw is the NVLink
figure inside a node, else min(NVLink, GPUs of the group per node x NIC rate x efficiency). Ranks
are numbered tp innermost, then dp_shard, then dp_replicate, as parallel/comm/mesh.h does.

The figures of each machine are in hardware.json with their sources; the model shapes in
models.json. `validate` runs the same step model with the CPU's measured compute (one rank) and
measured collective times (bench_collectives) and compares it with measured multi-rank steps
(bench_fsdp_step). Standard library only.
"""
import argparse
import json
import math
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
GB = 1e9


# --- model shapes ------------------------------------------------------------------------------

def layer_matmul_params(m, kind):
    """GEMM weight elements of one decoder layer of `kind` (attention, gated_attention, gdn)."""
    h, i = m["hidden"], m["ffn"]
    mlp = 3 * h * i
    if kind in ("attention", "gated_attention"):
        q_out = m["heads"] * m["head_dim"] * (2 if kind == "gated_attention" else 1)
        kv = 2 * m["kv_heads"] * m["head_dim"]
        return h * (q_out + kv) + m["heads"] * m["head_dim"] * h + mlp
    g = m["gdn"]  # in_proj_qkv, in_proj_z, in_proj_b, in_proj_a, out_proj
    return h * (2 * g["key_dim"] + g["value_dim"]) + h * g["value_dim"] + 2 * h * g["value_heads"] \
        + g["value_dim"] * h + mlp


def layer_params(m, kind):
    """All parameters of a layer: GEMMs, norms (and the GDN's conv, gates and norm)."""
    n = layer_matmul_params(m, kind) + 2 * m["hidden"]
    if kind in ("attention", "gated_attention"):
        return n + 2 * m["head_dim"]
    g = m["gdn"]
    return n + g["conv"] * (2 * g["key_dim"] + g["value_dim"]) + 2 * g["value_heads"] + g["dv"]


def layer_kinds(m):
    return [k for k, count in m["layers"].items() for _ in range(count)]


def param_counts(m):
    """(per-layer params, embedding, head (0 if tied), vision) in elements."""
    embed = m["vocab"] * m["hidden"]
    head = 0 if m["tied"] else embed
    return [layer_params(m, k) for k in layer_kinds(m)], embed, head, m.get("vision_params", 0)


def flops_per_token(m, doc_len):
    """Training FLOPs per text token (docs/qwen-models.md section 7): 6 x GEMM weights (the head
    counted even when tied), causal attention 6 x Hq x D x (S + 1) per softmax layer for documents
    of doc_len tokens, the GDN recurrence's minimal count 18 x HV x dk x dv."""
    f = 6.0 * (sum(layer_matmul_params(m, k) for k in layer_kinds(m)) + m["vocab"] * m["hidden"])
    for k in layer_kinds(m):
        if k == "gdn":
            g = m["gdn"]
            f += 18.0 * g["value_heads"] * g["dk"] * g["dv"]
        else:
            f += 6.0 * m["heads"] * m["head_dim"] * (doc_len + 1)
    return f


# --- layouts and groups ------------------------------------------------------------------------

def group_placement(layout, gpus_per_node, which):
    """(size, nodes spanned, members per node) of rank 0's `which` group (tp, shard, replicate)."""
    r, s, t = layout
    size, stride = {"tp": (t, 1), "shard": (s, t), "replicate": (r, s * t)}[which]
    nodes = {(i * stride) // gpus_per_node for i in range(size)}
    return size, len(nodes), size // len(nodes)


class Network:
    """Collective times on a GPU cluster, from the figures of hardware.json."""

    def __init__(self, hw):
        self.hw = hw

    def busbw(self, nodes, per_node):
        intra = self.hw["intra_node_busbw_gbps"] * GB
        if nodes == 1:
            return intra
        return min(intra, per_node * self.hw["nic_gbps_per_gpu"] * self.hw["nic_efficiency"] * GB)

    def time(self, kind, nbytes, size, nodes, per_node):
        if size <= 1:
            return 0.0
        f = (2.0 if kind == "all_reduce" else 1.0) * (size - 1) / size
        lat = self.hw["latency_us"]["intra" if nodes == 1 else "inter"] * 1e-6
        return lat + f * nbytes / self.busbw(nodes, per_node)


def step_collectives(m, layout, seq, micro_batches, param_bytes, grad_bytes, act_bytes):
    """The collectives of one step of one rank: [(group, kind, bytes of one, count,
    data_parallel)] (an FSDP unit's bytes: the mean unit's)."""
    r, s, t = layout
    layers, embed, head, vision = param_counts(m)
    blocks = sum(layers) + vision  # block units (decoder layers, vision blocks)
    vision_units = m.get("vision_blocks", 0)
    root = embed + head + m["hidden"]
    units = len(layers) + vision_units + (2 if head else 1)
    out = []
    if s > 1:  # FSDP: gathers and reduce-scatters of each unit, every micro-batch
        last = layers[-1]
        for kind, elems, count, nbytes in (
                ("all_gather", blocks + root, units, param_bytes),          # forward
                ("all_gather", blocks - last, len(layers) - 1 + vision_units, param_bytes),
                ("reduce_scatter", blocks + root, units, grad_bytes)):
            out.append(("shard", kind, elems / t * nbytes / count, count * micro_batches, True))
    if r > 1:  # replicas (HSDP, or DDP with dp_shard 1): each unit's f32 gradient shard, per step
        out.append(("replicate", "all_reduce", (blocks + root) / (t * s) * grad_bytes / units,
                    units, True))
    if t > 1:  # tensor parallelism: activations, every micro-batch
        n_act = 4 * len(layers) + 1
        out.append(("tp", "all_reduce", seq * m["hidden"] * act_bytes, n_act * micro_batches,
                    False))
        out.append(("tp", "all_reduce", seq * m["hidden"] * 4, micro_batches, False))  # loss
    return out


def comm_seconds(colls, layout, gpus_per_node, time_fn):
    """(data-parallel, tensor-parallel) seconds of the collectives; time_fn(kind, bytes, group
    size, nodes spanned, members per node) is one collective's time."""
    dp = tp = 0.0
    for group, kind, nbytes, count, data_parallel in colls:
        size, nodes, per_node = group_placement(layout, gpus_per_node, group)
        one = time_fn(kind, nbytes, size, nodes, per_node)
        if data_parallel:
            dp += one * count
        else:
            tp += one * count
    return dp, tp


def memory_gb(m, layout, seq, ac):
    """Rough per-GPU memory: bf16 params + f32 master, AdamW moments and gradient, sharded over
    dp_shard x tp; two gathered units and the root units whole (/tp); activations per micro-batch
    (34 bytes per hidden element and layer without checkpointing, Megatron's count with a fused
    attention; with full checkpointing the layers' inputs and one layer's)."""
    r, s, t = layout
    layers, embed, head, vision = param_counts(m)
    total = sum(layers) + embed + head + vision
    state = total * (2 + 4 + 8 + 4) / (s * t)
    gathered = (2 * max(layers) + embed + head) * 2 / t
    per_layer = 34.0 * seq * m["hidden"] / t
    act = len(layers) * per_layer if ac == "none" else len(layers) * 2.0 * seq * m["hidden"] + per_layer
    return (state + gathered + act) / GB


# --- predictions for the clusters --------------------------------------------------------------

def fitting_ac(m, hw, layout, seq):
    """The cheapest activation checkpointing ("none", then "full") whose memory fits in 90% of
    the GPU's, or None."""
    return next((a for a in ("none", "full")
                 if memory_gb(m, layout, seq, a) <= 0.9 * hw["memory_gb"]), None)


def predict(m, hw, layout, seq, micro_batches, doc_len, ac):
    """One step on the cluster with activation checkpointing `ac`: a dict of times (s), tokens/s
    per GPU, MFU and memory."""
    g = hw["gpus_per_node"]
    f_tok = flops_per_token(m, doc_len)
    r, s, t = layout
    recompute = 4.0 / 3.0 if ac == "full" else 1.0
    compute = f_tok * seq * micro_batches * recompute / t / (hw["peak_tflops"] * 1e12 *
                                                              hw["compute_efficiency"])
    colls = step_collectives(m, layout, seq, micro_batches, 2, 4, 2)
    dp, tp = comm_seconds(colls, layout, g, Network(hw).time)
    exposed = tp + max(0.0, dp - hw["overlap"] * compute)
    step = compute + exposed
    tok_s_gpu = seq * micro_batches / t / step
    return {"ac": ac, "compute": compute, "dp_comm": dp, "tp_comm": tp, "exposed": exposed,
            "step": step, "tokens_per_s_gpu": tok_s_gpu,
            "mfu": f_tok * tok_s_gpu / (hw["peak_tflops"] * 1e12),
            "memory_gb": memory_gb(m, layout, seq, ac)}


def layouts_for(nodes, g, family, tp):
    world = nodes * g
    if family == "fsdp":
        return (1, world // tp, tp)
    if family == "hsdp":  # shard inside a node, replicate across nodes
        return (nodes, g // tp, tp)
    raise ValueError(family)


def cmd_predict(args):
    hardware = json.load(open(os.path.join(HERE, "hardware.json")))
    models = json.load(open(os.path.join(HERE, "models.json")))
    hws = [args.hardware] if args.hardware else ["mn5", "jupiter"]
    ms = [args.model] if args.model else ["qwen3-vl-8b", "qwen3.5-9b"]
    nodes_list = [int(x) for x in args.nodes.split(",")]
    rows = []
    for hname in hws:
        hw = dict(hardware[hname])
        if args.overlap is not None:
            hw["overlap"] = args.overlap
        if args.compute_efficiency is not None:
            hw["compute_efficiency"] = args.compute_efficiency
        for mname in ms:
            m = models[mname]
            for family in ("fsdp", "hsdp"):
                for tp in (1, 2, 4):
                    # One checkpointing mode per row: what the smallest job that fits needs
                    # (sharding over more GPUs only frees memory), so that the efficiency
                    # compares the same step.
                    g = hw["gpus_per_node"]
                    fits = [(n, fitting_ac(m, hw, layouts_for(n, g, family, tp), args.seq))
                            for n in nodes_list]
                    ac = next((a for _, a in fits if a), None)
                    ac = "full" if any(a == "full" for _, a in fits) else ac
                    base = None
                    for n in nodes_list:
                        layout = layouts_for(n, g, family, tp)
                        fit = fitting_ac(m, hw, layout, args.seq)
                        p = (predict(m, hw, layout, args.seq, args.micro_batches, args.doc_len, ac)
                             if fit else None)
                        if p and base is None:
                            base = p["tokens_per_s_gpu"]
                        rec = {"hardware": hname, "model": mname, "family": family, "nodes": n,
                               "layout": list(layout), "prediction": p,
                               "scaling_efficiency": p["tokens_per_s_gpu"] / base if p else None}
                        rows.append(rec)
    if args.json:
        for r in rows:
            print(json.dumps(r))
        return
    print_predictions(rows, nodes_list, hardware, models, args)


def print_predictions(rows, nodes_list, hardware, models, args):
    key = lambda r: (r["hardware"], r["model"])
    seen = []
    for r in rows:
        if key(r) not in seen:
            seen.append(key(r))
    for hname, mname in seen:
        hw, m = hardware[hname], models[mname]
        print(f"\n### {m['name']} on {hw['name']} (modelled)\n")
        print(f"seq {args.seq}, {args.micro_batches} micro-batches per step, documents of "
              f"{args.doc_len} tokens; {flops_per_token(m, args.doc_len) / 1e9:.1f} GFLOP per "
              f"token. Cell: MFU % / weak-scaling efficiency % against 1 node (AC mode when "
              f"checkpointing is needed to fit).\n")
        print("| layout | " + " | ".join(f"{n} node{'s' if n > 1 else ''}" for n in nodes_list) + " |")
        print("|---|" + "---|" * len(nodes_list))
        sel = [r for r in rows if key(r) == (hname, mname)]
        for family in ("fsdp", "hsdp"):
            for tp in (1, 2, 4):
                cells = []
                for n in nodes_list:
                    r = next(x for x in sel if x["family"] == family and x["nodes"] == n and
                             x["layout"][2] == tp)
                    p = r["prediction"]
                    if p is None:
                        cells.append("does not fit")
                    else:
                        cells.append(f"{100 * p['mfu']:.0f} / {100 * r['scaling_efficiency']:.0f}"
                                     + (" (AC)" if p["ac"] == "full" else ""))
                name = {"fsdp": "FSDP", "hsdp": "HSDP (shard in node)"}[family]
                print(f"| {name}, tp {tp} | " + " | ".join(cells) + " |")
        big = nodes_list[-1]
        print(f"\nAt {big} nodes (seconds per step: compute, data-parallel collectives, TP "
              f"collectives, exposed; GB per GPU):\n")
        print("| layout | compute | DP comm | TP comm | exposed | step | tok/s/GPU | GB |")
        print("|---|---|---|---|---|---|---|---|")
        for r in sel:
            p = r["prediction"]
            if r["nodes"] != big or p is None:
                continue
            rr, ss, tt = r["layout"]
            print(f"| {r['family']} ({rr}, {ss}, {tt}) | {p['compute']:.2f} | {p['dp_comm']:.2f} | "
                  f"{p['tp_comm']:.2f} | {p['exposed']:.2f} | {p['step']:.2f} | "
                  f"{p['tokens_per_s_gpu']:.0f} | {p['memory_gb']:.0f} |")


# --- validation on the CPU ---------------------------------------------------------------------

def read_records(path):
    out = []
    with open(path) as f:
        for n, line in enumerate(f, 1):
            line = line.strip()
            if not line:
                continue
            try:
                out.append(json.loads(line))
            except json.JSONDecodeError as e:
                sys.exit(f"{path}:{n}: not a JSON record: {e}")
    return out


class MeasuredCollectives:
    """Collective times from bench_collectives records (ours, per kind, ranks and bytes),
    interpolated log-log in the message size, extrapolated at the end's bandwidth."""

    def __init__(self, records):
        self.curves = {}
        for r in records:
            if r["benchmark"] != "bench_collectives" or r["metric"] != "time_us":
                continue
            kind, nbytes = r["case"].split()[0], int(r["case"].split()[1])
            ranks = int(r["mesh"].split()[0])
            self.curves.setdefault((kind, ranks), []).append((nbytes, r["value"] * 1e-6))
        for c in self.curves.values():
            c.sort()

    def time(self, kind, nbytes, size):
        c = self.curves.get((kind, size))
        if c is None:
            sys.exit(f"validate: no bench_collectives records of {kind} on {size} ranks")
        if nbytes <= c[0][0]:
            return c[0][1]
        for (b0, t0), (b1, t1) in zip(c, c[1:]):
            if nbytes <= b1:
                w = math.log(nbytes / b0) / math.log(b1 / b0)
                return math.exp(math.log(t0) + w * (math.log(t1) - math.log(t0)))
        b0, t0 = c[-1]
        return t0 * nbytes / b0


def cpu_time_fn(coll, n, cores):
    """One collective's time in a job of n single-threaded ranks on `cores` cores: a group of the
    whole job takes its measured time; a smaller group runs beside the others, so its curve (from
    a job of its size) is slowed as the cores are shared."""
    oversub = max(1.0, n / cores)

    def time_fn(kind, nbytes, size, nodes, per_node):
        t = coll.time(kind, nbytes, size)
        return t * oversub / max(1.0, size / cores) if size < n else t
    return time_fn


# Bytes the optimizer step moves per f32 parameter it holds: AdamW reads the parameter, its
# gradient and both moments and writes the parameter and the moments (28), the gradient norm
# reads the gradient (4) and zeroing writes it (4).
OPTIMIZER_BYTES_PER_PARAM = 36


def predict_cpu_step(m, layout, seq, compute1, flop_seconds, param_seconds, coll, cores):
    """(compute, data-parallel comm, TP comm) seconds of bench_fsdp_step's step (f32, one
    micro-batch, blocking MPI collectives: no overlap). The one-rank compute splits into three
    measured parts: the model FLOPs at the GEMM rate (flop_seconds), which tensor parallelism
    divides by tp; the optimizer's pass over the parameters at the copy bandwidth
    (param_seconds), which the rank's share of the parameters sets (divided by dp_shard x tp);
    the rest (norms, residuals, the loss's elementwise work), which every rank repeats. A job of
    more single-threaded ranks than cores runs that much slower."""
    r, s, t = layout
    n = r * s * t
    flop_seconds = min(flop_seconds, compute1)
    param_seconds = min(param_seconds, compute1 - flop_seconds)
    rest = compute1 - flop_seconds - param_seconds
    compute = (flop_seconds / t + param_seconds / (s * t) + rest) * max(1.0, n / cores)
    colls = step_collectives(m, layout, seq, 1, 4, 4, 4)
    dp, tp = comm_seconds(colls, layout, n, cpu_time_fn(coll, n, cores))
    return compute, dp, tp


def cmd_validate(args):
    records = read_records(args.records)
    coll = MeasuredCollectives(records)
    steps = [r for r in records if r["benchmark"] == "bench_fsdp_step" and r["metric"] == "step_ms"]
    if not steps:
        sys.exit("validate: no bench_fsdp_step step_ms records")
    m = {"hidden": args.hidden, "ffn": args.ffn, "heads": args.heads, "kv_heads": args.kv_heads,
         "head_dim": args.head_dim, "vocab": args.vocab, "tied": False,
         "layers": {"attention": args.layers}, "vision_params": 0}
    single = [r for r in steps if r["mesh"].startswith("1 ranks")]
    if not single:
        sys.exit("validate: no one-rank bench_fsdp_step record (the measured compute)")
    compute1 = single[0]["value"] * 1e-3
    gemm = [r["value"] for r in records
            if r["benchmark"] == "bench_ops_cpu" and r["case"].startswith("linear f32")]
    if not gemm:
        sys.exit("validate: no bench_ops_cpu linear f32 record (the measured GEMM rate)")
    gemm_rate = max(gemm) * 1e9
    copy = [r["reference"] for r in records
            if r["benchmark"] == "bench_ops_cpu" and r["case"].startswith("rms_norm")
            and r["metric"] == "GBps"]
    if not copy:
        sys.exit("validate: no bench_ops_cpu rms_norm record (the copy bandwidth, its reference)")
    copy_rate = min(copy) * 1e9  # the largest buffers' (memory, not cache)
    # bench_fsdp_step's row: 4 documents of seq / 4 tokens.
    flop_seconds = flops_per_token(m, args.seq // 4) * args.seq / gemm_rate
    layers, embed, head, vision = param_counts(m)
    params = sum(layers) + embed + head + vision
    param_seconds = params * OPTIMIZER_BYTES_PER_PARAM / copy_rate
    cores = args.cores
    rows = []
    for r in steps:
        shape = r["mesh"].split(": ")[1].split(" x ")  # dp_replicate R, dp_shard S, tp T
        layout = tuple(int(x.split()[-1]) for x in shape)
        compute, dp, tp = predict_cpu_step(m, layout, args.seq, compute1, flop_seconds,
                                           param_seconds, coll, cores)
        predicted = compute + tp + dp
        measured = r["value"] * 1e-3
        rows.append((r["mesh"], r["case"].split("--layout ")[-1], measured, predicted, compute,
                     dp + tp))
    if args.json:  # one line per step, for `vlmtrain report --records`
        for mesh, lay, meas, pred, comp, comm in rows:
            print(json.dumps({"validation": {"mesh": mesh, "layout": lay, "measured_ms": meas * 1e3,
                                             "predicted_ms": pred * 1e3,
                                             "input": mesh.startswith("1 ranks")}}))
        return 0
    print("| ranks, layout | --layout | measured ms | predicted ms | (compute + comm) | "
          "predicted / measured |")
    print("|---|---|---|---|---|---|")
    worst = 0.0
    for mesh, lay, meas, pred, comp, comm in rows:
        ratio = pred / meas
        one_rank = mesh.startswith("1 ranks")  # the measured input, not a prediction
        if not one_rank:
            worst = max(worst, abs(ratio - 1))
        print(f"| {mesh} | {lay} | {meas * 1e3:.1f} | {pred * 1e3:.1f} | "
              f"({comp * 1e3:.1f} + {comm * 1e3:.1f}) | "
              f"{'(the input)' if one_rank else f'{ratio:.2f}'} |")
    print(f"\none rank: {compute1 * 1e3:.1f} ms, of which {flop_seconds * 1e3:.1f} ms the model's "
          f"{flops_per_token(m, args.seq // 4) * args.seq / 1e9:.2f} GFLOP at the measured "
          f"{gemm_rate / 1e9:.1f} GFLOP/s (bench_ops_cpu, linear f32) and "
          f"{param_seconds * 1e3:.1f} ms the optimizer's {params / 1e6:.2f}M parameters x "
          f"{OPTIMIZER_BYTES_PER_PARAM} bytes at the measured copy rate {copy_rate / 1e9:.1f} "
          f"GB/s (bench_ops_cpu's rms_norm reference); {cores} cores")
    print(f"\nworst |predicted / measured - 1|: {100 * worst:.1f}% (bound {100 * args.bound:.0f}%)")
    return 0 if worst <= args.bound else 1


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = p.add_subparsers(dest="cmd", required=True)
    a = sub.add_parser("predict", help="tables for the clusters")
    a.add_argument("--hardware", choices=["mn5", "jupiter"])
    a.add_argument("--model", choices=["qwen3-vl-8b", "qwen3.5-9b", "qwen3-8b"])
    a.add_argument("--seq", type=int, default=8192)
    a.add_argument("--micro-batches", type=int, default=2)
    a.add_argument("--doc-len", type=int, default=2048, help="mean document length (attention)")
    a.add_argument("--nodes", default="1,2,4,8,16,32,64")
    a.add_argument("--json", action="store_true", help="one JSON line per prediction")
    a.add_argument("--overlap", type=float, help="override hardware.json's overlap")
    a.add_argument("--compute-efficiency", type=float,
                   help="override hardware.json's compute_efficiency (a measured MFU of one GPU)")
    b = sub.add_parser("validate", help="predicted vs measured CPU steps")
    b.add_argument("records")
    b.add_argument("--cores", type=int, default=os.cpu_count())
    b.add_argument("--bound", type=float, default=0.2)
    b.add_argument("--seq", type=int, default=512)
    b.add_argument("--json", action="store_true", help="one JSON line per step (for report)")
    for name, default in (("hidden", 256), ("layers", 4), ("heads", 4), ("kv-heads", 2),
                          ("head-dim", 64), ("ffn", 768), ("vocab", 8192)):
        b.add_argument("--" + name, type=int, default=default)
    args = p.parse_args()
    if args.cmd == "predict":
        cmd_predict(args)
        return 0
    return cmd_validate(args)


if __name__ == "__main__":
    sys.exit(main())
