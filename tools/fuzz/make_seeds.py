#!/usr/bin/env python3
"""Seed corpora for the libFuzzer targets, from the repository's test data (standard library only).

    tools/fuzz/make_seeds.py OUT_DIR      writes OUT_DIR/{tar,safetensors,chat,tokenizer}/

Each target's input layout is described at the top of its tools/fuzz/fuzz_*.cpp.
"""
import io
import json
import os
import struct
import sys
import tarfile

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
DATA = os.path.join(ROOT, "tests", "data")


def write(out, target, name, data):
    d = os.path.join(out, target)
    os.makedirs(d, exist_ok=True)
    with open(os.path.join(d, name), "wb") as f:
        f.write(data)


def read(*parts):
    with open(os.path.join(DATA, *parts), "rb") as f:
        return f.read()


def make_tar(members, fmt):
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=fmt) as t:
        for name, data in members:
            info = tarfile.TarInfo(name)
            info.size = len(data)
            info.mtime = 1700000000
            t.addfile(info, io.BytesIO(data))
    return buf.getvalue()


def tar_seeds(out):
    shards = os.path.join(DATA, "energon_prepared", "dataset", "shards")
    for name in sorted(os.listdir(shards)):
        if name.endswith(".tar"):
            write(out, "tar", name, read("energon_prepared", "dataset", "shards", name))
    sample = [("a/000.json", b'{"text": "x"}'), ("a/000.txt", b"hello"), ("__meta__", b"m"),
              ("b.seg.mask.png", b"\x89PNG"), ("README", b"no key")]
    longname = [("d/" + "x" * 150 + ".txt", b"long name"), ("d/y.jpg", b"\xff\xd8")]
    for fmt, tag in ((tarfile.USTAR_FORMAT, "ustar"), (tarfile.GNU_FORMAT, "gnu"),
                     (tarfile.PAX_FORMAT, "pax")):
        write(out, "tar", tag + ".tar", make_tar(sample, fmt))
        if fmt != tarfile.USTAR_FORMAT:
            write(out, "tar", tag + "_long.tar", make_tar(longname, fmt))


def safetensors_file(tensors, metadata=None):
    header, data = {}, b""
    for name, dtype, shape, raw in tensors:
        header[name] = {"dtype": dtype, "shape": shape, "data_offsets": [len(data), len(data) + len(raw)]}
        data += raw
    if metadata:
        header["__metadata__"] = metadata
    h = json.dumps(header).encode()
    h += b" " * (-len(h) % 8)
    return struct.pack("<Q", len(h)) + h + data


def safetensors_seeds(out):
    for name in ("packed.safetensors", "single.safetensors"):
        write(out, "safetensors", name, read("qwen3_tiny_batches", name))
    write(out, "safetensors", "dtypes.safetensors", safetensors_file([
        ("f32", "F32", [2, 2], b"\0" * 16), ("bf16", "BF16", [3], b"\1" * 6),
        ("f16", "F16", [1, 1], b"\2" * 2), ("i64", "I64", [1], b"\3" * 8),
        ("i32", "I32", [2], b"\4" * 8), ("u8", "U8", [4], b"\5" * 4),
        ("empty", "F32", [0, 4], b""), ("scalar", "F64", [], b"\6" * 8)], {"format": "pt"}))
    write(out, "safetensors", "empty_header.safetensors", safetensors_file([]))


def chat_seeds(out):
    golden = json.loads(read("chat", "golden.json"))
    for case in golden["cases"]:
        parts = case["parts"]
        images = sum(1 for p in parts if p.rsplit(".", 1)[-1] in ("jpg", "jpeg", "png"))
        flags = min(images, 3) | (4 if "txt" in parts else 0) | (8 if "json" in parts else 0)
        kind = case.get("subflavors", {}).get("type_dataset", "")
        flags |= {"llava_recap": 1, "llava_recap_mn5": 2}.get(kind, 0) << 4
        body = parts.get("json", "").encode() + b"\0" + parts.get("txt", "").encode()
        write(out, "chat", case["key"], bytes([flags]) + body)
    write(out, "chat", "messages", bytes([9]) + json.dumps({"messages": [
        {"role": "system", "content": "s"},
        {"role": "user", "content": [{"type": "image"}, {"type": "text", "text": "what?"}]},
        {"role": "assistant", "content": [{"type": "text", "text": "a cat"}]}]}).encode())


def tokenizer_seeds(out):
    bpe = read("bpe", "tokenizer.json")
    write(out, "tokenizer", "bpe.json", b"\0" + bpe)
    # The same tokenizer cut to 16 merges: small inputs keep the loader's executions fast.
    t = json.loads(bpe)
    merges = t["model"]["merges"][:16]
    keep = {k for k in t["model"]["vocab"] if len(k) == 1}
    for m in merges:
        a, b = m.split(" ") if isinstance(m, str) else m
        keep |= {a, b, a + b}
    t["model"]["vocab"] = {k: v for k, v in t["model"]["vocab"].items() if k in keep}
    t["model"]["merges"] = merges
    write(out, "tokenizer", "small.json", b"\0" + json.dumps(t).encode())
    texts = []
    for name in ("mini.jsonl", "golden.jsonl"):
        for line in read("tokenizer", name).decode().split("\n"):
            if not line.strip():
                continue
            case = json.loads(line)
            if case.get("case") == "encode" and case["text"] not in texts:
                texts.append(case["text"])
    for i, text in enumerate(texts[:60]):
        write(out, "tokenizer", "text_%03d" % i, b"\1" + text.encode())


def main():
    if len(sys.argv) != 2:
        sys.exit(__doc__)
    out = sys.argv[1]
    tar_seeds(out)
    safetensors_seeds(out)
    chat_seeds(out)
    tokenizer_seeds(out)


if __name__ == "__main__":
    main()
