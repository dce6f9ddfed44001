#!/usr/bin/env bash
# bench_ops_cpu (matmul, attention forward/backward, RMSNorm) and, on its attention shapes,
# torch's scaled_dot_product_attention in the same script with the same thread count
# (bench_attention_torch.py): ours and torch side by side, ratio = torch time / ours.
#   bench/bench_ops_cpu.sh [build_dir] [--quick]     THREADS (default nproc)
# The torch side is skipped, with a message, when torch cannot be imported (pip install torch).
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
build=${1:-$root/build}
shift || true
bin=$build/bench/bench_ops_cpu
[[ -x $bin ]] || { echo "bench_ops_cpu: $bin not built" >&2; exit 1; }
threads=${THREADS:-$(nproc)}
export OMP_NUM_THREADS=$threads OPENBLAS_NUM_THREADS=$threads MKL_NUM_THREADS=$threads
out=$(mktemp)
trap 'rm -f "$out"' EXIT
"$bin" "$@" | tee "$out"
echo
if python3 -c "import torch" 2>/dev/null; then
  python3 "$root/bench/bench_attention_torch.py" "$out" --threads "$threads"
else
  echo "torch is not importable: the torch SDPA comparison is skipped (pip install torch)"
fi
