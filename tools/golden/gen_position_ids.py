"""Golden MRoPE position ids from transformers' own get_rope_index (Qwen3-VL and Qwen3.5).

Builds a few synthetic documents (text-only, one image, several images, an image first or last,
an image run without <|vision_start|>/<|vision_end|> markers, grids of various shapes including
a t=2 grid), runs the real `Qwen3VLModel.get_rope_index` and `Qwen3_5Model.get_rope_index` on
each document alone (batch of one, no padding), checks that both agree, and writes
tests/data/position_ids/golden.json: per case the input ids, image_grid_thw and the [3][L]
position ids (rows t, h, w). The C++ test (tests/io/loader/test_position_ids.cpp) recomputes them and
packs several cases into one row, where every document must restart at 0.

Only the get_rope_index methods are used; no weights are loaded. They read nothing from `self`
but `config.vision_config.spatial_merge_size` and `get_vision_position_ids`, so a minimal stand-in
object carries those (the methods themselves are transformers' code, called unbound).

Usage: python tools/golden/gen_position_ids.py
"""
import json
import os
import random
import sys
import types

import torch
import transformers
from transformers.models.qwen3_5.modeling_qwen3_5 import Qwen3_5Model
from transformers.models.qwen3_vl.modeling_qwen3_vl import Qwen3VLModel

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
OUT = os.path.join(REPO, "tests", "data", "position_ids", "golden.json")

# Qwen3 / Qwen3-VL token ids (docs/qwen-models.md §5).
IMAGE = 151655
VSTART = 151652
VEND = 151653
MERGE = 2

rng = random.Random(0)


def text(n):
    return [rng.randrange(0, 151643) for _ in range(n)]


def image(grid, markers=True):
    t, h, w = grid
    body = [IMAGE] * (t * h * w // (MERGE * MERGE))
    return [VSTART] + body + [VEND] if markers else body


def doc(*parts):
    """parts: ints (text run lengths) or grid tuples (an image, with markers) or ("bare", grid)."""
    ids, grids = [], []
    for p in parts:
        if isinstance(p, int):
            ids += text(p)
        elif p[0] == "bare":
            ids += image(p[1], markers=False)
            grids.append(list(p[1]))
        else:
            ids += image(p)
            grids.append(list(p))
    return ids, grids


CASES = {
    "text_only": doc(12),
    "one_image": doc(5, (1, 4, 6), 7),
    "image_first": doc((1, 8, 4), 3),
    "image_last": doc(4, (1, 6, 6)),
    "multi_image": doc(3, (1, 4, 4), 2, (1, 6, 10), 5, (1, 2, 2), 4),
    "wide_image": doc(2, (1, 2, 16), 3),
    "tall_image": doc(2, (1, 18, 4), 3),
    "bare_image_run": doc(3, ("bare", (1, 4, 8)), 2),
    "t2_grid": doc(2, (2, 4, 6), 2),
    "realistic_chat": doc(9, (1, 32, 46), 40),
}


class StandIn:
    """The only attributes get_rope_index reads from `self`."""

    def __init__(self, model_cls):
        self.config = types.SimpleNamespace(
            vision_config=types.SimpleNamespace(spatial_merge_size=MERGE))
        self.get_vision_position_ids = types.MethodType(model_cls.get_vision_position_ids, self)
        self.get_rope_index = types.MethodType(model_cls.get_rope_index, self)


def rope_index(model_cls, ids, grids):
    m = StandIn(model_cls)
    input_ids = torch.tensor([ids], dtype=torch.long)
    mm_types = (input_ids == IMAGE).int()
    grid = torch.tensor(grids, dtype=torch.long) if grids else None
    pos, _ = m.get_rope_index(input_ids, mm_types, image_grid_thw=grid)
    return pos[:, 0, :]  # [3, L]


def main():
    cases = []
    for name, (ids, grids) in CASES.items():
        vl = rope_index(Qwen3VLModel, ids, grids)
        q35 = rope_index(Qwen3_5Model, ids, grids)
        assert torch.equal(vl, q35), f"{name}: Qwen3-VL and Qwen3.5 get_rope_index disagree"
        cases.append({
            "name": name,
            "input_ids": ids,
            "image_grid_thw": grids,
            "position_ids": vl.tolist(),
        })
    golden = {
        "generator": os.path.relpath(os.path.abspath(sys.argv[0]), REPO),
        "transformers": transformers.__version__,
        "torch": torch.__version__,
        "functions": ["Qwen3VLModel.get_rope_index", "Qwen3_5Model.get_rope_index"],
        "image_token_id": IMAGE,
        "vision_start_token_id": VSTART,
        "vision_end_token_id": VEND,
        "spatial_merge_size": MERGE,
        "cases": cases,
    }
    os.makedirs(os.path.dirname(OUT), exist_ok=True)
    with open(OUT, "w") as f:
        # One case per line keeps the file small and diffable.
        f.write("{\n")
        keys = [k for k in golden if k != "cases"]
        for k in keys:
            f.write(f"  {json.dumps(k)}: {json.dumps(golden[k])},\n")
        f.write('  "cases": [\n')
        f.write(",\n".join("    " + json.dumps(c, separators=(",", ":")) for c in cases))
        f.write("\n  ]\n}\n")
    print(f"wrote {OUT}: {len(cases)} cases, {os.path.getsize(OUT) / 1024:.1f} KiB")


if __name__ == "__main__":
    main()
