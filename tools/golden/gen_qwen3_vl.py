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
      loss (mean over the row's valid targets), "grad.<hf name>" of every parameter, whole up to
      1024 elements, else sampled with its stride in "grad_stride.<hf name>"
      (vlm_common.sampled_gradient; 170 of the 336 gradients: every row and column of each still
      compared; whole they made the file 9,661,048 bytes, sampled 1,612,552) (vision parameters
      absent from HF's text-only run: their gradient is zero by definition).

Reference semantics: each document runs alone (transformers computes its MRoPE ids itself from
mm_token_type_ids), logits concatenated, loss = sum of per-document CE sums / the row's valid
count. The generator checks that transformers' own packed run (4-row position ids: row 0 the
per-document text positions that mark the documents, use_cache=False) agrees to 1e-5.

What this and gen_qwen3_5.py share (documents, rows, the separate runs, the driver) is in
vlm_common.py.

Run: python3 tools/golden/gen_qwen3_vl.py   (torch + transformers + safetensors from pip)
"""
import math

import torch
from transformers import Qwen3VLConfig, Qwen3VLForConditionalGeneration

from common import rel
from vlm_common import (GRIDS, assert_tied, grads_of, hf_separate, image_doc, new_model,
                        text_doc, tiny_config, write_goldens)


def t2_config(variant):
    tied = variant == "tied"
    text = dict(intermediate_size=128, num_hidden_layers=4, num_attention_heads=4,
                num_key_value_heads=2, head_dim=32,
                rope_parameters={"rope_type": "default", "rope_theta": 5e6,
                                 "mrope_section": [8, 4, 4] if tied else [6, 5, 5],
                                 "mrope_interleaved": True})
    vision = dict(depth=4, hidden_size=72 if tied else 64, num_heads=1 if tied else 4,
                  intermediate_size=128, deepstack_visual_indexes=[0, 2, 3])
    return tiny_config(Qwen3VLConfig, text, vision, tied)


def build_model(variant):
    model = new_model(Qwen3VLForConditionalGeneration, t2_config(variant), variant)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("norm.weight") or ".norm" in name and name.endswith(".weight"):
                p.copy_(1.0 + 0.1 * torch.randn_like(p))
            elif name.endswith(".bias"):
                p.copy_(0.02 * torch.randn_like(p))
            elif name.startswith("model.visual.") and p.dim() >= 2 and "pos_embed" not in name:
                p.normal_(0.0, 1.0 / math.sqrt(p[0].numel()))
    if variant == "tied":
        assert_tied(model)
    return model


def documents(gen, with_images):
    if with_images:
        return [(text_doc(gen, 30, masked=(3, 4, 5)), []), (image_doc(gen, (7, 9, 12)), GRIDS),
                (text_doc(gen, 11), [])]
    return [(text_doc(gen, 23, masked=(7, 8)), []), (text_doc(gen, 41, masked=(20,)), [])]


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


def reference(case, model, batch, doc_grids):
    """The separate runs (the golden), checked against transformers' own packed run."""
    logits, loss, grads = hf_separate(model, batch, doc_grids)
    p_logits, p_loss, p_grads = hf_packed(model, batch)
    errs = [rel(p_logits, logits), abs(float(p_loss - loss))]
    errs += [rel(p_grads[n], g) for n, g in grads.items()]
    assert set(p_grads) == set(grads), set(p_grads) ^ set(grads)
    print(f"{case}: transformers packed vs separate: logits {errs[0]:.2e}, "
          f"loss {errs[1]:.2e}, worst grad {max(errs[2:]):.2e}")
    assert max(errs) < 1e-5, errs
    return logits, loss, grads


def main():
    write_goldens("qwen3_vl_tiny", ("untied", "tied"), build_model, documents, reference)


if __name__ == "__main__":
    main()
