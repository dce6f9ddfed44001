#!/usr/bin/env python3
"""Runs the cases of tests/cli/fuzz/gen_cases.py and gen_checkpoint_cases.py and classifies each
outcome (standard library only).

    run_cases.py --bin VLMTRAIN --cases CASES.json [--cases MORE.json ...] [--jobs N]
                 [--timeout S] [--mem-mb M] [--asan]

Each case runs as `ulimit -v M*1024; timeout S VLMTRAIN ...` (under --asan, where ulimit -v breaks
the sanitizer's shadow memory, ASAN_OPTIONS caps single allocations and RSS instead). A case fails
when it ends by a signal, a timeout, a sanitizer report, an uncaught-exception text (bad_alloc, a
bare nlohmann exception, std::terminate), or against its expectation (see gen_cases.py). Optional
fields of a case: `preserve` (paths whose every file must be unchanged afterwards: nothing lost,
whatever the outcome), `expect_files` (paths that must exist after exit 0), `want` (texts the
output must hold after exit 0), `env` (extra environment) and, with expect "rc", `rc` (the exit
code the case must end with). Prints one line per failing case,
then "N cases, M failed" by group; exits 1 when any failed.
"""
import hashlib
import argparse
import json
import os
import re
import shlex
import subprocess
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor

# Text that means the program did not handle the input, whatever the exit code.
BAD_TEXT = [
    (re.compile(r"bad_alloc|bad_array_new_length"), "allocation failure (bad_alloc)"),
    (re.compile(r"terminate called|std::terminate"), "std::terminate"),
    (re.compile(r"(^|\n)(\[[^\]\n]*\] )?error: \[json\.exception"), "bare nlohmann exception"),
    (re.compile(r"(^|\n)(\[[^\]\n]*\] )?error: (basic_string|vector|map::at|stoi|stol|stoll|stod)"),
     "bare std library exception"),
    (re.compile(r"AddressSanitizer|LeakSanitizer|runtime error:|UndefinedBehaviorSanitizer"),
     "sanitizer report"),
]
# A reported skipped sample: `data inspect` ("skipped: invalid_json 1"), `data pack` ("skipped
# samples:"), or a train summary that counts skipped samples by reason ("chat:invalid_json").
SKIP_RE = re.compile(r"(?i)(skipped: |skipped samples|samples? skipped|skipped [1-9]\d* samples?"
                     r"|\b(read|chat|image|tokenize|pack):[a-z_]+ [1-9])")
# The source location vlm::Error appends ("[/src/io/x.cpp:12, check failed: ...]"): not a name.
SOURCE_LOC = re.compile(r" \[[^\s\]]+\.(?:cpp|h|cu|cuh):\d+(?:, check failed: [^\n]*)?\]")


def final_error(stderr):
    """The last error message (from the last line starting "error:" on), without source lines."""
    at = max(stderr.rfind("\nerror: "), stderr.rfind("] error: "))
    if at < 0 and stderr.startswith("error: "):
        at = 0
    msg = stderr[at:] if at >= 0 else ""
    return SOURCE_LOC.sub("", msg)


def digest(path):
    """{relative path: sha256} of every file under `path` (or of `path` itself); links by target."""
    out = {}
    if os.path.islink(path) or os.path.isfile(path):
        items = [("", path)]
    else:
        items = []
        for d, dirs, files in os.walk(path):
            for name in dirs + files:
                full = os.path.join(d, name)
                if os.path.islink(full) or os.path.isfile(full):
                    items.append((os.path.relpath(full, path), full))
    for rel, full in items:
        if os.path.islink(full):
            out[rel] = "link:" + os.readlink(full)
        else:
            with open(full, "rb") as f:
                out[rel] = hashlib.sha256(f.read()).hexdigest()
    return out


def lost(before, after):
    """What of `before` ({path: digest}) is gone or changed in `after`."""
    for path, files in before.items():
        now = after.get(path, {})
        for rel, h in files.items():
            if now.get(rel) != h:
                where = os.path.join(path, rel) if rel else path
                return "%s %s" % (where, "was changed" if rel in now else "was lost")
    return ""


def classify(case, rc, out, err, rss_mb, mem_mb):
    """'' when the outcome is right, else why not."""
    if rc == 124:
        return "timeout (hang)"
    if rc < 0 or rc >= 128:
        sig = -rc if rc < 0 else rc - 128
        return "killed by signal %d" % sig
    for pattern, why in BAD_TEXT:
        if pattern.search(err):
            return why
    if rss_mb > mem_mb:
        return "max RSS %d MB over the cap" % rss_mb
    expect, names = case["expect"], case["names"]
    if expect == "rc": # a documented exit code of its own (75: stopped by a signal, saved)
        return "" if rc == case["rc"] else "exit %d, expected %d" % (rc, case["rc"])
    skipped = bool(SKIP_RE.search(out + err))
    msg = final_error(err)
    named = any(n in msg for n in names)
    if rc == 0:
        if expect == "error":
            return "exit 0, expected an error naming %s" % " or ".join(names)
        if expect == "skip" and not skipped:
            return "exit 0 but no skipped sample reported"
        if expect == "skip_or_error" and not skipped:
            return "exit 0 but no skipped sample reported (or error naming %s)" % " or ".join(names)
        for path in case.get("expect_files", []):
            if not os.path.lexists(path):
                return "exit 0 but %s is not there" % path
        for text in case.get("want", []):
            if text not in out + err:
                return "exit 0 but the output does not say %r" % text
        return ""
    if expect in ("ok", "skip"):
        return "exit %d, expected exit 0%s" % (rc, " with a skip report" if expect == "skip" else "")
    if not msg:
        return "exit %d without an error message" % rc
    if not named:
        return "error does not name %s" % " or ".join(names)
    return ""


def run_case(case, args):
    cmd = [args.bin if c == "@BIN@" else c for c in case["cmd"]]
    env = dict(os.environ, OMP_NUM_THREADS="1", **case.get("env", {}))
    # Its own Open MPI session folder: two mpiruns of one user at once race on the shared one
    # (tests/CMakeLists.txt says how).
    env["OMPI_MCA_orte_tmpdir_base"] = os.path.join(args.logs, "mpi", case["name"])
    before = {p: digest(p) for p in case.get("preserve", [])}
    if args.asan:
        # ulimit -v and ASan's shadow memory do not mix: cap allocations and RSS in ASan itself.
        env["ASAN_OPTIONS"] = ("detect_leaks=0:abort_on_error=1:allocator_may_return_null=0:"
                               "max_allocation_size_mb=%d:hard_rss_limit_mb=%d"
                               % (args.mem_mb, args.mem_mb))
        prefix = "exec timeout -k 5 %d" % args.timeout
    else:
        prefix = "ulimit -v %d; exec timeout -k 5 %d" % (args.mem_mb * 1024, args.timeout)
    line = "%s %s" % (prefix, " ".join(shlex.quote(c) for c in cmd))
    if case["stdin"]:
        line += " < " + shlex.quote(case["stdin"])
    start = time.time()
    out_path = os.path.join(args.logs, case["name"] + ".out")
    err_path = os.path.join(args.logs, case["name"] + ".err")
    with open(out_path, "wb") as fo, open(err_path, "wb") as fe:
        p = subprocess.Popen(["bash", "-c", line], stdin=subprocess.DEVNULL, stdout=fo,
                             stderr=fe, env=env)
        # wait4 instead of wait: the case's own peak RSS comes with its exit status.
        _, status, usage = os.wait4(p.pid, 0)
        p.returncode = os.waitstatus_to_exitcode(status)
    rss_mb = usage.ru_maxrss // 1024
    with open(out_path, "rb") as f:
        out = f.read().decode("utf-8", "replace")
    with open(err_path, "rb") as f:
        err = f.read().decode("utf-8", "replace")
    why = classify(case, p.returncode, out, err, rss_mb, args.mem_mb)
    if not why and before:
        why = lost(before, {path: digest(path) for path in before})
    return {"name": case["name"], "group": case["group"], "line": line, "rc": p.returncode,
            "why": why, "out": out, "err": err, "secs": time.time() - start}


def tail(text, n):
    lines = [l for l in text.strip().splitlines() if l.strip()]
    return lines[-n:]


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--bin", required=True)
    p.add_argument("--cases", required=True, action="append")
    p.add_argument("--jobs", type=int, default=2)
    p.add_argument("--timeout", type=int, default=60)
    p.add_argument("--mem-mb", type=int, default=2048)
    p.add_argument("--asan", action="store_true")
    p.add_argument("--only", default="", help="run only cases whose name contains this")
    p.add_argument("--report", default="", help="write every outcome as JSON here")
    args = p.parse_args()
    args.logs = os.path.join(os.path.dirname(os.path.abspath(args.cases[0])), "logs")
    os.makedirs(args.logs, exist_ok=True)
    cases = []
    for path in args.cases:
        with open(path) as f:
            cases += [c for c in json.load(f) if args.only in c["name"]]
    assert len({c["name"] for c in cases}) == len(cases), "case names repeat across files"
    # Train runs first: they are the slowest, and a hanging one then overlaps the rest.
    cases.sort(key=lambda c: c["cmd"][1] != "train")
    start = time.time()
    lock = threading.Lock()
    results = []

    def one(case):
        r = run_case(case, args)
        with lock:
            results.append(r)
            if r["why"]:
                print("FAIL %s: %s\n  command: %s\n  rc %d; last output:" %
                      (r["name"], r["why"], r["line"], r["rc"]))
                for l in tail(r["err"], 4) or tail(r["out"], 4):
                    print("    " + l[:300])
                sys.stdout.flush()
        return r

    with ThreadPoolExecutor(max_workers=args.jobs) as pool:
        list(pool.map(one, cases))
    failed = [r for r in results if r["why"]]
    if args.report:
        with open(args.report, "w") as f:
            json.dump(sorted(results, key=lambda r: r["name"]), f, indent=1)
    groups = {}
    for r in results:
        n, f = groups.get(r["group"], (0, 0))
        groups[r["group"]] = (n + 1, f + bool(r["why"]))
    for g, (n, f) in sorted(groups.items()):
        print("  %-28s %4d cases, %d failed" % (g, n, f))
    print("%d cases, %d failed (%.0f s)" % (len(results), len(failed), time.time() - start))
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
