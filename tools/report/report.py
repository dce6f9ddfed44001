#!/usr/bin/env python3
"""PNG plots of training runs and benchmark records (`vlmtrain report` runs this).

    report.py RUN_OR_METRICS... [--records FILE.jsonl ...] [--out DIR]

RUN_OR_METRICS: a run's output_dir (its metrics.jsonl) or a metrics.jsonl; several runs are
drawn over each other, named by their folders. Writes to DIR (default: report/ in the current
folder):
  training.png   loss (and eval loss), learning rate, gradient norm, tokens/s, MFU and peak
                 memory against the step, one panel each;
  loss.png       the loss panel alone;
  scaling.png    with --records: bench_fsdp_step's measured step time per layout against the
                 ranks; with `scaling_model.py validate --json` lines, the model's predicted step
                 against the measured one; with `scaling_model.py predict --json` lines, the
                 modelled MFU against the nodes for each cluster and model.
Uses matplotlib (Debian's python3-matplotlib), with no display (the Agg backend).
"""
import argparse
import json
import os
import sys

try:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
except ImportError:
    sys.exit("report: matplotlib is not importable by " + sys.executable +
             " (apt-get install python3-matplotlib; tools/deps/install_deps.sh installs it)")


def read_jsonl(path):
    rows = []
    with open(path) as f:
        for n, line in enumerate(f, 1):
            line = line.strip()
            if line:
                try:
                    rows.append(json.loads(line))
                except json.JSONDecodeError as e:
                    sys.exit(f"report: {path}:{n}: not a JSON line: {e}")
    return rows


def load_run(arg):
    path = os.path.join(arg, "metrics.jsonl") if os.path.isdir(arg) else arg
    if not os.path.isfile(path):
        sys.exit(f"report: {arg}: no metrics.jsonl there (a run's output_dir or the file itself)")
    rows = read_jsonl(path)
    steps = [r for r in rows if "loss" in r and not r.get("skipped")]
    evals = [r for r in rows if "eval_loss" in r]
    if not steps:
        sys.exit(f"report: {path}: no step records")
    name = os.path.basename(os.path.dirname(os.path.abspath(path))) or path
    return name, steps, evals


def series(steps, key):
    """(steps, values) of a numeric field; the first group's value for {"llm": ...} fields."""
    xs, ys = [], []
    for r in steps:
        v = r.get(key)
        if isinstance(v, dict):
            v = next(iter(v.values()), None)
        if isinstance(v, (int, float)):
            xs.append(r["step"])
            ys.append(v)
    return xs, ys


PANELS = [  # (field, title, y label, scale)
    ("loss", "loss", "loss", 1.0),
    ("lr", "learning rate", "lr", 1.0),
    ("grad_norm", "gradient norm (before clipping)", "norm", 1.0),
    ("tokens_per_s", "throughput (real tokens)", "tokens/s", 1.0),
    ("mfu", "MFU", "% of peak", 100.0),
    ("peak_memory_bytes", "peak memory", "GiB", 1.0 / 2**30),
]


def draw_panel(ax, runs, field, title, ylabel, scale):
    drawn = False
    for name, steps, evals in runs:
        xs, ys = series(steps, field)
        if xs:
            ax.plot(xs, [y * scale for y in ys], label=name, linewidth=1.2)
            drawn = True
        if field == "loss" and evals:
            ax.plot([r["step"] for r in evals], [r["eval_loss"] for r in evals], "o--",
                    label=name + " (eval)", markersize=4)
    ax.set_title(title)
    ax.set_xlabel("step")
    ax.set_ylabel(ylabel)
    ax.grid(alpha=0.3)
    if field == "lr":
        ax.ticklabel_format(axis="y", style="sci", scilimits=(-3, 3))
    if drawn:
        ax.legend(fontsize=8)
    else:
        why = "needs logging.peak_tflops" if field == "mfu" else "null in metrics.jsonl"
        ax.text(0.5, 0.5, f"not recorded\n({why})", ha="center", va="center",
                transform=ax.transAxes, color="gray")
    return drawn


def plot_training(runs, out):
    fig, axes = plt.subplots(2, 3, figsize=(15, 8))
    missing = [panel[1] for ax, panel in zip(axes.flat, PANELS) if not draw_panel(ax, runs, *panel)]
    if missing:
        print("report: not in the metrics: " + ", ".join(missing), file=sys.stderr)
    fig.suptitle("training: " + ", ".join(name for name, _, _ in runs))
    fig.tight_layout()
    fig.savefig(os.path.join(out, "training.png"), dpi=100)
    plt.close(fig)
    fig, ax = plt.subplots(figsize=(7, 4.5))
    draw_panel(ax, runs, *PANELS[0])
    fig.tight_layout()
    fig.savefig(os.path.join(out, "loss.png"), dpi=100)
    plt.close(fig)


def measured_panel(ax, measured):
    one = measured.pop("1 rank", [])
    for key, pts in sorted(measured.items()):
        pts = sorted(one + pts)
        ax.plot([p[0] for p in pts], [p[1] for p in pts], "o-", label=key)
    ax.set_title("measured: bench_fsdp_step step time")
    ax.set_xlabel("ranks")
    ax.set_ylabel("ms per step")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)


def validation_panel(ax, rows):
    top = 1.1 * max(max(r["measured_ms"], r["predicted_ms"]) for r in rows)
    ax.fill_between([0, top], [0, 0.8 * top], [0, 1.2 * top], color="green", alpha=0.1,
                    label="within 20%")
    ax.plot([0, top], [0, top], "k--", linewidth=0.8)
    for r in rows:
        # "4 ranks: dp_replicate 1 x dp_shard 2 x tp 2" -> "4 ranks, 1 x 2 x 2 (fsdp)"
        ranks, shape = r["mesh"].split(": ") if ": " in r["mesh"] else (r["mesh"], "")
        dims = " x ".join(part.split()[-1] for part in shape.split(" x ")) if shape else ""
        ax.plot(r["measured_ms"], r["predicted_ms"], "s" if r["input"] else "o",
                label=f"{ranks}, {dims} ({r['layout']})" + (", the input" if r["input"] else ""))
    ax.set_xlim(0, top)
    ax.set_ylim(0, top)
    ax.set_title("scaling model vs measured (CPU; dp_replicate x dp_shard x tp)")
    ax.set_xlabel("measured ms per step")
    ax.set_ylabel("predicted ms per step")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7)


def modelled_panel(ax, key, lays):
    for lay, pts in sorted(lays.items()):
        pts.sort()
        ax.plot([p[0] for p in pts], [p[1] for p in pts], "o-", label=lay)
    ax.set_xscale("log", base=2)
    ax.set_title(f"modelled: {key}")
    ax.set_xlabel("nodes")
    ax.set_ylabel("MFU %")
    ax.set_ylim(bottom=0)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)


def plot_scaling(records, out):
    """scaling.png: the measured steps (bench_fsdp_step records), the scaling model against them
    (scaling_model.py validate --json lines) and its predictions (predict --json lines)."""
    measured = {}
    for r in records:
        if r.get("benchmark") == "bench_fsdp_step" and r.get("metric") == "step_ms":
            ranks = int(r["mesh"].split()[0])
            layout = r["mesh"].split(": ", 1)[1] if ": " in r["mesh"] else r["mesh"]
            family = r["case"].split("--layout ")[-1]
            key = f"{family}, tp {layout.split('tp ')[-1]}" if ranks > 1 else "1 rank"
            measured.setdefault(key, []).append((ranks, r["value"]))
    validation = [r["validation"] for r in records if "validation" in r]
    predicted = {}
    for r in records:
        if r.get("prediction"):
            key = f"{r['model']} on {r['hardware']}"
            lay = f"{r['family']}, tp {r['layout'][2]}"
            predicted.setdefault(key, {}).setdefault(lay, []).append(
                (r["nodes"], 100 * r["prediction"]["mfu"]))
    panels = []
    if measured:
        panels.append(lambda ax: measured_panel(ax, measured))
    if validation:
        panels.append(lambda ax: validation_panel(ax, validation))
    for key, lays in sorted(predicted.items()):
        panels.append(lambda ax, key=key, lays=lays: modelled_panel(ax, key, lays))
    if not panels:
        return False
    cols = min(3, len(panels))
    rows = (len(panels) + cols - 1) // cols
    fig, axes = plt.subplots(rows, cols, figsize=(6 * cols, 4.5 * rows), squeeze=False)
    for ax, draw in zip(axes.flat, panels):
        draw(ax)
    for ax in list(axes.flat)[len(panels):]:
        ax.axis("off")
    fig.tight_layout()
    fig.savefig(os.path.join(out, "scaling.png"), dpi=100)
    plt.close(fig)
    return True


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("runs", nargs="*", help="run output_dirs or metrics.jsonl files")
    p.add_argument("--records", action="append", default=[],
                   help="benchmark records (JSON lines; also scaling_model.py validate / "
                   "predict --json)")
    p.add_argument("--out", default="report", help="output folder (default: report)")
    a = p.parse_args()
    if not a.runs and not a.records:
        p.error("give at least one run or --records file")
    os.makedirs(a.out, exist_ok=True)
    written = []
    if a.runs:
        plot_training([load_run(r) for r in a.runs], a.out)
        written += ["training.png", "loss.png"]
    if a.records:
        records = [r for path in a.records for r in read_jsonl(path)]
        if plot_scaling(records, a.out):
            written.append("scaling.png")
        else:
            print("report: no bench_fsdp_step or scaling-model records in --records: no "
                  "scaling.png", file=sys.stderr)
    for w in written:
        print(os.path.join(a.out, w))
    return 0


if __name__ == "__main__":
    sys.exit(main())
