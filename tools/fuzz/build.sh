#!/usr/bin/env bash
# Builds the libFuzzer targets (tools/fuzz/fuzz_*.cpp) with clang and
# -fsanitize=fuzzer,address,undefined against the io/ and src/base sources they need (CPU only,
# header-only nlohmann-json; no CMake, no CUDA).
#   tools/fuzz/build.sh [OUT_DIR (build-fuzz)]    -> OUT_DIR/fuzz_{tar,safetensors,chat,tokenizer}
# CXX overrides the compiler (default clang++-14, else clang++); it needs the libFuzzer runtime
# (Debian: libclang-rt-14-dev). Objects are rebuilt only when a source or header is newer.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
out="${1:-$root/build-fuzz}"
cxx="${CXX:-$(command -v clang++-14 || command -v clang++ || true)}"
[[ -n $cxx ]] || {
  echo "fuzz build: clang++ not found (tools/deps/install_deps.sh installs clang-14)" >&2
  exit 1
}
mkdir -p "$out/obj"

# VLM_SOURCE_ROOT as src/base/CMakeLists.txt sets it: errors name repo-relative paths.
flags=(-std=c++20 -O1 -g -fno-omit-frame-pointer -I"$root" -DVLM_SOURCE_ROOT="\"$root/\""
  -fsanitize=address,undefined -fno-sanitize-recover=undefined)
# The library sources the four targets reach: tar, safetensors (+atomic_file for the writer),
# io/text/ (chat format, the tokenizer's stages, unicode; not the BPE trainer) and src/base.
lib_srcs=(io/energon/tar.cpp io/state/safetensors.cpp io/state/atomic_file.cpp)
for f in "$root"/io/text/*.cpp "$root"/src/base/*.cpp; do
  [[ $f == */bpe_trainer.cpp ]] || lib_srcs+=("${f#"$root"/}")
done
targets=(tar safetensors chat tokenizer)

# An object is stale when its source or any header it includes (clang's .d file) is newer.
stale() {
  local obj="$1" dep="$1.d"
  [[ -f $obj && -f $dep ]] || return 0
  local f
  for f in $(sed -e 's/^[^:]*://' -e 's/\\$//' "$dep"); do
    [[ $f -nt $obj ]] && return 0
  done
  return 1
}

compile() { # compile SRC OBJ [extra flags]
  local src="$1" obj="$2"
  shift 2
  if stale "$obj"; then
    echo "fuzz build: $src"
    "$cxx" "${flags[@]}" "$@" -MMD -MF "$obj.d" -c "$root/$src" -o "$obj"
  fi
}

# Every compile is waited for, failed or not, before the script exits: a compiler left running
# after the exit would outlive the checkout it reads (CI removes it).
objs=()
pids=()
failures=0
jobs_max="${VLM_BUILD_JOBS:-2}"
for s in "${lib_srcs[@]}"; do
  obj="$out/obj/$(echo "$s" | tr / _).o"
  objs+=("$obj")
  # Coverage instrumentation without libFuzzer's main for the library code.
  compile "$s" "$obj" -fsanitize=fuzzer-no-link &
  pids+=($!)
  if ((${#pids[@]} >= jobs_max)); then
    wait "${pids[0]}" || failures=$((failures + 1))
    pids=("${pids[@]:1}")
  fi
done
for p in "${pids[@]}"; do wait "$p" || failures=$((failures + 1)); done
if ((failures)); then
  echo "fuzz build: $failures library sources failed to compile" >&2
  exit 1
fi

for t in "${targets[@]}"; do
  obj="$out/obj/fuzz_$t.o"
  compile "tools/fuzz/fuzz_$t.cpp" "$obj" -fsanitize=fuzzer-no-link
  bin="$out/fuzz_$t"
  newer=0
  [[ -f $bin ]] || newer=1
  for o in "$obj" "${objs[@]}"; do [[ $o -nt $bin ]] && newer=1; done
  if ((newer)); then
    echo "fuzz build: link $bin"
    "$cxx" "${flags[@]}" -fsanitize=fuzzer "$obj" "${objs[@]}" -o "$bin"
  fi
done
echo "fuzz build: targets in $out: ${targets[*]/#/fuzz_}"
