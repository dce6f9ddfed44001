"""Shared helpers for the golden-file generators (torch on CPU, fp32/fp64).

Each generator writes one safetensors file under tests/golden/ holding, per case, the inputs,
the outputs and the input gradients of one op, named "<case>.<tensor>". The upstream gradient
used for backward is stored too ("<case>.grad_out"), so the C++ test replays exactly the same
backward. Metadata records the generator, torch version and seed.
"""
import os
import sys

import torch
from safetensors.torch import save_file

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
GOLDEN_DIR = os.path.join(REPO, "tests", "golden")


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

    def save(self):
        os.makedirs(GOLDEN_DIR, exist_ok=True)
        path = os.path.join(GOLDEN_DIR, f"{self.name}.safetensors")
        meta = {
            "generator": os.path.relpath(sys.argv[0], REPO),
            "torch": torch.__version__,
            "seed": str(self.seed),
        }
        save_file(self.tensors, path, metadata=meta)
        size = os.path.getsize(path)
        print(f"wrote {path}: {len(self.tensors)} tensors, {size / 1024:.1f} KiB")


def run_backward(outputs, grad_outputs):
    """Backward with given upstream gradients; returns nothing (grads land in .grad)."""
    torch.autograd.backward(outputs, grad_outputs)
