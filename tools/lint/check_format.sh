#!/usr/bin/env bash
# Checks that the C++/CUDA sources follow .clang-format (clang-format 14) without changing them.
# Usage: tools/lint/check_format.sh <repo_root>   (exit 0 clean, 1 if any file needs formatting)
# Fix with tools/lint/format.sh <repo_root>. CLANG_FORMAT=/path/to/clang-format overrides the binary.
set -euo pipefail

root=${1:?usage: check_format.sh <repo_root>}
cd "$root"

# clang-format-14 first: other versions format some constructs differently.
cf=${CLANG_FORMAT:-$(command -v clang-format-14 || command -v clang-format || true)}
if [[ -z $cf ]]; then
  echo "check_format: clang-format-14 not found (tools/deps/install_deps.sh installs it)" >&2
  exit 1
fi
if ! "$cf" --version | grep -q 'version 14\.'; then
  echo "check_format: warning: $("$cf" --version) is not clang-format 14" >&2
fi

# Sources under the code folders, skipping build and hidden directories.
dirs=()
for d in src kernels io parallel model tests bench; do [[ -d $d ]] && dirs+=("$d"); done
bad=()
checked=0
if ((${#dirs[@]} > 0)); then
  while IFS= read -r -d '' f; do
    checked=$((checked + 1))
    "$cf" --dry-run --Werror "$f" >/dev/null 2>&1 || bad+=("${f#./}")
  done < <(find "${dirs[@]}" -type d \( -name '.*' -o -name 'build*' -o -name _deps \) -prune \
    -o -type f \( -name '*.h' -o -name '*.cpp' -o -name '*.cu' -o -name '*.cuh' \) -print0 |
    sort -z)
fi

if ((${#bad[@]} > 0)); then
  printf '%s\n' "${bad[@]/%/: not clang-formatted}"
  echo "check_format: ${#bad[@]} of $checked files need formatting; run tools/lint/format.sh $root" >&2
  exit 1
fi
echo "check_format: OK ($checked files checked)"
