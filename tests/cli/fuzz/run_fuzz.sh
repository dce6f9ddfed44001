#!/usr/bin/env bash
# The command-level fuzz suite (issues 11 and 31, ctest label `fuzz`): broken inputs of every class
# -- Energon metadata, tar shards and indexes, sample JSON/text/images, safetensors, config.json,
# tokenizer.json, TOML configs and --set values; damaged state.h5 files, output_dir states,
# export destinations, generate inputs, multi-rank layouts and fault flags -- run through the
# real commands, each under
# `ulimit -v` (2 GB) and `timeout 60`, and checked against what a good trainer does (exit 0 with
# a reported skip for sample-level damage, else a non-zero exit whose message names the file, key
# or sample; never a signal, a hang, a bad_alloc or a bare library exception).
#   tests/cli/fuzz/run_fuzz.sh [--asan] <vlmtrain> [qwen tokenizer dir] [-- run_cases.py options]
# --asan (a sanitizer build, where `ulimit -v` breaks ASan): ASAN_OPTIONS caps single allocations
# and RSS at 2 GB instead. Without the Qwen tokenizer the `data pack` cases are left out.
# VLM_FUZZ_KEEP=1 keeps the work folder (cases, logs/, report.json) for a look afterwards.
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
root="$(cd "$here/../../.." && pwd)"
asan=()
if [[ "${1:-}" == "--asan" ]]; then
  asan=(--asan)
  shift
fi
bin="$(realpath "${1:?usage: run_fuzz.sh [--asan] <vlmtrain> [qwen tokenizer dir]}")"
shift
qwen=""
if [[ $# -gt 0 && "$1" != "--" ]]; then
  [[ -e $1/tokenizer.json || -f $1 ]] || { echo "run_fuzz: no tokenizer at $1" >&2; exit 1; }
  qwen="$(realpath "$1")"
  shift
fi
[[ "${1:-}" == "--" ]] && shift
[[ -n $qwen ]] || echo "run_fuzz: no Qwen tokenizer given: leaving out the data pack cases"

work="$(mktemp -d "${TMPDIR:-/tmp}/vlm_fuzz.XXXXXX")"
if [[ "${VLM_FUZZ_KEEP:-0}" == 1 ]]; then
  echo "run_fuzz: work folder $work (kept)"
else
  trap 'rm -rf "$work"' EXIT
fi

# The valid base: a make-demo dataset with a few samples and its tokenizer.json.
"$bin" data make-demo "$work/base" --train 6 --val 3 --seed 1 >/dev/null
python3 "$here/gen_cases.py" --base "$work/base" --repo "$root" --out "$work/cases" \
  --qwen-tokenizer "$qwen" --seed 1234
if ((${#asan[@]})); then
  echo "run_fuzz: sanitizer build: no ulimit -v; ASan caps allocations and RSS at 2048 MB"
fi
# Checkpoints, resume, export, generate and multi-rank cases (issue 31): base runs trained here,
# damaged state.h5 files made with Debian's h5py (python3-h5py, tools/deps/install_deps.sh).
/usr/bin/python3 -c "import h5py" ||
  { echo "run_fuzz: Debian's python3-h5py is missing (tools/deps/install_deps.sh installs it)" >&2; exit 1; }
/usr/bin/python3 "$here/gen_checkpoint_cases.py" --bin "$bin" --base "$work/base" \
  --out "$work/cases" --qwen-tokenizer "$qwen"
python3 "$here/run_cases.py" --bin "$bin" --cases "$work/cases/cases.json" \
  --cases "$work/cases/checkpoint_cases.json" --jobs 2 --timeout 60 --mem-mb 2048 \
  --report "$work/report.json" "${asan[@]}" "$@"
