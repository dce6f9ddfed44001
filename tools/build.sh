#!/usr/bin/env bash
# Configures and builds vlmtrain into a build folder (default: build/).
#   tools/build.sh [--sanitize] [--build-dir DIR] [extra cmake args...]
# CUDA sources are built whenever nvcc is found (VLM_CUDA=AUTO); --sanitize builds a CPU-only
# address+undefined-behaviour sanitizer tree in build-asan/.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
build_dir="$root/build"
cmake_args=()
while (($#)); do
  case "$1" in
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
jobs="${VLM_BUILD_JOBS:-$(nproc)}"
generator=()
command -v ninja >/dev/null && generator=(-G Ninja)
if [[ ! -f "$build_dir/CMakeCache.txt" ]]; then
  cmake -S "$root" -B "$build_dir" "${generator[@]}" -DCMAKE_BUILD_TYPE=Release "${cmake_args[@]}"
elif ((${#cmake_args[@]})); then
  cmake "$build_dir" "${cmake_args[@]}"
fi
cmake --build "$build_dir" -j "$jobs"
