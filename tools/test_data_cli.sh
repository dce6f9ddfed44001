#!/usr/bin/env bash
# The dataset commands end to end: `data make-demo` writes a dataset that `data inspect` reads,
# `data pack` writes a packing plan covering every sample, and bad arguments fail with a message.
#   tools/test_data_cli.sh <path to vlmtrain> <tokenizer dir>
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
echo "data commands: make-demo, inspect and pack work; bad arguments are clear errors"
