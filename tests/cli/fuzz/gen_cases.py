#!/usr/bin/env python3
"""Writes the command-level fuzz cases of tests/cli/fuzz/run_fuzz.sh (standard library only).

    gen_cases.py --base DEMO_DIR --repo REPO_ROOT --out OUT_DIR [--qwen-tokenizer DIR] [--seed N]

Starts from valid inputs -- DEMO_DIR (`vlmtrain data make-demo` output with a few samples and its
tokenizer.json), the tiny snapshot tests/data/qwen3_tiny_tied, the batch
tests/data/qwen3_tiny_batches/packed.safetensors and configs/demo.toml shrunk to 2 steps -- and
writes broken variants of each input class, one folder per case, plus OUT_DIR/cases.json: a list
of {name, group, cmd, stdin, expect, names}. `cmd` holds "@BIN@" for the vlmtrain binary.
`expect` is what a good trainer does:
  ok             exit 0
  skip           exit 0 and the output reports a skipped sample (sample-level damage)
  error          non-zero exit, and the final error message names one of `names`
  skip_or_error  either of the two (damage that is fair to treat as a sample's or the file's)
  ok_or_error    exit 0, or an error naming one of `names` (legal but extreme values)
Everything is deterministic for a given --seed.
"""
import argparse
import io
import json
import os
import random
import shutil
import struct
import tarfile
import zlib

CASES = []


def add(name, group, cmd, expect, names=(), stdin=None):
    assert not any(c["name"] == name for c in CASES), name
    CASES.append({"name": name, "group": group, "cmd": [str(c) for c in cmd], "expect": expect,
                  "names": list(names), "stdin": stdin})


def write(path, data):
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "wb") as f:
        f.write(data if isinstance(data, bytes) else data.encode())


def read(path):
    with open(path, "rb") as f:
        return f.read()


# --- Energon datasets ------------------------------------------------------------------------------

def read_shard(path):
    """[(key, [(part, bytes)])] of a tar, grouped as energon does (consecutive same key)."""
    samples = []
    with tarfile.open(path) as t:
        for m in t.getmembers():
            base = m.name.rsplit("/", 1)[-1]
            key = m.name[: len(m.name) - len(base)] + base.split(".", 1)[0]
            part = base.split(".", 1)[1]
            data = t.extractfile(m).read()
            if samples and samples[-1][0] == key:
                samples[-1][1].append((part, data))
            else:
                samples.append((key, [(part, data)]))
    return samples


def tar_bytes(samples):
    """ustar bytes of the samples and the .tar.idx offsets (count + 1 entries)."""
    buf = io.BytesIO()
    offsets = []
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.USTAR_FORMAT) as t:
        for key, parts in samples:
            offsets.append(t.offset)
            for part, data in parts:
                info = tarfile.TarInfo(key + "." + part)
                info.size = len(data)
                info.mode = 0o644
                t.addfile(info, io.BytesIO(data))
        offsets.append(t.offset)
    return buf.getvalue(), offsets


def idx_bytes(offsets):
    return b"".join(struct.pack("<Q", o) for o in offsets)


class Dataset:
    """A dataset in memory: splits of shards of samples, plus the .nv-meta texts."""

    def __init__(self, base):
        self.splits = {}
        for split in ("train", "val"):
            self.splits[split] = {split + "/shard_000000.tar":
                                  read_shard(os.path.join(base, split, "shard_000000.tar"))}
        self.dataset_yaml = "__module__: megatron.energon\n__class__: CrudeWebdataset\n"
        self.exclude = "[]"

    def copy(self):
        d = Dataset.__new__(Dataset)
        d.splits = {s: {n: [(k, list(p)) for k, p in v] for n, v in shards.items()}
                    for s, shards in self.splits.items()}
        d.dataset_yaml, d.exclude = self.dataset_yaml, self.exclude
        return d

    def split_yaml(self):
        y = "split_parts:\n"
        for split, shards in self.splits.items():
            y += "  %s:\n" % split + "".join("  - %s\n" % n for n in shards)
        return y + "exclude: %s\n" % self.exclude

    def info(self):
        counts = {n: len(s) for shards in self.splits.values() for n, s in shards.items()}
        return {"energon_version": "fuzz", "shard_counts": counts}

    def write(self, root):
        for shards in self.splits.values():
            for name, samples in shards.items():
                data, offsets = tar_bytes(samples)
                write(os.path.join(root, name), data)
                write(os.path.join(root, name + ".idx"), idx_bytes(offsets))
        write(os.path.join(root, ".nv-meta", "dataset.yaml"), self.dataset_yaml)
        write(os.path.join(root, ".nv-meta", "split.yaml"), self.split_yaml())
        write(os.path.join(root, ".nv-meta", ".info.json"), json.dumps(self.info(), indent=2))
        return root


# --- images ---------------------------------------------------------------------------------------

def png_chunk(kind, data):
    return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))


def png(width, height, bit_depth=8, colour=2, rows=None, idat=None):
    """A PNG; `rows` = number of (zero) rows to compress (default all), `idat` = raw IDAT bytes."""
    ihdr = struct.pack(">IIBBBBB", width, height, bit_depth, colour, 0, 0, 0)
    if idat is None:
        channels = {0: 1, 2: 3, 4: 2, 6: 4}[colour]
        row = b"\0" * (1 + (width * channels * bit_depth + 7) // 8)
        z = zlib.compressobj(9)
        idat = b"".join(z.compress(row) for _ in range(height if rows is None else rows))
        idat += z.flush()
    return (b"\x89PNG\r\n\x1a\n" + png_chunk(b"IHDR", ihdr) + png_chunk(b"IDAT", idat) +
            png_chunk(b"IEND", b""))


def jpeg_with_size(jpg, width, height):
    """The JPEG with the frame size of its SOF0/SOF2 marker replaced."""
    b = bytearray(jpg)
    i = 2
    while i + 4 < len(b):
        marker, length = b[i + 1], struct.unpack(">H", b[i + 2:i + 4])[0]
        if marker in (0xC0, 0xC1, 0xC2):
            b[i + 5:i + 9] = struct.pack(">HH", height, width)
            return bytes(b)
        i += 2 + length
    raise ValueError("no SOF marker")


def flip_bytes(data, rng, n, start=0):
    b = bytearray(data)
    for _ in range(n):
        i = rng.randrange(start, len(b))
        b[i] ^= 1 + rng.randrange(255)
    return bytes(b)


# --- the case families ----------------------------------------------------------------------------

class Gen:
    def __init__(self, args):
        self.rng = random.Random(args.seed)
        self.out = os.path.abspath(args.out)
        self.repo = os.path.abspath(args.repo)
        self.base = os.path.abspath(args.base)
        self.tok = os.path.join(self.base, "tokenizer.json")
        self.qwen = args.qwen_tokenizer
        self.snapshot = os.path.join(self.repo, "tests", "data", "qwen3_tiny_tied")
        self.batch = os.path.join(self.repo, "tests", "data", "qwen3_tiny_batches",
                                  "packed.safetensors")
        self.images = os.path.join(self.repo, "tests", "data", "images")
        self.ds = Dataset(self.base)

    def case_dir(self, name):
        d = os.path.join(self.out, name)
        os.makedirs(d, exist_ok=True)
        return d

    def commands(self, cmds):
        return [c for c in cmds if c != "pack" or self.qwen]

    # Commands.
    def inspect(self, ds, tok=None):
        return ["@BIN@", "data", "inspect", ds, "--tokenizer", tok or self.tok]

    def pack(self, ds, d):
        # With the real Qwen tokenizer (tests/data/qwen3-tokenizer); without one the pack cases
        # are left out (see commands()).
        return ["@BIN@", "data", "pack", ds, "--tokenizer", self.qwen, "--seq-len", "128",
                "--threads", "1", "--out", os.path.join(d, "plan.bin")]

    def train_toml(self, d, data=None, model=None, tok=None, extra=""):
        """configs/demo.toml shrunk to 2 steps on tiny data; `model` = a snapshot dir."""
        m = ('model_dir = "%s"\n' % model) if model else 'preset = "tiny"\n'
        text = ("[model]\nmodel_name = \"fuzz\"\n%stokenizer = \"%s\"\n\n"
                "[training]\nseed = 0\ntotal_steps = 2\nwarmup_steps = 1\n"
                "scheduler_type = \"cosine\"\nlr_llm = 3e-3\nmicro_batch_rows = 1\n"
                "param_dtype = \"f32\"\neval_steps = 0\n\n"
                "[data]\ndata_path = \"%s\"\nseq_len = 64\npacking_buffer_size = 8\n"
                "num_workers = 1\n\n"
                "[checkpoint]\noutput_dir = \"%s\"\nsave_steps = 0\n\n"
                "[logging]\nlog_every = 1\n%s"
                % (m, tok or self.tok, data or self.base, os.path.join(d, "out"), extra))
        path = os.path.join(d, "train.toml")
        write(path, text)
        return path

    def train(self, d, sets=(), **kw):
        cmd = ["@BIN@", "train", "--config", self.train_toml(d, **kw)]
        for s in sets:
            cmd += ["--set", s]
        return cmd

    # 1. TOML configs and --set values.
    def configs(self):
        # (key=value, expectation, names); names default to the key.
        sets = [
            ("training.micro_batch_rows=1000000000", "error", None),
            ("data.num_workers=100000", "error", None),
            ("data.packing_buffer_size=1e12", "error", None),
            ("data.packing_buffer_size=1000000000000", "error", None),
            ("data.shuffle_buffer_size=1000000000000", "ok_or_error", None),
            ("data.seq_len=2147483647", "error", None),
            ("data.seq_len=1000000000000", "error", None),
            ("data.seq_len=-5", "error", None),
            ("data.seq_len=1", "error", None),
            ("data.seq_len=abc", "error", None),
            ("data.seq_len=12.5", "error", None),
            ("data.seq_len=true", "error", None),
            ("training.total_steps=-1", "error", None),
            ("training.total_steps=0", "error", None),
            ("training.total_steps=1e30", "error", None),
            ("training.total_steps=99999999999999999999", "error", None),
            ("training.micro_batch_rows=0", "error", None),
            ("training.micro_batch_rows=-3", "error", None),
            ("training.lr_llm=-1", "error", None),
            ("training.lr_llm=nan", "error", None),
            ("training.lr_llm=inf", "error", None),
            ("training.lr_llm=fast", "error", None),
            ("training.lr_llm=1e400", "error", None),
            ("data.num_workers=0", "error", None),
            ("data.num_workers=-1", "error", None),
            ("data.shuffle_buffer_size=-1", "error", None),
            ("data.max_samples_per_sequence=-1", "error", None),
            ("data.epochs=-1", "error", None),
            ("data.epochs=1000000000000", "ok", None),
            ("data.min_pixels=0", "error", None),
            ("data.max_pixels=1", "error", None),
            ("data.min_pixels=1000000000000", "ok_or_error", ["data.min_pixels", "data.max_pixels"]),
            ("data.max_pixels=9223372036854775807", "ok_or_error", None),
            ("training.tpi_multiplier=1.001", "error", None),
            ("training.tpi_multiplier=0", "error", None),
            ("training.tpi_multiplier=1e9", "error", None),
            ("training.loss_vocab_chunk=-1", "error", None),
            ("training.loss_vocab_chunk=1000000000000", "ok_or_error", None),
            ("training.eval_steps=-1", "error", None),
            ("training.eval_batches=-1", "error", None),
            ("training.warmup_steps=5", "error", None),
            ("training.min_lr_ratio=1.5", "error", None),
            ("training.adam_beta1=1.0", "error", None),
            ("training.adam_eps=0", "error", None),
            ("training.max_grad_norm=-1", "error", None),
            ("training.device=cuda:99999999999", "error", None),
            ("training.device=tpu", "error", None),
            ("training.param_dtype=f64", "error", None),
            ("training.scheduler_type=bogus", "error", None),
            ("training.seed=-1", "error", None),
            ("training.seed=18446744073709551615", "error", None),
            ("training.nan_policy=ignore", "error", None),
            ("training.ac_mode=partial", "error", None),
            ("logging.log_every=0", "error", None),
            ("logging.log_every=1000000000000", "ok", None),
            ("logging.peak_tflops=-1", "error", None),
            ("checkpoint.save_steps=-1", "error", None),
            ("checkpoint.save_steps=1000000000000", "ok", None),
            ("checkpoint.output_dir=", "error", ["checkpoint.output_dir"]),
            ("checkpoint.output_dir=/proc/vlm_fuzz_nonexistent/x", "error",
             ["/proc/vlm_fuzz_nonexistent", "checkpoint.output_dir"]),
            ("checkpoint.format=zip", "error", None),
            ("parallel.tp_size=0", "error", None),
            ("parallel.tp_size=100000", "error", None),
            ("model.preset=huge", "error", None),
            ("model.tokenizer=/vlm_fuzz_nonexistent/tok", "error", ["/vlm_fuzz_nonexistent/tok"]),
            ("data.data_path=/vlm_fuzz_nonexistent/ds", "error", ["/vlm_fuzz_nonexistent/ds"]),
            ("data.train_split=nosuch", "error", ["nosuch"]),
            ("data.packing_plan=/vlm_fuzz_nonexistent/plan.bin", "error",
             ["/vlm_fuzz_nonexistent/plan.bin"]),
            ("training.lr_lmm=1e-3", "error", ["training.lr_lmm"]),
            ("training.total_steps", "error", ["training.total_steps"]),
            ("=5", "error", ["=5", "--set"]),
            ("nosection=5", "error", ["nosection"]),
            ("training.=5", "error", ["training."]),
            ("training.total_steps=" + "9" * 5000, "error", ["training.total_steps"]),
        ]
        for i, (s, expect, names) in enumerate(sets):
            key = s.split("=", 1)[0]
            name = "set_%02d_%s" % (i, "".join(c if c.isalnum() else "_" for c in s)[:48])
            d = self.case_dir(name)
            add(name, "config --set", self.train(d, [s]), expect, names or [key])

        # Broken TOML files: the error names the file.
        good = read(self.train_toml(self.case_dir("toml_base"), extra=""))
        shutil.rmtree(os.path.join(self.out, "toml_base"))
        broken = {
            "empty": b"",
            "truncated": good[: len(good) // 2] + b'"unterminated',
            "bad_header": b"[training\ntotal_steps = 2\n",
            "duplicate_key": good + b"\n[training]\ntotal_steps = 3\n",
            "duplicate_key_same_table": good.replace(b"total_steps = 2\n",
                                                      b"total_steps = 2\ntotal_steps = 3\n"),
            "wrong_section": good.replace(b"[data]\n", b"[data]\ntotal_steps = 2\n"),
            "string_for_int": good.replace(b"total_steps = 2", b'total_steps = "2"'),
            "array_for_int": good.replace(b"total_steps = 2", b"total_steps = [2, 3]"),
            "table_for_int": good.replace(b"total_steps = 2", b"total_steps = { a = 2 }"),
            "int_for_string": good.replace(b'scheduler_type = "cosine"', b"scheduler_type = 7"),
            "deep_array": good + b"\n[extra]\nx = " + b"[" * 20000 + b"]" * 20000 + b"\n",
            "deep_inline_table": good + b"\n[extra2]\nx = " + b"{a=" * 5000 + b"1" +
                                 b"}" * 5000 + b"\n",
            "invalid_utf8": good.replace(b'model_name = "fuzz"', b'model_name = "fu\xff\xfezz"'),
            "nul_byte": good.replace(b"[data]", b"[da\0ta]"),
            "huge_float": good.replace(b"lr_llm = 3e-3", b"lr_llm = 1e400"),
            "int_overflow": good.replace(b"total_steps = 2", b"total_steps = 99999999999999999999"),
            "binary_png": read(os.path.join(self.images, "rgb8_19x13.png")),
        }
        for tag, text in broken.items():
            name = "toml_" + tag
            d = self.case_dir(name)
            path = os.path.join(d, "broken.toml")
            write(path, text)
            add(name, "config file", ["@BIN@", "train", "--config", path], "error", ["broken.toml"])
        # Fine TOML variations: they train.
        fine = {
            "crlf": good.replace(b"\n", b"\r\n"),
            "bom": b"\xef\xbb\xbf" + good,
            "comments": good.replace(b"\n", b" # comment\n").replace(b"] # comment", b"]"),
            "long_comment": good + b"\n# " + b"x" * 4000000 + b"\n",
        }
        for tag, text in fine.items():
            name = "toml_ok_" + tag
            d = self.case_dir(name)
            path = os.path.join(d, "fine.toml")
            write(path, text.replace(b"/toml_base/out", ("/" + name + "/out").encode()))
            add(name, "config file", ["@BIN@", "train", "--config", path], "ok_or_error",
                ["fine.toml"])
        # A folder given as the config must be refused as such, not read as an empty file.
        d = self.case_dir("config_folder")
        add("config_folder", "config file", ["@BIN@", "train", "--config", d], "error",
            ["directory", "not a file", "not a regular file"])
        add("config_missing", "config file",
            ["@BIN@", "train", "--config", os.path.join(self.out, "no_such.toml")], "error",
            ["no_such.toml"])
        # A packing plan that is garbage, or made for another seq_len.
        d = self.case_dir("plan_garbage")
        write(os.path.join(d, "garbage.bin"), bytes(self.rng.randrange(256) for _ in range(4096)))
        add("plan_garbage", "config --set",
            self.train(d, ["data.packing_plan=" + os.path.join(d, "garbage.bin")]), "error",
            ["garbage.bin"])
        d = self.case_dir("plan_truncated")
        write(os.path.join(d, "trunc.bin"), b"VLMP")
        add("plan_truncated", "config --set",
            self.train(d, ["data.packing_plan=" + os.path.join(d, "trunc.bin")]), "error",
            ["trunc.bin"])

    # 2. Dataset metadata, shards and indexes: whole-dataset damage is an error naming the file.
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
    def config_json(self):
        cfg = json.loads(read(os.path.join(self.snapshot, "config.json")))

        def edit(**kv):
            c = dict(cfg)
            for k, v in kv.items():
                if v is DROP:
                    c.pop(k, None)
                else:
                    c[k] = v
            return json.dumps(c, indent=2).encode()

        variants = [
            ("hidden_size_huge", edit(hidden_size=1 << 40), ["hidden_size"], True),
            ("hidden_size_1e9", edit(hidden_size=1000000000), ["hidden_size"], True),
            ("vocab_size_huge", edit(vocab_size=10 ** 12), ["vocab_size"], True),
            ("vocab_size_2_31", edit(vocab_size=2 ** 31), ["vocab_size"], False),
            ("intermediate_size_huge", edit(intermediate_size=1 << 40), ["intermediate_size"],
             True),
            # Export only: building 100000 layers until memory runs out takes ~30 s per command.
            ("num_layers_huge", edit(num_hidden_layers=100000),
             ["num_hidden_layers", "model.layers.2"], False),
            ("num_heads_zero", edit(num_attention_heads=0), ["num_attention_heads"], False),
            ("num_kv_heads_not_dividing", edit(num_key_value_heads=3), ["num_key_value_heads"],
             False),
            ("head_dim_negative", edit(head_dim=-1), ["head_dim"], False),
            ("head_dim_huge", edit(head_dim=1 << 40), ["head_dim"], False),
            ("hidden_size_string", edit(hidden_size="64"), ["hidden_size"], True),
            ("hidden_size_float", edit(hidden_size=64.5), ["hidden_size"], False),
            ("hidden_size_null", edit(hidden_size=None), ["hidden_size"], False),
            ("hidden_size_negative", edit(hidden_size=-64), ["hidden_size"], False),
            ("hidden_size_missing", edit(hidden_size=DROP), ["hidden_size"], True),
            ("vocab_size_missing", edit(vocab_size=DROP), ["vocab_size"], False),
            ("model_type_missing", edit(model_type=DROP), ["model_type"], False),
            ("model_type_unknown", edit(model_type="llama9"), ["llama9"], False),
            ("model_type_int", edit(model_type=3), ["model_type"], False),
            ("rms_norm_eps_string", edit(rms_norm_eps="tiny"), ["rms_norm_eps"], False),
            ("rms_norm_eps_negative", edit(rms_norm_eps=-1.0), ["rms_norm_eps"], False),
            ("rope_theta_string", edit(rope_parameters={"rope_theta": "big",
                                                        "rope_type": "default"}),
             ["rope_theta", "rope_parameters"], False),
            ("rope_parameters_list", edit(rope_parameters=[1, 2]), ["rope_parameters"], False),
            ("tie_embeddings_string", edit(tie_word_embeddings="yes"), ["tie_word_embeddings"],
             False),
            ("max_position_negative", edit(max_position_embeddings=-1),
             ["max_position_embeddings"], False),
            ("layer_types_short", edit(layer_types=["full_attention"]), ["layer_types"], False),
            ("vocab_size_tiny", edit(vocab_size=8), ["vocab_size", "embed_tokens"], True),
            ("layer_types_int", edit(layer_types=5), ["layer_types"], False),
        ]
        raw = [
            ("empty", b""),
            ("not_json", b"{hidden_size: 64"),
            ("array", b"[1, 2]"),
            ("truncated", read(os.path.join(self.snapshot, "config.json"))[:200]),
            ("deep", b'{"a": ' + b"[" * 100000 + b"]" * 100000 + b"}"),
        ]
        for tag, blob, names, more in [(t, b, ["config.json"], True) for t, b in raw] + variants:
            name = "config_json_" + tag
            d = self.case_dir(name)
            snap = os.path.join(d, "snap")
            os.makedirs(snap)
            shutil.copy(os.path.join(self.snapshot, "model.safetensors"), snap)
            write(os.path.join(snap, "config.json"), blob)
            # layer_types is not used by a full-attention model: ignoring a short list is fine.
            expect = "ok_or_error" if tag == "layer_types_short" else "error"
            add(name + "_export", "config.json",
                ["@BIN@", "export", "--checkpoint", snap, "--out", os.path.join(d, "export")],
                expect, names)
            if more:
                add(name + "_train", "config.json",
                    self.train(d, model=snap, sets=["training.random_init=false"]), "error", names)
                add(name + "_dump", "config.json",
                    ["@BIN@", "dump", "--model", snap, "--batch", self.batch, "--out",
                     os.path.join(d, "dump.safetensors")], "error", names)
        d = self.case_dir("config_json_missing")
        snap = os.path.join(d, "snap")
        os.makedirs(snap)
        shutil.copy(os.path.join(self.snapshot, "model.safetensors"), snap)
        add("config_json_missing_export", "config.json",
            ["@BIN@", "export", "--checkpoint", snap, "--out", os.path.join(d, "export")],
            "error", ["config.json"])

    # 6. tokenizer.json, through `vlmtrain tokenize` and `data inspect`.
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


DROP = object()


def fix_checksum(b, at):
    """Recomputes the ustar checksum of the header block at offset `at`."""
    h = bytearray(b[at:at + 512])
    h[148:156] = b" " * 8
    h[148:156] = b"%06o\0 " % sum(h)
    return b[:at] + bytes(h) + b[at + 512:]


def flip_headers(b, rng):
    """Random byte damage in a few header blocks (checksums fixed half the time, so the damage
    reaches the number and name fields and not only the checksum test)."""
    starts = []
    at = 0
    while at + 512 <= len(b) and any(b[at:at + 512]):
        starts.append(at)
        size = int(b[at + 124:at + 136].strip(b"\0 ") or b"0", 8)
        at += 512 + (size + 511) // 512 * 512
    for at in rng.sample(starts, min(2, len(starts))):
        field = rng.choice([(0, 100), (100, 124), (124, 136), (156, 157), (257, 265), (345, 500)])
        h = bytearray(b[at:at + 512])
        for _ in range(rng.randrange(1, 4)):
            i = rng.randrange(*field)
            h[i] = rng.choice([0, 0x20, 0x30, 0x37, 0x38, 0x80, 0xFF, rng.randrange(256)])
        b = b[:at] + bytes(h) + b[at + 512:]
        if rng.random() < 0.5:
            b = fix_checksum(b, at)
    return b


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--base", required=True)
    p.add_argument("--repo", required=True)
    p.add_argument("--out", required=True)
    p.add_argument("--qwen-tokenizer", default="")
    p.add_argument("--seed", type=int, default=1234)
    args = p.parse_args()
    g = Gen(args)
    os.makedirs(g.out, exist_ok=True)
    for family in (g.configs, g.metadata, g.samples, g.safetensors, g.config_json, g.tokenizer):
        family()
    with open(os.path.join(g.out, "cases.json"), "w") as f:
        json.dump(CASES, f, indent=1)
    print("gen_cases: %d cases in %s" % (len(CASES), g.out))


if __name__ == "__main__":
    main()
