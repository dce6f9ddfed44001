"""Fuzz cases of the training config (TOML) and of config.json (a mixin of gen_cases.Gen)."""
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


class ConfigCases:
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
        # A model.model_dir that was never downloaded: said as such, not as a missing tokenizer.
        d = self.case_dir("model_dir_missing")
        add("model_dir_missing", "config file",
            self.train(d, model=os.path.join(d, "no_snapshot"), tok=os.path.join(d, "no_snapshot")),
            "error", ["model.model_dir = \"%s\" is not a folder" % os.path.join(d, "no_snapshot")])
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
