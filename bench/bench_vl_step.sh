#!/usr/bin/env bash
# One vision-language training step on CPU (vision tower, merger and the text stack; forward,
# backward, clipping, AdamW) against PyTorch eager, for Qwen3-VL and Qwen3.5: transformers'
# Qwen3VLForConditionalGeneration / Qwen3_5ForConditionalGeneration (attn_implementation "eager",
# fp32, torch.optim.AdamW(fused=False), clip_grad_norm_) and our TrainStepper (bench_vl_step) on the
# SAME weights and the SAME batch — bench_vl_step_ref.py writes a random snapshot and one packed
# batch with transformers, and both sides load them — for two configs per family:
#   qwen3_vl tiny   T2 of qwen-models.md §8 (text H 64, L 4; vision depth 4, Hv 64), 3 documents
#                   of 96 tokens, each with one image of grid (1, 8, 8) (16 tokens)
#   qwen3_vl small  text H 512, L 8, Hq 8, Hkv 4, D 64, I 1536, vocab 32000; vision depth 8,
#                   Hv 256, 4 heads, Iv 1024, deepstack [1, 3, 5]; 4 documents of 256 tokens, each
#                   with one image of grid (1, 16, 16) (64 tokens)
#   qwen3_5 tiny    T3 (tools/golden/gen_qwen3_5.py's hybrid variant: text H 64, L 8 = [linear x3,
#                   full] x 2, Hq 4, Hkv 2, D 64, partial rotary 0.25, vocab 512; GDN HK 2, HV 4,
#                   dk 32, dv 16) with I 128; vision depth 4, Hv 64, 4 heads, Iv 128; the batch of
#                   qwen3_vl tiny
#   qwen3_5 small   text H 512, L 8 = [linear x3, full] x 2, Hq 8, Hkv 4, D 128 (partial rotary
#                   0.25, mrope_section [6, 5, 5]), I 1536, vocab 32000; GDN HK 4, HV 8,
#                   dk = dv = 64; the vision tower (no DeepStack) and the batch of qwen3_vl small
# Labels: -100 on the images and each document's first token. Torch runs each document alone
# (transformers computes its MRoPE ids; Qwen3.5's GDN torch fallbacks cannot keep packed documents
# apart); ours the packed row with the get_rope_index ids. The first-step losses of both sides must
# agree (same weights, same data): the table shows them.
# Median step time over K timed steps after W warm-up steps; ratio = ours / torch tokens/s.
#
# Usage: bench/bench_vl_step.sh [build_dir]   (default: build; needs bench/bench_vl_step)
#   THREADS (default nproc), FAMILIES ("qwen3_vl qwen3_5"), CONFIGS ("tiny small"),
#   TINY_STEPS/TINY_WARMUP (10, 2), SMALL_STEPS/SMALL_WARMUP (3, 1), FLUSH_DENORMAL=1 (torch runs
#   with torch.set_flush_denormal(True)). Needs torch + transformers.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
build=${1:-$root/build}
bin=$build/bench/bench_vl_step
[[ -x $bin ]] || { echo "bench_vl_step: $bin not built (cmake -DVLM_BUILD_BENCH=ON)" >&2; exit 1; }
cores=$(nproc) # before OMP_NUM_THREADS, which nproc honours
threads=${THREADS:-$cores}
export OMP_NUM_THREADS=$threads OPENBLAS_NUM_THREADS=$threads MKL_NUM_THREADS=$threads
python3 -c "import torch, transformers" 2>/dev/null ||
  { echo "bench_vl_step: torch + transformers needed (pip install torch transformers)"; exit 0; }
ref=$root/bench/bench_vl_step_ref.py
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT

flush=${FLUSH_DENORMAL:+; torch FLUSH_DENORMAL=$FLUSH_DENORMAL}
echo "threads: $threads; $cores cores, load $(cut -d' ' -f1-3 /proc/loadavg)$flush"
results=()
for family in ${FAMILIES:-qwen3_vl qwen3_5}; do
  for cfg in ${CONFIGS:-tiny small}; do
    st=${SMALL_STEPS:-3} wu=${SMALL_WARMUP:-1}
    [[ $cfg == tiny ]] && st=${TINY_STEPS:-10} wu=${TINY_WARMUP:-2}
    dir=$tmp/$family-$cfg
    mkdir -p "$dir"
    python3 "$ref" make "$family" "$cfg" "$dir" 2>/dev/null
    ours=$("$bin" --model "$dir/model" --batch "$dir/batch.safetensors" --steps "$st" \
      --warmup "$wu" 2>/dev/null | tail -n 1) # the JSON line (the loader logs first)
    echo "$family $cfg ours:  $ours"
    torch=$(python3 "$ref" run "$family" "$cfg" "$dir" "$threads" "$st" "$wu" 2>/dev/null |
      tail -n 1)
    echo "$family $cfg torch: $torch"
    results+=("$family $cfg" "$ours" "$torch")
  done
done
python3 - "$root/bench" "${results[@]}" <<'EOF2'
import json, sys
sys.path.insert(0, sys.argv[1])
import records
a = sys.argv[2:]
print(f"\n{'model':<15} {'ours tok/s':>11} {'torch tok/s':>12} {'ratio':>7} {'ours ms':>9} "
      f"{'torch ms':>9}   first-step loss ours | torch (rel diff)   last loss ours | torch")
for i in range(0, len(a), 3):
    name, o, r = a[i], json.loads(a[i + 1]), json.loads(a[i + 2])
    rel = abs(o['loss_first'] - r['loss_first']) / abs(r['loss_first'])
    records.emit("bench_vl_step.sh", name, 1, "cpu", "tokens_per_s", o["tokens_per_s"],
                 r["tokens_per_s"])
    print(f"{name:<15} {o['tokens_per_s']:>11.0f} {r['tokens_per_s']:>12.0f} "
          f"{o['tokens_per_s'] / r['tokens_per_s']:>6.2f}x {o['step_ms']:>9.1f} {r['step_ms']:>9.1f}"
          f"   {o['loss_first']:.6f} | {r['loss_first']:.6f} ({rel:.1e})"
          f"   {o['loss_last']:.4f} | {r['loss_last']:.4f}")
print("ratio = ours / torch tokens/s (median steps); the first-step losses must agree (same "
      "weights and batch)")
EOF2
