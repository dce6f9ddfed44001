#!/usr/bin/env python3
"""The PyTorch side of bench/bench_vl_step.sh: a random snapshot and one packed batch for a
vision-language family and config (mode "make"), and transformers eager training steps on them
(mode "run"), which prints one JSON line like bench_vl_step's.

  bench_vl_step_ref.py make FAMILY CONFIG DIR
  bench_vl_step_ref.py run FAMILY CONFIG DIR THREADS STEPS WARMUP

FAMILY: qwen3_vl (Qwen3VLForConditionalGeneration) or qwen3_5 (Qwen3_5ForConditionalGeneration:
hybrid Gated DeltaNet + gated attention; on CPU transformers runs its pure-torch fallbacks,
torch_chunk_gated_delta_rule and an F.conv1d causal conv). CONFIG: tiny or small (sizes below and
in bench_vl_step.sh). DIR receives model/ (save_pretrained, fp32) and batch.safetensors (the format
of `vlmtrain dump`: input_ids, labels, position_ids [3, T] from get_rope_index per document,
cu_seqlens, pixel_values, image_grid_thw).

The step: fp32, attn_implementation "eager", every parameter trained; each document runs alone
(transformers computes its MRoPE ids from mm_token_type_ids; neither family's torch path keeps
packed documents apart: Qwen3.5's GDN fallbacks refuse cu_seqlens), loss = the sum of the
documents' CE sums over the row's valid targets; backward, clip_grad_norm_(1.0),
torch.optim.AdamW(lr 1e-3, betas 0.9/0.999, eps 1e-8, fused=False) with weight decay 0.01 on what
ours decays (no decay on 1-D parameters: norms, biases, A_log, dt_bias; nor on the token and
position embeddings). FLUSH_DENORMAL=1 in the environment: torch.set_flush_denormal(True) for the
run (our kernels flush subnormals where they make them; torch's GDN fallback makes them from strong
decays).
"""
import json
import os
import sys
import time

import torch
from safetensors.torch import load_file, save_file

LIN, FULL = "linear_attention", "full_attention"

# Per family and config: the text and vision configs, the special ids' base (image, video, vision
# start, vision end = IMAGE .. IMAGE + 3) and the batch: docs documents of doc_len tokens, each with
# one image of grid (t, h, w).
SHAPES = {
    "qwen3_vl": {
        "tiny": dict(text=dict(vocab_size=512, hidden_size=64, intermediate_size=128,
                               num_hidden_layers=4, num_attention_heads=4, num_key_value_heads=2,
                               head_dim=32,
                               rope_parameters={"rope_type": "default", "rope_theta": 5e6,
                                                "mrope_section": [6, 5, 5]}),
                     vision=dict(depth=4, hidden_size=64, num_heads=4, intermediate_size=128,
                                 out_hidden_size=64, num_position_embeddings=64,
                                 deepstack_visual_indexes=[0, 2, 3]),
                     image=500, docs=3, doc_len=96, grid=(1, 8, 8)),
        "small": dict(text=dict(vocab_size=32000, hidden_size=512, intermediate_size=1536,
                                num_hidden_layers=8, num_attention_heads=8, num_key_value_heads=4,
                                head_dim=64,
                                rope_parameters={"rope_type": "default", "rope_theta": 5e6,
                                                 "mrope_section": [12, 10, 10]}),
                      vision=dict(depth=8, hidden_size=256, num_heads=4, intermediate_size=1024,
                                  out_hidden_size=512, num_position_embeddings=256,
                                  deepstack_visual_indexes=[1, 3, 5]),
                      image=31000, docs=4, doc_len=256, grid=(1, 16, 16)),
    },
    "qwen3_5": {
        # tools/golden/gen_qwen3_5.py's "hybrid" T3 variant with I 128 and a wider vision tower
        "tiny": dict(text=dict(vocab_size=512, hidden_size=64, intermediate_size=128,
                               num_hidden_layers=8, layer_types=[LIN, LIN, LIN, FULL] * 2,
                               num_attention_heads=4, num_key_value_heads=2, head_dim=64,
                               linear_num_key_heads=2, linear_num_value_heads=4,
                               linear_key_head_dim=32, linear_value_head_dim=16,
                               rope_parameters={"rope_type": "default", "rope_theta": 1e7,
                                                "partial_rotary_factor": 0.25,
                                                "mrope_section": [3, 3, 2],
                                                "mrope_interleaved": True}),
                     vision=dict(depth=4, hidden_size=64, num_heads=4, intermediate_size=128,
                                 out_hidden_size=64, num_position_embeddings=64),
                     image=500, docs=3, doc_len=96, grid=(1, 8, 8)),
        "small": dict(text=dict(vocab_size=32000, hidden_size=512, intermediate_size=1536,
                                num_hidden_layers=8, layer_types=[LIN, LIN, LIN, FULL] * 2,
                                num_attention_heads=8, num_key_value_heads=4, head_dim=128,
                                linear_num_key_heads=4, linear_num_value_heads=8,
                                linear_key_head_dim=64, linear_value_head_dim=64,
                                rope_parameters={"rope_type": "default", "rope_theta": 1e7,
                                                 "partial_rotary_factor": 0.25,
                                                 "mrope_section": [6, 5, 5],
                                                 "mrope_interleaved": True}),
                      vision=dict(depth=8, hidden_size=256, num_heads=4, intermediate_size=1024,
                                  out_hidden_size=512, num_position_embeddings=256),
                      image=31000, docs=4, doc_len=256, grid=(1, 16, 16)),
    },
}


def model_class(family):
    if family == "qwen3_vl":
        from transformers import Qwen3VLConfig, Qwen3VLForConditionalGeneration
        return Qwen3VLConfig, Qwen3VLForConditionalGeneration
    from transformers import Qwen3_5Config, Qwen3_5ForConditionalGeneration
    return Qwen3_5Config, Qwen3_5ForConditionalGeneration


def make(family, shapes, out):
    config_cls, model_cls = model_class(family)
    image = shapes["image"]
    text = dict(shapes["text"], rms_norm_eps=1e-6, hidden_act="silu", max_position_embeddings=4096,
                attention_bias=False)
    if family == "qwen3_5":
        text["linear_conv_kernel_dim"] = 4
    torch.manual_seed(0)
    cfg = config_cls(text_config=text,
                     vision_config=dict(shapes["vision"], patch_size=16, temporal_patch_size=2,
                                        in_channels=3, spatial_merge_size=2,
                                        hidden_act="gelu_pytorch_tanh"),
                     image_token_id=image, video_token_id=image + 1,
                     vision_start_token_id=image + 2, vision_end_token_id=image + 3,
                     tie_word_embeddings=False)
    model = model_cls(cfg).float()
    model.save_pretrained(out + "/model")
    g = torch.Generator().manual_seed(1)
    t, h, w = shapes["grid"]
    n_img = t * h * w // 4
    ids, pos, cu = [], [], [0]
    for _ in range(shapes["docs"]):
        n_text = shapes["doc_len"] - n_img - 2
        head = torch.randint(0, image, (4,), generator=g).tolist()
        tail = torch.randint(0, image, (n_text - 4,), generator=g).tolist()
        doc = head + [image + 2] + [image] * n_img + [image + 3] + tail
        row = torch.tensor([doc])
        p, _ = model.model.get_rope_index(row, (row == image).long(),
                                          image_grid_thw=torch.tensor([shapes["grid"]]))
        ids += doc
        pos.append(p[:, 0])
        cu.append(len(ids))
    ids = torch.tensor(ids)
    labels = ids.clone()
    labels[ids == image] = -100
    labels[torch.tensor(cu[:-1])] = -100
    patches = shapes["docs"] * t * h * w
    save_file({"input_ids": ids, "labels": labels, "position_ids": torch.cat(pos, 1).contiguous(),
               "cu_seqlens": torch.tensor(cu, dtype=torch.int32),
               "pixel_values": torch.randn(patches, 1536, generator=g),
               "image_grid_thw": torch.tensor([shapes["grid"]] * shapes["docs"])},
              out + "/batch.safetensors")


def documents(b, image):
    """Each document of the packed row alone: (ids [1, L], shifted targets, pixel_values, grid,
    mm_token_type_ids), and the row's valid-target count."""
    cu = b["cu_seqlens"].tolist()
    per_doc = b["image_grid_thw"].prod(-1).tolist()
    num_targets, docs = 0, []
    for d in range(len(cu) - 1):
        s, e = cu[d], cu[d + 1]
        ids = b["input_ids"][s:e]
        tgt = torch.cat([b["labels"][s + 1:e], torch.tensor([-100])])
        num_targets += int((tgt != -100).sum())
        p0 = sum(per_doc[:d])
        docs.append((ids.view(1, -1), tgt, b["pixel_values"][p0:p0 + per_doc[d]],
                     b["image_grid_thw"][d:d + 1], (ids == image).long().view(1, -1)))
    return docs, num_targets


def run(family, shapes, out, threads, steps, warmup):
    torch.set_num_threads(max(threads, 1))
    if os.environ.get("FLUSH_DENORMAL") == "1":
        torch.set_flush_denormal(True)
    _, model_cls = model_class(family)
    model = model_cls.from_pretrained(out + "/model", dtype=torch.float32,
                                      attn_implementation="eager").train()
    b = load_file(out + "/batch.safetensors")
    docs, num_targets = documents(b, shapes["image"])
    decay, no_decay = [], []
    for name, p in model.named_parameters():
        exempt = p.dim() < 2 or name.endswith(("embed_tokens.weight", "pos_embed.weight"))
        (no_decay if exempt else decay).append(p)
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


def main():
    mode, family, cfg_name, out = sys.argv[1:5]
    shapes = SHAPES[family][cfg_name]
    if mode == "make":
        make(family, shapes, out)
    else:
        run(family, shapes, out, *(int(x) for x in sys.argv[5:8]))


if __name__ == "__main__":
    main()
