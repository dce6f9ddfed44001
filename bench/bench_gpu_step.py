"""PyTorch eager side of bench/bench_gpu_step.sh: one Qwen3 training step (forward + backward +
gradient clipping + AdamW) of transformers' Qwen3ForCausalLM on the batch of bench_gpu_step.cpp.

The model comes from the config.json that bench_gpu_step --write-config wrote (nothing is
downloaded), attn_implementation="sdpa" (flash attention through SDPA: no mask, is_causal), HF's
random init on the device. The batch: R rows of S tokens, one document per row, token ids from
the LCG of bench_gpu_step.cpp over all R·S positions, targets the next id within the row (the last
position of a row ignored), loss = sum of token cross-entropies (logits upcast to fp32, as HF does)
/ number of targets. The step: clip_grad_norm_(1.0), AdamW (betas 0.9/0.999, eps 1e-8, constant LR,
weight decay 0.01 on projection weights, none on norms and the embedding), zero_grad(set_to_none).

Recipes (--recipe):
  amp   the usual PyTorch eager mixed-precision recipe: fp32 parameters (the master weights),
        torch.autocast(bfloat16) around the forward, fp32 gradients and AdamW states,
        torch.optim.AdamW(fused=True). Same numerics class as ours (bf16 compute, fp32 master
        weights and states).
  bf16  pure bf16: parameters, gradients and AdamW states in bf16, AdamW(fused=True). Less memory
        traffic and less precision (no master weights) than ours: a faster, not an equal, baseline.

Prints one JSON line: impl ("torch-amp" / "torch-bf16"), versions, params, tokens_per_step,
targets_per_step, ids_checksum, flops_per_step (qwen-models.md §7, computed here independently of
model/flops.h), step_ms (median of the timed steps; each step between two synchronizations),
step_ms_min/max, tokens_per_s, peak_memory_bytes (torch.cuda.max_memory_allocated), init_s,
loss_first, loss_last, grad_norm_first. "skipped" instead when torch/transformers (or a CUDA
torch) is missing; "error" (exit status 1) when the run failed, e.g. out of memory.
"""
import argparse
import json
import os
import sys
import time

parser = argparse.ArgumentParser()
parser.add_argument("--config", required=True, help="folder holding config.json")
parser.add_argument("--seq-len", type=int, required=True)
parser.add_argument("--rows", type=int, required=True)
parser.add_argument("--steps", type=int, default=10)
parser.add_argument("--warmup", type=int, default=3)
parser.add_argument("--lr", type=float, default=3e-4)
parser.add_argument("--device", default="cuda")
parser.add_argument("--recipe", choices=["amp", "bf16"], default="amp")
args = parser.parse_args()
impl = f"torch-{args.recipe}"


def emit(obj, status=0):
    print(json.dumps({"impl": impl, **obj}), flush=True)
    sys.exit(status)


try:
    import torch
    import transformers
    from transformers import Qwen3Config, Qwen3ForCausalLM
except ImportError as e:
    emit({"skipped": f"{impl}: skipped, torch/transformers cannot be imported ({e}); "
                     "pip install torch transformers"})
cuda = args.device.startswith("cuda")
if cuda and not torch.cuda.is_available():
    emit({"skipped": f"{impl}: skipped, torch {torch.__version__} sees no CUDA device"})

S, R = args.seq_len, args.rows
dev = torch.device(args.device)
if cuda and dev.index is None:  # torch.cuda.set_device needs an index
    dev = torch.device("cuda", 0)


def lcg_ids(count, vocab):
    """The token ids of bench_gpu_step.cpp."""
    ids, x = [], 1
    for _ in range(count):
        x = (x * 6364136223846793005 + 1442695040888963407) % 2**64
        ids.append((x >> 33) % vocab)
    return ids


def training_flops(c, rows, seq):
    """qwen-models.md §7: 6 · matmul weights (tied head counted) · tokens + causal attention."""
    q, kv = c.num_attention_heads * c.head_dim, c.num_key_value_heads * c.head_dim
    H = c.hidden_size
    per_layer = 2 * H * q + 2 * H * kv + 3 * H * c.intermediate_size
    matmul = c.num_hidden_layers * per_layer + H * c.vocab_size
    attention = 12 * q * c.num_hidden_layers * rows * seq * (seq + 1) / 2
    return 6.0 * matmul * rows * seq + attention


def sync():
    if cuda:
        torch.cuda.synchronize(dev)


def run():
    cfg = Qwen3Config.from_pretrained(args.config)  # a local folder: no download
    cfg.use_cache = False
    param_dtype = torch.float32 if args.recipe == "amp" else torch.bfloat16
    if cuda:
        torch.cuda.set_device(dev)
        torch.cuda.reset_peak_memory_stats(dev)
    torch.manual_seed(0)
    t0 = time.perf_counter()
    with torch.device(dev):  # HF init directly on the device
        try:
            model = Qwen3ForCausalLM._from_config(cfg, attn_implementation="sdpa", dtype=param_dtype)
        except TypeError:  # transformers 4 spells it torch_dtype
            model = Qwen3ForCausalLM._from_config(cfg, attn_implementation="sdpa",
                                                  torch_dtype=param_dtype)
    model = model.to(device=dev, dtype=param_dtype).train()
    if cfg.tie_word_embeddings and model.lm_head.weight is not model.model.embed_tokens.weight:
        raise RuntimeError("lm_head is not tied to embed_tokens although the config says so")
    sync()
    init_s = time.perf_counter() - t0
    V = cfg.vocab_size

    ids_list = lcg_ids(R * S, V)
    checksum = sum(v * (t % 1000003 + 1) for t, v in enumerate(ids_list))
    input_ids = torch.tensor(ids_list, dtype=torch.long, device=dev).view(R, S)
    targets = torch.full_like(input_ids, -100)
    targets[:, :-1] = input_ids[:, 1:]
    num_targets = R * (S - 1)

    decay, no_decay = [], []
    for name, p in model.named_parameters():  # a tied head appears once, as embed_tokens
        (no_decay if name.endswith("norm.weight") or "embed_tokens" in name else decay).append(p)
    optim = torch.optim.AdamW([{"params": decay, "weight_decay": 0.01},
                               {"params": no_decay, "weight_decay": 0.0}],
                              lr=args.lr, betas=(0.9, 0.999), eps=1e-8, fused=cuda)
    autocast = torch.autocast(device_type=dev.type, dtype=torch.bfloat16,
                              enabled=args.recipe == "amp")

    def step():
        with autocast:
            logits = model(input_ids=input_ids, use_cache=False).logits
        loss_sum = torch.nn.functional.cross_entropy(
            logits.float().view(-1, V), targets.view(-1), ignore_index=-100, reduction="sum")
        del logits
        (loss_sum / num_targets).backward()
        grad_norm = torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optim.step()
        optim.zero_grad(set_to_none=True)
        return float(loss_sum.detach()) / num_targets, float(grad_norm)

    losses, ms, grad_norm_first = [], [], None
    for s in range(args.warmup + args.steps):
        sync()
        t0 = time.perf_counter()
        loss, grad_norm = step()
        sync()
        t1 = time.perf_counter()
        losses.append(loss)
        if grad_norm_first is None:
            grad_norm_first = grad_norm
        if s >= args.warmup:
            ms.append((t1 - t0) * 1e3)
    ms_sorted = sorted(ms)
    k = len(ms_sorted)
    med = ms_sorted[k // 2] if k % 2 else 0.5 * (ms_sorted[k // 2 - 1] + ms_sorted[k // 2])
    return {
        "recipe": args.recipe, "device": str(dev),
        "device_name": torch.cuda.get_device_name(dev) if cuda else "cpu",
        "torch": torch.__version__, "transformers": transformers.__version__,
        "params": sum(p.numel() for p in model.parameters()),
        "seq_len": S, "rows": R, "tokens_per_step": R * S, "targets_per_step": num_targets,
        "ids_checksum": checksum, "flops_per_step": training_flops(cfg, R, S),
        "steps": args.steps, "warmup": args.warmup, "step_ms": med, "step_ms_min": ms_sorted[0],
        "step_ms_max": ms_sorted[-1], "tokens_per_s": R * S / (med / 1e3),
        "peak_memory_bytes": torch.cuda.max_memory_allocated(dev) if cuda else None,
        "init_s": init_s, "loss_first": losses[0], "loss_last": losses[-1],
        "grad_norm_first": grad_norm_first,
    }


try:
    result = run()
except Exception as e:  # out of memory, a transformers API change...: reported, not a traceback
    emit({"error": f"{impl}: {type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"}, 1)
emit(result)
