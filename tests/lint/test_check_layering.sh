#!/usr/bin/env bash
# Tests tools/lint/check_layering.sh on small fixture trees in a temp dir: a clean tree must pass,
# and each bad tree must fail naming the offending file:line. Exit 0 when the checker behaves.
set -uo pipefail

checker="$(cd "$(dirname "$0")/../.." && pwd)/tools/lint/check_layering.sh"
tmp=$(mktemp -d "${TMPDIR:-/tmp}/vlm_layering_test.XXXXXX")
trap 'rm -rf "$tmp"' EXIT
failures=0

# make_file <fixture> <path> <include...>: a source file with one quoted include per argument.
make_file() {
  local dir=$1 path=$2 inc
  shift 2
  mkdir -p "$dir/$(dirname "$path")"
  : >"$dir/$path"
  for inc in "$@"; do echo "#include \"$inc\"" >>"$dir/$path"; done
  echo "int x;" >>"$dir/$path"
}

# A tree that follows every rule.
make_clean() {
  local d=$1
  make_file "$d" src/base/check.h
  make_file "$d" src/base/check.cpp src/base/check.h
  make_file "$d" kernels/gemm.h src/base/check.h
  make_file "$d" kernels/cpu/gemm.cpp kernels/gemm.h src/base/dtype.h
  make_file "$d" src/core/tensor.h src/base/check.h kernels/gemm.h
  make_file "$d" src/nn/module.h src/core/tensor.h
  make_file "$d" src/optim/adamw.h src/nn/module.h src/core/tensor.h
  make_file "$d" parallel/fsdp/fsdp.h src/optim/adamw.h parallel/comm/mesh.h
  make_file "$d" io/state/safetensors.h src/core/tensor.h
  make_file "$d" io/state/safetensors.cpp io/state/safetensors.h src/core/tensor.h
  make_file "$d" model/causal_lm.h src/nn/module.h
  make_file "$d" model/registry.cpp model/causal_lm.h model/qwen3/spec.h model/qwen3_vl/spec.h
  make_file "$d" model/qwen3/model.cpp io/state/safetensors.h parallel/fsdp/fsdp.h model/causal_lm.h \
    model/qwen3/model.h
  make_file "$d" model/qwen3_vl/model.cpp model/vision/tower.h model/causal_lm.h
  make_file "$d" io/energon/tar.h src/core/tensor.h
  make_file "$d" io/text/chat_format.h io/energon/raw_sample.h src/core/tensor.h
  make_file "$d" io/image/decode.h src/base/check.h
  make_file "$d" io/loader/loader.h io/text/chat_format.h io/image/decode.h io/state/safetensors.h
  make_file "$d" model/generate.h model/causal_lm.h io/loader/position_ids.h
  make_file "$d" src/demo/caption_eval.cpp model/generate.h io/image/decode.h
  make_file "$d" src/train/trainer.cpp model/model_spec.h io/loader/loader.h src/demo/caption_eval.h
  make_file "$d" src/cli/cmd_train.cpp src/train/trainer.h src/demo/demo_dataset.h
  make_file "$d" src/main.cpp src/cli/cli.h
  make_file "$d" bench/bench_gemm.cpp kernels/gemm.h src/train/trainer.h
  make_file "$d" tests/core/test_tensor.cpp tests/skip.h src/core/tensor.h model/qwen3/model.h
  # Angle includes and unknown quoted headers (third-party) are not the checker's business.
  printf '#include <vector>\n#include "nlohmann/json.hpp"\n' >"$d/src/base/extra.cpp"
  # Build and hidden folders are skipped.
  make_file "$d" build/gen/bad.cpp tests/skip.h
  make_file "$d" io/build-debug/bad.cpp parallel/fsdp/fsdp.h
  make_file "$d" .cache/io/bad.cpp parallel/fsdp/fsdp.h
}

# expect <name> <expected rc> <expected output substring> <fixture dir>
expect() {
  local name=$1 want_rc=$2 want_out=$3 dir=$4 out rc
  out=$(bash "$checker" "$dir" 2>&1)
  rc=$?
  if [[ $rc -ne $want_rc || $out != *"$want_out"* ]]; then
    echo "FAIL: $name: rc=$rc (want $want_rc), output:"
    echo "$out" | sed 's/^/    /'
    echo "    (wanted it to contain: $want_out)"
    failures=$((failures + 1))
  else
    echo "ok: $name"
  fi
}

# bad_case <name> <path> <include> <expected message>: the clean tree plus one bad file.
bad_case() {
  local name=$1 path=$2 inc=$3 msg=$4 d
  d=$(mktemp -d "$tmp/case.XXXXXX")
  make_clean "$d"
  make_file "$d" "$path" src/base/check.h "$inc"
  expect "$name" 1 "$msg" "$d"
}

clean="$tmp/clean"
make_clean "$clean"
expect "clean tree passes" 0 "check_layering: OK" "$clean"

bad_case "kernels -> core" kernels/bad.cpp src/core/tensor.h \
  "kernels/bad.cpp:2: kernels must not include src/core/tensor.h"
bad_case "base -> kernels" src/base/bad.h kernels/gemm.h \
  "src/base/bad.h:2: src/base must not include kernels/gemm.h"
bad_case "core -> nn" src/core/bad.cpp src/nn/module.h \
  "src/core/bad.cpp:2: src/core must not include src/nn/module.h"
bad_case "nn -> optim" src/nn/bad.cpp src/optim/adamw.h \
  "src/nn/bad.cpp:2: src/nn must not include src/optim/adamw.h"
bad_case "io -> parallel" io/loader/bad.cpp parallel/fsdp/fsdp.h \
  "io/loader/bad.cpp:2: io/loader must not include parallel/fsdp/fsdp.h"
bad_case "io/energon -> io/loader" io/energon/bad.cpp io/loader/loader.h \
  "io/energon/bad.cpp:2: io/energon must not include io/loader/loader.h"
bad_case "io/state -> io/text" io/state/bad.cpp io/text/tokenizer.h \
  "io/state/bad.cpp:2: io/state must not include io/text/tokenizer.h"
bad_case "io/text -> io/image" io/text/bad.cpp io/image/decode.h \
  "io/text/bad.cpp:2: io/text must not include io/image/decode.h"
bad_case "io/image -> io/energon" io/image/bad.cpp io/energon/tar.h \
  "io/image/bad.cpp:2: io/image must not include io/energon/tar.h"
bad_case "a file at io/'s top" io/bad.cpp io/state/safetensors.h \
  "io/bad.cpp:1: io must not include src/base/check.h"
bad_case "parallel -> io" parallel/bad.cpp io/state/safetensors.h \
  "parallel/bad.cpp:2: parallel must not include io/state/safetensors.h"
bad_case "parallel -> model" parallel/bad.cpp model/causal_lm.h \
  "parallel/bad.cpp:2: parallel must not include model/causal_lm.h"
bad_case "family -> family" model/qwen3_vl/bad.cpp model/qwen3/model.h \
  "model/qwen3_vl/bad.cpp:2: model/qwen3_vl must not include model/qwen3/model.h"
bad_case "train -> family" src/train/bad.cpp model/qwen3/model.h \
  "src/train/bad.cpp:2: src/train must not include model/qwen3/model.h"
bad_case "main -> family" src/bad_main.cpp model/qwen3/config.h \
  "src/bad_main.cpp:2: src must not include model/qwen3/config.h"
bad_case "model -> train" model/bad.cpp src/train/trainer.h \
  "model/bad.cpp:2: model must not include src/train/trainer.h"
bad_case "model -> demo" model/bad.cpp src/demo/caption_eval.h \
  "model/bad.cpp:2: model must not include src/demo/caption_eval.h"
bad_case "demo -> train" src/demo/bad.cpp src/train/trainer.h \
  "src/demo/bad.cpp:2: src/demo must not include src/train/trainer.h"
bad_case "demo -> family" src/demo/bad.cpp model/qwen3/model.h \
  "src/demo/bad.cpp:2: src/demo must not include model/qwen3/model.h"
bad_case "train -> cli" src/train/bad.cpp src/cli/cli.h \
  "src/train/bad.cpp:2: src/train must not include src/cli/cli.h"
bad_case "cli -> family" src/cli/bad.cpp model/qwen3/model.h \
  "src/cli/bad.cpp:2: src/cli must not include model/qwen3/model.h"
bad_case "train -> tests" src/train/bad.cpp tests/skip.h \
  "src/train/bad.cpp:2: src/train must not include tests/skip.h"
bad_case "bench -> tests" bench/bad.cpp tests/skip.h \
  "bench/bad.cpp:2: bench must not include tests/skip.h"
bad_case "file named build*" io/state/builder.cpp parallel/comm/mesh.h \
  "io/state/builder.cpp:2: io/state must not include parallel/comm/mesh.h"
bad_case "relative include" io/state/bad.cpp safetensors.h \
  "io/state/bad.cpp:2: io/state must not include safetensors.h (includes are rooted at the repo root)"

# Indented and spaced include directives count too.
d="$tmp/spaced"
make_clean "$d"
printf '// comment\n  #  include   "src/core/tensor.h"  // why\n' >"$d/kernels/spaced.cpp"
expect "spaced directive" 1 "kernels/spaced.cpp:2: kernels must not include src/core/tensor.h" "$d"

expect "missing root is an error" 2 "no such directory" "$tmp/does-not-exist"

if ((failures > 0)); then
  echo "test_check_layering: $failures failure(s)"
  exit 1
fi
echo "test_check_layering: all cases passed"
