"""The common benchmark record from the benchmark scripts (the C++ side: bench/record.h).

    import records  (with bench/ on sys.path)
    records.emit("bench_train_step", "qwen3 h512 x4", "1", "cpu", "tokens_per_s", ours, torch)

prints one JSON line {"benchmark", "case", "mesh", "device", "metric", "value", "reference",
"ratio", "commit"} and appends it to $VLM_BENCH_RECORDS when that is set. Standard library only.
"""
import functools
import json
import os
import subprocess

_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


@functools.lru_cache(maxsize=None)
def commit():
    """The checkout's commit (+dirty with uncommitted changes), or "unknown" outside git; asked
    of git once per process."""
    try:
        c = subprocess.run(["git", "-C", _ROOT, "rev-parse", "--short=12", "HEAD"],
                           capture_output=True, text=True, check=True).stdout.strip()
        dirty = subprocess.run(["git", "-C", _ROOT, "status", "--porcelain",
                                "--untracked-files=no"], capture_output=True, text=True).stdout
        return c + ("+dirty" if dirty.strip() else "")
    except (OSError, subprocess.CalledProcessError):
        return "unknown"


def record(benchmark, case, mesh, device, metric, value, reference=None):
    ratio = value / reference if reference not in (None, 0) else None
    return {"benchmark": benchmark, "case": case, "mesh": str(mesh), "device": device,
            "metric": metric, "value": value, "reference": reference, "ratio": ratio,
            "commit": commit()}


def emit(benchmark, case, mesh, device, metric, value, reference=None):
    line = json.dumps(record(benchmark, case, mesh, device, metric, value, reference))
    print(line, flush=True)
    path = os.environ.get("VLM_BENCH_RECORDS")
    if path:
        with open(path, "a") as f:
            f.write(line + "\n")
