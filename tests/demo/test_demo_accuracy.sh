#!/usr/bin/env bash
# The main job in full, as a test: `vlmtrain train` with no --config (configs/demo.toml) trains the
# tiny Qwen3-VL on a fresh demo dataset and must name the colour and shape of at least 80% of
# the held-out images (chance is at most 9.4%: the issue's bar). About 105 s on 2 cores.
#   tests/demo/test_demo_accuracy.sh <path to vlmtrain>
set -euo pipefail
bin="$(cd "$(dirname "$1")" && pwd)/$(basename "$1")"
dir="$(mktemp -d)"
trap 'rm -rf "$dir"' EXIT
cd "$dir"
"$bin" train --require-caption-accuracy 0.8 >log.txt 2>&1 ||
  { cat log.txt; echo "FAIL: the main job did not reach 80% caption accuracy"; exit 1; }
grep "caption accuracy on\|train done" log.txt
