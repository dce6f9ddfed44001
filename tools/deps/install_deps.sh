#!/usr/bin/env bash
# Installs the Debian packages that vlmtrain builds and tests with (DESIGN.md §8).
#   tools/deps/install_deps.sh          everything: the build, the tests, the lint and fuzz tools
#                                       (README command 2), and the cuDNN frontend headers
#   tools/deps/install_deps.sh --demo   only what building `vlmtrain` needs (README command 1);
#                                       the cuDNN frontend headers too when VLM_CUDA=ON
# Idempotent and non-interactive: when every package is already installed it does not touch apt.
# Runs as root, or through sudo when available. The CUDA toolkit comes from the machine. The
# cuDNN frontend headers go into .deps/ (tools/deps/fetch_cudnn_frontend.sh).
set -euo pipefail
export DEBIAN_FRONTEND=noninteractive

# What `vlmtrain` itself builds with.
packages=(
  build-essential cmake ninja-build pkg-config
  libopenblas-dev libopenblas-openmp-dev
  libopenmpi-dev openmpi-bin libhdf5-openmpi-dev
  nlohmann-json3-dev libtomlplusplus-dev libyaml-cpp-dev libpcre2-dev
  libcli11-dev # the argument parser of the commands and benchmarks (src/cli/args.h)
  libjpeg62-turbo-dev libpng-dev
)
# The tests, the lint and fuzz tools, the report plots and the frontend fetch (command 2).
test_packages=(
  git catch2 clang-format-14 python3
  shellcheck # tests/jobs/test_jobs.sh: the cluster job scripts
  python3-pip # fetch_cudnn_frontend.sh: pip download of the cuDNN frontend headers' wheel
  python3-h5py # tests/io/state/test_hdf5_state_mpi.cpp: h5py reads our checkpoints
  python3-matplotlib # `vlmtrain report` (tools/report/report.py): the plots
  clang-14 libclang-rt-14-dev # libFuzzer targets (tools/fuzz/): clang++ and libclang_rt.fuzzer
)
headers=1 # the cuDNN frontend headers: with the CUDA sources only
if [[ ${1:-} == --demo ]]; then
  headers=0
  if [[ ${VLM_CUDA:-} == ON ]]; then
    packages+=(python3-pip) # the frontend headers' fetch
    headers=1
  fi
else
  packages+=("${test_packages[@]}")
fi

missing=()
for p in "${packages[@]}"; do
  # "install ok installed" is dpkg's status for a fully installed package.
  if [[ $(dpkg-query -W -f='${Status}' "$p" 2>/dev/null || true) != "install ok installed" ]]; then
    missing+=("$p")
  fi
done

fetch_headers() {
  ((headers)) || return 0
  bash "$(dirname "${BASH_SOURCE[0]}")/fetch_cudnn_frontend.sh"
}

if ((${#missing[@]} == 0)); then
  echo "install_deps: all ${#packages[@]} packages already installed; skipping apt"
  fetch_headers
  exit 0
fi
echo "install_deps: missing: ${missing[*]}"

sudo=()
if ((EUID != 0)); then
  if command -v sudo >/dev/null; then
    sudo=(sudo -n env DEBIAN_FRONTEND=noninteractive) # -n: never prompt, there is no stdin
  else
    echo "install_deps: not root and no sudo; install these as root: ${missing[*]}" >&2
    exit 1
  fi
fi

echo "install_deps: apt-get update"
"${sudo[@]}" apt-get update </dev/null
echo "install_deps: apt-get install -y --no-install-recommends ${packages[*]}"
"${sudo[@]}" apt-get install -y --no-install-recommends "${packages[@]}" </dev/null
fetch_headers
echo "install_deps: done"
