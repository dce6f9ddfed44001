"""Golden losses for the training loop (src/train/train_step.h): a PyTorch reference loop.

Starts from the tiny untied Qwen3 snapshot of gen_qwen3.py (tests/data/qwen3_tiny_untied) and
runs 30 optimizer steps with transformers' Qwen3ForCausalLM in fp32 on CPU:
  * accumulation 2: each step has 2 micro-batches; each micro-batch is a packed row of 2-3
    documents (arithmetic sequences mod 64: learnable; some labels masked). The step loss is
    the token mean over both micro-batches: sum of token cross-entropies / number of valid targets of the step (each
    document run on its own, which is what varlen attention over cu_seqlens computes);
  * torch.nn.utils.clip_grad_norm_(max_norm = 1.0) — active on most steps;
  * torch.optim.AdamW(betas (0.9, 0.95), eps 1e-8), weight decay 0.1 on projection weights,
    0 on norms and embeddings;
  * LambdaLR: warmup (s + 1) / 5 for s < 5, then cosine to min_lr_ratio 0.1 at s = 30; peak 3e-3.
The config the C++ test must use is stored in the file's metadata; the batches (HF-aligned labels)
and the per-step loss and pre-clip gradient norm in:
  tests/golden/train_loop.safetensors
    mb<i>.input_ids [T] i64, mb<i>.labels [T] i64, mb<i>.position_ids [T] i64,
    mb<i>.cu_seqlens [docs + 1] i32 (i = 0 .. 59; step s uses 2s and 2s + 1)
    losses [30] f64, grad_norms [30] f64, lrs [30] f64

Run: python3 tools/golden/gen_train_loop.py   (torch + transformers + safetensors from pip)
"""
import json
import math
import os

import torch
from safetensors.torch import save_file
from transformers import Qwen3ForCausalLM

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SNAPSHOT = os.path.join(REPO, "tests", "data", "qwen3_tiny_untied")
OUT = os.path.join(REPO, "tests", "golden", "train_loop.safetensors")

STEPS, ACCUM = 30, 2
PEAK_LR, WARMUP, MIN_LR_RATIO = 3e-3, 5, 0.1
BETAS, EPS, WEIGHT_DECAY, MAX_NORM = (0.9, 0.95), 1e-8, 0.1, 1.0
VOCAB = 512


def make_batches(gen):
    batches = []
    for _ in range(STEPS * ACCUM):
        docs = int(torch.randint(2, 4, (1,), generator=gen))
        lengths = [int(torch.randint(5, 40, (1,), generator=gen)) for _ in range(docs)]
        ids, labels, pos, cu = [], [], [], [0]
        for n in lengths:
            # A learnable rule (arithmetic sequences mod 64), so that the loss falls and every
            # update shows in the next losses.
            a = int(torch.randint(0, 64, (1,), generator=gen))
            d = int(torch.randint(1, 6, (1,), generator=gen))
            toks = (a + d * torch.arange(n)) % 64
            lab = toks.clone()
            lab[0] = -100  # the packer's rule: no target crosses into a document
            mask = torch.rand(n, generator=gen) < 0.2
            lab[mask] = -100
            ids.append(toks)
            labels.append(lab)
            pos.append(torch.arange(n))
            cu.append(cu[-1] + n)
        batches.append({
            "input_ids": torch.cat(ids).long(),
            "labels": torch.cat(labels).long(),
            "position_ids": torch.cat(pos).long(),
            "cu_seqlens": torch.tensor(cu, dtype=torch.int32),
        })
    return batches


def targets_of(batch):
    """Next-token targets of a packed row: targets[t] = labels[t + 1], the last one ignored."""
    lab = batch["labels"]
    return torch.cat([lab[1:], torch.tensor([-100])])


def loss_sum(model, batch):
    """Sum of token cross-entropies of a packed row, each document run on its own."""
    targets = targets_of(batch)
    cu = batch["cu_seqlens"].tolist()
    total = None
    for a, b in zip(cu[:-1], cu[1:]):
        logits = model(input_ids=batch["input_ids"][a:b][None],
                       position_ids=batch["position_ids"][a:b][None], use_cache=False).logits[0]
        ce = torch.nn.functional.cross_entropy(logits.float(), targets[a:b], ignore_index=-100,
                                               reduction="sum")
        total = ce if total is None else total + ce
    return total


def lr_lambda(s):
    if s < WARMUP:
        return (s + 1) / WARMUP
    p = min(max((s - WARMUP) / (STEPS - WARMUP), 0.0), 1.0)
    return MIN_LR_RATIO + (1 - MIN_LR_RATIO) * 0.5 * (1 + math.cos(math.pi * p))


def main():
    torch.manual_seed(0)
    gen = torch.Generator().manual_seed(1234)
    model = Qwen3ForCausalLM.from_pretrained(SNAPSHOT, torch_dtype=torch.float32,
                                             attn_implementation="eager").train()
    decay, no_decay = [], []
    for name, p in model.named_parameters():
        is_norm = p.dim() == 1
        (no_decay if is_norm or "embed_tokens" in name else decay).append(p)
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": WEIGHT_DECAY},
                             {"params": no_decay, "weight_decay": 0.0}],
                            lr=PEAK_LR, betas=BETAS, eps=EPS)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lr_lambda)

    batches = make_batches(gen)
    losses, norms, lrs = [], [], []
    for s in range(STEPS):
        micro = batches[ACCUM * s: ACCUM * (s + 1)]
        n = sum(int((targets_of(b) != -100).sum()) for b in micro)
        total = 0.0
        for b in micro:
            l = loss_sum(model, b)
            total += float(l)
            (l / n).backward()
        norm = torch.nn.utils.clip_grad_norm_(model.parameters(), MAX_NORM)
        lrs.append(opt.param_groups[0]["lr"])
        opt.step()
        opt.zero_grad()
        sched.step()
        losses.append(total / n)
        norms.append(float(norm))
        print(f"step {s + 1:2d} loss {losses[-1]:.6f} grad_norm {norms[-1]:.4f} lr {lrs[-1]:.3e}")

    tensors = {}
    for i, b in enumerate(batches):
        for k, v in b.items():
            tensors[f"mb{i}.{k}"] = v.contiguous()
    tensors["losses"] = torch.tensor(losses, dtype=torch.float64)
    tensors["grad_norms"] = torch.tensor(norms, dtype=torch.float64)
    tensors["lrs"] = torch.tensor(lrs, dtype=torch.float64)
    config = {"steps": STEPS, "accumulation": ACCUM, "lr": PEAK_LR, "warmup_steps": WARMUP,
              "scheduler": "cosine", "min_lr_ratio": MIN_LR_RATIO, "betas": list(BETAS),
              "eps": EPS, "weight_decay": WEIGHT_DECAY, "max_grad_norm": MAX_NORM,
              "no_decay": "norms and embeddings"}
    save_file(tensors, OUT, metadata={"generator": "tools/golden/gen_train_loop.py",
                                      "torch": torch.__version__, "config": json.dumps(config)})
    print(f"wrote {OUT} ({os.path.getsize(OUT)} bytes)")


if __name__ == "__main__":
    main()
