#!/usr/bin/env bash
# The data pipeline's benchmarks in one run (issue 3): tokenizer MB/s against HF `tokenizers`
# (bench_tokenizer.sh, single thread) and the loader's samples/s and tokens/s on image +
# conversation samples with 1 and 2 reader threads against one GPU's consumption
# (bench_loader; Qwen3-VL-8B at seq 8192).
# Usage: bench/bench_data.sh [build_dir]   (default: build)
#   VLM_TOKENIZER   tokenizer.json or its directory (default: build/test_data/qwen3-tokenizer,
#                   unpacked from tests/data/qwen3-tokenizer by CMake)
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
build=${1:-$root/build}
tok=${VLM_TOKENIZER:-$root/build/test_data/qwen3-tokenizer}
[[ -x $build/bench/bench_loader ]] || { echo "bench_data: $build/bench/bench_loader not built" >&2; exit 1; }

echo "== tokenizer (single thread) =="
VLM_TOKENIZER=$tok bash "$root/bench/bench_tokenizer.sh" "$build"
echo
echo "== loader (image + conversation samples, seq_len 8192) =="
"$build/bench/bench_loader" --tokenizer "$tok" --samples "${SAMPLES:-600}"
