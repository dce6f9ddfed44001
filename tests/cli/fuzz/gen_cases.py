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

from fuzz_common import (CASES, add, write, read, read_shard, tar_bytes, idx_bytes, Dataset, png_chunk, png, jpeg_with_size, flip_bytes, DROP, fix_checksum, flip_headers)
from cases_configs import ConfigCases
from cases_data import DataCases
from cases_files import FileCases


class Gen(ConfigCases, DataCases, FileCases):
    """The generator: the valid inputs it starts from and the commands it runs on them; the case
    families are its mixins."""
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
