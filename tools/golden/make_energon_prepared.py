#!/usr/bin/env python3
"""Writes tests/data/energon_prepared/: a tiny WebDataset prepared by the real `energon prepare`.

The C++ Energon reader (io/energon/dataset.h) is tested on these files, so that it is checked
against what energon itself writes and reads, not only against our own fixture writer.

What this script does:
1. Writes three tar shards with Python's tarfile, one per tar dialect:
   shard_000000.tar  PAX (tarfile's default): a UTF-8 key and a >100-char key (PAX 'x' path)
   shard_000001.tar  GNU: a directory member, a `__info__/...` member energon skips, a
                     >100-char key ('L' long name), a part with dots (`seg.mask.png`)
   shard_000002.tar  USTAR: a 150-char key that fits only through the ustar `prefix` field
   Parts are real tiny JPEG/PNG images (Pillow), LLaVA-style json and txt captions.
2. Runs `energon prepare` non-interactively (train = shards 0-1, val = shard 2,
   CrudeWebdataset). It writes .nv-meta/{dataset.yaml, split.yaml, .info.json, index.sqlite,
   index.uuid} and the .tar.idx files.
3. Adds `.nv-meta/split_exclude.yaml` (a custom split config, written here, not by energon) that
   excludes one shard by a brace pattern and one sample by "<shard>/<key>".
4. Reads every split back with energon's own reader (WebdatasetMeta + ShardInfosITarReader),
   checks that it returns exactly what step 1 wrote, and writes manifest.json: per split and
   split config, the samples in global-index order with shard, key, and per part its size and
   FNV-1a-64 hash (excluded samples are listed with "excluded": true), plus the .tar.idx
   contents and shard counts.
5. Writes braceexpand_vectors.json (patterns expanded by the `braceexpand` package that energon
   uses) and name_vectors.json (member names run through energon's own key/part and skip regexes).
6. Writes mds/*.yaml, MetadatasetV2 files over the dataset (blend with nesting, subsets,
   subflavors, split_part, shuffle multipliers; blend_epochized), resolves them with energon's own
   MetadatasetV2.get_datasets and writes mds/expected.json: per file the blend mode and, per leaf,
   its shards, weight, repetitions, subflavors, subset, shuffle_over_epochs and the subset's
   [start, end) over the leaf's split.

Run with a Python that has megatron-energon and pillow installed:
    pip install megatron-energon pillow
    python tools/golden/make_energon_prepared.py
It replaces tests/data/energon_prepared/ entirely. Tar bytes are deterministic (fixed mtime,
owner and mode); index.sqlite and index.uuid are not, and the C++ reader does not use them.
"""
import hashlib
import io
import json
import os
import shutil
import subprocess
import sys
import tarfile

import braceexpand
from PIL import Image

import megatron.energon
from megatron.energon.dataset_config import load_config
from megatron.energon.epathlib import EPath
from megatron.energon.metadataset.metadataset_v2 import MetadatasetV2
from megatron.energon.worker import WorkerConfig
from megatron.energon.flavors.webdataset import config as wds_config
from megatron.energon.flavors.webdataset.itar_reader import ShardInfosITarReader
from megatron.energon.flavors.webdataset.metadata import WebdatasetMeta

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
OUT = os.path.join(REPO, "tests", "data", "energon_prepared")
DATASET = os.path.join(OUT, "dataset")

LONG_PAX_KEY = "pax_long_" + "p" * 100 + "_000001"
UTF8_KEY = "caf\u00e9_\u00fcber_000002"
LONG_GNU_KEY = "gnu/" + "g" * 110 + "_000004"
# 150 chars with a '/' at 60: ustar stores "<prefix>/<name>" with prefix <= 155, name <= 100.
USTAR_PREFIX_KEY = "ustar_" + "u" * 53 + "/" + "v" * 84 + "_000005"


def fnv1a64(data: bytes) -> str:
    h = 0xCBF29CE484222325
    for b in data:
        h = ((h ^ b) * 0x100000001B3) & 0xFFFFFFFFFFFFFFFF
    return f"{h:016x}"


def tiny_image(fmt: str, color, size=(4, 3)) -> bytes:
    buf = io.BytesIO()
    Image.new("RGB" if fmt == "JPEG" else "L", size, color).save(buf, format=fmt)
    return buf.getvalue()


def conversation(i: int) -> bytes:
    conv = {
        "id": i,
        "conversations": [
            {"from": "human", "value": "<image>\nDescribe the image."},
            {"from": "gpt", "value": f"A tiny test image number {i}."},
        ],
    }
    return json.dumps(conv).encode()


def sample(i: int, key: str, extra=None):
    parts = {
        "jpg": tiny_image("JPEG", (40 * i % 256, 100, 200 - 20 * i)),
        "json": conversation(i),
        "txt": f"caption {i}".encode(),
    }
    parts.update(extra or {})
    return key, parts


# Shard layout: (file name, tar format, members). A member is ("sample", key, parts),
# ("dir", name) or ("file", name, bytes) for a member that is not part of any sample.
SHARDS = [
    ("shards/shard_000000.tar", tarfile.PAX_FORMAT, [
        ("sample", *sample(0, "000000")),
        ("sample", *sample(1, LONG_PAX_KEY)),
        ("sample", *sample(2, UTF8_KEY)),
    ]),
    ("shards/shard_000001.tar", tarfile.GNU_FORMAT, [
        ("dir", "gnu"),
        ("file", "__info__/about.txt", b"not a sample: energon skips __*__ paths"),
        ("sample", *sample(3, "000003", {"seg.mask.png": tiny_image("PNG", 7, (5, 2))})),
        ("sample", *sample(4, LONG_GNU_KEY)),
    ]),
    ("shards/shard_000002.tar", tarfile.USTAR_FORMAT, [
        ("sample", *sample(5, USTAR_PREFIX_KEY)),
    ]),
]
SPLIT_PARTS = ["train:shards/shard_00000[01].tar", "val:shards/shard_000002.tar"]

# A custom split config: shard_000000 removed by a brace pattern, one sample of shard_000001
# excluded by key (read and counted, never emitted).
SPLIT_EXCLUDE_YAML = f"""split_parts:
  train:
  - shards/shard_{{000000..000001}}.tar
  val:
  - shards/shard_000002.tar
exclude:
- shards/shard_{{000000,999999}}.tar
- shards/shard_000001.tar/{LONG_GNU_KEY}
"""


def write_tar(path: str, fmt: int, members) -> None:
    os.makedirs(os.path.dirname(path), exist_ok=True)

    def info(name, size, type_=tarfile.REGTYPE):
        ti = tarfile.TarInfo(name)
        ti.size, ti.type, ti.mtime, ti.mode = size, type_, 1700000000, 0o644
        ti.uid = ti.gid = 0
        ti.uname = ti.gname = ""
        return ti

    with tarfile.open(path, "w", format=fmt, encoding="utf-8") as tar:
        for m in members:
            if m[0] == "dir":
                ti = info(m[1], 0, tarfile.DIRTYPE)
                ti.mode = 0o755
                tar.addfile(ti)
            elif m[0] == "file":
                tar.addfile(info(m[1], len(m[2])), io.BytesIO(m[2]))
            else:
                _, key, parts = m
                for part, data in parts.items():
                    tar.addfile(info(f"{key}.{part}", len(data)), io.BytesIO(data))


def read_split(split_part: str, split_config: str):
    """Every sample of a split as energon's reader returns it (None for an excluded one)."""
    path = EPath(DATASET)
    meta = WebdatasetMeta.from_config(path, split_part=split_part, split_config=split_config)
    reader = ShardInfosITarReader(
        path, meta.shards, sample_filter=lambda name: name not in meta.sample_excludes)
    # The global index space of the split: shards in split order, counts from .info.json.
    locations = [(s.name, i) for s in meta.shards for i in range(s.count)]
    out = []
    for gi in range(len(reader)):
        s = reader[gi]
        if s is None:
            out.append({"global_index": gi, "shard": locations[gi][0], "excluded": True})
            continue
        parts = {k: v for k, v in s.items() if not k.startswith("__")}
        out.append({"global_index": gi, "shard": s["__shard__"], "key": s["__key__"],
                    "excluded": False, "parts": parts})
    reader.close()
    return [s.name for s in meta.shards], out


def written_samples():
    """(shard, key) -> parts, from the SHARDS table."""
    table = {}
    for shard, _, members in SHARDS:
        for m in members:
            if m[0] == "sample":
                table[(shard, m[1])] = m[2]
    return table


def main():
    if os.path.exists(OUT):
        shutil.rmtree(OUT)
    os.makedirs(DATASET)
    for shard, fmt, members in SHARDS:
        write_tar(os.path.join(DATASET, shard), fmt, members)

    energon = shutil.which("energon") or os.path.join(os.path.dirname(sys.executable), "energon")
    cmd = [energon, "prepare", DATASET, "--non-interactive", "--no-progress",
           "--num-workers", "1", "--sample-type", "CrudeWebdataset"]
    for sp in SPLIT_PARTS:
        cmd += ["--split-parts", sp]
    subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL)

    nv_meta = os.path.join(DATASET, wds_config.MAIN_FOLDER_NAME)
    with open(os.path.join(nv_meta, "split_exclude.yaml"), "w") as f:
        f.write(SPLIT_EXCLUDE_YAML)
    with open(os.path.join(nv_meta, ".info.json")) as f:
        info = json.load(f)

    expected = written_samples()
    manifest = {
        "generator": "tools/golden/make_energon_prepared.py",
        "energon_version": megatron.energon.__version__,
        "shard_counts": info["shard_counts"],
        "tar_idx": {},
        "splits": {},
    }
    for shard in info["shard_counts"]:
        with open(os.path.join(DATASET, shard[: -len(".tar")] + ".tar.idx"), "rb") as f:
            raw = f.read()
        manifest["tar_idx"][shard] = [int.from_bytes(raw[i:i + 8], "little")
                                      for i in range(0, len(raw), 8)]

    for split_config in ("split.yaml", "split_exclude.yaml"):
        per_split = {}
        for split_part in ("train", "val"):
            shards, samples = read_split(split_part, split_config)
            rows = []
            for s in samples:
                row = {"global_index": s["global_index"], "shard": s["shard"],
                       "excluded": s["excluded"]}
                if not s["excluded"]:
                    want = expected[(s["shard"], s["key"])]
                    assert s["parts"] == want, f"energon read {s['key']} differently"
                    row["key"] = s["key"]
                    row["parts"] = {k: {"size": len(v), "fnv1a64": fnv1a64(v)}
                                    for k, v in sorted(s["parts"].items())}
                rows.append(row)
            per_split[split_part] = {"shards": shards, "samples": rows}
        manifest["splits"][split_config] = per_split
    # Every written sample is read back exactly once under split.yaml.
    seen = [(r["shard"], r["key"]) for sp in manifest["splits"]["split.yaml"].values()
            for r in sp["samples"]]
    assert sorted(seen) == sorted(expected), "energon did not return every written sample"

    with open(os.path.join(OUT, "manifest.json"), "w") as f:
        json.dump(manifest, f, indent=1, ensure_ascii=False)
        f.write("\n")

    write_brace_vectors()
    write_name_vectors()
    write_metadatasets()
    total = sum(os.path.getsize(os.path.join(d, n)) for d, _, ns in os.walk(OUT) for n in ns)
    print(f"wrote {OUT}: {total / 1024:.1f} KiB, energon {megatron.energon.__version__}")


BRACE_PATTERNS = [
    "plain.tar", "", "shards/shard_{000000..000007}.tar", "{0..10}", "{00..3}", "{9..011}",
    "{1..3}", "{3..1}", "{-2..2}", "{2..-1}", "{-01..2}", "{-0..2}", "{-00..2}", "{1..10..3}",
    "{10..1..3}", "{1..10..-3}", "{1..3..0}", "{5..5}", "{a..e}", "{e..a}", "{a..g..2}",
    "{e..A..3}", "{Z..a}", "{x,y,z}", "{x}", "{}", "{,}", "{,a}", "{a,}", "a{b,c}d{e,f}",
    "{1..3}{a,b}", "python{2.{5..7},3.{2,3}}", "{a{b,c}}", "{a,{b,{c,d}}}", "x{1,{2..4..2},\\,}y",
    "a\\{b,c\\}", "{a\\,b}", "{a,b\\,c}", "a\\\\{b,c}", "}{", "{a..}", "{1..a}", "{aa..c}",
    "{1..2..3..4}", "shards/shard_{000000..000001}.tar/{00000{1..3},key}", "trailing\\",
    "{1{2,3}", "a}b{c}", "{a,b", "x}",
]


def write_brace_vectors():
    vectors = []
    for p in BRACE_PATTERNS:
        try:
            vectors.append({"pattern": p, "expansion": list(braceexpand.braceexpand(p))})
        except braceexpand.UnbalancedBracesError:
            vectors.append({"pattern": p, "error": "unbalanced"})
    with open(os.path.join(OUT, "braceexpand_vectors.json"), "w") as f:
        json.dump({"generator": "braceexpand " + braceexpand.__version__, "vectors": vectors},
                  f, indent=1)
        f.write("\n")


NAMES = [
    "000000.jpg", "a/b/c.seg.mask.png", "shard_0/abc.json", "README", "dir.x/file",
    "dir.x/file.txt", "a/.hidden", "x.y/.hidden", ".hidden", "/.x", "a//.x", "a/b.c/.d",
    "__meta__", "__key__.json", "__x__/y.json", "d/__x__", "__a__b__", "__a__b", "____",
    "___", "__/x.y", "__x__.y/z.json", "k.", "k..json", "./000001.jpg", "a.b.c", "sub/000002.txt",
]


def write_name_vectors():
    vectors = []
    for n in NAMES:
        m = wds_config.split_name_re.match(n)
        vectors.append({
            "name": n,
            "skip_meta": wds_config.skip_meta_re.match(n) is not None,
            "key": m.group(1) if m else None,
            "part": m.group(2) if m else None,
        })
    with open(os.path.join(OUT, "name_vectors.json"), "w") as f:
        json.dump({"generator": "megatron.energon.flavors.webdataset.config regexes",
                   "vectors": vectors}, f, indent=1)
        f.write("\n")


# Metadatasets over ../dataset (the same dataset at every leaf; leaves are compared in order).
MDS = {
    "nested.yaml": """__module__: megatron.energon
__class__: MetadatasetV2
splits:
  train:
    blend:
    - weight: 1
      path: ../dataset
      subflavors: {type_dataset: inner, extra: x}
      subset: {range: [0%, 50%]}
    - {weight: 3, path: ../dataset, shuffle_over_epochs_multiplier: 3}
  val:
    path: ../dataset
    subflavors: {source: nested_val}
""",
    "top.yaml": """__module__: megatron.energon
__class__: MetadatasetV2
splits:
  train:
    blend:
    - weight: 2
      path: ./nested.yaml
      subflavors: {type_dataset: outer}
      subset: {range: [50%, 100%]}
      shuffle_over_epochs_multiplier: 2
    - weight: 1
      path: ../dataset
      split_part: val
      subset: {range: [1, end]}
    - weight: 1.0
      path: nested.yaml
      split_part: val
      shuffle_over_epochs_multiplier: null
  val:
    path: ../dataset
    subset: {range: [0, 1]}
""",
    "epochized.yaml": """__module__: megatron.energon
__class__: MetadatasetV2
splits:
  train:
    blend_epochized:
    - {repetitions: 2, path: ../dataset, shuffle_over_epochs_multiplier: -1}
    - {repetitions: 0.5, path: ../dataset, subset: {range: ["12.5%", "87.5%"]}}
""",
}


def write_metadatasets():
    mds_dir = os.path.join(OUT, "mds")
    os.makedirs(mds_dir)
    for name, text in MDS.items():
        with open(os.path.join(mds_dir, name), "w") as f:
            f.write(text)
    expected = {}
    for name, split in (("top.yaml", "train"), ("top.yaml", "val"), ("epochized.yaml", "train"),
                        ("nested.yaml", "train")):
        path = EPath(os.path.join(mds_dir, name))
        mds = load_config(path, default_type=MetadatasetV2, default_kwargs=dict(path=path))
        mds.post_initialize()
        result = mds.get_datasets(training=True, split_part=split,
                                  worker_config=WorkerConfig(rank=0, world_size=1, num_workers=0))
        leaves = []
        for loaded in result.datasets:
            ds = loaded.dataset
            total = sum(s.count for s in ds.shards)
            sub = ds.subset
            leaves.append({
                "path": os.path.relpath(str(ds.path), mds_dir),
                "shards": [s.name for s in ds.shards],
                "weight": loaded.weight,
                "repetitions": loaded.repetitions,
                "subflavors": ds.subflavors,
                "subset": None if sub is None else {
                    "range": list(sub.range) if sub.range is not None else None,
                    "absolute_range": list(sub.absolute_range) if sub.absolute_range else None},
                "shuffle_over_epochs": ds.shuffle_over_epochs,
                "total": total,
                "subset_range": list(sub.compute_subset(total)) if sub else [0, total],
            })
        expected.setdefault(name, {})[split] = {"blend_mode": result.blend_mode.name,
                                                "leaves": leaves}
    with open(os.path.join(mds_dir, "expected.json"), "w") as f:
        json.dump({"generator": "megatron.energon MetadatasetV2.get_datasets "
                                + megatron.energon.__version__, "files": expected}, f, indent=1)
        f.write("\n")


if __name__ == "__main__":
    main()
