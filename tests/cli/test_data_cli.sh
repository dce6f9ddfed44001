#!/usr/bin/env bash
# The dataset commands end to end: `data make-demo` writes a dataset that `data inspect` reads,
# `data pack` writes a packing plan covering every sample, and bad arguments fail with a message.
#   tests/cli/test_data_cli.sh <path to vlmtrain> <tokenizer dir>
set -euo pipefail
bin="$1"
tok="$2"
dir="$(mktemp -d)"
trap 'rm -rf "$dir"' EXIT
fail() { echo "FAIL: $*"; exit 1; }

"$bin" data make-demo "$dir/demo" --train 300 --val 40 >/dev/null
out=$("$bin" data inspect "$dir/demo" --tokenizer "$tok")
grep -q "split train: 300 samples" <<<"$out" || fail "inspect: no train count in: $out"
grep -q "split val: 40 samples" <<<"$out" || fail "inspect: no val count in: $out"
grep -q "tokens per sample: mean" <<<"$out" || fail "inspect: no token statistics in: $out"

out=$("$bin" data pack "$dir/demo" --tokenizer "$tok" --seq-len 1024 --out "$dir/plan.bin")
grep -q "300 samples packed, 0 skipped" <<<"$out" || fail "pack: not every sample packed: $out"
[[ -s $dir/plan.bin ]] || fail "pack: no plan file"
[[ ! -e $dir/plan.bin.tmp ]] || fail "pack: temporary file left behind"

if err=$("$bin" data pack "$dir/demo" --tokenizer "$tok" --out "$dir/x.bin" 2>&1); then
  fail "pack without --seq-len succeeded"
fi
grep -q -- "--seq-len" <<<"$err" || fail "pack: the error does not name --seq-len: $err"
if err=$("$bin" data pack "$dir/missing" --tokenizer "$tok" --seq-len 64 --out "$dir/x.bin" 2>&1); then
  fail "pack of a missing dataset succeeded"
fi
grep -q "missing" <<<"$err" || fail "pack: the error does not name the dataset: $err"

# Bad samples are counted skips in inspect and pack, never an abort: well-formed JSON of the wrong
# type and a txt part that is not UTF-8, patched in place (same length: tar and index stay valid).
python3 - "$dir/demo" <<'EOF'
import glob, sys, tarfile
path = sorted(glob.glob(sys.argv[1] + "/**/*.tar", recursive=True))[0]
with tarfile.open(path) as t:
    members = t.getmembers()
js = next(m for m in members if m.name.endswith(".json"))
txt = next(m for m in members if m.name.endswith(".txt"))
bad_json = b'{"messages":[{"role":"user","content":[{"type":5}]},{"role":"assistant","content":"a"}]}'
assert len(bad_json) <= js.size, (len(bad_json), js.size)
with open(path, "r+b") as f:
    f.seek(js.offset_data)
    f.write(bad_json.ljust(js.size))
    f.seek(txt.offset_data)
    f.write(b"\xff")
EOF
out=$("$bin" data inspect "$dir/demo" --tokenizer "$tok") || fail "inspect aborted on bad samples"
grep -q "chat:invalid_json: 1" <<<"$out" || fail "inspect: the JSON type error is not a skip: $out"
grep -q "chat:invalid_utf8: 1" <<<"$out" || fail "inspect: invalid UTF-8 is not a skip: $out"
grep -q "\[chat:invalid_json\] .* key '" <<<"$out" || fail "inspect: the sample is not named: $out"
out=$("$bin" data pack "$dir/demo" --tokenizer "$dir/demo" --seq-len 1024 --out "$dir/plan3.bin") ||
  fail "pack aborted on bad samples (with make-demo's own tokenizer)"
grep -q "298 samples packed, 2 skipped" <<<"$out" || fail "pack: the bad samples are not skips: $out"
echo "data commands: make-demo, inspect and pack work; bad arguments are clear errors"
