"""Golden files for the Qwen3-VL model (model/qwen3_vl/, `vlmtrain dump`) from transformers.

Builds the tiny Qwen3-VL of docs/qwen-models.md §8 (T2: text H=64, L=4, Hq=4, Hkv=2, D=32,
I=128, vocab=512, θ=5e6, mrope_section [6,5,5]; vision depth 4, Hv=64, 4 heads (hd 16), Iv=128,
patch 16, temporal patch 2, merge 2, an 8×8 position table, out 64, DeepStack [0, 2, 3]; special
ids 500-503) with transformers' own Qwen3VLForConditionalGeneration in fp32 eager on CPU, in two
variants:

  untied   the T2 model, untied head;
  tied     tied head and a vision width of 72 with one head (hd 72, the released models' vision
           head dim; T2's 16 covers the multi-head layout), mrope_section [8,4,4] (the
           [24,20,20]-style tail slots that fall back to T).

HF init leaves norms at 1 and biases at 0, and its 0.02 std makes the vision features vanish in
a 4-layer model; the generator perturbs every norm weight (1 + 0.1·N), gives every bias 0.02·N
and every vision linear weight std 1/sqrt(fan_in), so every parameter's place in the formulas is
tested. Writes:

  tests/data/qwen3_vl_tiny_{untied,tied}/   HF snapshots (config.json + model.safetensors, fp32).
  tests/data/qwen3_vl_tiny_batches/<variant>_packed.safetensors   one packed row of 3 documents:
      a text-only one, one with two images of grids (1,4,6) and (1,10,8) (6 and 20 placeholder
      tokens, text before, between and after), a short text-only one. input_ids [T] int64,
      HF-aligned labels (-100 on each document's first token, on the image placeholders and on a
      "prompt" span), cu_seqlens, position_ids [3, T] from transformers' get_rope_index run on
      each document, pixel_values [104, 1536] f32, image_grid_thw [2, 3] int64, and doc_lengths
      (the documents' lengths, for the position-id test).
  tests/data/qwen3_vl_tiny_batches/<variant>_text.safetensors   a row of 2 text-only documents
      (no images: the text path; every vision gradient must be zero).
  tests/golden/qwen3_vl_tiny.safetensors   per case "<variant>_<batch>": logits [T, 512] f32,
      loss (mean over the row's valid targets), "grad.<hf name>" of every parameter (vision
      parameters absent from HF's text-only run: their gradient is zero by definition).

Reference semantics: each document runs alone (transformers computes its MRoPE ids itself from
mm_token_type_ids), logits concatenated, loss = sum of per-document CE sums / the row's valid
count. The generator checks that transformers' own packed run (4-row position ids: row 0 the
per-document text positions that mark the documents, use_cache=False) agrees to 1e-5.

Run: python3 tools/golden/gen_qwen3_vl.py   (torch + transformers + safetensors from pip)
"""
import math
import os
import shutil
import sys

import torch
import transformers
from safetensors.torch import save_file
from transformers import Qwen3VLConfig, Qwen3VLForConditionalGeneration

from common import documents_loss, rel, save_snapshot

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
DATA = os.path.join(REPO, "tests", "data")
GOLDEN = os.path.join(REPO, "tests", "golden", "qwen3_vl_tiny.safetensors")
SEED = 0
IMAGE, VIDEO, VSTART, VEND = 500, 501, 502, 503
VOCAB = 512
GRIDS = [(1, 4, 6), (1, 10, 8)]


def t2_config(variant):
    tied = variant == "tied"
    text = dict(vocab_size=VOCAB, hidden_size=64, intermediate_size=128, num_hidden_layers=4,
                num_attention_heads=4, num_key_value_heads=2, head_dim=32, rms_norm_eps=1e-6,
                max_position_embeddings=4096, attention_bias=False, hidden_act="silu",
                initializer_range=0.02,
                rope_parameters={"rope_type": "default", "rope_theta": 5e6,
                                 "mrope_section": [8, 4, 4] if tied else [6, 5, 5],
                                 "mrope_interleaved": True})
    vision = dict(depth=4, hidden_size=72 if tied else 64, num_heads=1 if tied else 4,
                  intermediate_size=128, patch_size=16, temporal_patch_size=2, in_channels=3,
                  spatial_merge_size=2, out_hidden_size=64, num_position_embeddings=64,
                  deepstack_visual_indexes=[0, 2, 3], hidden_act="gelu_pytorch_tanh",
                  initializer_range=0.02)
    cfg = Qwen3VLConfig(text_config=text, vision_config=vision, image_token_id=IMAGE,
                        video_token_id=VIDEO, vision_start_token_id=VSTART,
                        vision_end_token_id=VEND, tie_word_embeddings=tied)
    cfg._attn_implementation = "eager"
    cfg.text_config._attn_implementation = "eager"
    cfg.vision_config._attn_implementation = "eager"
    return cfg


def build_model(variant):
    torch.manual_seed(SEED + (variant == "tied"))
    model = Qwen3VLForConditionalGeneration(t2_config(variant)).float().eval()
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("norm.weight") or ".norm" in name and name.endswith(".weight"):
                p.copy_(1.0 + 0.1 * torch.randn_like(p))
            elif name.endswith(".bias"):
                p.copy_(0.02 * torch.randn_like(p))
            elif name.startswith("model.visual.") and p.dim() >= 2 and "pos_embed" not in name:
                p.normal_(0.0, 1.0 / math.sqrt(p[0].numel()))
    if variant == "tied":
        assert model.lm_head.weight.data_ptr() == model.model.language_model.embed_tokens.weight.data_ptr()
    return model


def image_doc(gen, merge=2):
    """Text, image 1, text, image 2, text; labels -100 on the placeholders and a prompt span."""
    pieces = []
    def text(n):
        pieces.append(torch.randint(0, IMAGE, (n,), generator=gen))
    def image(g):
        n = g[0] * (g[1] // merge) * (g[2] // merge)
        pieces.append(torch.tensor([VSTART] + [IMAGE] * n + [VEND]))
    text(7)
    image(GRIDS[0])
    text(9)
    image(GRIDS[1])
    text(12)
    ids = torch.cat(pieces)
    labels = ids.clone()
    labels[ids == IMAGE] = -100
    labels[:5] = -100  # a "prompt" span
    return ids, labels


def text_doc(gen, n, masked=()):
    ids = torch.randint(0, IMAGE, (n,), generator=gen)
    labels = ids.clone()
    labels[list(masked)] = -100
    return ids, labels


def hf_doc_positions(model, ids, grids):
    mm = (ids == IMAGE).long().view(1, -1)
    grid = torch.tensor(grids, dtype=torch.long) if grids else None
    if grid is None:
        return torch.arange(ids.numel()).view(1, -1).expand(3, -1).clone()
    pos, _ = model.model.get_rope_index(ids.view(1, -1), mm, image_grid_thw=grid)
    return pos[:, 0, :]


def make_batch(model, gen, with_images):
    if with_images:
        docs = [(text_doc(gen, 30, masked=(3, 4, 5)), []), (image_doc(gen), GRIDS),
                (text_doc(gen, 11), [])]
    else:
        docs = [(text_doc(gen, 23, masked=(7, 8)), []), (text_doc(gen, 41, masked=(20,)), [])]
    ids, labels, pos, cu, doc_grids = [], [], [], [0], []
    for (d_ids, d_labels), grids in docs:
        d_labels = d_labels.clone()
        d_labels[0] = -100  # the previous document's last position must not predict it
        ids.append(d_ids)
        labels.append(d_labels)
        pos.append(hf_doc_positions(model, d_ids, grids))
        cu.append(cu[-1] + d_ids.numel())
        doc_grids.append(grids)
    batch = {"input_ids": torch.cat(ids).long(), "labels": torch.cat(labels).long(),
             "position_ids": torch.cat(pos, dim=1).long().contiguous(),
             "cu_seqlens": torch.tensor(cu, dtype=torch.int32),
             "doc_lengths": torch.tensor([d[0][0].numel() for d in docs], dtype=torch.int64)}
    all_grids = [g for gs in doc_grids for g in gs]
    if all_grids:
        patches = sum(t * h * w for t, h, w in all_grids)
        vc = model.config.vision_config
        dim = vc.in_channels * vc.temporal_patch_size * vc.patch_size ** 2
        batch["pixel_values"] = torch.randn(patches, dim, generator=gen)
        batch["image_grid_thw"] = torch.tensor(all_grids, dtype=torch.int64)
    return batch, doc_grids


def grads_of(model):
    return {n: p.grad.detach().clone() for n, p in model.named_parameters()
            if p.grad is not None}


def hf_separate(model, batch, doc_grids):
    """The definition: each document alone, loss = the row's valid-target mean."""
    model.zero_grad(set_to_none=True)
    cu = batch["cu_seqlens"].tolist()
    pairs, patch0, image0 = [], 0, 0
    for b in range(len(cu) - 1):
        s, e = cu[b], cu[b + 1]
        ids, labels = batch["input_ids"][s:e], batch["labels"][s:e]
        kwargs = {}
        grids = doc_grids[b]
        if grids:
            patches = sum(t * h * w for t, h, w in grids)
            kwargs = dict(pixel_values=batch["pixel_values"][patch0:patch0 + patches],
                          image_grid_thw=batch["image_grid_thw"][image0:image0 + len(grids)],
                          mm_token_type_ids=(ids == IMAGE).long().view(1, -1))
            patch0 += patches
            image0 += len(grids)
        lg = model(input_ids=ids.view(1, -1), use_cache=False, **kwargs).logits[0]
        target = torch.cat([labels[1:], torch.tensor([-100])])  # HF's shift inside the doc
        pairs.append((lg, target))
    logits, loss = documents_loss(pairs)
    return logits, loss, grads_of(model)


def hf_packed(model, batch):
    """The packed row as one transformers call: 4-row position ids, row 0 marks the documents."""
    model.zero_grad(set_to_none=True)
    cu = batch["cu_seqlens"].tolist()
    text_pos = torch.cat([torch.arange(cu[i + 1] - cu[i]) for i in range(len(cu) - 1)])
    pos4 = torch.cat([text_pos.view(1, -1), batch["position_ids"]]).view(4, 1, -1)
    kwargs = {}
    if "pixel_values" in batch:
        kwargs = dict(pixel_values=batch["pixel_values"], image_grid_thw=batch["image_grid_thw"])
    out = model(input_ids=batch["input_ids"].view(1, -1), labels=batch["labels"].view(1, -1),
                position_ids=pos4, use_cache=False, **kwargs)
    out.loss.backward()
    return out.logits[0].detach(), out.loss.detach(), grads_of(model)


def main():
    golden = {}
    bdir = os.path.join(DATA, "qwen3_vl_tiny_batches")
    shutil.rmtree(bdir, ignore_errors=True)
    os.makedirs(bdir)
    for variant in ("untied", "tied"):
        model = build_model(variant)
        gen = torch.Generator().manual_seed(SEED + 10 + (variant == "tied"))
        for bname, with_images in (("packed", True), ("text", False)):
            case = f"{variant}_{bname}"
            batch, doc_grids = make_batch(model, gen, with_images)
            save_file({k: v.contiguous() for k, v in batch.items()},
                      os.path.join(bdir, f"{case}.safetensors"),
                      metadata={"generator": os.path.relpath(sys.argv[0], REPO)})
            logits, loss, grads = hf_separate(model, batch, doc_grids)
            p_logits, p_loss, p_grads = hf_packed(model, batch)
            errs = [rel(p_logits, logits), abs(float(p_loss - loss))]
            errs += [rel(p_grads[n], g) for n, g in grads.items()]
            assert set(p_grads) == set(grads), set(p_grads) ^ set(grads)
            print(f"{case}: transformers packed vs separate: logits {errs[0]:.2e}, "
                  f"loss {errs[1]:.2e}, worst grad {max(errs[2:]):.2e}")
            assert max(errs) < 1e-5, errs
            golden[f"{case}.logits"] = logits.float().contiguous()
            golden[f"{case}.loss"] = loss.float().reshape(())
            for n, g in grads.items():
                golden[f"{case}.grad.{n}"] = g.float().contiguous()
            vision = [n for n in grads if n.startswith("model.visual.")]
            image_rows = int((batch["input_ids"] == IMAGE).sum())
            print(f"{case}: {batch['input_ids'].numel()} tokens, {image_rows} image tokens, "
                  f"loss {float(loss):.6f}, {len(grads)} gradients ({len(vision)} vision)")
        save_snapshot(model, f"qwen3_vl_tiny_{variant}")
    save_file(golden, GOLDEN, metadata={"generator": os.path.relpath(sys.argv[0], REPO),
                                        "torch": torch.__version__,
                                        "transformers": transformers.__version__,
                                        "seed": str(SEED)})
    print(f"wrote {GOLDEN}: {len(golden)} tensors, {os.path.getsize(GOLDEN) / 1024:.0f} KiB")


if __name__ == "__main__":
    main()
