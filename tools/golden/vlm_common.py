"""What the vision-language golden generators (gen_qwen3_vl.py, gen_qwen3_5.py) share.

Both build tiny transformers models with the same special ids (image 500, video 501, vision
start 502, vision end 503; vocab 512), in fp32 eager on CPU, seeded per variant, and write per
variant two rows — "packed" (documents with and without images) and "text" (text-only
documents) — as:

  tests/data/<family>_batches/<variant>_<batch>.safetensors   input_ids [T] int64, HF-aligned
      labels (-100 on each document's first token, on the image placeholders and on the spans
      the generator masks), cu_seqlens int32, position_ids [3, T] from transformers'
      get_rope_index run on each document, doc_lengths int64; with images also pixel_values
      [patches, 1536] f32 and image_grid_thw [images, 3] int64.
  tests/data/<family>_<variant>/   the HF snapshot (common.save_snapshot).
  tests/golden/<family>.safetensors   per case "<variant>_<batch>": logits [T, 512] f32, loss
      (0-dim f32), and of every parameter that has a gradient "grad.<hf name>" f32: the whole
      gradient if it has at most GRAD_SAMPLES elements, else (sampled_gradient) its flattened
      elements 0, s, 2s, ... [ceil(n / s)] with the stride s in "grad_stride.<hf name>" (0-dim
      int64), s chosen so that every row and every column of its [out, fan_in] view is sampled.

Reference semantics: each document runs alone (transformers computes its MRoPE ids itself from
mm_token_type_ids, use_cache=False), logits concatenated, loss = sum of per-document CE sums /
the row's valid count (common.documents_loss).
"""
import math
import os
import shutil
import sys

import torch
import transformers
from safetensors.torch import save_file

from common import DATA_DIR, REPO, GoldenWriter, documents_loss, save_snapshot

SEED = 0
IMAGE, VIDEO, VSTART, VEND = 500, 501, 502, 503
VOCAB = 512
GRIDS = [(1, 4, 6), (1, 10, 8)]
# Elements stored of a large gradient (sampled_gradient): the golden files of both families stay
# under 2 MiB; whole gradients would take 4.9 MiB (Qwen3.5) and 9.2 MiB (Qwen3-VL).
GRAD_SAMPLES = 1024


def tiny_config(config_cls, text, vision, tied):
    """config_cls with the special ids above and eager attention everywhere; `text` and `vision`
    are the family's own fields on top of those both families' tiny models have."""
    text = dict(vocab_size=VOCAB, hidden_size=64, rms_norm_eps=1e-6, max_position_embeddings=4096,
                attention_bias=False, hidden_act="silu", initializer_range=0.02, **text)
    vision = dict(patch_size=16, temporal_patch_size=2, in_channels=3, spatial_merge_size=2,
                  out_hidden_size=64, num_position_embeddings=64, hidden_act="gelu_pytorch_tanh",
                  initializer_range=0.02, **vision)
    cfg = config_cls(text_config=text, vision_config=vision, image_token_id=IMAGE,
                     video_token_id=VIDEO, vision_start_token_id=VSTART,
                     vision_end_token_id=VEND, tie_word_embeddings=tied)
    cfg._attn_implementation = "eager"
    cfg.text_config._attn_implementation = "eager"
    cfg.vision_config._attn_implementation = "eager"
    return cfg


def new_model(model_cls, cfg, variant):
    """model_cls(cfg) in fp32 eval mode, after seeding torch with the variant's seed."""
    torch.manual_seed(SEED + (variant == "tied"))
    return model_cls(cfg).float().eval()


def assert_tied(model):
    assert model.lm_head.weight.data_ptr() == model.model.language_model.embed_tokens.weight.data_ptr()


def image_doc(gen, texts, merge=2):
    """Text, image 1, text, image 2, text (the images of GRIDS, each between vision start / end;
    `texts` the three text lengths); labels -100 on the placeholders and a prompt span."""
    pieces = []
    def text(n):
        pieces.append(torch.randint(0, IMAGE, (n,), generator=gen))
    def image(g):
        n = g[0] * (g[1] // merge) * (g[2] // merge)
        pieces.append(torch.tensor([VSTART] + [IMAGE] * n + [VEND]))
    text(texts[0])
    image(GRIDS[0])
    text(texts[1])
    image(GRIDS[1])
    text(texts[2])
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


def make_batch(model, gen, docs):
    """One packed row of `docs`, [((ids, labels), grids)]; pixel_values drawn from `gen` after
    the documents. Returns the batch and each document's grids."""
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


def sampled_gradient(grad):
    """The golden tensors of one gradient: {"": the gradient} if it has at most GRAD_SAMPLES
    elements (every 1-D one: norms, biases, A_log, dt_bias), else {"": its flattened elements
    0, s, 2s, ..., "_stride": s}. Seen as [out, fan_in] (rows: output channels, columns: inputs),
    s <= fan_in samples every row and s <= out with gcd(s, fan_in) = 1 every column, so a wrong
    head, channel, input feature or token row cannot hide between the samples."""
    n = grad.numel()
    out = grad.shape[0] if grad.dim() >= 2 else n
    fan_in = n // out
    s = min(-(-n // GRAD_SAMPLES), out, fan_in)
    while s > 1 and math.gcd(s, fan_in) != 1:
        s -= 1
    if s <= 1:
        return {"": grad}
    picked = grad.reshape(-1)[::s]
    at = torch.arange(n)[::s]
    rows, cols = at // fan_in, at % fan_in
    assert rows.unique().numel() == out and cols.unique().numel() == fan_in, (grad.shape, s)
    return {"": picked, "_stride": torch.tensor(s, dtype=torch.int64)}


def grads_of(model):
    return {n: p.grad.detach().clone() for n, p in model.named_parameters()
            if p.grad is not None}


def doc_pairs(model, batch, doc_grids):
    """Each document alone through transformers: [(logits, shifted targets)]."""
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
    return pairs


def hf_separate(model, batch, doc_grids):
    """The definition: each document alone, loss = the row's valid-target mean."""
    model.zero_grad(set_to_none=True)
    logits, loss = documents_loss(doc_pairs(model, batch, doc_grids))
    return logits, loss, grads_of(model)


def write_goldens(family, variants, build_model, documents, reference, finish_variant=None):
    """Every case of one family, in the files listed at the top (family e.g. "qwen3_vl_tiny"):
    per variant the model build_model(variant), then the rows "packed" and "text" made of
    documents(gen, with_images) (gen seeded per variant; pixel_values drawn after the
    documents), whose golden values reference(case, model, batch, doc_grids) returns as
    (logits, loss, grads); then the snapshot, and finish_variant(variant, model, rows) with
    rows = {"packed" / "text": (batch, doc_grids)} for the family's own checks and files."""
    golden = GoldenWriter(family, SEED)
    bdir = os.path.join(DATA_DIR, f"{family}_batches")
    shutil.rmtree(bdir, ignore_errors=True)
    os.makedirs(bdir)
    for variant in variants:
        model = build_model(variant)
        gen = torch.Generator().manual_seed(SEED + 10 + (variant == "tied"))
        rows = {}
        for bname, with_images in (("packed", True), ("text", False)):
            case = f"{variant}_{bname}"
            batch, doc_grids = make_batch(model, gen, documents(gen, with_images))
            save_file({k: v.contiguous() for k, v in batch.items()},
                      os.path.join(bdir, f"{case}.safetensors"),
                      metadata={"generator": os.path.relpath(sys.argv[0], REPO)})
            logits, loss, grads = reference(case, model, batch, doc_grids)
            golden.add(case, logits=logits.float(), loss=loss.float().reshape(()),
                       **{f"grad{suffix}.{n}": t.float() if t.is_floating_point() else t
                          for n, g in grads.items()
                          for suffix, t in sampled_gradient(g).items()})
            vision = [n for n in grads if n.startswith("model.visual.")]
            image_rows = int((batch["input_ids"] == IMAGE).sum())
            print(f"{case}: {batch['input_ids'].numel()} tokens, cu_seqlens "
                  f"{batch['cu_seqlens'].tolist()}, {image_rows} image tokens, "
                  f"loss {float(loss):.6f}, {len(grads)} gradients ({len(vision)} vision)")
            rows[bname] = (batch, doc_grids)
        save_snapshot(model, f"{family}_{variant}")
        if finish_variant is not None:
            finish_variant(variant, model, rows)
    golden.save(transformers=transformers.__version__)
