#!/usr/bin/env bash
# README command 2: installs dependencies (the test tools too), builds everything (with CUDA
# when nvcc is found: VLM_CUDA=AUTO, also over a build/ that command 1 configured for the demo
# alone) and runs the whole test suite with ctest. GPU tests skip with "no CUDA device" on
# machines without one.
#   tools/test.sh              all tests (unit, grad, golden, gpu, lint, ...)
#   tools/test.sh --sanitize   the same suite built with -fsanitize=address,undefined (CPU only)
#   tools/test.sh -L grad      extra arguments go to ctest
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
build_args=(-DVLM_BUILD_TESTS=ON -DVLM_BUILD_BENCH=ON -DVLM_CUDA="${VLM_CUDA:-AUTO}")
if [[ "${1:-}" == "--sanitize" ]]; then
  build_args=(--sanitize)
  shift
fi
bash "$root/tools/deps/install_deps.sh"
bash "$root/tools/build.sh" "${build_args[@]}"
build_dir="$root/build"
[[ " ${build_args[*]} " == *" --sanitize "* ]] && build_dir="$root/build-asan"
# The layering checker's own test, so a broken checker cannot pass silently.
bash "$root/tests/lint/test_check_layering.sh" >/dev/null
echo "layering checker self-test: OK"
cd "$build_dir"
export OMP_NUM_THREADS="${OMP_NUM_THREADS:-2}"
# ASan's leak checker needs ptrace, which containers often lack; UBSan and ASan errors still abort.
export ASAN_OPTIONS="${ASAN_OPTIONS:-detect_leaks=0:abort_on_error=1}"
export UBSAN_OPTIONS="${UBSAN_OPTIONS:-print_stacktrace=1:halt_on_error=1}"
ctest --output-on-failure -j "$(nproc)" "$@"
