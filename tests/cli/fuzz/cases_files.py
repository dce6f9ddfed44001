"""Fuzz cases of safetensors files and of tokenizer.json and the tokenize input (a mixin of gen_cases.Gen)."""
import argparse
import io
import json
import os
import random
import shutil
import struct
import tarfile
import zlib

from fuzz_common import (CASES, add, write, read, read_shard, tar_bytes, idx_bytes, Dataset, png_chunk, png, jpeg_with_size, flip_bytes, DROP, fix_checksum, flip_headers)


class FileCases:
    def safetensors(self):
        model = read(os.path.join(self.snapshot, "model.safetensors"))
        hlen = struct.unpack("<Q", model[:8])[0]
        header = json.loads(model[8:8 + hlen])
        data = model[8 + hlen:]
        names = sorted(k for k in header if k != "__metadata__")
        embed = next(n for n in names if "embed_tokens" in n)

        def st(h, d=data, raw_len=None):
            hb = json.dumps(h).encode()
            hb += b" " * (-len(hb) % 8)
            return struct.pack("<Q", len(hb) if raw_len is None else raw_len) + hb + d

        def edit(fn):
            h = json.loads(json.dumps(header))
            fn(h)
            return st(h)

        first = names[0]
        variants = {
            "empty": b"",
            "four_bytes": b"\x10\0\0\0",
            "header_len_beyond": st(header, raw_len=10 ** 9),
            "header_len_max": st(header, raw_len=2 ** 64 - 1),
            "header_len_zero": st(header, raw_len=0),
            "header_not_json": struct.pack("<Q", 16) + b"{not json at al" + b"}" + data,
            "header_array": st([1, 2, 3]),
            "truncated_data": st(header)[: 8 + hlen + len(data) // 2],
            "entry_not_object": edit(lambda h: h.__setitem__(first, 5)),
            "missing_dtype": edit(lambda h: h[first].pop("dtype")),
            "missing_shape": edit(lambda h: h[first].pop("shape")),
            "missing_offsets": edit(lambda h: h[first].pop("data_offsets")),
            "dtype_unknown": edit(lambda h: h[first].__setitem__("dtype", "F128")),
            "dtype_int": edit(lambda h: h[first].__setitem__("dtype", 5)),
            "shape_negative": edit(lambda h: h[first].__setitem__("shape", [-1, 64])),
            "shape_float": edit(lambda h: h[first].__setitem__("shape", [1.5])),
            "shape_string": edit(lambda h: h[first].__setitem__("shape", "64")),
            "shape_overflow": edit(lambda h: h[first].__setitem__("shape", [2 ** 62, 2 ** 62])),
            "offsets_beyond": edit(lambda h: h[first].__setitem__(
                "data_offsets", [0, len(data) + 4096])),
            "offsets_reversed": edit(lambda h: h[first].__setitem__(
                "data_offsets", list(reversed(h[first]["data_offsets"])))),
            "offsets_overlap": edit(lambda h: h[names[1]].__setitem__(
                "data_offsets", h[names[0]]["data_offsets"])),
            "offsets_strings": edit(lambda h: h[first].__setitem__("data_offsets", ["0", "4"])),
            "offsets_huge": edit(lambda h: h[first].__setitem__("data_offsets", [2 ** 64 - 8,
                                                                                2 ** 64 - 4])),
            "metadata_not_object": edit(lambda h: h.__setitem__("__metadata__", 5)),
            "metadata_value_int": edit(lambda h: h.__setitem__("__metadata__", {"a": 5})),
        }
        # Valid files with the wrong content: a missing tensor, a wrong shape or dtype.
        missing = json.loads(json.dumps(header))
        missing.pop(embed)
        variants["tensor_missing"] = st(missing)
        wrong = json.loads(json.dumps(header))
        b, e = wrong[embed]["data_offsets"]
        wrong[embed]["shape"] = [int((e - b) // 4 // 32), 32]
        variants["tensor_wrong_shape"] = st(wrong)
        as_int = json.loads(json.dumps(header))
        as_int[embed]["dtype"] = "I32"
        variants["tensor_wrong_dtype"] = st(as_int)
        nan_data = bytearray(data)
        b, e = header[embed]["data_offsets"]
        nan_data[b:e] = struct.pack("<f", float("nan")) * ((e - b) // 4)
        variants_ok = {"tensor_nan_values": st(header, bytes(nan_data))}

        for tag, blob in list(variants.items()) + list(variants_ok.items()):
            name = "weights_" + tag
            d = self.case_dir(name)
            snap = os.path.join(d, "snap")
            os.makedirs(snap)
            shutil.copy(os.path.join(self.snapshot, "config.json"), snap)
            write(os.path.join(snap, "model.safetensors"), blob)
            if tag in variants_ok:
                want, names_ = "ok_or_error", ["model.safetensors", embed, "non-finite", "nan"]
            else:
                want, names_ = "error", ["model.safetensors"]
                if tag.startswith("tensor_"):
                    names_ = ["model.safetensors", embed]
            cmds = [("dump", ["@BIN@", "dump", "--model", snap, "--batch", self.batch, "--out",
                              os.path.join(d, "dump.safetensors")])]
            if tag in ("header_len_beyond", "dtype_unknown", "tensor_missing",
                       "tensor_wrong_shape", "offsets_beyond", "tensor_nan_values"):
                cmds.append(("train", self.train(d, model=snap, sets=["training.random_init=false"])))
                cmds.append(("export", ["@BIN@", "export", "--checkpoint", snap, "--out",
                                        os.path.join(d, "export")]))
            for c, cmd in cmds:
                add(name + "_" + c, "safetensors", cmd, want, names_)

        # The batch file of `vlmtrain dump`.
        batch = read(self.batch)
        bl = struct.unpack("<Q", batch[:8])[0]
        bh = json.loads(batch[8:8 + bl])
        bdata = batch[8 + bl:]

        def bst(h, d=bdata):
            hb = json.dumps(h).encode()
            hb += b" " * (-len(hb) % 8)
            return struct.pack("<Q", len(hb)) + hb + d

        def bedit(fn, d=bdata):
            h = json.loads(json.dumps(bh))
            fn(h)
            return bst(h, d)

        ids_b, ids_e = bh["input_ids"]["data_offsets"]
        ids_dtype = bh["input_ids"]["dtype"]
        fmt = {"I64": "<q", "I32": "<i"}[ids_dtype]
        big = bytearray(bdata)
        big[ids_b:ids_b + struct.calcsize(fmt)] = struct.pack(fmt, 100000)
        neg = bytearray(bdata)
        neg[ids_b:ids_b + struct.calcsize(fmt)] = struct.pack(fmt, -7)
        cu_b, cu_e = bh["cu_seqlens"]["data_offsets"]
        cu_fmt = {"I64": "<q", "I32": "<i"}[bh["cu_seqlens"]["dtype"]]
        cu_bad = bytearray(bdata)
        cu_bad[cu_e - struct.calcsize(cu_fmt):cu_e] = struct.pack(cu_fmt, 10 ** 6)
        def half_labels(h):
            n = h["labels"]["shape"][0]
            b, e = h["labels"]["data_offsets"]
            h["labels"]["shape"] = [n // 2]
            h["labels"]["data_offsets"] = [b, b + (e - b) // n * (n // 2)]

        batches = {
            "missing_input_ids": bedit(lambda h: h.pop("input_ids")),
            "missing_cu_seqlens": bedit(lambda h: h.pop("cu_seqlens")),
            "input_ids_f32": bedit(lambda h: h["input_ids"].__setitem__(
                "dtype", "F32" if ids_dtype == "I32" else "F64")),
            "input_ids_2d": bedit(lambda h: h["input_ids"].__setitem__(
                "shape", [1] + h["input_ids"]["shape"])),
            "id_beyond_vocab": bst(bh, bytes(big)),
            "id_negative": bst(bh, bytes(neg)),
            "cu_seqlens_beyond": bst(bh, bytes(cu_bad)),
            "labels_short": bedit(half_labels),
            "truncated": batch[: len(batch) // 2],
            "not_safetensors": b"hello, world, this is not a batch file",
        }
        # [1, T] input_ids are what HF batches look like: accepting them is fine.
        batch_expect = {"input_ids_2d": ("ok_or_error", ["input_ids"]),
                        "cu_seqlens_beyond": ("error", ["cu_seqlens"]),
                        "id_beyond_vocab": ("error", ["input_ids"]),
                        "id_negative": ("error", ["input_ids"])}
        for tag, blob in batches.items():
            name = "batch_" + tag
            d = self.case_dir(name)
            path = os.path.join(d, "batch.safetensors")
            write(path, blob)
            expect, names = batch_expect.get(tag, ("error", []))
            add(name, "safetensors", ["@BIN@", "dump", "--model", self.snapshot, "--batch", path,
                                      "--out", os.path.join(d, "out.safetensors")], expect,
                ["batch.safetensors"] + names)

    # 5. config.json of the snapshot.
    def tokenizer(self):
        tok = json.loads(read(self.tok))
        vocab = tok["model"]["vocab"]
        last = max(vocab, key=vocab.get)

        def edit(fn):
            t = json.loads(json.dumps(tok))
            fn(t)
            return json.dumps(t).encode()

        def added(**kv):
            return lambda t: t["added_tokens"][0].update(kv)

        variants = {
            "empty": b"",
            "not_json": b"{model: ",
            "truncated": read(self.tok)[: len(read(self.tok)) // 2],
            "array": b"[]",
            "deep": b'{"a": ' + b"[" * 100000 + b"]" * 100000 + b"}",
            "model_missing": edit(lambda t: t.pop("model")),
            "model_type_wordpiece": edit(lambda t: t["model"].__setitem__("type", "WordPiece")),
            "model_type_int": edit(lambda t: t["model"].__setitem__("type", 7)),
            "vocab_missing": edit(lambda t: t["model"].pop("vocab")),
            "vocab_list": edit(lambda t: t["model"].__setitem__("vocab", [1, 2])),
            "vocab_id_2_31_minus_1": edit(lambda t: t["model"]["vocab"].__setitem__(
                last, 2 ** 31 - 1)),
            "vocab_id_2_31": edit(lambda t: t["model"]["vocab"].__setitem__(last, 2 ** 31)),
            "vocab_id_2_30": edit(lambda t: t["model"]["vocab"].__setitem__(last, 2 ** 30)),
            "vocab_id_2_31_minus_2": edit(lambda t: t["model"]["vocab"].__setitem__(
                last, 2 ** 31 - 2)),
            "vocab_id_2_31_minus_1000": edit(lambda t: t["model"]["vocab"].__setitem__(
                last, 2 ** 31 - 1000)),
            "vocab_id_negative": edit(lambda t: t["model"]["vocab"].__setitem__(last, -1)),
            "vocab_id_string": edit(lambda t: t["model"]["vocab"].__setitem__(last, "5")),
            "vocab_id_float": edit(lambda t: t["model"]["vocab"].__setitem__(last, 1.5)),
            "vocab_id_duplicate": edit(lambda t: t["model"]["vocab"].__setitem__(last, 0)),
            "merges_missing": edit(lambda t: t["model"].pop("merges")),
            "merges_int": edit(lambda t: t["model"].__setitem__("merges", 5)),
            "merges_items_int": edit(lambda t: t["model"].__setitem__("merges", [[1, 2]])),
            "merges_no_space": edit(lambda t: t["model"].__setitem__("merges", ["ab"])),
            "merges_unknown_tokens": edit(lambda t: t["model"].__setitem__(
                "merges", [["zzzq", "qqqz"]] + t["model"]["merges"])),
            "merges_triple": edit(lambda t: t["model"].__setitem__("merges", [["a", "n", "x"]])),
            "added_tokens_object": edit(lambda t: t.__setitem__("added_tokens", {"a": 1})),
            "added_id_2_31_minus_1": edit(added(id=2 ** 31 - 1)),
            "added_id_2_31_minus_2": edit(added(id=2 ** 31 - 2)),
            "added_id_2_30": edit(added(id=2 ** 30)),
            "added_id_negative": edit(added(id=-5)),
            "added_id_string": edit(added(id="353")),
            "added_content_empty": edit(added(content="")),
            "added_content_int": edit(added(content=5)),
            "added_special_string": edit(added(special="yes")),
            "normalizer_lowercase": edit(lambda t: t.__setitem__("normalizer",
                                                                 {"type": "Lowercase"})),
            "pre_tokenizer_missing": edit(lambda t: t.pop("pre_tokenizer")),
            "pre_tokenizer_bad_regex": edit(lambda t: t["pre_tokenizer"]["pretokenizers"][0]
                                            ["pattern"].__setitem__("Regex", "(a|b")),
            "pre_tokenizer_int": edit(lambda t: t.__setitem__("pre_tokenizer", 3)),
            "decoder_wrong": edit(lambda t: t.__setitem__("decoder", {"type": "WordPiece"})),
            "binary": bytes(range(256)) * 8,
        }
        for tag, blob in variants.items():
            name = "tokenizer_" + tag
            d = self.case_dir(name)
            path = os.path.join(d, "tokenizer.json")
            write(path, blob)
            stdin = os.path.join(d, "stdin.jsonl")
            write(stdin, '{"text": "Hello <|im_start|> world"}\n')
            add(name, "tokenizer.json", ["@BIN@", "tokenize", "--tokenizer", path], "error",
                ["tokenizer.json"], stdin=stdin)
            if tag in ("truncated", "vocab_id_2_31_minus_2", "vocab_id_2_30", "added_id_2_30",
                       "merges_items_int", "model_type_int"):
                add(name + "_inspect", "tokenizer.json", self.inspect(self.base, path), "error",
                    ["tokenizer.json"])
                add(name + "_train", "tokenizer.json", self.train(d, tok=path), "error",
                    ["tokenizer.json"])

        # HF writes added_tokens always, but a file without them is still a usable BPE.
        d = self.case_dir("tokenizer_added_tokens_missing")
        path = os.path.join(d, "tokenizer.json")
        write(path, edit(lambda t: t.pop("added_tokens")))
        write(os.path.join(d, "stdin.jsonl"), '{"text": "Hello world"}\n')
        add("tokenizer_added_tokens_missing", "tokenizer.json",
            ["@BIN@", "tokenize", "--tokenizer", path], "ok_or_error", ["tokenizer.json"],
            stdin=os.path.join(d, "stdin.jsonl"))

        # `vlmtrain tokenize` input lines: an error names the line.
        lines = {
            "not_json": b'{"text": \n',
            "text_int": b'{"text": 5}\n',
            "invalid_utf8_raw": b'{"text": "caf\xff"}\n',
            "lone_surrogate": b'{"text": "\\ud800x"}\n',
            "empty_line": b'{"text": "a"}\n\n',
            "ids_not_array": b'{"ids": "x"}\n',
            "ids_huge": b'{"ids": [100000000000000000000]}\n',
            "ids_out_of_vocab": b'{"ids": [2147483647]}\n',
            "ids_negative": b'{"ids": [-1]}\n',
            "ids_float": b'{"ids": [1.5]}\n',
            "deep": b'{"text": ' + b"[" * 100000 + b"]" * 100000 + b"}\n",
        }
        for tag, blob in lines.items():
            name = "tokenize_input_" + tag
            d = self.case_dir(name)
            stdin = os.path.join(d, "stdin.jsonl")
            write(stdin, blob)
            cmd = ["@BIN@", "tokenize", "--tokenizer", self.tok]
            if tag.startswith("ids_"):
                cmd.append("--decode")
            add(name, "tokenize input", cmd, "error", ["input line"], stdin=stdin)
        for tag, blob in (("long_text", b'{"text": "' + b"hello world " * 100000 + b'"}\n'),
                          ("specials", b'{"text": "<|im_start|><|im_end|><|endoftext|>"}\n')):
            name = "tokenize_input_ok_" + tag
            d = self.case_dir(name)
            stdin = os.path.join(d, "stdin.jsonl")
            write(stdin, blob)
            add(name, "tokenize input", ["@BIN@", "tokenize", "--tokenizer", self.tok], "ok",
                stdin=stdin)
        if self.qwen:
            d = self.case_dir("tokenize_input_qwen_invalid_utf8")
            stdin = os.path.join(d, "stdin.jsonl")
            write(stdin, b'{"text": "ok"}\n{"text": "caf\xc3"}\n')
            add("tokenize_input_qwen_invalid_utf8", "tokenize input",
                ["@BIN@", "tokenize", "--tokenizer", self.qwen], "error", ["input line 2"],
                stdin=stdin)
