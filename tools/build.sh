#!/usr/bin/env bash
# Configures and builds vlmtrain into a build folder (default: build/).
#   tools/build.sh [--demo | --sanitize] [--build-dir DIR] [extra cmake args...]
# Every target; CUDA sources whenever nvcc is found (VLM_CUDA=AUTO, the default).
# --demo      only the `vlmtrain` binary (README command 1); a new build folder is configured
#             without tests and benchmarks and with CUDA only if VLM_CUDA=ON (tools/demo.sh
#             decides), an existing one is kept as it is
# --sanitize  a CPU-only address+undefined-behaviour sanitizer tree in build-asan/
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
build_dir="$root/build"
cmake_args=()
demo=0
while (($#)); do
  case "$1" in
  --demo) demo=1 ;;
  --sanitize)
    build_dir="$root/build-asan"
    cmake_args+=(-DVLM_SANITIZE=ON -DVLM_CUDA=OFF -DVLM_BUILD_BENCH=OFF)
    ;;
  --build-dir)
    build_dir="$2"
    shift
    ;;
  *) cmake_args+=("$1") ;;
  esac
  shift
done
targets=()
if ((demo)); then
  targets=(--target vlmtrain)
  [[ -f $build_dir/CMakeCache.txt ]] ||
    cmake_args+=(-DVLM_CUDA="${VLM_CUDA:-OFF}" -DVLM_BUILD_TESTS=OFF -DVLM_BUILD_BENCH=OFF)
fi
jobs="${VLM_BUILD_JOBS:-$(nproc)}"
generator=()
command -v ninja >/dev/null && generator=(-G Ninja)
if [[ ! -f "$build_dir/CMakeCache.txt" ]]; then
  cmake -S "$root" -B "$build_dir" "${generator[@]}" -DCMAKE_BUILD_TYPE=Release "${cmake_args[@]}"
elif ((${#cmake_args[@]})); then
  cmake "$build_dir" "${cmake_args[@]}"
fi
cmake --build "$build_dir" -j "$jobs" "${targets[@]}"
