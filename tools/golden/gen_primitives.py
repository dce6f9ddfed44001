"""Golden cases for the primitive ops (matmul, linear, broadcast arithmetic, reductions, views,
concat, casts) -> tests/golden/primitives.safetensors.

torch on CPU computes forward and backward in fp64 from fp32-representable inputs; everything is
stored as fp32. Per case: the inputs (a, b, ...), grad_out, out, and d<input> for each input.
Run: python3 tools/golden/gen_primitives.py
"""
import torch

from common import GoldenWriter, run_backward


def rnd(*shape):
    # fp32-representable values, computed on in fp64
    return torch.randn(*shape, dtype=torch.float32).double().requires_grad_(True)


def case(writer, name, fn, **inputs):
    out = fn(**inputs)
    grad_out = torch.randn(out.shape, dtype=torch.float32).double()
    run_backward([out], [grad_out])
    tensors = {k: v.float() for k, v in inputs.items()}
    tensors["grad_out"] = grad_out.float()
    tensors["out"] = out.float()
    for k, v in inputs.items():
        tensors["d" + k] = v.grad.float()
    writer.add(name, **tensors)


def main():
    w = GoldenWriter("primitives", seed=7)
    case(w, "matmul_2d", lambda a, b: a @ b, a=rnd(2, 5, 8), b=rnd(8, 6))
    case(w, "matmul_batched", lambda a, b: a @ b, a=rnd(3, 4, 7), b=rnd(3, 7, 5))
    case(w, "linear_bias", lambda x, w, bias: torch.nn.functional.linear(x, w, bias),
         x=rnd(2, 3, 16), w=rnd(12, 16), bias=rnd(12))
    case(w, "linear", lambda x, w: torch.nn.functional.linear(x, w), x=rnd(10, 24), w=rnd(20, 24))
    case(w, "add_broadcast", lambda a, b: a + b, a=rnd(2, 3, 4), b=rnd(3, 1))
    case(w, "sub_broadcast", lambda a, b: a - b, a=rnd(4), b=rnd(3, 4))
    case(w, "mul_broadcast", lambda a, b: a * b, a=rnd(2, 3, 4), b=rnd(1, 3, 4))
    case(w, "div_broadcast", lambda a, b: a / b, a=rnd(2, 3, 4),
         b=(torch.rand(4, dtype=torch.float32).double() + 0.5).requires_grad_(True))
    case(w, "affine", lambda a: a * -1.75 + 0.5, a=rnd(5, 6))
    case(w, "sum_dims", lambda a: a.sum(dim=(0, 2)), a=rnd(3, 4, 5))
    case(w, "mean_keepdim", lambda a: a.mean(dim=1, keepdim=True), a=rnd(3, 4, 5))
    case(w, "sum_all", lambda a: a.sum(), a=rnd(3, 4, 5))
    case(w, "transpose", lambda a: a.transpose(0, 2).contiguous(), a=rnd(2, 3, 4))
    case(w, "permute_reshape", lambda a: a.permute(1, 0, 2).reshape(3, 8), a=rnd(2, 3, 4))
    case(w, "slice", lambda a: a[:, 1:3].contiguous(), a=rnd(3, 5, 2))
    case(w, "concat", lambda a, b: torch.cat([a, b], dim=1), a=rnd(2, 3, 4), b=rnd(2, 5, 4))
    case(w, "expand", lambda a: a.expand(2, 3, 4).contiguous(), a=rnd(3, 1))
    # Casts: fp32 -> bf16 rounding (round to nearest even) and back; the gradient is cast back.
    x = torch.randn(64, dtype=torch.float32) * 3
    w.add("cast_bf16", a=x, out=x.to(torch.bfloat16).float())
    w.save()


if __name__ == "__main__":
    main()
