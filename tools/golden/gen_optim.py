"""Golden data for src/optim: torch.optim.AdamW and torch.nn.utils.clip_grad_norm_ (CPU, fp32).

Case "adamw": three parameters in two param groups with different lr and weight decay, 10 steps
with fixed synthetic gradients (stored per step) and a per-step LR factor (group lr = base lr *
factor, set by hand before each step, as a scheduler would). Stored:
  adamw.init.<p>        initial values (rounded to bf16-representable fp32, so that the C++
                        bf16-parameter run starts from exactly the same values)
  adamw.grads.<p>       [steps, ...] the gradient given at each step
  adamw.params.<p>      [steps, ...] the parameter after each step
  adamw.exp_avg.<p>, adamw.exp_avg_sq.<p>   the final optimizer state
  adamw.lr_factor [steps], adamw.group_lr [2], adamw.group_wd [2], adamw.hyper [beta1, beta2, eps]
The bias gradient is scaled to ~1e-6 so that eps (1e-8) visibly matters in its update.

Cases "clip" (clipping applies) and "clip_noop" (max_norm above the norm): grads_in.<i>,
grads_out.<i> after clip_grad_norm_, total_norm (the returned pre-clip norm), max_norm.
All computed by torch in fp32 (foreach=False: the plain single-tensor loop).
"""
import torch

from common import GoldenWriter

STEPS = 10


def bf16_representable(t):
    return t.to(torch.bfloat16).to(torch.float32)


def adamw_case(w):
    shapes = {"w0": (4, 3), "b0": (3,), "w1": (5, 2)}
    grad_scale = {"w0": 1.0, "b0": 1e-6, "w1": 0.3}
    group_lr = [1e-2, 3e-3]
    group_wd = [0.1, 0.0]
    beta1, beta2, eps = 0.9, 0.95, 1e-8
    init = {k: bf16_representable(torch.randn(s)) for k, s in shapes.items()}
    grads = {k: torch.randn((STEPS,) + s) * grad_scale[k] for k, s in shapes.items()}
    lr_factor = torch.tensor([0.5, 1.0, 1.0, 0.9, 0.8, 0.6, 0.4, 0.3, 0.2, 0.1])

    params = {k: torch.nn.Parameter(v.clone()) for k, v in init.items()}
    opt = torch.optim.AdamW(
        [
            {"params": [params["w0"], params["b0"]], "lr": group_lr[0], "weight_decay": group_wd[0]},
            {"params": [params["w1"]], "lr": group_lr[1], "weight_decay": group_wd[1]},
        ],
        betas=(beta1, beta2), eps=eps, foreach=False)
    history = {k: [] for k in shapes}
    for s in range(STEPS):
        for gi, g in enumerate(opt.param_groups):
            g["lr"] = group_lr[gi] * float(lr_factor[s])
        for k, p in params.items():
            p.grad = grads[k][s].clone()
        opt.step()
        for k, p in params.items():
            history[k].append(p.detach().clone())

    for k, p in params.items():
        st = opt.state[p]
        w.add("adamw", **{
            f"init.{k}": init[k],
            f"grads.{k}": grads[k],
            f"params.{k}": torch.stack(history[k]),
            f"exp_avg.{k}": st["exp_avg"],
            f"exp_avg_sq.{k}": st["exp_avg_sq"],
        })
    w.add("adamw", lr_factor=lr_factor, group_lr=torch.tensor(group_lr, dtype=torch.float64),
          group_wd=torch.tensor(group_wd, dtype=torch.float64),
          hyper=torch.tensor([beta1, beta2, eps], dtype=torch.float64))


def clip_case(w, case, max_norm):
    shapes = [(6, 5), (7,), (3, 2, 2)]
    grads_in = [torch.randn(s) * (i + 1) for i, s in enumerate(shapes)]
    params = [torch.nn.Parameter(torch.zeros(s)) for s in shapes]
    for p, g in zip(params, grads_in):
        p.grad = g.clone()
    total = torch.nn.utils.clip_grad_norm_(params, max_norm, foreach=False)
    for i, (g, p) in enumerate(zip(grads_in, params)):
        w.add(case, **{f"grads_in.{i}": g, f"grads_out.{i}": p.grad})
    w.add(case, total_norm=total.reshape(1), max_norm=torch.tensor([max_norm]))


def main():
    w = GoldenWriter("optim", seed=0)
    adamw_case(w)
    clip_case(w, "clip", 2.0)
    clip_case(w, "clip_noop", 1000.0)
    w.save()


if __name__ == "__main__":
    main()
