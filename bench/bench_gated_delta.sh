#!/usr/bin/env bash
# bench_gated_delta (our gated delta rule op on CPU, f32: forward, forward + backward) and, on its
# shapes and the inputs it writes, transformers' torch_chunk_gated_delta_rule in the same script
# with the same thread count (bench_gated_delta_torch.py): ours and torch side by side,
# ratio = torch time / ours.
#   bench/bench_gated_delta.sh [build_dir] [--quick] [--reps R]     THREADS (default nproc),
#   FLUSH_DENORMAL=1 (torch.set_flush_denormal on the torch side, as our kernels flush subnormals)
# The torch side is skipped, with a message, when torch or transformers' Qwen3.5 cannot be
# imported (pip install torch transformers).
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
build=${1:-$root/build}
shift || true
bin=$build/bench/bench_gated_delta
[[ -x $bin ]] || { echo "bench_gated_delta: $bin not built" >&2; exit 1; }
cores=$(nproc) # before OMP_NUM_THREADS, which nproc honours
threads=${THREADS:-$cores}
export OMP_NUM_THREADS=$threads OPENBLAS_NUM_THREADS=$threads MKL_NUM_THREADS=$threads
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
echo "threads: $threads; $cores cores, load $(cut -d' ' -f1-3 /proc/loadavg)"
"$bin" --inputs "$tmp" "$@" | tee "$tmp/ours.txt"
echo
reps=()
for ((i = 1; i < $#; i++)); do
  j=$((i + 1))
  [[ ${!i} == --reps ]] && reps=(--reps "${!j}")
done
flush=()
[[ ${FLUSH_DENORMAL:-0} == 1 ]] && flush=(--flush-denormal)
qwen3_5=transformers.models.qwen3_5.modeling_qwen3_5
if python3 -c "from $qwen3_5 import torch_chunk_gated_delta_rule" 2>/dev/null; then
  python3 "$root/bench/bench_gated_delta_torch.py" "$tmp/ours.txt" "$tmp" --threads "$threads" \
    "${reps[@]}" "${flush[@]}"
else
  echo "torch / transformers (Qwen3.5) not importable: the torch_chunk_gated_delta_rule" \
    "comparison is skipped (pip install torch transformers)"
fi
