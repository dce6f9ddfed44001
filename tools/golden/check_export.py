"""Checks an exported HF snapshot in transformers against our own numbers (manual verification).

Loads DIR (written by save_hf_snapshot, e.g. `vlmtrain dump ... --export DIR`) with
transformers (Qwen3ForCausalLM, Qwen3VLForConditionalGeneration for model_type qwen3_vl,
Qwen3_5ForConditionalGeneration for qwen3_5), checks that it reports no missing and no unexpected
keys, runs the batch file that `vlmtrain dump` used (input_ids, labels, position_ids, cu_seqlens;
pixel_values and image_grid_thw for the VLMs) as one packed row — position-ids varlen with
use_cache=False, without which transformers silently attends across documents; for Qwen3-VL the
4-row form whose row 0 (text positions restarting per document) marks the documents; Qwen3.5
document by document, since transformers' pure-torch Gated DeltaNet ignores packing — and
compares the logits and the loss with the dump file. The model runs in the snapshot's dtype on CPU with eager attention. If DIR holds
tokenizer files, the tokenizer is loaded too (a smoke check that they were copied intact).

Usage:
  build/vlmtrain dump --model tests/data/qwen3_tiny_untied \\
      --batch tests/data/qwen3_tiny_batches/packed.safetensors --out /tmp/dump.safetensors \\
      --export /tmp/export
  python3 tools/golden/check_export.py /tmp/export --batch \\
      tests/data/qwen3_tiny_batches/packed.safetensors --dump /tmp/dump.safetensors
  (Qwen3-VL: --model tests/data/qwen3_vl_tiny_untied and
   --batch tests/data/qwen3_vl_tiny_batches/untied_packed.safetensors; Qwen3.5:
   tests/data/qwen3_5_tiny_hybrid and tests/data/qwen3_5_tiny_batches/hybrid_packed.safetensors.)
Exit status 0 when logits rel_error (max-norm) <= --tol (default 1e-5 for float32 snapshots, 2e-2
for bfloat16) and |loss difference| <= 10 * tol.
"""
import argparse
import json
import os
import sys

import torch
from safetensors.torch import load_file
from transformers import (AutoTokenizer, Qwen3_5ForConditionalGeneration, Qwen3ForCausalLM,
                          Qwen3VLForConditionalGeneration)

from common import documents_loss


def per_document(model, batch, image_token_id, merge):
    """Each document of the packed batch alone (its images with it): (logits, loss)."""
    cu = batch["cu_seqlens"].tolist()
    grids = batch["image_grid_thw"].long().tolist() if "image_grid_thw" in batch else []
    pairs, image, patch = [], 0, 0
    for d in range(len(cu) - 1):
        ids = batch["input_ids"][cu[d]:cu[d + 1]].long()
        labels = batch["labels"][cu[d]:cu[d + 1]].long()
        kwargs, placeholders, first = {}, int((ids == image_token_id).sum()), image
        while placeholders > 0:
            placeholders -= grids[image][0] * grids[image][1] * grids[image][2] // (merge * merge)
            image += 1
        if image > first:
            n = sum(t * h * w for t, h, w in grids[first:image])
            kwargs = dict(pixel_values=batch["pixel_values"][patch:patch + n].to(model.dtype),
                          image_grid_thw=torch.tensor(grids[first:image]),
                          mm_token_type_ids=(ids == image_token_id).long().view(1, -1))
            patch += n
        logits = model(input_ids=ids.view(1, -1), use_cache=False, **kwargs).logits[0].float()
        pairs.append((logits, torch.cat([labels[1:], torch.tensor([-100])])))
    with torch.enable_grad():
        return documents_loss(pairs)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("dir", help="exported HF snapshot directory")
    ap.add_argument("--batch", required=True, help="the batch file given to vlmtrain dump")
    ap.add_argument("--dump", required=True, help="the output file of vlmtrain dump")
    ap.add_argument("--tol", type=float, default=None, help="logits max-norm relative tolerance")
    args = ap.parse_args()

    with open(os.path.join(args.dir, "config.json")) as f:
        config = json.load(f)
    dtype_name = config.get("torch_dtype", config.get("dtype", "float32"))
    model_type = config.get("model_type")
    vision = model_type in ("qwen3_vl", "qwen3_5")
    dtype = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}[dtype_name]
    tol = args.tol if args.tol is not None else (1e-5 if dtype == torch.float32 else 2e-2)

    cls = {"qwen3_vl": Qwen3VLForConditionalGeneration,
           "qwen3_5": Qwen3_5ForConditionalGeneration}.get(model_type, Qwen3ForCausalLM)
    model, info = cls.from_pretrained(args.dir, dtype=dtype, attn_implementation="eager",
                                      output_loading_info=True)
    model.eval()
    bad_keys = {k: v for k, v in info.items() if v and k in ("missing_keys", "unexpected_keys")}
    print(f"loading info: {bad_keys or 'no missing or unexpected keys'}")
    print(f"loaded {args.dir} in transformers: {sum(p.numel() for p in model.parameters())} "
          f"parameters, {dtype_name}, tie_word_embeddings={model.config.tie_word_embeddings}")
    if os.path.exists(os.path.join(args.dir, "tokenizer.json")):
        tok = AutoTokenizer.from_pretrained(args.dir)
        print(f"tokenizer loads: {type(tok).__name__}, {len(tok)} tokens")

    batch = load_file(args.batch)
    dump = load_file(args.dump)
    if model_type == "qwen3_5":
        ref_logits, ref_loss = per_document(model, batch, config["image_token_id"],
                                            config["vision_config"]["spatial_merge_size"])
        return compare(dump, ref_logits, ref_loss, tol, bad_keys)
    ids = batch["input_ids"].long().view(1, -1)
    labels = batch["labels"].long().view(1, -1)
    kwargs = {}
    if vision:
        cu = batch["cu_seqlens"].tolist()
        text_pos = torch.cat([torch.arange(cu[i + 1] - cu[i]) for i in range(len(cu) - 1)])
        pos = torch.cat([text_pos.view(1, -1), batch["position_ids"].long().view(3, -1)])
        pos = pos.view(4, 1, -1)
        if "pixel_values" in batch:
            kwargs = dict(pixel_values=batch["pixel_values"].to(dtype),
                          image_grid_thw=batch["image_grid_thw"].long())
    else:
        pos = batch["position_ids"].long().view(1, -1)
    with torch.no_grad():
        out = model(input_ids=ids, labels=labels, position_ids=pos, use_cache=False, **kwargs)
    return compare(dump, out.logits[0].float(), out.loss, tol, bad_keys)


def compare(dump, ref_logits, ref_loss, tol, bad_keys):
    """Our dump's logits and loss against transformers'; 0 when within tol."""
    ours = dump["logits"].float()
    err = float((ours - ref_logits).abs().max() / ref_logits.abs().max())
    loss_err = abs(float(dump["loss"]) - float(ref_loss))
    print(f"logits rel_error {err:.3e} (tol {tol:g}); loss ours {float(dump['loss']):.7f} "
          f"transformers {float(ref_loss):.7f} (|diff| {loss_err:.2e})")
    ok = err <= tol and loss_err <= 10 * tol and not bad_keys
    print("OK" if ok else "MISMATCH")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
