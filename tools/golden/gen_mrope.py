"""Golden interleaved-MRoPE tables from transformers' own Qwen3VLTextRotaryEmbedding.

The position ids are those of tests/data/position_ids/golden.json (transformers' get_rope_index
on documents with images of several grids, a t=2 grid and text-only ones), packed into one row as
the loader packs them (each document restarting at 0). For each case the real rotary module of
a Qwen3VLTextConfig with the case's head_dim, rope_theta and mrope_section turns the [3, T]
position ids into cos/sin [T, head_dim] in fp32 and in bf16 (the activation dtype HF casts them
to), of which the first head_dim/2 columns are kept (the second half repeats them); the C++ test (tests/core/ops/test_mrope_golden.cpp) builds them with mrope_tables.

Cases: the tiny Qwen3-VL's [6, 5, 5] (every slot in the 3-way pattern), [8, 4, 4] (t takes the
tail slots 13, 14), and the released models' [24, 20, 20] at head_dim 128 (tail 60..63).

Usage: python tools/golden/gen_mrope.py
"""
import json
import os

import torch
import transformers
from transformers.models.qwen3_vl.configuration_qwen3_vl import Qwen3VLTextConfig
from transformers.models.qwen3_vl.modeling_qwen3_vl import Qwen3VLTextRotaryEmbedding

from common import REPO, GoldenWriter

POSITIONS = os.path.join(REPO, "tests", "data", "position_ids", "golden.json")


def packed_positions():
    """[3, T]: every golden document's position ids, back to back."""
    with open(POSITIONS) as f:
        cases = json.load(f)["cases"]
    rows = [[], [], []]
    for c in cases:
        for a in range(3):
            rows[a] += c["position_ids"][a]
    return torch.tensor(rows, dtype=torch.int64)


def tables(head_dim, theta, section, position_ids, dtype):
    config = Qwen3VLTextConfig(
        hidden_size=64, num_attention_heads=4, num_key_value_heads=2, head_dim=head_dim,
        rope_parameters={"rope_type": "default", "rope_theta": theta, "mrope_section": section})
    rotary = Qwen3VLTextRotaryEmbedding(config)
    x = torch.zeros(1, position_ids.shape[1], head_dim, dtype=dtype)
    cos, sin = rotary(x, position_ids[:, None, :])  # position ids [3, batch 1, T]
    half = head_dim // 2
    # HF's [T, head_dim] tables repeat the R/2 slots (emb = concat(f, f)): keep them once.
    assert torch.equal(cos[0, :, :half], cos[0, :, half:]) and torch.equal(sin[0, :, :half],
                                                                           sin[0, :, half:])
    return cos[0, :, :half], sin[0, :, :half]


def main():
    w = GoldenWriter("mrope")
    pos = packed_positions()
    for name, head_dim, theta, section in [("mrope_d32_655", 32, 5e6, [6, 5, 5]),
                                           ("mrope_d32_844", 32, 5e6, [8, 4, 4]),
                                           ("mrope_d128_242020", 128, 5e6, [24, 20, 20])]:
        cos32, sin32 = tables(head_dim, theta, section, pos, torch.float32)
        cos16, sin16 = tables(head_dim, theta, section, pos, torch.bfloat16)
        w.add(name, position_ids=pos, head_dim=torch.tensor(float(head_dim)),
              theta=torch.tensor(theta, dtype=torch.float64),
              section=torch.tensor(section, dtype=torch.int64), cos_f32=cos32, sin_f32=sin32,
              cos_bf16=cos16, sin_bf16=sin16)
    w.save()
    print("transformers", transformers.__version__, "torch", torch.__version__)


if __name__ == "__main__":
    main()
