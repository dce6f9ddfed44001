#!/usr/bin/env bash
# The demo as a test: the loss falls, the same seed gives bit-identical losses, and activation
# checkpointing changes nothing numerically.   tools/test_demo.sh <path to vlmtrain>
# Runs share one thread count: OpenBLAS's summation order depends on it (our own kernels do not).
set -euo pipefail
bin="$1"
dir="$(mktemp -d)"
trap 'rm -rf "$dir"' EXIT
run() { "$bin" train --steps 300 --log-every 25 --seed 3 "$@"; }
run --metrics "$dir/a.jsonl" --require-loss-drop 0.5 >/dev/null
run --metrics "$dir/b.jsonl" >/dev/null
run --metrics "$dir/c.jsonl" --ac >/dev/null
losses() { grep -o '"loss": [^,]*' "$1"; }
[[ $(losses "$dir/a.jsonl" | wc -l) -eq 12 ]] || { echo "expected 12 logged steps"; exit 1; }
if ! diff <(losses "$dir/a.jsonl") <(losses "$dir/b.jsonl"); then
  echo "FAIL: the same seed gave different losses"
  exit 1
fi
if ! diff <(losses "$dir/a.jsonl") <(losses "$dir/c.jsonl"); then
  echo "FAIL: activation checkpointing changed the losses"
  exit 1
fi
echo "demo: loss falls, reruns are bit-identical, checkpointing changes nothing"
