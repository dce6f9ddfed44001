"""Golden vision-tower patch positions from transformers' own helpers (transformers.vision_utils),
called exactly as Qwen3VLVisionModel.forward calls them (bilinear, align_corners=True, merge 2):
per patch the 4 position-table indices and fp32 weights, the (row, col) ids of the 2-D rotary,
and the attention cu_seqlens, for the tiny Qwen3-VL's grids (one smaller and one larger than its
8x8 table, non-square, a t=2 video) and the released models' 48x48 table.
Writes tests/data/vision_positions/golden.json, and tests/golden/vision_rope.safetensors: the
cos/sin tables of the real Qwen3VLVisionRotaryEmbedding for those position ids at head dims 16,
64 and 72 (first half; the second repeats it). The C++ test is
tests/model/test_vision_positions.cpp.

Usage: python tools/golden/gen_vision_positions.py
"""
import json
import os

import torch
import transformers
from transformers.models.qwen3_vl.configuration_qwen3_vl import Qwen3VLVisionConfig
from transformers.models.qwen3_vl.modeling_qwen3_vl import Qwen3VLVisionRotaryEmbedding
from transformers.vision_utils import (get_vision_attention_seqlens,
                                       get_vision_interpolation_indices_and_weights,
                                       get_vision_position_ids)

from common import GoldenWriter

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
OUT = os.path.join(REPO, "tests", "data", "vision_positions", "golden.json")


def case(name, grids, side):
    g = torch.tensor(grids, dtype=torch.int64)
    idx, w = get_vision_interpolation_indices_and_weights(
        g, num_grid_per_side=side, mode="bilinear", align_corners=True, spatial_merge_size=2)
    pos = get_vision_position_ids(g, 2)
    # As the vision model passes it: its config (one attention segment per frame).
    cu, _ = get_vision_attention_seqlens(g, Qwen3VLVisionConfig())
    assert w.dtype == torch.float32
    return {"name": name, "grids": grids, "table_side": side, "taps": idx.tolist(),
            "weights": w.tolist(), "rows": pos[:, 0].tolist(), "cols": pos[:, 1].tolist(),
            "cu_seqlens": cu.tolist()}


def main():
    cases = [case("tiny_images_and_video", [[1, 4, 6], [1, 10, 8], [2, 4, 4]], 8),
             case("released_48", [[1, 16, 22], [1, 2, 2], [1, 64, 10]], 48)]
    os.makedirs(os.path.dirname(OUT), exist_ok=True)
    with open(OUT, "w") as f:
        json.dump({"generator": "tools/golden/gen_vision_positions.py",
                   "transformers": transformers.__version__, "torch": torch.__version__,
                   "cases": cases}, f)
    print("wrote", OUT, os.path.getsize(OUT), "bytes")

    w = GoldenWriter("vision_rope")
    for name, grids, heads, hidden in [("tiny_hd16", [[1, 4, 6], [1, 10, 8], [2, 4, 4]], 4, 64),
                                       ("vl2b_hd64", [[1, 16, 22], [1, 2, 2]], 16, 1024),
                                       ("vl8b_hd72", [[1, 16, 22], [1, 2, 2]], 16, 1152)]:
        g = torch.tensor(grids, dtype=torch.int64)
        pos = get_vision_position_ids(g, 2)
        rotary = Qwen3VLVisionRotaryEmbedding(
            Qwen3VLVisionConfig(hidden_size=hidden, num_heads=heads))
        cos, sin = rotary(torch.zeros(pos.shape[0], hidden), pos)
        half = cos.shape[-1] // 2
        assert torch.equal(cos[:, :half], cos[:, half:]) and cos.dtype == torch.float32
        w.add(name, grids=g, head_dim=torch.tensor(float(2 * half)), cos=cos[:, :half],
              sin=sin[:, :half])
    w.save()


if __name__ == "__main__":
    main()
