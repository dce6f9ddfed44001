"""Golden data for activations, softmax, cross-entropy, embedding and index ops.

Inputs are drawn in fp32; torch then computes outputs and input gradients in fp64 on CPU (from
the fp32 inputs, so they are exact references) and everything is stored as fp32 (labels and
indices as int64). Per case: inputs, "out", the upstream gradient "grad_out" and "grad_<input>".
Run: python3 tools/golden/gen_activation_loss_index.py
"""
import torch
import torch.nn.functional as F

from common import GoldenWriter, run_backward


def f32(t):
    return t.to(torch.float32)


def leaf64(t):
    return t.detach().to(torch.float64).requires_grad_(True)


def add_case(w, case, fn, inputs, extra=None):
    """inputs: name -> fp32 tensor (all differentiable). extra: name -> tensor stored verbatim."""
    extra = extra or {}
    leaves = {k: leaf64(v) for k, v in inputs.items()}
    out = fn(**leaves)
    grad_out = f32(torch.randn(out.shape)).to(torch.float64)
    run_backward([out], [grad_out])
    tensors = dict(inputs)
    tensors.update(extra)
    tensors["out"] = f32(out)
    tensors["grad_out"] = f32(grad_out)
    for k, v in leaves.items():
        tensors[f"grad_{k}"] = f32(v.grad)
    w.add(case, **tensors)


def main():
    w = GoldenWriter("activation_loss_index", seed=0)

    # Elementwise activations over a range that reaches both tails.
    x = torch.randn(8, 33) * 3
    add_case(w, "gelu_erf", lambda x: F.gelu(x, approximate="none"), {"x": x})
    add_case(w, "gelu_tanh", lambda x: F.gelu(x, approximate="tanh"), {"x": x})
    add_case(w, "silu", lambda x: F.silu(x), {"x": x})
    add_case(w, "sigmoid", lambda x: torch.sigmoid(x), {"x": x})
    add_case(w, "exp", lambda x: torch.exp(x), {"x": torch.randn(4, 9)})
    positive = torch.rand(4, 9) * 4 + 0.1
    add_case(w, "log", lambda x: torch.log(x), {"x": positive})
    add_case(w, "rsqrt", lambda x: torch.rsqrt(x), {"x": positive})
    add_case(w, "square", lambda x: torch.square(x), {"x": torch.randn(4, 9) * 2})
    add_case(w, "softmax", lambda x: torch.softmax(x, dim=-1), {"x": torch.randn(6, 50) * 3})
    add_case(w, "swiglu", lambda gate, up: F.silu(gate) * up,
             {"gate": torch.randn(8, 33) * 3, "up": torch.randn(8, 33)})

    # Cross-entropy (mean over non-ignored tokens, ignore_index -100).
    for case, rows, vocab, ignored in (("ce_v50", 16, 50, [2, 7, 11]), ("ce_v1000", 8, 1000, [0, 5])):
        labels = torch.randint(0, vocab, (rows,), dtype=torch.int64)
        labels[ignored] = -100
        add_case(w, case, lambda logits: F.cross_entropy(logits, labels, ignore_index=-100),
                 {"logits": torch.randn(rows, vocab) * 3}, extra={"labels": labels})

    # Embedding with repeated ids (ids drawn from a small range of a larger table).
    ids = torch.randint(0, 8, (3, 5), dtype=torch.int64)
    add_case(w, "embedding", lambda weight: F.embedding(ids, weight),
             {"weight": torch.randn(20, 16)}, extra={"ids": ids})

    # index_select / index_add along dim 1 with repeated indices.
    index = torch.tensor([4, 0, 4, 2, 5, 0, 1], dtype=torch.int64)
    add_case(w, "index_select", lambda x: torch.index_select(x, 1, index),
             {"x": torch.randn(4, 6, 5)}, extra={"index": index})
    add_index = torch.tensor([3, 6, 3, 0, 3], dtype=torch.int64)
    add_case(w, "index_add", lambda x, src: torch.index_add(x, 1, add_index, src),
             {"x": torch.randn(4, 7, 5), "src": torch.randn(4, 5, 5)}, extra={"index": add_index})

    w.save()


if __name__ == "__main__":
    main()
