"""Shared helpers for the golden-file generators (torch on CPU, fp32/fp64).

Each generator writes one safetensors file under tests/golden/ holding, per case, the inputs,
the outputs and the input gradients of one op, named "<case>.<tensor>". The upstream gradient
used for backward is stored too ("<case>.grad_out"), so the C++ test replays exactly the same
backward. Metadata records the generator, torch version and seed (and what a generator adds).
"""
import json
import os
import shutil
import sys

import torch
from safetensors.torch import save_file

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
GOLDEN_DIR = os.path.join(REPO, "tests", "golden")
DATA_DIR = os.path.join(REPO, "tests", "data")


class GoldenWriter:
    def __init__(self, name, seed=0):
        self.name = name
        self.tensors = {}
        self.seed = seed
        torch.manual_seed(seed)

    def add(self, case, **tensors):
        for key, t in tensors.items():
            full = f"{case}.{key}"
            assert full not in self.tensors, f"duplicate golden tensor {full}"
            self.tensors[full] = t.detach().contiguous().clone()

    def save(self, **metadata):
        """Writes tests/golden/<name>.safetensors; `metadata` (e.g. transformers=version) joins
        the header's."""
        os.makedirs(GOLDEN_DIR, exist_ok=True)
        path = os.path.join(GOLDEN_DIR, f"{self.name}.safetensors")
        meta = {
            "generator": os.path.relpath(sys.argv[0], REPO),
            "torch": torch.__version__,
            "seed": str(self.seed),
            **metadata,
        }
        save_file(self.tensors, path, metadata=meta)
        size = os.path.getsize(path)
        print(f"wrote {path}: {len(self.tensors)} tensors, {size / 1024:.1f} KiB")


def run_backward(outputs, grad_outputs):
    """Backward with given upstream gradients; returns nothing (grads land in .grad)."""
    torch.autograd.backward(outputs, grad_outputs)


def rel(a, b):
    """The largest difference relative to the largest magnitude of the reference b."""
    return float((a - b).abs().max() / b.abs().max().clamp_min(1e-30))


def save_snapshot(model, name):
    """An HF snapshot of `model` in tests/data/<name>: config.json and model.safetensors only."""
    path = os.path.join(DATA_DIR, name)
    shutil.rmtree(path, ignore_errors=True)
    model.save_pretrained(path, safe_serialization=True)
    for extra in os.listdir(path):
        if extra not in ("config.json", "model.safetensors"):
            os.remove(os.path.join(path, extra))  # generation_config.json: not needed here
    with open(os.path.join(path, "config.json")) as f:
        cfg = json.load(f)
    print(f"wrote {path}: {sorted(os.listdir(path))}, dtype {cfg.get('dtype')}")


def documents_loss(pairs):
    """The loss of documents run one by one, [(logits, shifted targets)]: the sum of their CE sums
    over the valid targets of all (-100 = ignored). Runs backward; returns the logits
    concatenated and the loss, detached."""
    total = sum(torch.nn.functional.cross_entropy(lg, target, ignore_index=-100, reduction="sum")
                for lg, target in pairs)
    count = sum(int((target != -100).sum()) for _, target in pairs)
    loss = total / count
    loss.backward()
    return torch.cat([lg for lg, _ in pairs]).detach(), loss.detach()
