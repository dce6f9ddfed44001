"""The scaling model's counts and formulas (tools/scaling/scaling_model.py) against independent
figures: FLOPs per token and parameter counts from docs/qwen-models.md (sections 3 and 7), the rank
placement of parallel/comm/mesh.h (tp innermost), nccl-tests' bus-bandwidth factors, and a records file
whose steps are made from its own collective times. Standard library only."""
import json
import os
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(ROOT, "tools", "scaling"))
import scaling_model as sm  # noqa: E402

MODELS = json.load(open(os.path.join(ROOT, "tools", "scaling", "models.json")))
HARDWARE = json.load(open(os.path.join(ROOT, "tools", "scaling", "hardware.json")))
failures = []


def check(ok, what):
    print(("ok    " if ok else "FAIL  ") + what)
    if not ok:
        failures.append(what)


def close(a, b, rel):
    return abs(a - b) <= rel * abs(b)


# docs/qwen-models.md section 7: training GFLOP per token at S = 4096.
f = sm.flops_per_token(MODELS["qwen3-8b"], 4096) / 1e9
check(close(f, 49.03, 5e-4), f"Qwen3-8B: {f:.3f} GFLOP per token (docs: 49.03)")
f = sm.flops_per_token(MODELS["qwen3.5-9b"], 4096) / 1e9
check(close(f, 47.61 + 0.81 + 0.23, 5e-4), f"Qwen3.5-9B: {f:.3f} GFLOP per token (docs: 48.65)")
# Parameters: Qwen3-8B 8.191 B (section 1), Qwen3.5-9B text 8.954 B (section 3).
for name, want in (("qwen3-8b", 8.191e9), ("qwen3.5-9b", 8.954e9)):
    layers, embed, head, _ = sm.param_counts(MODELS[name])
    n = sum(layers) + embed + head
    check(close(n, want, 5e-4), f"{name}: {n / 1e9:.3f} B parameters (docs: {want / 1e9:.3f})")

# Rank placement on 4 GPUs per node: (dp_replicate, dp_shard, tp), tp innermost.
check(sm.group_placement((1, 16, 4), 4, "tp") == (4, 1, 4), "tp 4 fills one node")
check(sm.group_placement((1, 16, 4), 4, "shard") == (16, 16, 1),
      "dp_shard 16 beside tp 4: one GPU on each of 16 nodes")
check(sm.group_placement((1, 8, 2), 4, "shard") == (8, 4, 2), "dp_shard 8 beside tp 2: 2 per node")
check(sm.group_placement((4, 4, 1), 4, "replicate") == (4, 4, 1), "HSDP replicas: one per node")
check(sm.group_placement((4, 4, 1), 4, "shard") == (4, 1, 4), "HSDP shards: inside a node")

# One collective: latency + factor x bytes / busbw, factor (n-1)/n or 2(n-1)/n (nccl-tests).
hw = HARDWARE["mn5"]
net = sm.Network(hw)
b = 1e9
t = net.time("all_reduce", b, 4, 1, 4)
want = hw["latency_us"]["intra"] * 1e-6 + 1.5 * b / (hw["intra_node_busbw_gbps"] * 1e9)
check(close(t, want, 1e-12), "all-reduce in a node: NVLink bus bandwidth, factor 2(n-1)/n")
t = net.time("all_gather", b, 16, 16, 1)
want = hw["latency_us"]["inter"] * 1e-6 + (15 / 16) * b / (25e9 * hw["nic_efficiency"])
check(close(t, want, 1e-12), "all-gather over 16 nodes, one GPU each: one NIC's rate")
check(net.time("all_reduce", b, 1, 1, 1) == 0.0, "a group of one: no time")

# validate: steps made of the model's own parts are predicted exactly.
m = {"hidden": 64, "ffn": 128, "heads": 4, "kv_heads": 2, "head_dim": 16, "vocab": 512,
     "tied": False, "layers": {"attention": 2}, "vision_params": 0}
recs = []
for kind in ("all_gather", "reduce_scatter", "all_reduce"):
    for ranks in (2, 4):
        for nbytes in (4096, 1 << 20, 16 << 20):
            recs.append({"benchmark": "bench_collectives", "case": f"{kind} {nbytes} bytes",
                         "mesh": f"{ranks} ranks", "metric": "time_us",
                         "value": 10 + nbytes / 1e3 * ranks})
coll = sm.MeasuredCollectives(recs)
compute1 = 0.050
gemm_gflops = 50.0
flop_s = sm.flops_per_token(m, 32 // 4) * 32 / (gemm_gflops * 1e9)
copy_gbps = 20.0
layers, embed, head, _ = sm.param_counts(m)
param_s = (sum(layers) + embed + head) * sm.OPTIMIZER_BYTES_PER_PARAM / (copy_gbps * 1e9)


def step_ms(layout):
    return 1e3 * sum(sm.predict_cpu_step(m, layout, 32, compute1, flop_s, param_s, coll, 2))


recs.append({"benchmark": "bench_ops_cpu", "case": "linear f32 x[512,512] w[1536,512]",
             "metric": "GFLOPs", "mesh": "1", "value": gemm_gflops})
recs.append({"benchmark": "bench_ops_cpu", "case": "rms_norm fwd f32 x[1024,4096]",
             "metric": "GBps", "mesh": "1", "value": 15.0, "reference": copy_gbps})
recs.append({"benchmark": "bench_fsdp_step", "case": "x, --layout fsdp", "metric": "step_ms",
             "mesh": "1 ranks: dp_replicate 1 x dp_shard 1 x tp 1", "value": 1e3 * compute1})
for layout in ((1, 2, 1), (1, 4, 1), (2, 2, 1), (1, 2, 2)):
    n = layout[0] * layout[1] * layout[2]
    mesh = f"{n} ranks: dp_replicate {layout[0]} x dp_shard {layout[1]} x tp {layout[2]}"
    recs.append({"benchmark": "bench_fsdp_step", "case": "x, --layout fsdp", "metric": "step_ms",
                 "mesh": mesh, "value": step_ms(layout)})
with tempfile.NamedTemporaryFile("w", suffix=".jsonl", delete=False) as tmp:
    tmp.write("\n".join(json.dumps(r) for r in recs) + "\n")
cmd = [sys.executable, os.path.join(ROOT, "tools", "scaling", "scaling_model.py"), "validate",
       tmp.name, "--cores", "2", "--seq", "32", "--hidden", "64", "--layers", "2", "--heads", "4",
       "--kv-heads", "2", "--head-dim", "16", "--ffn", "128", "--vocab", "512", "--bound", "1e-9"]
r = subprocess.run(cmd, capture_output=True, text=True)
check(r.returncode == 0,
      "validate: reads the records (meshes, GEMM and copy rates, collectives) back to the steps made from them")
if r.returncode != 0:
    print(r.stdout + r.stderr)
recs[-1]["value"] *= 1.3
with open(tmp.name, "w") as f2:
    f2.write("\n".join(json.dumps(x) for x in recs) + "\n")
r = subprocess.run(cmd[:-1] + ["0.2"], capture_output=True, text=True)
check(r.returncode == 1 and "worst" in r.stdout, "validate: a step 30% off fails the 20% bound")
os.unlink(tmp.name)

# predict runs for both clusters and models and prints both tables.
r = subprocess.run([sys.executable, os.path.join(ROOT, "tools", "scaling", "scaling_model.py"),
                    "predict", "--nodes", "1,4,64"], capture_output=True, text=True)
check(r.returncode == 0 and r.stdout.count("(modelled)") == 4,
      "predict: tables for Qwen3-VL-8B and Qwen3.5-9B on both clusters")
sys.exit(1 if failures else 0)
