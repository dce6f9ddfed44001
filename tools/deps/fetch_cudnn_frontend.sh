#!/usr/bin/env bash
# Fetches the cuDNN frontend headers (header-only C++ graph API, what the cuDNN fused attention
# is built on) from PyPI's nvidia-cudnn-frontend wheel, pinned by version and sha256, into
# .deps/cudnn_frontend/include (gitignored; never vendored). The build finds them there
# (kernels/cuda/CMakeLists.txt); without them it builds the own attention kernel only.
#   tools/deps/fetch_cudnn_frontend.sh [--check]
#     --check   exit 0 when the pinned headers are in place, 1 otherwise; fetch nothing.
# The headers are the same on every platform: the x86-64 cp311 wheel is fetched everywhere (also
# on ARM machines), so one sha256 pins them. Needs python3 with pip (python3-pip), and PyPI.
# Idempotent; never reads stdin. Exit 0 also when PyPI cannot be reached (a warning: the build
# goes on without cuDNN attention), unless VLM_REQUIRE_CUDNN_FRONTEND=1.
set -euo pipefail
exec </dev/null
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
version=1.32.0
wheel=nvidia_cudnn_frontend-$version-cp311-cp311-manylinux_2_27_x86_64.manylinux_2_28_x86_64.whl
sha256=c6006556017a4d1c914c52a556c71b1267f2d6a0500f742e7b4edef539878df0
dest="$root/.deps/cudnn_frontend"
stamp="$dest/VERSION"

if [[ -f $stamp && $(cat "$stamp") == "$version" && -f $dest/include/cudnn_frontend.h ]]; then
  echo "fetch_cudnn_frontend: headers $version already in $dest/include"
  exit 0
fi
[[ ${1:-} == --check ]] && exit 1

fail() {
  echo "fetch_cudnn_frontend: $*" >&2
  if [[ ${VLM_REQUIRE_CUDNN_FRONTEND:-0} == 1 ]]; then exit 1; fi
  echo "fetch_cudnn_frontend: building without the cuDNN frontend (CUDA attention: own kernel)" >&2
  exit 0
}

tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
echo "fetch_cudnn_frontend: downloading nvidia-cudnn-frontend==$version from PyPI"
python3 -m pip download --quiet --no-deps --only-binary=:all: --platform manylinux_2_28_x86_64 \
  --python-version 3.11 --implementation cp --abi cp311 -d "$tmp" \
  "nvidia-cudnn-frontend==$version" >"$tmp/pip.log" 2>&1 ||
  fail "pip download failed: $(tail -3 "$tmp/pip.log" | paste -sd ' ')"
[[ -f $tmp/$wheel ]] || fail "pip fetched $(ls "$tmp" | paste -sd ' '), not $wheel"
got=$(sha256sum "$tmp/$wheel" | cut -d' ' -f1)
[[ $got == "$sha256" ]] || fail "$wheel has sha256 $got, expected $sha256"

# A wheel is a zip; only its include/ folder is needed (3 MiB of headers, nlohmann json inside).
python3 - "$tmp/$wheel" "$tmp/x" <<'EOF'
import sys, zipfile
with zipfile.ZipFile(sys.argv[1]) as z:
    z.extractall(sys.argv[2], [n for n in z.namelist() if n.startswith("include/")])
EOF
[[ -f $tmp/x/include/cudnn_frontend.h ]] || fail "$wheel holds no include/cudnn_frontend.h"
rm -rf "$dest"
mkdir -p "$dest"
mv "$tmp/x/include" "$dest/include"
echo "$version" >"$stamp"
echo "fetch_cudnn_frontend: headers $version in $dest/include"
