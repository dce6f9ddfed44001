"""Fuzz cases of the dataset metadata (.nv-meta, split YAML, index) and of the samples (a mixin of gen_cases.Gen)."""
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


class DataCases:
    def metadata(self):
        shard = "train/shard_000000.tar"

        def variant(name, mutate, expect="error", names=(), cmds=("inspect",)):
            d = self.case_dir(name)
            root = self.ds.copy().write(os.path.join(d, "ds"))
            mutate(root)
            for c in self.commands(cmds):
                cmd = {"inspect": self.inspect(root), "pack": self.pack(root, d),
                       "train": self.train(d, data=root, sets=["data.max_skip_fraction=1"])}[c]
                add(name + ("" if c == "inspect" else "_" + c), "dataset metadata", cmd, expect,
                    names)

        meta = lambda root, f: os.path.join(root, ".nv-meta", f)

        def put(f, data):
            return lambda root: write(meta(root, f), data)

        def remove(path):
            return lambda root: os.remove(os.path.join(root, path))

        variant("nvmeta_missing", lambda r: shutil.rmtree(os.path.join(r, ".nv-meta")),
                names=[".nv-meta"])
        # dataset.yaml
        variant("dataset_yaml_missing", remove(".nv-meta/dataset.yaml"), names=["dataset.yaml"])
        variant("dataset_yaml_empty", put("dataset.yaml", ""), "ok_or_error", ["dataset.yaml"])
        variant("dataset_yaml_invalid", put("dataset.yaml", "__class__: [unclosed\n  - :"),
                names=["dataset.yaml"])
        variant("dataset_yaml_class_int", put("dataset.yaml", "__class__: 5\n"), "ok_or_error",
                ["dataset.yaml", "__class__"])
        variant("dataset_yaml_class_list", put("dataset.yaml", "__class__: [a, b]\n"),
                "ok_or_error", ["dataset.yaml", "__class__"])
        variant("dataset_yaml_subflavors_list",
                put("dataset.yaml", "__class__: CrudeWebdataset\nsubflavors: [a, b]\n"),
                names=["dataset.yaml", "subflavors"])
        variant("dataset_yaml_part_filter_string",
                put("dataset.yaml", "__class__: CrudeWebdataset\npart_filter: json\n"),
                "ok_or_error", ["dataset.yaml", "part_filter"])
        variant("dataset_yaml_part_filter_map",
                put("dataset.yaml", "__class__: CrudeWebdataset\npart_filter: {a: 1}\n"),
                names=["dataset.yaml", "part_filter"])
        variant("dataset_yaml_part_filter_none",
                put("dataset.yaml", "__class__: CrudeWebdataset\npart_filter: [nothing]\n"),
                "skip_or_error", ["dataset.yaml", "part_filter", "no_parts"])
        bomb = "a: &a [x, x, x, x, x, x, x, x, x, x]\n"
        for i in range(1, 9):
            bomb += "%s: &%s [%s]\n" % (chr(97 + i), chr(97 + i), ", ".join(["*" + chr(96 + i)] * 10))
        variant("dataset_yaml_alias_bomb",
                put("dataset.yaml", "__class__: CrudeWebdataset\n" + bomb), "ok_or_error",
                ["dataset.yaml"])
        variant("dataset_yaml_deep", put("dataset.yaml", "__class__: " + "[" * 10000 + "]" * 10000),
                names=["dataset.yaml"])
        variant("dataset_yaml_binary", put("dataset.yaml", bytes(range(256)) * 4),
                names=["dataset.yaml"])
        # split.yaml
        variant("split_yaml_missing", remove(".nv-meta/split.yaml"), names=["split.yaml",
                                                                            "split.json"])
        variant("split_yaml_empty", put("split.yaml", ""), names=["split.yaml"])
        variant("split_yaml_invalid", put("split.yaml", "split_parts: {train: [a,\n"),
                names=["split.yaml"])
        variant("split_yaml_no_split_parts", put("split.yaml", "exclude: []\n"),
                names=["split.yaml", "split_parts"])
        variant("split_yaml_split_parts_list", put("split.yaml", "split_parts: [a, b]\n"),
                names=["split.yaml", "split_parts"])
        variant("split_yaml_train_string",
                put("split.yaml", "split_parts:\n  train: %s\n  val:\n  - val/shard_000000.tar\n"
                    % shard), "ok_or_error", ["split.yaml", "train"])
        variant("split_yaml_train_int", put("split.yaml", "split_parts:\n  train: 5\n"),
                names=["split.yaml", "train"])
        variant("split_yaml_train_empty",
                put("split.yaml", "split_parts:\n  train: []\n  val:\n  - val/shard_000000.tar\n"),
                names=["train"], cmds=("pack",))
        # An empty split nobody uses must not block the others (known bug: refused).
        variant("split_yaml_unused_test_empty",
                put("split.yaml", self.ds.split_yaml().replace("exclude:", "  test: []\nexclude:")),
                "ok", cmds=("inspect", "pack", "train"))
        variant("split_yaml_shard_missing",
                put("split.yaml", self.ds.split_yaml().replace(shard, "train/nope.tar")),
                names=["nope.tar"], cmds=("inspect", "pack"))
        variant("split_yaml_path_escape",
                put("split.yaml", self.ds.split_yaml().replace(shard, "../../../etc/passwd")),
                names=["../../../etc/passwd", "passwd"])
        variant("split_yaml_brace_huge",
                put("split.yaml", self.ds.split_yaml().replace(
                    shard, "train/shard_{000000..999999999}.tar")),
                names=["split.yaml", "shard_", "{000000..999999999}"])
        variant("split_yaml_brace_product",
                put("split.yaml", self.ds.split_yaml().replace(shard, "train/s" + "{a,b}" * 40)),
                names=["split.yaml", "{a,b}", "train/s"])
        variant("split_yaml_brace_unclosed",
                put("split.yaml", self.ds.split_yaml().replace(shard, "train/shard_{0..")),
                names=["split.yaml", "shard_{0.."])
        variant("split_yaml_shard_twice",
                put("split.yaml", self.ds.split_yaml().replace(
                    "  - " + shard + "\n", "  - " + shard + "\n  - " + shard + "\n")),
                "ok_or_error", [shard, "split.yaml"])
        variant("split_yaml_exclude_string",
                put("split.yaml", self.ds.split_yaml().replace("exclude: []", "exclude: abc")),
                "ok_or_error", ["split.yaml", "exclude"])
        variant("split_yaml_exclude_all",
                put("split.yaml", self.ds.split_yaml().replace("exclude: []", "exclude: [%s]"
                                                               % shard)),
                names=["train"], cmds=("pack",))
        key0 = self.ds.splits["train"][shard][0][0]
        variant("split_yaml_exclude_sample",
                put("split.yaml", self.ds.split_yaml().replace(
                    "exclude: []", "exclude: [%s/%s]" % (shard, key0))), "ok")
        variant("split_yaml_binary", put("split.yaml", b"\xff\xfe\x00split" * 100),
                names=["split.yaml"])
        variant("split_json_fallback_invalid",
                lambda r: (os.remove(meta(r, "split.yaml")), write(meta(r, "split.json"), "{[")),
                names=["split.json"])
        # .info.json / .info.yaml
        info = self.ds.info()

        def info_with(count):
            i = json.loads(json.dumps(info))
            i["shard_counts"][shard] = count
            return put(".info.json", json.dumps(i))

        variant("info_missing", remove(".nv-meta/.info.json"), names=[".info"])
        variant("info_invalid_json", put(".info.json", '{"shard_counts": {'), names=[".info.json"])
        variant("info_array", put(".info.json", "[1, 2]"), names=[".info.json"])
        variant("info_no_shard_counts", put(".info.json", '{"energon_version": "x"}'),
                names=[".info.json", "shard_counts"])
        variant("info_counts_list", put(".info.json", '{"shard_counts": [6, 3]}'),
                names=[".info.json", "shard_counts"])
        variant("info_shard_not_listed",
                put(".info.json", json.dumps({"shard_counts": {"val/shard_000000.tar": 3}})),
                names=[shard])
        for tag, count in (("negative", -1), ("zero", 0), ("huge", 10 ** 18),
                           ("over_int64", 2 ** 64 + 6), ("string", "6"), ("float", 6.5),
                           ("null", None), ("plus_one", 7)):
            variant("info_count_" + tag, info_with(count), names=[shard, ".info.json"],
                    cmds=("inspect", "pack") if tag in ("huge", "plus_one") else ("inspect",))
        variant("info_yaml_fallback_ok",
                lambda r: (os.remove(meta(r, ".info.json")),
                           write(meta(r, ".info.yaml"), "shard_counts:\n" + "".join(
                               "  %s: %d\n" % (k, v) for k, v in info["shard_counts"].items()))),
                "ok")
        variant("info_yaml_fallback_invalid",
                lambda r: (os.remove(meta(r, ".info.json")),
                           write(meta(r, ".info.yaml"), "shard_counts: [unclosed")),
                names=[".info.yaml"])
        variant("info_yaml_count_string",
                lambda r: (os.remove(meta(r, ".info.json")),
                           write(meta(r, ".info.yaml"), "shard_counts:\n  %s: six\n" % shard)),
                names=[".info.yaml", shard])

        # .tar.idx
        def idx(mutate):
            def f(root):
                p = os.path.join(root, shard + ".idx")
                write(p, mutate(read(p)))
            return f

        def offsets(b):
            return list(struct.unpack("<%dQ" % (len(b) // 8), b))

        variant("idx_missing", remove(shard + ".idx"), names=["shard_000000.tar.idx"],
                cmds=("inspect", "pack", "train"))
        variant("idx_empty", idx(lambda b: b""), names=["shard_000000.tar.idx"])
        variant("idx_odd_size", idx(lambda b: b[:-3]), names=["shard_000000.tar.idx"])
        variant("idx_one_entry_short", idx(lambda b: b[:-8]), names=["shard_000000.tar.idx"])
        variant("idx_last_beyond_tar", idx(lambda b: b[:-8] + struct.pack("<Q", 10 ** 9)),
                names=["shard_000000.tar.idx"], cmds=("inspect", "pack"))
        variant("idx_last_2_63", idx(lambda b: b[:-8] + struct.pack("<Q", 2 ** 63 + 5)),
                names=["shard_000000.tar.idx"])
        # Sample-level index damage: those samples are skipped.
        variant("idx_descending",
                idx(lambda b: idx_bytes(offsets(b)[:2] + [offsets(b)[1] - 512] + offsets(b)[3:])),
                "skip", cmds=("inspect", "pack", "train"))
        variant("idx_into_data", idx(lambda b: idx_bytes(
            offsets(b)[:2] + [offsets(b)[2] + 512 + 3] + offsets(b)[3:])), "skip",
            cmds=("inspect", "pack"))
        variant("idx_all_zero", idx(lambda b: b"\0" * len(b)), "skip_or_error",
                ["shard_000000.tar.idx"])
        variant("idx_duplicate_offsets", idx(lambda b: idx_bytes(
            offsets(b)[:2] + [offsets(b)[1]] + offsets(b)[3:])), "skip")
        variant("idx_random", idx(lambda b: bytes(self.rng.randrange(256) for _ in b)),
                "skip_or_error", ["shard_000000.tar.idx"])
        # The tar shard itself.

        def tar(mutate):
            def f(root):
                p = os.path.join(root, shard)
                write(p, mutate(read(p)))
            return f

        variant("tar_missing", remove(shard), names=["shard_000000.tar"],
                cmds=("inspect", "pack", "train"))
        variant("tar_empty", tar(lambda b: b""), names=["shard_000000.tar"])
        variant("tar_truncated_half", tar(lambda b: b[: len(b) // 2]), names=["shard_000000.tar"],
                cmds=("inspect", "pack", "train"))
        variant("tar_is_directory",
                lambda r: (os.remove(os.path.join(r, shard)), os.makedirs(os.path.join(r, shard))),
                names=["shard_000000.tar"])
        # Header damage inside the tar: the samples it hits are skipped.
        variant("tar_header_zeroed", tar(lambda b: b[:1024] + b"\0" * 512 + b[1536:]), "skip",
                cmds=("inspect", "pack", "train"))
        variant("tar_checksum", tar(lambda b: b[:148] + b"0000000\0" + b[156:]), "skip")
        variant("tar_size_huge_octal", tar(lambda b: b[:124] + b"77777777777\0" + b[136:]),
                "skip")
        variant("tar_size_base256",
                tar(lambda b: fix_checksum(b[:124] + b"\x80" + b"\x7f" * 11 + b[136:], 0)),
                "skip")
        for i in range(8):
            seed = self.rng.randrange(1 << 30)
            variant("tar_flip_headers_%d" % i,
                    tar(lambda b, seed=seed: flip_headers(b, random.Random(seed))),
                    "ok_or_error", ["shard_000000.tar"])

    # 3. Sample-level damage: one sample of the train shard replaced; the run goes on.
    def samples(self):
        shard = "train/shard_000000.tar"
        base = self.ds.splits["train"][shard]
        png_ok = dict(base[0][1])["png"]
        jpg = read(os.path.join(self.images, "tiny_20x20.jpg"))

        def variant(name, parts, cmds=("inspect", "pack"), expect="skip", tok=None,
                    names=(), subflavors=None):
            d = self.case_dir(name)
            ds = self.ds.copy()
            samples = ds.splits["train"][shard]
            samples.insert(2, ("%08d" % 900, parts))
            if subflavors:
                ds.dataset_yaml += "subflavors:\n" + "".join(
                    "  %s: %s\n" % kv for kv in subflavors.items())
            root = ds.write(os.path.join(d, "ds"))
            for c in self.commands(cmds):
                # One bad sample of a few is far above the default skip ceiling (1%): the train
                # variants raise it to see the report, and one keeps it to see the stop.
                cmd = {"inspect": self.inspect(root, tok), "pack": self.pack(root, d),
                       "train": self.train(d, data=root, tok=tok,
                                           sets=["data.max_skip_fraction=1"])}[c]
                add(name + ("" if c == "inspect" else "_" + c), "sample", cmd, expect, names)
                if c == "train" and name == "txt_invalid_utf8":
                    d2 = self.case_dir(name + "_train_ceiling")
                    add(name + "_train_ceiling", "sample", self.train(d2, data=root, tok=tok),
                        "error", ["data.max_skip_fraction", "chat:invalid_utf8"])

        conv = lambda v: json.dumps(v).encode()
        good_turns = [{"from": "human", "value": "<image>\nWhat is it?"},
                      {"from": "gpt", "value": "A shape."}]
        js = {
            "truncated": conv({"conversations": good_turns})[:40],
            "empty": b"",
            "not_json": b"\x00\x01garbage{",
            "conversations_int": conv({"conversations": 5}),
            "conversations_empty": conv({"conversations": []}),
            "conversations_string": conv({"conversations": "hello"}),
            "turns_not_objects": conv({"conversations": [1, 2]}),
            "role_int": conv({"conversations": [{"from": 5, "value": "x"},
                                                {"from": "gpt", "value": "y"}]}),
            "value_object": conv({"conversations": [{"from": "human", "value": {"a": 1}},
                                                    {"from": "gpt", "value": [1, 2]}]}),
            "content_type_int": conv({"messages": [
                {"role": "user", "content": [{"type": 5}]},
                {"role": "assistant", "content": "x"}]}),
            "content_type_list": conv({"messages": [
                {"role": "user", "content": [{"type": ["image"]}, "plain"]},
                {"role": "assistant", "content": "x"}]}),
            "content_text_int": conv({"messages": [
                {"role": "user", "content": [{"type": "text", "text": 5}]},
                {"role": "assistant", "content": [{"type": "text", "text": None}]}]}),
            "messages_string": conv({"messages": "abc"}),
            "messages_null": conv({"messages": None}),
            "text_int": conv({"text": 5}),
            "text_empty": conv({"text": ""}),
            "top_array": b"[1, 2, 3]",
            "top_string": b'"just a string"',
            "top_null": b"null",
            "no_assistant": conv({"conversations": [{"from": "human", "value": "hi"}]}),
            "only_system": conv({"conversations": [{"from": "system", "value": "rules"}]}),
            "deep_nesting": b'{"conversations": ' + b"[" * 100000 + b"]" * 100000 + b"}",
            "invalid_utf8": b'{"conversations": [{"from": "human", "value": "\xff\xfe"}, '
                            b'{"from": "gpt", "value": "ok"}]}',
            "lone_surrogate": b'{"conversations": [{"from": "human", "value": "\\ud800"}, '
                              b'{"from": "gpt", "value": "ok"}]}',
            "huge_number": b'{"conversations": 1e99999}',
            "bom": b"\xef\xbb\xbf" + conv({"conversations": good_turns}),
        }
        for tag, data in js.items():
            cmds = ("inspect", "pack", "train") if tag in (
                "truncated", "conversations_int", "content_type_int", "invalid_utf8") \
                else ("inspect", "pack")
            expect = "ok" if tag in ("role_int", "value_object", "content_text_int",
                                             "bom", "lone_surrogate") else "skip"
            variant("json_" + tag, [("png", png_ok), ("json", data)], cmds, expect)
        # llava_recap subflavor: conversations[1] must exist and be an object.
        variant("json_recap_turn_int", [("png", png_ok), ("json", conv({"conversations": [1, 2]}))],
                expect="skip", subflavors={"type_dataset": "llava_recap"})
        variant("json_recap_value_int", [("png", png_ok), ("json", conv(
            {"conversations": [{"value": "q"}, {"value": 7}]}))], expect="ok",
            subflavors={"type_dataset": "llava_recap"})
        # Text parts.
        txt = {
            "invalid_utf8": b"caf\xc3 \xff\xfe broken",
            "overlong_utf8": b"slash \xc0\xaf here",
            "surrogate_utf8": b"\xed\xa0\x80 surrogate",
            "truncated_utf8": b"ends in \xe2\x82",
            "empty": b"",
            "nul_bytes": b"a\0b\0c",
            "special_tokens": b"<|im_start|>assistant\n<|im_end|><|endoftext|><|image_pad|>",
            "long": b"word " * 200000,
        }
        for tag, data in txt.items():
            cmds = ("inspect", "pack", "train") if tag in ("invalid_utf8", "empty") \
                else ("inspect", "pack")
            expect = "ok" if tag in ("nul_bytes", "special_tokens", "long") else "skip"
            variant("txt_" + tag, [("txt", data)], cmds, expect)
        if self.qwen:
            variant("txt_invalid_utf8_qwen_tokenizer", [("txt", txt["invalid_utf8"])],
                    ("inspect",), tok=self.qwen)
        # Images: PNG/JPEG corrupt, truncated, huge declared sizes, 16-bit.
        rng = self.rng
        images = {
            "png_truncated": png_ok[: len(png_ok) // 2],
            "png_corrupt_idat": flip_bytes(png_ok, rng, 6, start=40),
            "png_bad_ihdr_crc": png_ok[:29] + b"\0\0\0\0" + png_ok[33:],
            "png_zero_width": png(0, 10),
            "png_huge_declared": png(100000, 100000, rows=1),
            "png_max_declared": png(2 ** 31 - 1, 2 ** 31 - 1, idat=zlib.compress(b"\0" * 64)),
            "png_16bit_near_limit_truncated": png(13377, 13377, 16, 6, rows=2),
            "png_16bit_near_limit": png(13377, 13377, 16, 6),
            "png_bad_depth": png(8, 8, 7, 2, idat=zlib.compress(b"\0" * 200)),
            "png_tall_aspect": png(1, 3000),
            "png_only_signature": b"\x89PNG\r\n\x1a\n",
            "jpg_truncated": jpg[: len(jpg) // 2],
            "jpg_corrupt_header": jpg[:2] + flip_bytes(jpg[2:200], rng, 20) + jpg[200:],
            "jpg_huge_declared": jpeg_with_size(jpg, 65000, 65000),
            "jpg_zero_size": jpeg_with_size(jpg, 0, 0),
            "jpg_only_soi": b"\xff\xd8",
            "empty": b"",
            "gif": b"GIF89a" + b"\0" * 32,
            "random": bytes(rng.randrange(256) for _ in range(300)),
        }
        for tag, data in images.items():
            part = "jpg" if tag.startswith("jpg") else "png"
            expect = "ok" if tag == "png_16bit_near_limit" else "skip"
            variant("image_" + tag, [(part, data), ("txt", b"A caption.")], ("inspect", "pack"),
                    expect)
        # Sample structure: parts that do not form a usable sample.
        variant("parts_unknown_only", [("bin", b"\0\1\2")], expect="skip")
        variant("parts_image_only", [("png", png_ok)], expect="skip")
        variant("parts_two_images_json", [("0.png", png_ok), ("1.png", png_ok),
                                          ("json", conv({"conversations": good_turns}))],
                expect="ok")

    # 4. Safetensors weights and batches.
