#!/usr/bin/env bash
# Enforces the include layering of DESIGN.md §3 on `#include "..."` lines (rooted at the repo):
#   src/base <- kernels <- src/core <- src/nn <- src/optim <- parallel, io <- model <- src/demo
#   <- src/train <- src/cli (src/main.cpp)
# parallel/ and io/ do not include each other; nothing but tests/ includes tests/.
# io/ is one folder per concern: energon/ and image/ and state/ stand alone, text/ reads energon/
# (its RawSample), loader/ reads all four.
# Model families (DESIGN.md §4.1): a folder model/<family>/ includes no other family's folder, only
# the contract in model/ and the shared towers (model/vision/: the vision tower; model/text/: the
# Qwen3 decoder layer of the Qwen3 and Qwen3-VL text stacks), and the application (src/demo,
# src/train, src/cli, src/main.cpp) includes no family at all: it asks the registry
# (model/model_spec.h).
# A quoted include that names no project folder but resolves next to the including file is a
# relative include and is reported too; anything else (third-party headers) is ignored.
# Usage: tools/lint/check_layering.sh <repo_root>   (exit 0 clean, 1 on violations, 2 on misuse)
set -euo pipefail

root=${1:?usage: check_layering.sh <repo_root>}
[[ -d $root ]] || { echo "check_layering: no such directory: $root" >&2; exit 2; }
cd "$root"

base="src/base/"
core_up="$base kernels/ src/core/"
library="$core_up src/nn/ src/optim/"
io_all="io/energon/ io/text/ io/image/ io/state/ io/loader/"
application="$library parallel/ $io_all model/ src/demo/ src/train/"
everything="$application src/cli/ src/ bench/ tests/"
not_tests="${everything% tests/}"

# The folder (layer) of a repo-relative path; most specific prefix first.
layer_of() {
  case $1 in
    src/base/*) echo src/base ;;
    src/core/*) echo src/core ;;
    src/nn/*) echo src/nn ;;
    src/optim/*) echo src/optim ;;
    src/demo/*) echo src/demo ;;
    src/train/*) echo src/train ;;
    src/cli/*) echo src/cli ;;
    src/*) echo src ;; # src/main.cpp: the executable, same rights as src/cli
    io/energon/* | io/text/* | io/image/* | io/state/* | io/loader/*) echo "${1%/*}" ;;
    io/*) echo io ;; # a file at io/'s top: none belongs there
    kernels/* | parallel/* | model/* | bench/* | tests/*) echo "${1%%/*}" ;;
    *) echo "" ;;
  esac
}

# Allowed include prefixes per layer.
allowed_for() {
  case $1 in
    src/base) echo "$base" ;;
    kernels) echo "$base kernels/" ;;
    src/core) echo "$core_up" ;;
    src/nn) echo "$core_up src/nn/" ;;
    src/optim) echo "$library" ;;
    parallel) echo "$library parallel/" ;;
    io/energon | io/image | io/state) echo "$library $1/" ;;
    io/text) echo "$library io/energon/ io/text/" ;;
    io/loader) echo "$library $io_all" ;;
    io) echo "" ;;
    model) echo "$library parallel/ $io_all model/" ;;
    src/demo) echo "$library parallel/ $io_all model/ src/demo/" ;;
    src/train) echo "$application" ;;
    src/cli | src | bench) echo "$not_tests" ;;
    tests) echo "$everything" ;;
  esac
}

violations=0
files=0
while IFS= read -r -d '' file; do
  file=${file#./}
  layer=$(layer_of "$file")
  [[ -n $layer ]] || continue
  allowed=$(allowed_for "$layer")
  files=$((files + 1))
  # grep -n prints "line:text"; the sed keeps "line:path" for quoted includes only.
  while IFS=: read -r line inc; do
    [[ -n $inc ]] || continue
    if [[ -z $(layer_of "$inc") ]]; then
      # Not a project path: a relative include if it resolves next to the file, else external.
      if [[ -f $(dirname "$file")/$inc ]]; then
        echo "$file:$line: $layer must not include $inc (includes are rooted at the repo root)"
        violations=$((violations + 1))
      fi
      continue
    fi
    ok=0
    for prefix in $allowed; do
      if [[ $inc == "$prefix"* ]]; then
        ok=1
        break
      fi
    done
    if ((ok == 0)); then
      echo "$file:$line: $layer must not include $inc"
      violations=$((violations + 1))
      continue
    fi
    if [[ $inc == model/*/* ]]; then
      family=${inc#model/}
      family=${family%%/*}
      if [[ $file == model/*/* ]]; then
        own=${file#model/}
        own=${own%%/*}
        if [[ $family != "$own" && $family != vision && $family != text ]]; then
          echo "$file:$line: model/$own must not include $inc (a family includes only the" \
            "contract in model/, model/vision/ and model/text/)"
          violations=$((violations + 1))
        fi
      elif [[ $layer == src || $layer == src/* ]]; then
        echo "$file:$line: $layer must not include $inc (a model family; the application asks" \
          "the registry, model/model_spec.h)"
        violations=$((violations + 1))
      fi
    fi
  done < <(grep -n -E '^[[:space:]]*#[[:space:]]*include[[:space:]]*"' "$file" |
    sed -E 's/^([0-9]+):[[:space:]]*#[[:space:]]*include[[:space:]]*"([^"]*)".*/\1:\2/' || true)
done < <(find . -mindepth 1 -type d \( -name '.*' -o -name 'build*' -o -name _deps \) -prune \
  -o -type f \
  \( -name '*.h' -o -name '*.hpp' -o -name '*.cpp' -o -name '*.cc' -o -name '*.cu' \
  -o -name '*.cuh' \) -print0 | sort -z)

if ((violations > 0)); then
  echo "check_layering: $violations violation(s) of the layering in DESIGN.md §3" >&2
  exit 1
fi
echo "check_layering: OK ($files files checked)"
