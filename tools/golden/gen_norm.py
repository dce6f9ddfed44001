"""Golden cases for the normalization family (src/core/ops/norm.h) -> tests/golden/norm.safetensors.

References are the HF module formulas (Qwen3RMSNorm, Qwen3_5RMSNorm, Qwen3_5RMSNormGated) and
torch.nn.functional.layer_norm, on CPU. Forward and backward run in fp32 (torch computes them in
fp32) with a stored upstream gradient; the plain RMSNorm is cross-checked against
F.rms_norm. Per case:
  x, [weight], [bias], [z], eps (f64, 1 value), grad_out, y, dx, [dweight], [dbias], [dz]
  y_bf16: the same formula evaluated by torch on the bf16-rounded inputs in bf16 (HF's rounding
          order), stored as fp32 (exact), to pin our bf16 numerics to HF's.
Run: python3 tools/golden/gen_norm.py
"""
import torch
import torch.nn.functional as F

from common import GoldenWriter, run_backward


def rms_hat(x, eps):
    h = x.float()
    return h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + eps)


def qwen3_rms_norm(x, w, eps):
    # Qwen3RMSNorm: normalise in fp32, cast to the input dtype, then weight * x̂ in that dtype.
    h = rms_hat(x, eps).to(x.dtype)
    return h if w is None else w * h


def zero_centered_rms_norm(x, w, eps):
    # Qwen3_5RMSNorm: (x̂ * (1 + w)) in fp32, one rounding at the end.
    h = rms_hat(x, eps)
    if w is not None:
        h = h * (1.0 + w.float())
    return h.type_as(x)


def gated_rms_norm(x, z, w, eps):
    # Qwen3_5RMSNormGated (norm before gate): w * x̂ in the input dtype, times silu(z) in fp32.
    h = rms_hat(x, eps).to(x.dtype)
    if w is not None:
        h = w * h
    h = h * F.silu(z.float())
    return h.to(x.dtype)


def layer_norm(x, w, b, eps):
    return F.layer_norm(x, (x.shape[-1],), w, b, eps)


# name, kind, x shape, has weight, has bias, eps
CASES = [
    ("rms_d64", "rms", (2, 5, 64), True, False, 1e-6),
    ("rms_d896_noweight", "rms", (2, 896), False, False, 1e-5),
    ("rms_d32_eps5", "rms", (4, 3, 32), True, False, 1e-5),
    ("zc_d64", "zc", (2, 3, 64), True, False, 1e-6),
    ("zc_d40_noweight", "zc", (5, 40), False, False, 1e-5),
    ("gated_d64", "gated", (2, 4, 64), True, False, 1e-6),
    ("gated_d32_noweight", "gated", (6, 32), False, False, 1e-5),
    ("ln_d64", "ln", (2, 3, 64), True, True, 1e-6),
    ("ln_d48_noaffine", "ln", (4, 48), False, False, 1e-5),
    ("ln_d40_weightonly", "ln", (3, 40), True, False, 1e-5),
]


def forward(kind, t, eps):
    if kind == "rms":
        return qwen3_rms_norm(t["x"], t.get("weight"), eps)
    if kind == "zc":
        return zero_centered_rms_norm(t["x"], t.get("weight"), eps)
    if kind == "gated":
        return gated_rms_norm(t["x"], t["z"], t.get("weight"), eps)
    return layer_norm(t["x"], t.get("weight"), t.get("bias"), eps)


def make_inputs(kind, shape, has_w, has_b):
    d = shape[-1]
    # LayerNorm inputs get an offset so that centring matters.
    t = {"x": torch.randn(shape) + (0.5 if kind == "ln" else 0.0)}
    if kind == "gated":
        t["z"] = 2.0 * torch.randn(shape)
    if has_w:
        # zero-centred weights are offsets around 0, the others multipliers around 1
        t["weight"] = 0.1 * torch.randn(d) + (0.0 if kind == "zc" else 1.0)
    if has_b:
        t["bias"] = 0.1 * torch.randn(d)
    return t


def main():
    w = GoldenWriter("norm", seed=0)
    for name, kind, shape, has_w, has_b, eps in CASES:
        inputs = make_inputs(kind, shape, has_w, has_b)
        leaves = {k: v.clone().requires_grad_(True) for k, v in inputs.items()}
        y = forward(kind, leaves, eps)
        if kind == "rms":
            ref = F.rms_norm(inputs["x"], (shape[-1],), inputs.get("weight"), eps)
            assert torch.allclose(y, ref, rtol=1e-6, atol=1e-6), name
        grad_out = torch.randn(shape)
        run_backward([y], [grad_out])
        with torch.no_grad():
            y_bf16 = forward(kind, {k: v.bfloat16() for k, v in inputs.items()}, eps).float()
        out = dict(inputs)
        out.update(eps=torch.tensor([eps], dtype=torch.float64), grad_out=grad_out, y=y,
                   y_bf16=y_bf16)
        for k, leaf in leaves.items():
            out["d" + k] = leaf.grad
        w.add(name, **out)
    w.save()


if __name__ == "__main__":
    main()
