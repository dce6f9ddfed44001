"""Golden files for the Qwen3 text model (model/qwen3/model.h, `vlmtrain dump`) from transformers.

Builds the tiny Qwen3 of docs/qwen-models.md §8 (T1: H=64, L=2, Hq=4, Hkv=2, D=32, I=128,
vocab=512, rope_theta=1e6, eps=1e-6) with transformers' own Qwen3ForCausalLM in fp32 on CPU,
seeded, untied and tied, and writes:

  tests/data/qwen3_tiny_untied/, tests/data/qwen3_tiny_tied/   tiny HF snapshots (config.json +
      model.safetensors in fp32, written by save_pretrained; the tied one has no lm_head.weight).
      Both share every weight but lm_head (the tied model is the untied one without its head).
  tests/data/qwen3_tiny_batches/packed.safetensors   one packed row of 3 documents,
      cu_seqlens = [0, 5, 70, 133], position ids restarting per document, HF-aligned labels with
      -100 on each document's first token and on a few masked spans; input_ids [133] int64.
  tests/data/qwen3_tiny_batches/single.safetensors   one sequence of S = 37 (input_ids [1, 37]
      int64, to exercise the [1, T] form), cu_seqlens = [0, 37].
  tests/golden/qwen3_tiny.safetensors   per case "<variant>_<batch>": logits [T, 512] f32, loss
      (0-dim f32, mean over valid targets); for the packed cases also "grad.<hf name>" for every
      parameter (the tied model has no lm_head gradient: it lands on embed_tokens).

Reference semantics. transformers 5.x honours packed position_ids with the eager/sdpa attention:
masking_utils.find_packed_sequence_indices splits the row where the position ids do not increase
by one, so a packed row runs as one batch of 1 without an attention mask — but only when no KV
cache exists: with the config default use_cache=True the model makes a DynamicCache and the packed
detection is skipped silently (every document then attends to the previous ones), so the calls
here pass use_cache=False. The generator checks
that this equals the definition — the 3 documents run separately and concatenated, the loss being
the mean over all valid targets of the row, gradients of that loss — to 1e-5, and stores the
separate-runs result. HF's loss shifts labels across the whole row; the -100 on each document's
first token keeps the shift from crossing documents.

Run: python3 tools/golden/gen_qwen3.py   (torch + transformers + safetensors from pip)
"""
import json
import os
import sys

import torch
import transformers
from safetensors.torch import save_file
from transformers import Qwen3Config, Qwen3ForCausalLM

from common import documents_loss, rel, save_snapshot

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
DATA = os.path.join(REPO, "tests", "data")
GOLDEN = os.path.join(REPO, "tests", "golden", "qwen3_tiny.safetensors")
SEED = 0


def t1_config(tie):
    return Qwen3Config(
        vocab_size=512, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, head_dim=32, rms_norm_eps=1e-6,
        rope_parameters={"rope_type": "default", "rope_theta": 1e6},
        max_position_embeddings=4096, tie_word_embeddings=tie, attention_bias=False,
        initializer_range=0.02, hidden_act="silu", attn_implementation="eager")


def build_models():
    torch.manual_seed(SEED)
    untied = Qwen3ForCausalLM(t1_config(False)).float().eval()
    with torch.no_grad():
        # HF init leaves every norm weight at 1; perturb them so their gradients and their place
        # in the formulas are tested too.
        for name, p in untied.named_parameters():
            if name.endswith("norm.weight"):
                p.copy_(1.0 + 0.1 * torch.randn_like(p))
    tied = Qwen3ForCausalLM(t1_config(True)).float().eval()
    state = {k: v for k, v in untied.state_dict().items() if k != "lm_head.weight"}
    missing, unexpected = tied.load_state_dict(state, strict=False)
    assert not unexpected and set(missing) <= {"lm_head.weight"}, (missing, unexpected)
    tied.tie_weights()
    assert tied.lm_head.weight.data_ptr() == tied.model.embed_tokens.weight.data_ptr()
    return untied, tied


def packed_batch(gen):
    cu = [0, 5, 70, 133]
    T = cu[-1]
    ids = torch.randint(0, 512, (T,), generator=gen)
    labels = ids.clone()
    pos = torch.cat([torch.arange(cu[i + 1] - cu[i]) for i in range(len(cu) - 1)])
    for start in cu[:-1]:
        labels[start] = -100  # the previous document's last position must not predict it
    labels[10:19] = -100       # a masked "prompt" span inside document 2
    labels[[30, 31, 100]] = -100
    labels[71:80] = -100       # document 3 starts with a masked span
    return {"input_ids": ids, "labels": labels, "position_ids": pos,
            "cu_seqlens": torch.tensor(cu, dtype=torch.int32)}


def single_batch(gen):
    S = 37
    ids = torch.randint(0, 512, (S,), generator=gen)
    labels = ids.clone()
    labels[0] = -100
    labels[[3, 4, 20]] = -100
    return {"input_ids": ids.view(1, S), "labels": labels.view(1, S),
            "position_ids": torch.arange(S).view(1, S),
            "cu_seqlens": torch.tensor([0, S], dtype=torch.int32)}


def hf_packed(model, batch):
    """The packed row as one transformers call (position_ids-based varlen, HF loss)."""
    model.zero_grad(set_to_none=True)
    out = model(input_ids=batch["input_ids"].view(1, -1), labels=batch["labels"].view(1, -1),
                position_ids=batch["position_ids"].view(1, -1), use_cache=False)
    out.loss.backward()
    grads = {n: p.grad.detach().clone() for n, p in model.named_parameters()}
    return out.logits[0].detach().clone(), out.loss.detach().clone(), grads


def hf_separate(model, batch):
    """The definition: each document alone, logits concatenated, loss = mean over all valid
    targets of the row (the sum of per-document CE sums / the row's valid count)."""
    model.zero_grad(set_to_none=True)
    ids, labels = batch["input_ids"].view(-1), batch["labels"].view(-1)
    cu = batch["cu_seqlens"].tolist()
    pairs = []
    for b in range(len(cu) - 1):
        s, e = cu[b], cu[b + 1]
        lg = model(input_ids=ids[s:e].view(1, -1), use_cache=False).logits[0]
        target = torch.cat([labels[s + 1:e], torch.tensor([-100])])  # HF shift inside the doc
        pairs.append((lg, target))
    logits, loss = documents_loss(pairs)
    grads = {n: p.grad.detach().clone() for n, p in model.named_parameters()}
    return logits, loss, grads


def main():
    untied, tied = build_models()
    gen = torch.Generator().manual_seed(SEED + 1)
    batches = {"packed": packed_batch(gen), "single": single_batch(gen)}

    bdir = os.path.join(DATA, "qwen3_tiny_batches")
    os.makedirs(bdir, exist_ok=True)
    for name, b in batches.items():
        save_file({k: v.contiguous() for k, v in b.items()}, os.path.join(bdir, f"{name}.safetensors"),
                  metadata={"generator": os.path.relpath(sys.argv[0], REPO)})

    golden = {}
    for variant, model in (("untied", untied), ("tied", tied)):
        for bname, batch in batches.items():
            case = f"{variant}_{bname}"
            logits, loss, grads = hf_separate(model, batch)
            if bname == "packed":
                p_logits, p_loss, p_grads = hf_packed(model, batch)
                errs = [rel(p_logits, logits), abs(float(p_loss - loss))]
                errs += [rel(p_grads[n], g) for n, g in grads.items()]
                print(f"{case}: transformers packed vs separate: logits {errs[0]:.2e}, "
                      f"loss {errs[1]:.2e}, worst grad {max(errs[2:]):.2e}")
                assert max(errs) < 1e-5, errs
            else:
                # a single sequence: HF's own loss on the whole sequence is the same thing
                h_logits, h_loss, _ = hf_packed(model, batch)
                assert rel(h_logits, logits) < 1e-6 and abs(float(h_loss - loss)) < 1e-6
            golden[f"{case}.logits"] = logits.float().contiguous()
            golden[f"{case}.loss"] = loss.float().reshape(())
            if bname == "packed":
                for n, g in grads.items():
                    golden[f"{case}.grad.{n}"] = g.float().contiguous()
            print(f"{case}: loss {float(loss):.6f}, {len(grads)} parameters")

    save_snapshot(untied, "qwen3_tiny_untied")
    save_snapshot(tied, "qwen3_tiny_tied")
    save_file(golden, GOLDEN, metadata={"generator": os.path.relpath(sys.argv[0], REPO),
                                        "torch": torch.__version__,
                                        "transformers": transformers.__version__,
                                        "seed": str(SEED)})
    total = 0
    for root in [os.path.join(DATA, d) for d in ("qwen3_tiny_untied", "qwen3_tiny_tied",
                                                 "qwen3_tiny_batches")]:
        for f in os.listdir(root):
            total += os.path.getsize(os.path.join(root, f))
    total += os.path.getsize(GOLDEN)
    print(f"wrote {GOLDEN}: {len(golden)} tensors; all files {total / 1024:.0f} KiB")


if __name__ == "__main__":
    main()
