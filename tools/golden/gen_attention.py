"""Golden data for rope and varlen attention (tests/core/ops/test_attention_golden.cpp).

rope cases ("rope_*"): HF's formula (Qwen3 / Qwen3.5 partial rotary), run by torch in fp32 exactly
as HF does: inv_freq = 1 / theta ** (arange(0, R, 2).float() / R), freqs = pos.float() * inv_freq,
emb = cat(freqs, freqs), cos/sin in fp32 cast to x.dtype, y = x * cos + rotate_half(x) * sin on
the first R dims, the rest passed through. Stored per case: x, position_ids (int64), rotary_dim and
theta (1-element fp64), out, grad_out, grad_x, and the same computation in bf16 (x and grad_out
cast to bf16, cos/sin rounded to bf16, bf16 arithmetic) as out_bf16 / grad_x_bf16 (stored as fp32,
exact).

attention cases ("attn_*"): per document, torch scaled_dot_product_attention on [H, L, D] with k/v
repeat_interleave'd for GQA, computed in fp64 from the fp32 inputs (an exact reference) and stored
as fp32. Stored: q, k, v, cu_seqlens (int32), causal and scale (1-element fp64), out, grad_out,
grad_q, grad_k, grad_v.
Run: python3 tools/golden/gen_attention.py
"""
import torch
import torch.nn.functional as F

from common import GoldenWriter, run_backward


def scalar(v):
    return torch.tensor([float(v)], dtype=torch.float64)


# --- rope (HF formula) ---------------------------------------------------------------------------


def rotate_half(x):
    half = x.shape[-1] // 2
    return torch.cat((-x[..., half:], x[..., :half]), dim=-1)


def hf_cos_sin(position_ids, rotary_dim, theta, dtype):
    exponents = torch.arange(0, rotary_dim, 2, dtype=torch.int64).float() / rotary_dim
    inv_freq = 1.0 / (theta ** exponents)
    freqs = position_ids.float()[:, None] * inv_freq[None, :]  # [T, R/2], fp32
    emb = torch.cat((freqs, freqs), dim=-1)
    return emb.cos().to(dtype), emb.sin().to(dtype)


def hf_rope(x, position_ids, rotary_dim, theta):
    """x: [T, H, D]; rotary on the first rotary_dim dims (Qwen3.5 partial rotary)."""
    cos, sin = hf_cos_sin(position_ids, rotary_dim, theta, x.dtype)
    cos, sin = cos[:, None, :], sin[:, None, :]  # broadcast over heads
    x_rot, x_pass = x[..., :rotary_dim], x[..., rotary_dim:]
    y = x_rot * cos + rotate_half(x_rot) * sin
    return torch.cat((y, x_pass), dim=-1)


def add_rope_case(w, case, tokens, heads, head_dim, rotary_dim, theta, positions):
    x = torch.randn(tokens, heads, head_dim)
    position_ids = torch.tensor(positions, dtype=torch.int64)
    grad_out = torch.randn(tokens, heads, head_dim)

    x32 = x.clone().requires_grad_(True)
    out = hf_rope(x32, position_ids, rotary_dim, theta)
    run_backward([out], [grad_out])

    x16 = x.to(torch.bfloat16).requires_grad_(True)
    out16 = hf_rope(x16, position_ids, rotary_dim, theta)
    run_backward([out16], [grad_out.to(torch.bfloat16)])

    w.add(case, x=x, position_ids=position_ids, rotary_dim=scalar(rotary_dim), theta=scalar(theta),
          out=out, grad_out=grad_out, grad_x=x32.grad,
          out_bf16=out16.float(), grad_x_bf16=x16.grad.float())


# --- attention ---------------------------------------------------------------------------------


def reference_attention(q, k, v, cu_seqlens, causal, scale):
    """q: [T, Hq, D], k/v: [T, Hkv, D]; SDPA per document, GQA by repeat_interleave."""
    group = q.shape[1] // k.shape[1]
    outs = []
    for b in range(len(cu_seqlens) - 1):
        s, e = cu_seqlens[b], cu_seqlens[b + 1]
        qd = q[s:e].transpose(0, 1)  # [Hq, L, D]
        kd = k[s:e].repeat_interleave(group, dim=1).transpose(0, 1)
        vd = v[s:e].repeat_interleave(group, dim=1).transpose(0, 1)
        od = F.scaled_dot_product_attention(qd, kd, vd, is_causal=causal, scale=scale)
        outs.append(od.transpose(0, 1))
    return torch.cat(outs, dim=0)


def add_attention_case(w, case, lengths, q_heads, kv_heads, head_dim, causal):
    cu = [0]
    for n in lengths:
        cu.append(cu[-1] + n)
    tokens = cu[-1]
    scale = head_dim ** -0.5
    q = torch.randn(tokens, q_heads, head_dim)
    k = torch.randn(tokens, kv_heads, head_dim)
    v = torch.randn(tokens, kv_heads, head_dim)
    grad_out = torch.randn(tokens, q_heads, head_dim)

    leaves = [t.to(torch.float64).requires_grad_(True) for t in (q, k, v)]
    out = reference_attention(*leaves, cu, causal, scale)
    run_backward([out], [grad_out.to(torch.float64)])
    gq, gk, gv = (t.grad.float() for t in leaves)

    w.add(case, q=q, k=k, v=v, cu_seqlens=torch.tensor(cu, dtype=torch.int32),
          causal=scalar(1.0 if causal else 0.0), scale=scalar(scale),
          out=out.float(), grad_out=grad_out, grad_q=gq, grad_k=gk, grad_v=gv)


def main():
    w = GoldenWriter("attention", seed=0)

    # Positions restart per packed document (lengths 5, 1, 9); an offset run as after an image;
    # a few large positions for the D = 72 cases.
    restart = list(range(5)) + [0] + list(range(9))
    offset = list(range(7, 22))
    large = [0, 1, 2, 3, 60, 127]
    add_rope_case(w, "rope_d16_full", 15, 2, 16, 16, 10000.0, restart)
    add_rope_case(w, "rope_d16_partial", 15, 2, 16, 4, 1e6, offset)
    add_rope_case(w, "rope_d72_full", 6, 1, 72, 72, 1e6, large)
    add_rope_case(w, "rope_d72_partial", 6, 1, 72, 18, 1e7, large)

    for causal in (True, False):
        mask = "causal" if causal else "bidir"
        for kv_heads in (2, 1):
            add_attention_case(w, f"attn_d16_{mask}_gqa4to{kv_heads}", [5, 1, 9], 4, kv_heads, 16,
                               causal)
    add_attention_case(w, "attn_d72_causal_gqa2to1", [3, 1, 4], 2, 1, 72, True)
    add_attention_case(w, "attn_d72_bidir_gqa2to2", [2, 3], 2, 2, 72, False)
    w.save()


if __name__ == "__main__":
    main()
