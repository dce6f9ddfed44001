#!/usr/bin/env bash
# One Qwen3-VL training step on CPU (vision tower, merger, DeepStack and the text stack; forward,
# backward, clipping, AdamW) against PyTorch eager: transformers' Qwen3VLForConditionalGeneration
# (attn_implementation "eager", fp32, torch.optim.AdamW(fused=False), clip_grad_norm_) and our
# TrainStepper (bench_vl_step) on the SAME weights and the SAME batch — the script writes a random
# snapshot and one packed batch with transformers, and both sides load them — for two configs:
#   tiny   T2 of qwen-models.md §8 (text H 64, L 4; vision depth 4, Hv 64), 3 documents of 96
#          tokens, each with one image of grid (1, 8, 8) (16 tokens)
#   small  text H 512, L 8, Hq 8, Hkv 4, D 64, I 1536, vocab 32000; vision depth 8, Hv 256,
#          4 heads, Iv 1024, deepstack [1, 3, 5]; 4 documents of 256 tokens, each with one image
#          of grid (1, 16, 16) (64 tokens)
# Labels: -100 on the images and each document's first token. Torch runs each document alone
# (transformers computes its MRoPE ids); ours the packed row with the get_rope_index ids. The
# first-step losses of both sides must agree (same weights, same data): the table shows them.
# Median step time over K timed steps after W warm-up steps; ratio = ours / torch tokens/s.
#
# Usage: bench/bench_vl_step.sh [build_dir]   (default: build; needs bench/bench_vl_step)
#   THREADS (default nproc), CONFIGS ("tiny small"), TINY_STEPS/TINY_WARMUP (10, 2),
#   SMALL_STEPS/SMALL_WARMUP (3, 1). Needs torch + transformers (pip).
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
build=${1:-$root/build}
bin=$build/bench/bench_vl_step
[[ -x $bin ]] || { echo "bench_vl_step: $bin not built (cmake -DVLM_BUILD_BENCH=ON)" >&2; exit 1; }
threads=${THREADS:-$(nproc)}
export OMP_NUM_THREADS=$threads OPENBLAS_NUM_THREADS=$threads MKL_NUM_THREADS=$threads
python3 -c "import torch, transformers" 2>/dev/null ||
  { echo "bench_vl_step: torch + transformers needed (pip install torch transformers)"; exit 0; }
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT

cat >"$tmp/ref.py" <<'EOF'
import json, sys, time
import torch
from safetensors.torch import save_file
from transformers import Qwen3VLConfig, Qwen3VLForConditionalGeneration

mode, cfg_name, out = sys.argv[1], sys.argv[2], sys.argv[3]
threads, steps, warmup = int(sys.argv[4]), int(sys.argv[5]), int(sys.argv[6])
torch.set_num_threads(max(threads, 1))
IMAGE = 500 if cfg_name == "tiny" else 31000
shapes = {
    "tiny": dict(text=dict(vocab_size=512, hidden_size=64, intermediate_size=128,
                           num_hidden_layers=4, num_attention_heads=4, num_key_value_heads=2,
                           head_dim=32, rope_parameters={"rope_type": "default", "rope_theta": 5e6,
                                                         "mrope_section": [6, 5, 5]}),
                 vision=dict(depth=4, hidden_size=64, num_heads=4, intermediate_size=128,
                             out_hidden_size=64, num_position_embeddings=64,
                             deepstack_visual_indexes=[0, 2, 3]),
                 docs=3, doc_len=96, grid=(1, 8, 8)),
    "small": dict(text=dict(vocab_size=32000, hidden_size=512, intermediate_size=1536,
                            num_hidden_layers=8, num_attention_heads=8, num_key_value_heads=4,
                            head_dim=64, rope_parameters={"rope_type": "default", "rope_theta": 5e6,
                                                          "mrope_section": [12, 10, 10]}),
                  vision=dict(depth=8, hidden_size=256, num_heads=4, intermediate_size=1024,
                              out_hidden_size=512, num_position_embeddings=256,
                              deepstack_visual_indexes=[1, 3, 5]),
                  docs=4, doc_len=256, grid=(1, 16, 16)),
}[cfg_name]

if mode == "make":
    torch.manual_seed(0)
    cfg = Qwen3VLConfig(text_config=dict(shapes["text"], rms_norm_eps=1e-6, hidden_act="silu",
                                         max_position_embeddings=4096, attention_bias=False),
                        vision_config=dict(shapes["vision"], patch_size=16, temporal_patch_size=2,
                                           in_channels=3, spatial_merge_size=2,
                                           hidden_act="gelu_pytorch_tanh"),
                        image_token_id=IMAGE, video_token_id=IMAGE + 1,
                        vision_start_token_id=IMAGE + 2, vision_end_token_id=IMAGE + 3,
                        tie_word_embeddings=False)
    model = Qwen3VLForConditionalGeneration(cfg).float()
    model.save_pretrained(out + "/model")
    g = torch.Generator().manual_seed(1)
    t, h, w = shapes["grid"]
    n_img = t * h * w // 4
    ids, pos, cu = [], [], [0]
    for d in range(shapes["docs"]):
        text = shapes["doc_len"] - n_img - 2
        head = torch.randint(0, IMAGE, (4,), generator=g).tolist()
        tail = torch.randint(0, IMAGE, (text - 4,), generator=g).tolist()
        doc = head + [IMAGE + 2] + [IMAGE] * n_img + [IMAGE + 3] + tail
        p, _ = model.model.get_rope_index(torch.tensor([doc]), (torch.tensor([doc]) == IMAGE).long(),
                                          image_grid_thw=torch.tensor([shapes["grid"]]))
        ids += doc
        pos.append(p[:, 0])
        cu.append(len(ids))
    ids = torch.tensor(ids)
    labels = ids.clone()
    labels[ids == IMAGE] = -100
    labels[torch.tensor(cu[:-1])] = -100
    patches = shapes["docs"] * t * h * w
    save_file({"input_ids": ids, "labels": labels, "position_ids": torch.cat(pos, 1).contiguous(),
               "cu_seqlens": torch.tensor(cu, dtype=torch.int32),
               "pixel_values": torch.randn(patches, 1536, generator=g),
               "image_grid_thw": torch.tensor([shapes["grid"]] * shapes["docs"])},
              out + "/batch.safetensors")
    sys.exit(0)

from safetensors.torch import load_file
model = Qwen3VLForConditionalGeneration.from_pretrained(out + "/model", dtype=torch.float32,
                                                        attn_implementation="eager").train()
b = load_file(out + "/batch.safetensors")
cu = b["cu_seqlens"].tolist()
per_doc = b["image_grid_thw"].prod(-1).tolist()
num_targets = 0
docs = []
for d in range(len(cu) - 1):
    s, e = cu[d], cu[d + 1]
    ids = b["input_ids"][s:e]
    tgt = torch.cat([b["labels"][s + 1:e], torch.tensor([-100])])
    num_targets += int((tgt != -100).sum())
    p0 = sum(per_doc[:d])
    docs.append((ids.view(1, -1), tgt, b["pixel_values"][p0:p0 + per_doc[d]],
                 b["image_grid_thw"][d:d + 1], (ids == IMAGE).long().view(1, -1)))
decay, no_decay = [], []
for name, p in model.named_parameters():
    small = p.dim() < 2 or "norm" in name or "embed" in name
    (no_decay if small else decay).append(p)
opt = torch.optim.AdamW([{"params": decay, "weight_decay": 0.01},
                         {"params": no_decay, "weight_decay": 0.0}],
                        lr=1e-3, betas=(0.9, 0.999), eps=1e-8, fused=False)
losses, ms = [], []
for s in range(warmup + steps):
    t0 = time.perf_counter()
    total = 0.0
    for ids, tgt, pv, grid, mm in docs:
        lg = model(input_ids=ids, pixel_values=pv, image_grid_thw=grid, mm_token_type_ids=mm,
                   use_cache=False).logits[0]
        total = total + torch.nn.functional.cross_entropy(lg, tgt, ignore_index=-100,
                                                          reduction="sum")
    (total / num_targets).backward()
    torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
    opt.step()
    opt.zero_grad(set_to_none=True)
    t1 = time.perf_counter()
    losses.append(float(total.detach()) / num_targets)
    if s >= warmup:
        ms.append((t1 - t0) * 1e3)
ms.sort()
k = len(ms)
med = ms[k // 2] if k % 2 else 0.5 * (ms[k // 2 - 1] + ms[k // 2])
T = len(b["input_ids"])
print(json.dumps({"impl": "torch", "tokens_per_s": T / (med / 1e3), "step_ms": med,
                  "step_ms_min": ms[0], "threads": torch.get_num_threads(),
                  "loss_first": losses[0], "loss_last": losses[-1]}))
EOF

echo "threads: $threads; $(nproc) cores, load $(cut -d' ' -f1-3 /proc/loadavg)"
results=()
for cfg in ${CONFIGS:-tiny small}; do
  if [[ $cfg == tiny ]]; then st=${TINY_STEPS:-10} wu=${TINY_WARMUP:-2}; else st=${SMALL_STEPS:-3} wu=${SMALL_WARMUP:-1}; fi
  mkdir -p "$tmp/$cfg"
  python3 "$tmp/ref.py" make "$cfg" "$tmp/$cfg" 0 0 0 2>/dev/null
  ours=$("$bin" --model "$tmp/$cfg/model" --batch "$tmp/$cfg/batch.safetensors" --steps "$st" \
    --warmup "$wu" 2>/dev/null | tail -n 1) # the JSON line (the loader logs first)
  echo "$cfg ours:  $ours"
  ref=$(python3 "$tmp/ref.py" run "$cfg" "$tmp/$cfg" "$threads" "$st" "$wu" 2>/dev/null | tail -n 1)
  echo "$cfg torch: $ref"
  results+=("$cfg" "$ours" "$ref")
done
python3 - "${results[@]}" <<'EOF'
import json, sys
a = sys.argv[1:]
print(f"\n{'config':<7} {'ours tok/s':>11} {'torch tok/s':>12} {'ratio':>7} {'ours ms':>9} "
      f"{'torch ms':>9}   first-step loss ours | torch   last loss ours | torch")
for i in range(0, len(a), 3):
    cfg, o, r = a[i], json.loads(a[i + 1]), json.loads(a[i + 2])
    print(f"{cfg:<7} {o['tokens_per_s']:>11.0f} {r['tokens_per_s']:>12.0f} "
          f"{o['tokens_per_s'] / r['tokens_per_s']:>6.2f}x {o['step_ms']:>9.1f} {r['step_ms']:>9.1f}"
          f"   {o['loss_first']:.6f} | {r['loss_first']:.6f}   {o['loss_last']:.4f} | {r['loss_last']:.4f}")
print("ratio = ours / torch tokens/s (median steps); the first-step losses must agree (same "
      "weights and batch)")
EOF
