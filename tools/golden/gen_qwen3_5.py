"""Golden files for the Qwen3.5 model (hybrid Gated DeltaNet + gated attention) from transformers.

Builds the tiny Qwen3.5 of docs/qwen-models.md §8 (T3) with transformers' own
Qwen3_5ForConditionalGeneration (model_type "qwen3_5") in fp32 eager on CPU, in two variants:

  hybrid   text H=64, L=8, layer_types [linear, linear, linear, full] x 2, Hq=4, Hkv=2, D=64
           (q_proj [512, 64]: per head [query | gate]), partial_rotary_factor 0.25 (rotary dim 16,
           8 frequencies), mrope_section [3,3,2], θ=1e7, I=16, vocab 512, eps 1e-6; GDN HK=2,
           HV=4 (GVA ratio 2), dk=32, dv=16 (Kd=64, Vd=64, conv_dim=192), Kc=4; untied head.
  tied     tied head, layer_types [full, linear], GDN HV=HK=4, dk=dv=32 (Kd=Vd=128,
           conv_dim=384), I=32, attention Hq=4, Hkv=2, D=32 (rotary dim 8, 4 frequencies,
           mrope_section [2,1,1]: T owns slots 0 and 3, H 1, W 2).

Both: vision depth 2, Hv=16, 1 head (hd 16, T2's head dim), Iv=32, patch 16, temporal patch 2,
merge 2, an 8x8 position table, out 64, no DeepStack (Qwen3_5VisionConfig has no such field);
special ids image 500, video 501, vision start 502, vision end 503. The text configs also carry
fields of the released configs that transformers does not read (qwen-models.md §3.1):
attn_output_gate true, mamba_ssm_dtype "float32", mtp_num_hidden_layers 0 (1 in the bf16
snapshot), mtp_use_dedicated_embeddings false, and full_attention_interval 4 — which the tied
variant's [full, linear] contradicts on purpose: layer_types is authoritative.

Sizes. The models were sized when every case stored every gradient whole (the text parameters four
times; at T3's I=128 with T2's vision the hybrid cases alone would have exceeded a 5 MiB budget:
2 x 525k + 93k floats); gradients of more than 1024 elements are now stored sampled
(vlm_common.sampled_gradient), which brought the golden file from 5,140,448 bytes to under 2 MiB
with the same models and inputs. The parts that Qwen3.5 adds — GDN, gated attention, zero-
centred norms, partial MRoPE — keep T3's sizes in the hybrid variant; what shrinks is what
Qwen3 / Qwen3-VL goldens already cover (MLP width I, the vision tower) and the second variant
(L=2, D=32). Text parameters: hybrid 353,232, tied 121,256 (lm_head shared); vision 38,416.
Files (bytes): golden 1,867,112 (1.78 MiB), hybrid snapshot 1,582,936, tied 645,208, hybrid bf16
955,768, each packed batch 646,716 (pixel_values), each text batch 3,036.

Initialisation (seeded): HF's init leaves norms at their identity, dt_bias at 1 and everything
at std 0.02, with which the conv and gates would sit in their linear ranges; so every
Qwen3_5RMSNorm (zero-centred, (1 + w)) weight is 0.1·N(0,1), every GDN gated-norm weight
(plain multiplier) 1 + 0.1·N, every vision LayerNorm weight 1 + 0.1·N and bias 0.02·N, every
other bias 0.02·N, A_log = log U(0.5, 8), dt_bias = U(-4, 1) (per-token log decays g from
-0.001 to -28: heads with mean g -0.03 carry state across chunks, others forget within a few
tokens), embed_tokens std 1/sqrt(H), and every Linear / Conv weight, text and vision, std
1/sqrt(fan_in) (conv1d: fan_in = Kc = 4; vision pos_embed keeps HF's 0.02). Writes:

  tests/data/qwen3_5_tiny_{hybrid,tied}/   HF snapshots (config.json + model.safetensors, fp32,
      save_pretrained; the tied one has no lm_head.weight).
  tests/data/qwen3_5_tiny_hybrid_bf16/   the hybrid snapshot typed like the official checkpoints
      (§3.9): every tensor BF16 (rounded from the fp32 snapshot) except the 6 linear_attn.A_log
      [4] and the 6 linear_attn.norm.weight [16], which stay F32 (bit-equal to the fp32
      snapshot), plus 15 random BF16 mtp.* tensors (§3.10; transformers drops them on load):
      mtp.pre_fc_norm_embedding.weight [64], mtp.pre_fc_norm_hidden.weight [64],
      mtp.fc.weight [64, 128], mtp.norm.weight [64], and one full-attention layer
      mtp.layers.0.{input_layernorm,post_attention_layernorm}.weight [64],
      self_attn.q_proj [512, 64], k_proj / v_proj [128, 64], o_proj [64, 256],
      q_norm / k_norm [64], mlp.gate_proj / up_proj [16, 64], mlp.down_proj [64, 16].
      config.json = the hybrid one with dtype "bfloat16" and mtp_num_hidden_layers 1. No golden
      outputs: it is for the dtype round trip (read, train, write back each tensor in its dtype).
  tests/data/qwen3_5_tiny_batches/<variant>_packed.safetensors   one packed row of 4 documents,
      cu_seqlens [0, 11, 151, 152, 177] (every boundary inside a 64-token chunk): a text-only one
      of 11, an image one of 140 (3 chunks: 28 text, image (1,4,6) = 6 placeholders, 14 text,
      image (1,10,8) = 20 placeholders at document positions 51-70 across the chunk boundary at
      64, 68 text; each image between vision start / end), one of 1 token (shorter than Kc), a
      text-only one of 25. input_ids [177] int64, HF-aligned labels (-100 on each document's
      first token, on the image placeholders and on a few masked spans), cu_seqlens [5] int32,
      position_ids [3, 177] from transformers' get_rope_index run on each document,
      pixel_values [104, 1536] f32, image_grid_thw [2, 3] int64, doc_lengths [4] int64.
  tests/data/qwen3_5_tiny_batches/<variant>_text.safetensors   a row of 2 text-only documents,
      cu_seqlens [0, 21, 65] (no images: the text path).
  tests/golden/qwen3_5_tiny.safetensors   per case "<variant>_<batch>": logits [T, 512] f32,
      loss (0-dim f32: the sum of the documents' CE sums over the row's valid count),
      "grad.<hf name>" f32 of every parameter, whole up to 1024 elements, else sampled with its
      stride in "grad_stride.<hf name>" (vlm_common.sampled_gradient; 78 of the 338 gradients:
      every row and column of each still compared) (vision parameters absent from the text
      cases, where transformers gives them no gradient: zero by definition; the tied model's
      head gradient lands on embed_tokens).

Reference semantics: each document runs alone (transformers computes its MRoPE ids itself from
mm_token_type_ids, use_cache=False), logits concatenated, loss = sum of per-document CE sums / the
row's valid count. Unlike gen_qwen3_vl.py there is no packed transformers run to compare with:
without flash-linear-attention and causal-conv1d (not installed; their kernels only run on GPU
anyway) the GDN layers use the pure-torch fallbacks — causal_conv1d_fn (F.conv1d, zero left
padding) and torch_chunk_gated_delta_rule (chunks of 64 counted from the start of the row) —
which carry the conv taps and the state across documents (and refuse cu_seqlens), so packing is
only defined through the separate runs. The generator checks (assert):
  * for the hybrid variant, on the inputs of each of its 6 GDN layers for the 140-token document,
    transformers' torch_chunk_gated_delta_rule (the path the model runs) and
    torch_recurrent_gated_delta_rule (token by token) agree: outputs and final states to 1e-5
    relative (measured 1.4e-6);
  * each fp32 snapshot holds exactly the model's parameter names, and transformers' reload of
    it reproduces the packed case's logits (measured: bit-equal);
  * the bf16 snapshot's header has F32 exactly for linear_attn.A_log / linear_attn.norm.weight
    and BF16 for everything else, and transformers loads it (dropping mtp.*) to the stored values.

Made with torch 2.15.0 (CPU run of the PyPI wheel), transformers 5.25.0, safetensors 0.8.0
(also in the golden file's metadata).

What this and gen_qwen3_vl.py share (documents, rows, the separate runs, the driver) is in
vlm_common.py.

Run: python3 tools/golden/gen_qwen3_5.py   (torch + transformers + safetensors from pip)
"""
import contextlib
import copy
import itertools
import json
import math
import os
import shutil

import torch
import transformers.models.qwen3_5.modeling_qwen3_5 as hf_qwen3_5
from safetensors import safe_open
from safetensors.torch import load_file, save_file
from transformers import Qwen3_5Config, Qwen3_5ForConditionalGeneration

from common import DATA_DIR, rel
from vlm_common import (GRIDS, SEED, assert_tied, doc_pairs, hf_separate, image_doc, new_model,
                        text_doc, tiny_config, write_goldens)

LIN, FULL = "linear_attention", "full_attention"
VARIANTS = {
    # name: (layer_types, I, GDN (HK, HV, dk, dv), attention (Hq, Hkv, D), mrope_section, tied)
    "hybrid": ([LIN, LIN, LIN, FULL] * 2, 16, (2, 4, 32, 16), (4, 2, 64), [3, 3, 2], False),
    "tied": ([FULL, LIN], 32, (4, 4, 32, 32), (4, 2, 32), [2, 1, 1], True),
}
BF16_KEEP_F32 = ("linear_attn.A_log", "linear_attn.norm.weight")


def t3_config(variant):
    layer_types, inter, (hk, hv, dk, dv), (hq, hkv, hd), section, tied = VARIANTS[variant]
    text = dict(intermediate_size=inter, num_hidden_layers=len(layer_types),
                layer_types=layer_types, num_attention_heads=hq, num_key_value_heads=hkv,
                head_dim=hd, linear_num_key_heads=hk, linear_num_value_heads=hv,
                linear_key_head_dim=dk, linear_value_head_dim=dv, linear_conv_kernel_dim=4,
                rope_parameters={"rope_type": "default", "rope_theta": 1e7,
                                 "partial_rotary_factor": 0.25, "mrope_section": section,
                                 "mrope_interleaved": True},
                # fields of the released configs that transformers does not read (qwen-models.md
                # §3.1); full_attention_interval contradicts the tied variant's list on purpose
                full_attention_interval=4, attn_output_gate=True, mamba_ssm_dtype="float32",
                mtp_num_hidden_layers=0, mtp_use_dedicated_embeddings=False)
    vision = dict(depth=2, hidden_size=16, num_heads=1, intermediate_size=32)
    return tiny_config(Qwen3_5Config, text, vision, tied)


def build_model(variant):
    model = new_model(Qwen3_5ForConditionalGeneration, t3_config(variant), variant)
    with torch.no_grad():
        for name, mod in model.named_modules():
            if isinstance(mod, hf_qwen3_5.Qwen3_5RMSNorm):  # zero-centred: (1 + w)
                mod.weight.copy_(0.1 * torch.randn_like(mod.weight))
            elif isinstance(mod, hf_qwen3_5.Qwen3_5RMSNormGated):  # plain multiplier
                mod.weight.copy_(1.0 + 0.1 * torch.randn_like(mod.weight))
            elif isinstance(mod, torch.nn.LayerNorm):
                mod.weight.copy_(1.0 + 0.1 * torch.randn_like(mod.weight))
                mod.bias.copy_(0.02 * torch.randn_like(mod.bias))
            elif isinstance(mod, hf_qwen3_5.Qwen3_5GatedDeltaNet):
                mod.A_log.copy_(torch.empty_like(mod.A_log).uniform_(0.5, 8.0).log())
                mod.dt_bias.copy_(torch.empty_like(mod.dt_bias).uniform_(-4.0, 1.0))
            elif isinstance(mod, (torch.nn.Linear, torch.nn.Conv1d, torch.nn.Conv3d)):
                # std gain / sqrt(fan_in) (Conv1d: the kernel, 4); the text stack's gain of 0.5
                # keeps the 8-layer hybrid well conditioned in fp32 (at 1, transformers' own fp32
                # run is off its float64 run by 2e-5 in the logits and 2e-4 in the gradients)
                w = mod.weight
                gain = 1.0 if name.startswith("model.visual.") else 0.5
                w.normal_(0.0, gain / math.sqrt(w[0].numel()))
                if mod.bias is not None:
                    mod.bias.copy_(0.02 * torch.randn_like(mod.bias))
            elif isinstance(mod, torch.nn.Embedding) and name == "model.language_model.embed_tokens":
                mod.weight.normal_(0.0, 1.0 / math.sqrt(mod.weight.shape[1]))
    if variant == "tied":
        assert_tied(model)
    assert model.config.text_config._attn_implementation == "eager"
    return model


def documents(gen, with_images):
    if with_images:
        # the image document: 140 tokens, its second image's placeholders straddle the
        # document's position 64, a chunk boundary
        docs = [(text_doc(gen, 11, masked=(3, 4)), []), (image_doc(gen, (28, 14, 68)), GRIDS),
                (text_doc(gen, 1), []), (text_doc(gen, 25, masked=(9,)), [])]
    else:
        docs = [(text_doc(gen, 21, masked=(7, 8)), []), (text_doc(gen, 44, masked=(20,)), [])]
    cu = list(itertools.accumulate(ids.numel() for (ids, _), _ in docs))
    assert all(c % 64 for c in cu), cu  # every boundary inside a 64-token chunk
    return docs


class _Float64Torch:
    """The torch module as transformers' Qwen3.5 code sees it inside float64_everywhere():
    torch.float32 / torch.float name float64."""

    def __getattr__(self, name):
        return torch.float64 if name in ("float32", "float") else getattr(torch, name)


@contextlib.contextmanager
def float64_everywhere():
    """transformers' Qwen3.5 computes some parts in fp32 whatever the model dtype (RoPE angles,
    RMSNorms, the delta-rule core, softmax): inside this block a float64 model runs them in
    float64 too (its `torch.float32` and Tensor.float() mean float64), so its outputs are the
    exact-arithmetic values of the same graph."""
    saved_torch, saved_float = hf_qwen3_5.torch, torch.Tensor.float
    hf_qwen3_5.torch = _Float64Torch()
    torch.Tensor.float = lambda self, *args, **kwargs: self.to(torch.float64)
    try:
        yield
    finally:
        hf_qwen3_5.torch, torch.Tensor.float = saved_torch, saved_float


def reference(case, model, batch, doc_grids):
    """The golden: transformers run in float64 on the same (fp32-stored) parameters and inputs;
    its own fp32 run is off by up to ~3e-5 (logits) and ~2e-4 (gradients) on these models, more
    than the tolerances it is meant to check."""
    logits, loss, grads = hf_separate(model, batch, doc_grids)
    assert len(grads) == len(list(model.parameters())) or "pixel_values" not in batch
    with float64_everywhere():
        ref_logits, ref_loss, ref_grads = hf_separate(
            copy.deepcopy(model).double(),
            {k: v.double() if v.is_floating_point() else v for k, v in batch.items()},
            doc_grids)
    print(f"{case}: transformers fp32 vs float64: logits {rel(logits, ref_logits):.1e}, "
          f"loss {abs(float(loss) - float(ref_loss)):.1e}, worst gradient "
          f"{max(rel(grads[n], ref_grads[n]) for n in grads):.1e}")
    return ref_logits, ref_loss, ref_grads


def check_chunk_vs_recurrent(model, batch, doc_grids):
    """transformers' two torch delta-rule fallbacks on the inputs every GDN layer gets for the
    longest document (3 chunks): chunked (what the model runs) vs token-by-token."""
    calls = []
    chunk = hf_qwen3_5.torch_chunk_gated_delta_rule

    def recorder(q, k, v, g, beta, **kwargs):
        calls.append([t.detach().clone() for t in (q, k, v, g, beta)])
        return chunk(q, k, v, g=g, beta=beta, **kwargs)

    longest = int(batch["doc_lengths"].argmax())
    cu = batch["cu_seqlens"].tolist()
    one = {k: batch[k] for k in ("pixel_values", "image_grid_thw") if k in batch}
    one["input_ids"] = batch["input_ids"][cu[longest]:cu[longest + 1]]
    one["labels"] = batch["labels"][cu[longest]:cu[longest + 1]]
    one["cu_seqlens"] = torch.tensor([0, one["input_ids"].numel()])
    # the batch's pixel_values are all this document's
    assert all(not g for i, g in enumerate(doc_grids) if i != longest)
    hf_qwen3_5.torch_chunk_gated_delta_rule = recorder  # the global the GDN forward calls
    try:
        with torch.no_grad():
            doc_pairs(model, one, [doc_grids[longest]])
    finally:
        hf_qwen3_5.torch_chunk_gated_delta_rule = chunk
    layers = model.config.text_config.layer_types
    assert len(calls) == layers.count(LIN), len(calls)
    worst = 0.0
    for q, k, v, g, beta in calls:
        kw = dict(output_final_state=True, use_qk_l2norm_in_kernel=True)
        o_c, s_c = chunk(q, k, v, g=g, beta=beta, **kw)
        o_r, s_r = hf_qwen3_5.torch_recurrent_gated_delta_rule(q, k, v, g=g, beta=beta, **kw)
        worst = max(worst, rel(o_c, o_r), rel(s_c, s_r))
    print(f"chunk vs recurrent delta rule: {len(calls)} GDN layers, {calls[0][0].shape[1]} tokens, "
          f"g in [{min(float(c[3].min()) for c in calls):.2f}, "
          f"{max(float(c[3].max()) for c in calls):.3f}], worst rel {worst:.2e}")
    assert worst <= 1e-5, worst


def check_snapshot(model, name, batch, doc_grids):
    """The snapshot on disk: the model's parameter names, and transformers' reload reproduces
    the model's logits on the batch."""
    path = os.path.join(DATA_DIR, name)
    on_disk = set(load_file(os.path.join(path, "model.safetensors")))
    params = {n for n, _ in model.named_parameters()}
    if model.config.tie_word_embeddings:
        assert "lm_head.weight" not in on_disk
    assert on_disk == params, on_disk ^ params
    loaded = Qwen3_5ForConditionalGeneration.from_pretrained(
        path, attn_implementation="eager", dtype=torch.float32).eval()
    with torch.no_grad():
        logits, again = (torch.cat([lg for lg, _ in doc_pairs(m, batch, doc_grids)])
                         for m in (model, loaded))
    err = rel(again, logits)
    print(f"{name}: reloaded snapshot reproduces the logits, rel {err:.1e}")
    assert err <= 1e-6, err


def mtp_tensors(cfg, gen):
    """One MTP module (qwen-models.md §3.10) with random values: the shapes of a full-attention
    decoder layer of this model, fc [H, 2H]; zero-centred norms."""
    tc = cfg.text_config
    h, i, d = tc.hidden_size, tc.intermediate_size, tc.head_dim
    hq, hkv = tc.num_attention_heads, tc.num_key_value_heads
    shapes = {"mtp.pre_fc_norm_embedding.weight": [h], "mtp.pre_fc_norm_hidden.weight": [h],
              "mtp.fc.weight": [h, 2 * h], "mtp.norm.weight": [h],
              "mtp.layers.0.input_layernorm.weight": [h],
              "mtp.layers.0.post_attention_layernorm.weight": [h],
              "mtp.layers.0.self_attn.q_proj.weight": [2 * hq * d, h],
              "mtp.layers.0.self_attn.k_proj.weight": [hkv * d, h],
              "mtp.layers.0.self_attn.v_proj.weight": [hkv * d, h],
              "mtp.layers.0.self_attn.o_proj.weight": [h, hq * d],
              "mtp.layers.0.self_attn.q_norm.weight": [d],
              "mtp.layers.0.self_attn.k_norm.weight": [d],
              "mtp.layers.0.mlp.gate_proj.weight": [i, h],
              "mtp.layers.0.mlp.up_proj.weight": [i, h],
              "mtp.layers.0.mlp.down_proj.weight": [h, i]}
    out = {}
    for n, s in shapes.items():
        t = torch.randn(s, generator=gen)
        t = 0.1 * t if len(s) == 1 else t / math.sqrt(s[1])
        out[n] = t.to(torch.bfloat16)
    return out


def write_bf16_snapshot(src_name, name, gen):
    """The fp32 snapshot src_name re-saved as official Qwen3.5 checkpoints are typed: BF16 but
    linear_attn.A_log and linear_attn.norm.weight F32, plus mtp.* (BF16). transformers must load
    it (dropping mtp.*) to the same values."""
    src = os.path.join(DATA_DIR, src_name)
    path = os.path.join(DATA_DIR, name)
    shutil.rmtree(path, ignore_errors=True)
    os.makedirs(path)
    fp32 = load_file(os.path.join(src, "model.safetensors"))
    tensors = {n: t if n.endswith(BF16_KEEP_F32) else t.to(torch.bfloat16) for n, t in fp32.items()}
    with open(os.path.join(src, "config.json")) as f:
        cfg = json.load(f)
    mtp = mtp_tensors(Qwen3_5Config.from_pretrained(src), gen)
    tensors.update(mtp)
    save_file({n: t.contiguous() for n, t in sorted(tensors.items())},
              os.path.join(path, "model.safetensors"), metadata={"format": "pt"})
    cfg["dtype"] = "bfloat16"
    cfg["text_config"]["mtp_num_hidden_layers"] = 1
    with open(os.path.join(path, "config.json"), "w") as f:
        json.dump(cfg, f, indent=2, sort_keys=True)
        f.write("\n")
    # the header: exactly the two kinds of GDN tensors are F32
    with safe_open(os.path.join(path, "model.safetensors"), "pt") as f:
        f32 = sorted(n for n in f.keys() if f.get_slice(n).get_dtype() == "F32")
        other = {f.get_slice(n).get_dtype() for n in f.keys()} - {"F32"}
    assert other == {"BF16"}, other
    assert f32 == sorted(n for n in fp32 if n.endswith(BF16_KEEP_F32)), f32
    # transformers loads it, ignores mtp.*, and holds the stored values
    loaded = Qwen3_5ForConditionalGeneration.from_pretrained(path, dtype=torch.float32)
    state = loaded.state_dict()
    assert not any(n.startswith("mtp.") for n in state)
    for n, t in tensors.items():
        if not n.startswith("mtp."):
            assert torch.equal(state[n], t.float()), n
    print(f"wrote {path}: {len(tensors)} tensors ({len(f32)} F32, {len(mtp)} mtp.*), "
          f"{os.path.getsize(os.path.join(path, 'model.safetensors')) / 1024:.0f} KiB")


def finish_variant(variant, model, rows):
    """The checks on the packed row, the snapshot's reload and (hybrid) the bf16 snapshot."""
    batch, doc_grids = rows["packed"]
    if variant == "hybrid":
        check_chunk_vs_recurrent(model, batch, doc_grids)
    check_snapshot(model, f"qwen3_5_tiny_{variant}", batch, doc_grids)
    if variant == "hybrid":
        write_bf16_snapshot("qwen3_5_tiny_hybrid", "qwen3_5_tiny_hybrid_bf16",
                            torch.Generator().manual_seed(SEED + 20))


def main():
    write_goldens("qwen3_5_tiny", VARIANTS, build_model, documents, reference, finish_variant)


if __name__ == "__main__":
    main()
