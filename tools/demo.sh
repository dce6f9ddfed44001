#!/usr/bin/env bash
# README command 1: installs dependencies, builds, and runs the main job (the CPU demo).
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
bash "$root/tools/deps/install_deps.sh"
bash "$root/tools/build.sh"
cd "$root"
exec "$root/build/vlmtrain" train "$@"
