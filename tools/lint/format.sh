#!/usr/bin/env bash
# Applies .clang-format in place (clang-format 14).
# Usage: tools/lint/format.sh <repo_root> [file...]
#   with no files: every *.h *.cpp *.cu *.cuh under the code folders (as tools/lint/check_format.sh);
#   with files (paths relative to the repo root, or absolute): only those.
set -euo pipefail

root=${1:?usage: format.sh <repo_root> [file...]}
shift
cd "$root"

cf=${CLANG_FORMAT:-$(command -v clang-format-14 || command -v clang-format || true)}
if [[ -z $cf ]]; then
  echo "format: clang-format-14 not found (tools/deps/install_deps.sh installs it)" >&2
  exit 1
fi

files=()
if (($# > 0)); then
  files=("$@")
else
  dirs=()
  for d in src kernels io parallel model tests bench; do [[ -d $d ]] && dirs+=("$d"); done
  if ((${#dirs[@]} > 0)); then
    while IFS= read -r -d '' f; do files+=("$f"); done < <(
      find "${dirs[@]}" -type d \( -name '.*' -o -name 'build*' -o -name _deps \) -prune \
        -o -type f \( -name '*.h' -o -name '*.cpp' -o -name '*.cu' -o -name '*.cuh' \) -print0 |
        sort -z)
  fi
fi

for f in "${files[@]}"; do "$cf" -i "$f"; done
echo "format: formatted ${#files[@]} file(s) with $cf"
