#!/usr/bin/env bash
# README command 1: installs what `vlmtrain` needs, builds only it, and runs the main job (the CPU
# demo). The CUDA sources are built when asked (VLM_CUDA=ON) or when a GPU is present (nvidia-smi
# lists one), not merely because nvcc is installed; README command 2 (tools/test.sh) builds them,
# the tests and the benchmarks on top, in the same build/ folder.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
if [[ -z ${VLM_CUDA:-} ]]; then
  VLM_CUDA=OFF
  if command -v nvidia-smi >/dev/null && nvidia-smi -L 2>/dev/null | grep -q '^GPU '; then
    VLM_CUDA=ON
  fi
fi
export VLM_CUDA
echo "demo: CUDA sources: $VLM_CUDA (VLM_CUDA=ON|OFF bash tools/demo.sh to choose)"
bash "$root/tools/deps/install_deps.sh" --demo
bash "$root/tools/build.sh" --demo
cd "$root"
exec "$root/build/vlmtrain" train "$@"
