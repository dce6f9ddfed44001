#!/usr/bin/python3
"""Writes the checkpoint, resume, export, generate and multi-rank cases of tests/cli/fuzz/run_fuzz.sh
(issue 31). Needs Debian's python3-h5py (tools/deps/install_deps.sh) for the damaged state.h5 files.

    gen_checkpoint_cases.py --bin VLMTRAIN --base DEMO_DIR --out OUT_DIR [--qwen-tokenizer DIR]

First it trains three small runs with VLMTRAIN (a tiny Qwen3 stopped by a signal at step 4 of 6;
the same run to its end; a tiny Qwen3-VL for 2 steps), then writes one folder per case, each with
a copy of what it needs, and OUT_DIR/checkpoint_cases.json in the format of gen_cases.py, plus:
  preserve      paths whose every file must be unchanged afterwards (nothing lost)
  expect_files  paths that must exist after exit 0
  want          texts the output must hold after exit 0
  env           extra environment (mpirun as root)
  expect "rc"   with `rc`: the exit code (75: stopped by a signal after saving)
The families (group names): damaged state.h5 through train on 1 and 2 ranks and through export;
output_dir states (latest, step_N, snapshots, metrics, branches) through train; export
destinations and sources; generate inputs and options; multi-rank layouts and fault flags; the
numbers of the data tools' options.
"""
import argparse
import json
import os
import shutil
import struct
import subprocess
import sys
import zlib

import h5py
import numpy as np

CASES = []
MPI_ENV = {"OMPI_ALLOW_RUN_AS_ROOT": "1", "OMPI_ALLOW_RUN_AS_ROOT_CONFIRM": "1",
           "OMPI_MCA_btl_vader_single_copy_mechanism": "none"}


def add(name, group, cmd, expect, names=(), preserve=(), expect_files=(), want=(), env=None,
        rc=None):
    assert not any(c["name"] == name for c in CASES), name
    c = {"name": name, "group": group, "cmd": [str(x) for x in cmd], "expect": expect,
         "names": list(names), "stdin": None, "preserve": list(preserve),
         "expect_files": list(expect_files), "want": list(want)}
    if env:
        c["env"] = env
    if rc is not None:
        c["rc"] = rc
    CASES.append(c)


def write(path, data):
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "wb") as f:
        f.write(data if isinstance(data, bytes) else data.encode())


def png(width, height, rows=None):
    """An RGB PNG; `rows` = the rows compressed (fewer: a header that claims more than is there)."""
    def chunk(kind, data):
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I",
                                                                     zlib.crc32(kind + data))
    raw = b"".join(b"\0" + b"\x80" * (3 * width) for _ in range(height if rows is None else 1))
    return (b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", struct.pack(">IIBBBBB", width, height, 8, 2, 0,
                                                               0, 0))
            + chunk(b"IDAT", zlib.compress(raw)) + chunk(b"IEND", b""))


class Gen:
    def __init__(self, args):
        self.bin = os.path.abspath(args.bin)
        self.base = os.path.abspath(args.base)
        self.out = os.path.abspath(args.out)
        self.qwen = args.qwen_tokenizer
        self.tok = os.path.join(self.base, "tokenizer.json")

    def case_dir(self, name):
        d = os.path.join(self.out, name)
        os.makedirs(d, exist_ok=True)
        return d

    # --- the base runs ------------------------------------------------------------------------

    def toml(self, path, out, preset="tiny", steps=6, extra=""):
        write(path, "[model]\nmodel_name = \"fuzz\"\npreset = \"%s\"\ntokenizer = \"%s\"\n\n"
                    "[training]\nseed = 0\ntotal_steps = %d\nwarmup_steps = 1\n"
                    "scheduler_type = \"cosine\"\nlr_llm = 3e-3\nmicro_batch_rows = 1\n"
                    "param_dtype = \"f32\"\neval_steps = 0\n\n"
                    "[data]\ndata_path = \"%s\"\nseq_len = 64\npacking_buffer_size = 8\n"
                    "num_workers = 1\nmin_pixels = 9216\nmax_pixels = 9216\n\n"
                    "[checkpoint]\noutput_dir = \"%s\"\nsave_steps = 2\n\n"
                    "[logging]\nlog_every = 1\nprogress = false\n%s"
              % (preset, self.tok, steps, self.base, out, extra))
        return path

    def run(self, *cmd, rc=0):
        p = subprocess.run([self.bin] + [str(c) for c in cmd], capture_output=True, text=True,
                           env=dict(os.environ, OMP_NUM_THREADS="1"))
        if p.returncode != rc:
            sys.exit("gen_checkpoint_cases: %s exited %d, expected %d:\n%s%s"
                     % (" ".join(map(str, cmd)), p.returncode, rc, p.stdout[-2000:],
                        p.stderr[-2000:]))

    def bases(self):
        b = os.path.join(self.out, "_base")
        os.makedirs(b, exist_ok=True)
        # A tiny Qwen3 stopped by SIGUSR1 at step 4 of 6: step_000002, step_000004, latest.
        self.stopped = os.path.join(b, "stopped")
        self.run("train", "--config", self.toml(os.path.join(b, "stopped.toml"), self.stopped),
                 "--inject-fault", "signal:0:4", rc=75)
        # The same run to its end: + step_000006 and the HF snapshot checkpoint-step-6.
        self.done = os.path.join(b, "done")
        self.run("train", "--config", self.toml(os.path.join(b, "done.toml"), self.done))
        # A tiny Qwen3-VL, 2 steps: checkpoint-step-2 with preprocessor_config.json.
        self.vl = os.path.join(b, "vl")
        self.run("train", "--config", self.toml(os.path.join(b, "vl.toml"), self.vl, "tiny-vl", 2))
        with h5py.File(os.path.join(self.done, "step_000006", "state.h5"), "r") as f:
            self.params = sorted(f["model"].keys())
        self.param = next(p for p in self.params if p.endswith("mlp.up_proj.weight"))

    def copy_run(self, src, d, name="out"):
        dst = os.path.join(d, name)
        shutil.copytree(src, dst, symlinks=True)
        return dst

    def train(self, d, out, *sets, preset="tiny", steps=6, ranks=1):
        cmd = ["@BIN@", "train", "--config", self.toml(os.path.join(d, "train.toml"), out, preset,
                                                        steps)]
        for s in sets:
            cmd += ["--set", s]
        if ranks > 1:
            cmd = ["mpirun", "-np", str(ranks), "--oversubscribe"] + cmd
        return cmd

    # --- 1. damaged state.h5 ------------------------------------------------------------------

    def damaged_states(self):
        key = "model/" + self.param
        opt = "optim/" + self.param + "/exp_avg"

        def replace(f, k, data=None, **kw):
            del f[k]
            if data is None:
                f.create_dataset(k, **kw)
            else:
                f.create_dataset(k, data=data, **kw)

        def unwritten_string(f, k, size):
            # A scalar fixed-length string declared `size` bytes, never written (numpy's own
            # string types stop at 2^31 bytes: the low-level API).
            del f[k]
            t = h5py.h5t.C_S1.copy()
            t.set_size(size)
            h5py.h5d.create(f.id, k.encode(), t, h5py.h5s.create(h5py.h5s.SCALAR))

        def state_json(f):
            return json.loads(f["state"][()])

        def set_json(f, k, value, text=None):
            replace(f, k, np.bytes_(text if text is not None else json.dumps(value)))

        def edit_state(fn):
            def go(f):
                s = state_json(f)
                fn(s)
                set_json(f, "state", s)
            return go

        def edit_config(fn, name="config"):
            def go(f):
                c = json.loads(f[name][()])
                c = fn(c)
                set_json(f, name, c)
            return go

        def rows(f, delta):
            a = f[key][()]
            replace(f, key, np.concatenate([a, a[:1]]) if delta > 0 else a[:-1])

        def set_step(v):
            def fn(s):
                s["step"] = v
            return fn

        def set_key(k, v):
            def fn(s):
                s[k] = v
            return fn

        def version(value):
            def go(f):
                del f.attrs["vlmtrain_checkpoint_version"]
                if value is not None:
                    f.attrs["vlmtrain_checkpoint_version"] = value
            return go

        def first_opt(s):
            return next(iter(s["optimizer_steps"]))

        # (name, edit of the h5py file, names the error must hold, export expectation)
        variants = [
            ("extra_rows", lambda f: rows(f, +1), [key], "error"),
            ("fewer_rows", lambda f: rows(f, -1), [key], "error"),
            ("rows_2g_unwritten",
             lambda f: replace(f, key, shape=(2 ** 31, f[key].shape[1]), dtype="f4"), [key],
             "error"),
            ("same_shape_unwritten",
             lambda f: replace(f, key, shape=f[key].shape, dtype="f4"), [key], "error"),
            ("int32_weight", lambda f: replace(f, key, f[key][()].astype(np.int32)), [key],
             "error"),
            ("f64_weight", lambda f: replace(f, key, f[key][()].astype(np.float64)), [key], "ok"),
            ("chunked_weight", lambda f: replace(f, key, f[key][()], chunks=True), [key], "error"),
            ("nine_dims",
             lambda f: replace(f, key, f[key][()].reshape((1,) * 7 + f[key].shape)), [key],
             "error"),
            ("extra_tensor", lambda f: f.create_dataset("model/zzz.extra", data=np.zeros(3, "f4")),
             ["model/zzz.extra"], "error"),
            ("missing_tensor", lambda f: f.__delitem__(key), [key], "error"),
            ("missing_optim", lambda f: f.__delitem__(opt), [opt], "ok"),
            ("optim_f64", lambda f: replace(f, opt, f[opt][()].astype(np.float64)), [opt], "ok"),
            ("optim_extra_rows",
             lambda f: replace(f, opt, np.concatenate([f[opt][()], f[opt][()][:1]])), [opt], "ok"),
            ("step_1e15", edit_state(set_step(10 ** 15)), ["'step'"], "ok"),
            ("step_negative", edit_state(set_step(-1)), ["'step'"], "ok"),
            ("step_string", edit_state(set_step("6")), ["'step'"], "ok"),
            ("step_float", edit_state(set_step(6.5)), ["'step'"], "ok"),
            ("step_2p64", edit_state(set_step(2 ** 64 - 1)), ["'step'"], "ok"),
            ("no_schedule", edit_state(lambda s: s.pop("schedule")), ["'schedule'"], "ok"),
            ("schedule_other", edit_state(lambda s: s["schedule"].update(total_steps=7)),
             ["LR schedule"], "ok"),
            ("tokens_negative", edit_state(set_key("tokens", -5)), ["'tokens'"], "ok"),
            ("skipped_past_step", edit_state(set_key("skipped_steps", 7)), ["'skipped_steps'"],
             "ok"),
            ("rng_short", edit_state(set_key("rng", [1, 2, 3])), ["'rng'"], "ok"),
            ("rng_negative", edit_state(set_key("rng", [1, 2, 3, 4, -5])), ["'rng'"], "ok"),
            ("optim_steps_huge",
             edit_state(lambda s: s["optimizer_steps"].update({first_opt(s): 10 ** 12})),
             ["AdamW steps"], "ok"),
            ("optim_steps_list", edit_state(set_key("optimizer_steps", [1, 2])),
             ["'optimizer_steps'"], "ok"),
            ("loaders_string", edit_state(set_key("loaders", "x")), ["'loaders'"], "ok"),
            ("loaders_foreign", edit_state(set_key("loaders", [{"format": "x"}])), ["'loaders'"],
             "ok"),
            ("loaders_workers_garbage",
             edit_state(lambda s: s["loaders"][0].update(workers=[{"sampler": 5}])),
             ["'loaders'"], "ok"),
            ("loaders_rows_huge",
             edit_state(lambda s: s["loaders"][0].update(next_worker=10 ** 15)), ["'loaders'"],
             "ok"),
            # A sample id past the data in the packing buffer: the checkpoint and the key are
            # named, not only the dataset (issue 50); a negative id and a negative count.
            ("loaders_packer_past_data",
             edit_state(lambda s: s["loaders"][0]["workers"][0].update(packer_buffer=[10 ** 6])),
             ["step_000006: /state 'loaders'[0]"], "ok"),
            ("loaders_packer_negative",
             edit_state(lambda s: s["loaders"][0]["workers"][0].update(packer_buffer=[-1])),
             ["workers[0].packer_buffer[0] = -1 is out of range"], "ok"),
            ("loaders_rows_negative",
             edit_state(lambda s: s["loaders"][0]["workers"][0].update(rows=-3)),
             ["workers[0].rows = -3 is negative"], "ok"),
            ("state_list", lambda f: set_json(f, "state", [1, 2]), ["/state", "'state'"], "ok"),
            ("state_not_json", lambda f: set_json(f, "state", None, "{{{"), ["'state'"], "ok"),
            ("state_vlen", lambda f: replace(f, "state", json.dumps(state_json(f)),
                                             dtype=h5py.string_dtype()), ["'state'"], "ok"),
            ("state_3gb_unwritten", lambda f: unwritten_string(f, "state", 3 * 10 ** 9),
             ["'state'"], "ok"),
            ("state_500mb_unwritten", lambda f: unwritten_string(f, "state", 5 * 10 ** 8),
             ["'state'"], "ok"),
            ("state_array", lambda f: replace(f, "state", np.array([b"{}", b"{}"])), ["'state'"],
             "ok"),
            ("config_no_training", edit_config(lambda c: {"model": c["model"]}),
             ["training.param_dtype"], "ok"),
            ("config_not_object", edit_config(lambda c: "x"), ["training.param_dtype", "/config"],
             "ok"),
            ("config_dtype_int", edit_config(lambda c: {**c, "training": {"param_dtype": 5}}),
             ["training.param_dtype"], "ok"),
            ("hf_config_vocab", edit_config(lambda c: {**c, "vocab_size": c["vocab_size"] + 1},
                                            "hf_config"), ["vocab_size"], "error"),
            ("hf_config_string", edit_config(lambda c: "qwen3", "hf_config"), ["hf_config"],
             "error"),
            ("version_2", version(2), ["format version 2"], "error"),
            ("version_array", version(np.arange(10000, dtype=np.int32)),
             ["not a vlmtrain checkpoint"], "error"),
            ("version_missing", version(None), ["not a vlmtrain checkpoint"], "error"),
        ]
        two_rank = {"extra_rows", "rows_2g_unwritten", "same_shape_unwritten", "int32_weight",
                    "step_1e15", "no_schedule", "state_3gb_unwritten", "config_no_training",
                    "extra_tensor", "truncated_half"}
        for name, edit, names, export_expect in variants:
            d = self.case_dir("state_" + name)
            out = self.copy_run(self.done, d)
            with h5py.File(os.path.join(out, "step_000006", "state.h5"), "r+") as f:
                edit(f)
            self.state_case(name, d, out, names, export_expect, name in two_rank)
        # Damage to the file itself.
        for name, size in (("truncated_half", None), ("truncated_4k", 4096), ("empty", 0)):
            d = self.case_dir("state_" + name)
            out = self.copy_run(self.done, d)
            path = os.path.join(out, "step_000006", "state.h5")
            with open(path, "r+b") as f:
                f.truncate(os.path.getsize(path) // 2 if size is None else size)
            self.state_case(name, d, out, ["state.h5"], "error", name in two_rank)
        d = self.case_dir("state_is_a_folder")
        out = self.copy_run(self.done, d)
        os.remove(os.path.join(out, "step_000006", "state.h5"))
        os.makedirs(os.path.join(out, "step_000006", "state.h5"))
        self.state_case("is_a_folder", d, out, ["step_000006"], "error", False)

    def state_case(self, name, d, out, names, export_expect, two_rank):
        """Resume (1 rank, and 2 ranks for some), export and model_dir of a damaged checkpoint."""
        add("state_%s_resume" % name, "damaged state.h5: train",
            self.train(d, out, "checkpoint.resume=latest"), "error", names, preserve=[out])
        if two_rank:
            add("state_%s_resume_2ranks" % name, "damaged state.h5: 2 ranks",
                self.train(d, out, "checkpoint.resume=latest", "parallel.data_parallel=fsdp",
                           ranks=2), "error", names, preserve=[out], env=MPI_ENV)
        exp = os.path.join(d, "exported")
        expect = "error" if export_expect == "error" else "ok_or_error"
        add("state_%s_export" % name, "damaged state.h5: export",
            ["@BIN@", "export", "--checkpoint", out, "--out", exp], expect, names, preserve=[out])

    # --- 2. output_dir states -----------------------------------------------------------------

    def folder_states(self):
        g = "output_dir states: train"

        def case(name):
            return self.case_dir("folder_" + name)

        d = case("fresh_into_run")
        out = self.copy_run(self.stopped, d)
        add("folder_fresh_into_run", g, self.train(d, out), "error", ["checkpoint.output_dir"],
            preserve=[out])
        d = case("fresh_into_snapshot")
        out = os.path.join(d, "out")
        shutil.copytree(os.path.join(self.done, "checkpoint-step-6"),
                        os.path.join(out, "checkpoint-step-6"))
        add("folder_fresh_into_snapshot", g, self.train(d, out), "error",
            ["checkpoint.output_dir"], preserve=[out])
        d = case("fresh_into_metrics")
        out = os.path.join(d, "out")
        write(os.path.join(out, "metrics.jsonl"), '{"step": 1, "loss": 5.0}\n')
        add("folder_fresh_into_metrics", g, self.train(d, out), "error", ["logging.metrics_file"],
            preserve=[out])
        d = case("fresh_into_abandoned")
        out = os.path.join(d, "out")
        write(os.path.join(out, "abandoned", "after_step_000002", "note"), "kept")
        add("folder_fresh_into_abandoned", g, self.train(d, out), "error",
            ["checkpoint.output_dir"], preserve=[out])
        for resume in ("", "latest"):
            d = case("latest_is_a_folder_" + (resume or "fresh"))
            out = self.copy_run(self.stopped, d)
            os.remove(os.path.join(out, "latest"))
            write(os.path.join(out, "latest", "mine.txt"), "a folder of the user's")
            add("folder_latest_is_a_folder_" + (resume or "fresh"), g,
                self.train(d, out, "checkpoint.resume=" + resume), "error", ["latest"],
                preserve=[out])
        d = case("latest_is_a_file")
        out = self.copy_run(self.stopped, d)
        os.remove(os.path.join(out, "latest"))
        write(os.path.join(out, "latest"), "step_000004\n")
        add("folder_latest_is_a_file", g, self.train(d, out, "checkpoint.resume=latest"), "error",
            ["latest"], preserve=[out])
        d = case("latest_dangling")
        out = self.copy_run(self.stopped, d)
        os.remove(os.path.join(out, "latest"))
        os.symlink("step_000009", os.path.join(out, "latest"))
        add("folder_latest_dangling", g, self.train(d, out, "checkpoint.resume=latest"), "error",
            ["step_000009"], preserve=[out])
        d = case("latest_to_damaged")
        out = self.copy_run(self.stopped, d)
        os.remove(os.path.join(out, "step_000004", "state.h5"))
        add("folder_latest_to_damaged", g, self.train(d, out, "checkpoint.resume=latest"),
            "error", ["step_000004"], preserve=[out])
        d = case("latest_to_truncated")
        out = self.copy_run(self.stopped, d)
        with open(os.path.join(out, "step_000004", "state.h5"), "r+b") as f:
            f.truncate(10000)
        add("folder_latest_to_truncated", g, self.train(d, out, "checkpoint.resume=latest"),
            "error", ["step_000004/state.h5"], preserve=[out])
        d = case("all_damaged_no_link")
        out = self.copy_run(self.stopped, d)
        os.remove(os.path.join(out, "latest"))
        for s in ("step_000002", "step_000004"):
            os.remove(os.path.join(out, s, "state.h5"))
        add("folder_all_damaged_no_link", g, self.train(d, out, "checkpoint.resume=latest"),
            "error", ["step_000002"], preserve=[out])
        # latest names step 2 while step 4 exists (an abandoned branch): step 2, not the highest.
        d = case("latest_older_than_newest")
        out = self.copy_run(self.stopped, d)
        os.remove(os.path.join(out, "latest"))
        os.symlink("step_000002", os.path.join(out, "latest"))
        add("folder_latest_older_than_newest", g, self.train(d, out, "checkpoint.resume=latest"),
            "ok", want=["resume: from %s/step_000002 at step 2" % out],
            expect_files=[os.path.join(out, "abandoned", "after_step_000002", "step_000004",
                                       "state.h5"),
                          os.path.join(out, "abandoned", "after_step_000002", "metrics.jsonl"),
                          os.path.join(out, "step_000006", "state.h5")])
        d = case("no_link")
        out = self.copy_run(self.stopped, d)
        os.remove(os.path.join(out, "latest"))
        add("folder_no_link", g, self.train(d, out, "checkpoint.resume=latest"), "ok",
            want=["resume: from %s/step_000004 at step 4" % out])
        d = case("resume_older_path")
        out = self.copy_run(self.done, d)
        add("folder_resume_older_path", g,
            self.train(d, out, "checkpoint.resume=%s/step_000002" % out), "ok",
            want=["branch this run abandons"],
            expect_files=[os.path.join(out, "abandoned", "after_step_000002", "step_000006"),
                          os.path.join(out, "abandoned", "after_step_000002", "checkpoint-step-6",
                                       "model.safetensors"),
                          os.path.join(out, "checkpoint-step-6", "model.safetensors")])
        d = case("empty_resume_latest")
        add("folder_empty_resume_latest", g,
            self.train(d, os.path.join(d, "out"), "checkpoint.resume=latest"), "ok",
            want=["no checkpoint in"])
        d = case("done_resume")
        out = self.copy_run(self.done, d)
        add("folder_done_resume", g, self.train(d, out, "checkpoint.resume=latest"), "ok",
            want=["nothing left to train"], preserve=[out])
        d = case("resume_other_folder_into_run")
        out = self.copy_run(self.stopped, d)
        add("folder_resume_other_folder_into_run", g,
            self.train(d, out, "checkpoint.resume=%s/step_000004" % self.done), "error",
            ["checkpoint.output_dir"], preserve=[out, self.done])
        d = case("resume_other_folder_into_empty")
        add("folder_resume_other_folder_into_empty", g,
            self.train(d, os.path.join(d, "out"), "checkpoint.resume=%s/step_000004"
                       % self.stopped), "ok", want=["resume: from"], preserve=[self.stopped])
        d = case("resume_a_file")
        write(os.path.join(d, "afile"), "x")
        add("folder_resume_a_file", g,
            self.train(d, os.path.join(d, "out"), "checkpoint.resume=" + os.path.join(d, "afile")),
            "error", ["checkpoint.resume"])
        d = case("resume_damaged_path")
        out = self.copy_run(self.stopped, d)
        os.remove(os.path.join(out, "step_000002", "state.h5"))
        add("folder_resume_damaged_path", g,
            self.train(d, out, "checkpoint.resume=%s/step_000002" % out), "error",
            ["checkpoint.resume"], preserve=[out])
        d = case("resume_missing_path")
        add("folder_resume_missing_path", g,
            self.train(d, os.path.join(d, "out"), "checkpoint.resume=/vlm_fuzz_none/step_000002"),
            "error", ["checkpoint.resume"])
        d = case("output_dir_is_a_file")
        write(os.path.join(d, "out"), "a file of the user's")
        add("folder_output_dir_is_a_file", g, self.train(d, os.path.join(d, "out")), "error",
            ["checkpoint.output_dir"], preserve=[os.path.join(d, "out")])
        d = case("tmp_leftover")
        out = self.copy_run(self.stopped, d)
        write(os.path.join(out, "step_000006.tmp", "state.h5"), "half a save")
        add("folder_tmp_leftover", g, self.train(d, out, "checkpoint.resume=latest"), "ok",
            want=["resume: from"], expect_files=[os.path.join(out, "step_000006", "state.h5")])
        d = case("step_name_is_a_file")
        out = self.copy_run(self.stopped, d)
        write(os.path.join(out, "step_000010"), "a file of the user's")
        add("folder_step_name_is_a_file", g, self.train(d, out, "checkpoint.resume=latest"), "ok",
            want=["resume: from %s/step_000004" % out],
            preserve=[os.path.join(out, "step_000010")])

    # --- 3. export destinations and sources ---------------------------------------------------

    def exports(self):
        g = "export: destinations"
        src = self.done

        def export(d, out, checkpoint=None, *extra):
            return ["@BIN@", "export", "--checkpoint", checkpoint or os.path.join(d, "run"),
                    "--out", out] + list(extra)

        d = self.case_dir("export_into_checkpoint")
        run = self.copy_run(src, d, "run")
        add("export_into_checkpoint", g, export(d, os.path.join(run, "step_000006")), "error",
            ["--out"], preserve=[run])
        d = self.case_dir("export_into_output_dir")
        run = self.copy_run(src, d, "run")
        add("export_into_output_dir", g, export(d, run), "error", ["--out"], preserve=[run])
        d = self.case_dir("export_into_snapshot")
        run = self.copy_run(src, d, "run")
        add("export_into_snapshot", g,
            export(d, os.path.join(run, "checkpoint-step-6"),
                   os.path.join(run, "checkpoint-step-6")), "error", ["--out"], preserve=[run])
        d = self.case_dir("export_into_user_folder")
        run = self.copy_run(src, d, "run")
        write(os.path.join(d, "mine", "thesis.tex"), "\\documentclass{article}")
        add("export_into_user_folder", g, export(d, os.path.join(d, "mine")), "error", ["--out"],
            preserve=[run, os.path.join(d, "mine")])
        d = self.case_dir("export_onto_file")
        run = self.copy_run(src, d, "run")
        write(os.path.join(d, "afile"), "keep")
        add("export_onto_file", g, export(d, os.path.join(d, "afile")), "error", ["--out"],
            preserve=[run, os.path.join(d, "afile")])
        d = self.case_dir("export_under_file")
        run = self.copy_run(src, d, "run")
        write(os.path.join(d, "afile"), "keep")
        add("export_under_file", g, export(d, os.path.join(d, "afile", "sub")), "error",
            [os.path.join(d, "afile")], preserve=[run, os.path.join(d, "afile")])
        d = self.case_dir("export_new_folder")
        run = self.copy_run(src, d, "run")
        write(os.path.join(d, "new.tmp", "notes"), "a folder named like the old temporary")
        add("export_new_folder", g, export(d, os.path.join(d, "new")), "ok",
            expect_files=[os.path.join(d, "new", "model.safetensors"),
                          os.path.join(d, "new", "tokenizer.json")],
            preserve=[run, os.path.join(d, "new.tmp")])
        d = self.case_dir("export_empty_folder")
        run = self.copy_run(src, d, "run")
        os.makedirs(os.path.join(d, "empty"))
        add("export_empty_folder", g, export(d, os.path.join(d, "empty"), None, "--dtype", "f32"),
            "ok", expect_files=[os.path.join(d, "empty", "model.safetensors")], preserve=[run])
        d = self.case_dir("export_from_step")
        run = self.copy_run(src, d, "run")
        add("export_from_step", g,
            export(d, os.path.join(d, "x"), os.path.join(run, "step_000002")), "ok",
            expect_files=[os.path.join(d, "x", "config.json")], preserve=[run])
        d = self.case_dir("export_from_snapshot")
        run = self.copy_run(src, d, "run")
        add("export_from_snapshot", g,
            export(d, os.path.join(d, "x"), os.path.join(run, "checkpoint-step-6")), "ok",
            expect_files=[os.path.join(d, "x", "config.json")], preserve=[run])
        d = self.case_dir("export_from_dangling")
        run = self.copy_run(src, d, "run")
        os.remove(os.path.join(run, "latest"))
        os.symlink("step_000042", os.path.join(run, "latest"))
        add("export_from_dangling", g, export(d, os.path.join(d, "x")), "error", ["step_000042"],
            preserve=[run])
        d = self.case_dir("export_from_damaged_step")
        run = self.copy_run(src, d, "run")
        os.remove(os.path.join(run, "step_000002", "state.h5"))
        add("export_from_damaged_step", g,
            export(d, os.path.join(d, "x"), os.path.join(run, "step_000002")), "error",
            ["step_000002"], preserve=[run])
        d = self.case_dir("export_from_missing")
        add("export_from_missing", g, export(d, os.path.join(d, "x"), "/vlm_fuzz_none/run"),
            "error", ["/vlm_fuzz_none/run"])
        d = self.case_dir("export_dtype_i32")
        run = self.copy_run(src, d, "run")
        add("export_dtype_i32", g, export(d, os.path.join(d, "x"), None, "--dtype", "i32"),
            "error", ["--dtype"], preserve=[run])

    # --- 4. generate inputs and options -------------------------------------------------------

    def generates(self):
        g = "generate: inputs and options"
        text = os.path.join(self.done, "checkpoint-step-6")
        vl = os.path.join(self.vl, "checkpoint-step-2")
        d = self.case_dir("generate_files")
        image = os.path.join(d, "image.png")
        write(image, png(96, 96))
        write(os.path.join(d, "corrupt.png"), png(96, 96)[:60])
        write(os.path.join(d, "huge.png"), png(60000, 60000, rows=1)) # past PIL's pixel limit
        with open(os.path.join(d, "sparse.png"), "wb") as f:
            f.truncate(300 << 20) # 300 MB, no disk: refused by its size before it is read
        os.makedirs(os.path.join(d, "folder.png"), exist_ok=True)

        def gen(model, *extra, prompt="what is this?"):
            return ["@BIN@", "generate", "--model", model, "--prompt", prompt] + list(extra)

        cases = [
            ("ok_text", gen(text, "--max-new-tokens", "3"), "ok", []),
            ("ok_image", gen(vl, "--image", image, "--max-new-tokens", "3"), "ok", []),
            ("ok_step_folder", gen(os.path.join(self.done, "step_000006"), "--max-new-tokens",
                                   "3"), "ok", []),
            ("ok_output_dir", gen(self.done, "--max-new-tokens", "3"), "ok", []),
            ("max_new_tokens_1e18", gen(text, "--max-new-tokens", "1000000000000000000"), "error",
             ["--max-new-tokens"]),
            ("max_new_tokens_past_positions", gen(text, "--max-new-tokens", "5000"), "error",
             ["--max-new-tokens"]),
            ("vl_max_new_tokens_past_positions", gen(vl, "--image", image, "--max-new-tokens",
                                                     "5000"), "error", ["--max-new-tokens"]),
            ("max_new_tokens_0", gen(text, "--max-new-tokens", "0"), "error",
             ["--max-new-tokens"]),
            ("max_new_tokens_negative", gen(text, "--max-new-tokens", "-5"), "error",
             ["--max-new-tokens"]),
            ("max_new_tokens_word", gen(text, "--max-new-tokens", "many"), "error",
             ["--max-new-tokens"]),
            ("prompt_past_positions", gen(text, prompt="red " * 6000), "error", ["--prompt"]),
            ("prompt_invalid_utf8", gen(text, prompt=os.fsdecode(b"caf\xc3 \xff")), "error",
             ["--prompt"]),
            ("prompt_empty", gen(text, prompt=""), "error", ["prompt"]),
            ("min_pixels_huge", gen(vl, "--image", image, "--min-pixels", "1000000000000"),
             "error", ["--min-pixels"]),
            ("min_above_max", gen(vl, "--image", image, "--min-pixels", "100000", "--max-pixels",
                                  "50000"), "error", ["--min-pixels"]),
            ("min_above_config_max", gen(vl, "--image", image, "--min-pixels", "100000"), "error",
             ["--min-pixels"]),
            ("image_dev_zero", gen(vl, "--image", "/dev/zero"), "error", ["--image"]),
            ("image_folder", gen(vl, "--image", os.path.join(d, "folder.png")), "error",
             ["--image"]),
            ("image_300mb", gen(vl, "--image", os.path.join(d, "sparse.png")), "error",
             ["--image"]),
            ("image_missing", gen(vl, "--image", os.path.join(d, "none.png")), "error",
             ["--image"]),
            ("image_corrupt", gen(vl, "--image", os.path.join(d, "corrupt.png")), "error",
             ["--image"]),
            ("image_huge_header", gen(vl, "--image", os.path.join(d, "huge.png")), "error",
             ["--image"]),
            ("image_on_text_model", gen(text, "--image", image), "error", ["--image"]),
            ("model_missing", gen("/vlm_fuzz_none/model"), "error", ["/vlm_fuzz_none/model"]),
            ("model_a_file", gen(image), "error", [image]),
            ("device_cuda_99", gen(text, "--device", "cuda:99"), "error", ["--device"]),
            ("dtype_i32", gen(text, "--dtype", "i32"), "error", ["--dtype"]),
        ]
        if self.qwen:
            cases.append(("tokenizer_past_vocab", gen(text, "--tokenizer", self.qwen), "error",
                          ["--tokenizer", self.qwen]))
        for name, cmd, expect, names in cases:
            add("generate_" + name, g, cmd, expect, names, preserve=[self.done, self.vl])
        d = self.case_dir("generate_damaged_step")
        run = self.copy_run(self.done, d, "run")
        with open(os.path.join(run, "step_000006", "state.h5"), "r+b") as f:
            f.truncate(20000)
        add("generate_damaged_step", g, gen(run), "error", ["state.h5"], preserve=[run])

    # --- 5. multi-rank layouts and fault flags ------------------------------------------------

    def layouts(self):
        g = "multi-rank layouts, faults"
        n = [0]

        def case(sets, ranks, expect, names, fault=None, **kw):
            n[0] += 1
            d = self.case_dir("layout_%02d" % n[0])
            cmd = self.train(d, os.path.join(d, "out"), *sets, ranks=ranks)
            if fault is not None:
                cmd += ["--inject-fault", fault]
            add("layout_%02d_%s" % (n[0], "_".join(s.split("=")[0].split(".")[-1] for s in sets)
                                    + ("_fault" if fault is not None else "")), g, cmd, expect,
                names,
                env=MPI_ENV if ranks > 1 else None, **kw)

        fsdp = "parallel.data_parallel=fsdp"
        case([fsdp, "parallel.dp_replicate=4294967296", "parallel.dp_shard=4294967296"], 2,
             "error", ["parallel.dp_replicate"])
        case([fsdp, "parallel.dp_shard=3"], 2, "error", ["parallel.dp_shard"])
        case([fsdp, "parallel.dp_replicate=2", "parallel.dp_shard=2"], 2, "error",
             ["dp_replicate"])
        case([fsdp, "parallel.dp_replicate=3"], 2, "error", ["parallel.dp_replicate"])
        case(["parallel.dp_shard=2"], 2, "error", ["parallel.dp_shard"])
        case(["parallel.tp_size=3"], 2, "error", ["parallel.tp_size"])
        case([fsdp, "parallel.tp_size=2", "parallel.dp_shard=2"], 2, "error",
             ["parallel.dp_shard"])
        case(["parallel.tp_size=2"], 2, "ok", [], want=["dp_shard 1 x tp 2"])
        case(["parallel.tp_size=4294967296"], 2, "error", ["parallel.tp_size"])
        case([fsdp, "parallel.collective_timeout_s=-1"], 2, "error",
             ["parallel.collective_timeout_s"])
        case([fsdp], 2, "ok", [], want=["dp_replicate 1 x dp_shard 2 x tp 1"])
        case([fsdp, "parallel.dp_replicate=2"], 2, "ok", [], want=["dp_replicate 2 x dp_shard 1"])
        case([fsdp], 2, "error", ["--inject-fault"], fault="error:5:1")
        case([fsdp], 2, "error", ["--inject-fault"], fault="error:0:99")
        case([fsdp], 2, "error", ["--inject-fault"], fault="crash:0:1:save-writing")
        case([fsdp], 2, "error", ["--inject-fault"], fault="bogus:0:1")
        case([fsdp], 2, "error", ["--inject-fault"], fault="error:-1:1")
        case([fsdp], 2, "error", ["--inject-fault"], fault="error:99999999999999999999:1")
        case([fsdp], 2, "error", ["--inject-fault"], fault="error:0:1:nowhere")
        case([fsdp], 2, "error", ["injected error on rank 1"], fault="error:1:2")
        case([fsdp, "parallel.collective_timeout_s=2"], 2, "error", ["did not finish within"],
             fault="hang:1:2")
        case([fsdp], 2, "rc", [], fault="signal:0:3", rc=75)
        case([], 1, "error", ["--inject-fault"], fault="error:1:1")
        case([], 1, "error", ["--inject-fault"], fault="error:0:0")
        # Given but empty (a variable that was not set): refused, not read as "no fault".
        case([], 1, "error", ['--inject-fault "": empty; expected KIND:RANK:STEP'], fault="")
        case([], 1, "error", ['--inject-fault "  ": empty'], fault="  ")
        # A fault at a step the resumed run never trains.
        d = self.case_dir("layout_fault_before_resume")
        out = self.copy_run(self.stopped, d)
        add("layout_fault_before_resume", g,
            self.train(d, out, "checkpoint.resume=latest") + ["--inject-fault", "error:0:2"],
            "error", ["--inject-fault"], preserve=[out])
        # A 1-rank checkpoint resumed on 2 ranks (the data starts over, with a warning).
        d = self.case_dir("layout_resume_on_2_ranks")
        out = self.copy_run(self.stopped, d)
        add("layout_resume_on_2_ranks", g,
            self.train(d, out, "checkpoint.resume=latest", fsdp, ranks=2), "ok",
            want=["resume: from", "the data starts over"], env=MPI_ENV,
            expect_files=[os.path.join(out, "step_000006", "state.h5")])


    # --- 6. numbers of the data tools' options -----------------------------------------------

    def data_options(self):
        g = "data tool options"
        d = self.case_dir("data_options")
        demo = ["@BIN@", "data", "make-demo", os.path.join(d, "demo")]
        add("data_make_demo_train_1e15", g, demo + ["--train", "1000000000000000"], "error",
            ["--train"])
        add("data_make_demo_val_negative", g, demo + ["--val", "-1"], "error", ["--val"])
        add("data_make_demo_seed_2p64", g, demo + ["--seed", "18446744073709551616"], "error",
            ["--seed"])
        pack = ["@BIN@", "data", "pack", self.base, "--tokenizer", self.tok, "--seq-len", "64",
                "--out", os.path.join(d, "plan.bin")]
        add("data_pack_threads_huge", g, pack + ["--threads", "1000000"], "error", ["--threads"])
        add("data_pack_seq_len_2p63", g, pack + ["--seq-len", "9223372036854775808"], "error",
            ["--seq-len"])


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--bin", required=True)
    p.add_argument("--base", required=True)
    p.add_argument("--out", required=True)
    p.add_argument("--qwen-tokenizer", default="")
    args = p.parse_args()
    g = Gen(args)
    os.makedirs(g.out, exist_ok=True)
    g.bases()
    for family in (g.damaged_states, g.folder_states, g.exports, g.generates, g.layouts,
                   g.data_options):
        family()
    with open(os.path.join(g.out, "checkpoint_cases.json"), "w") as f:
        json.dump(CASES, f, indent=1)
    groups = {}
    for c in CASES:
        groups[c["group"]] = groups.get(c["group"], 0) + 1
    print("gen_checkpoint_cases: %d cases in %s (%s)" % (
        len(CASES), g.out, ", ".join("%s %d" % kv for kv in sorted(groups.items()))))


if __name__ == "__main__":
    main()
