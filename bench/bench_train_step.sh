#!/usr/bin/env bash
# One training step on CPU (forward + backward + grad clipping + AdamW) against PyTorch eager
# (issue 4): our TrainStepper (bench_train_step) and transformers' Qwen3ForCausalLM
# (attn_implementation "sdpa", fp32, torch.optim.AdamW(fused=False), clip_grad_norm_) on the same
# model shape and the same packed batch, with the same thread count, for two configs:
#   tiny   T1 of qwen-models.md §8: H 64, L 2, Hq 4, Hkv 2, D 32, I 128, vocab 512, seq 256, 3 docs
#   small       H 512, L 8, Hq 8, Hkv 4, D 64, I 1536, vocab 32000, seq 1024, 4 docs
#   small-1doc  the same, seq 1024 in one document (attention over 1024 keys)
#   long        the same, seq 4096 in one document (attention dominates: issue 15)
# Each side reports the median step time over K timed steps after W warm-up steps; the table gives
# tokens/s of both and ours / torch (target >= 1.0, goal 2.0).
#
# Both sides: random init (normal(0, 0.02), norms 1 — each its own RNG, so the losses agree only
# to about ln(vocab) at the start), fp32, one packed row of S tokens in N equal documents (ids
# from the LCG of bench_train_step.cpp, position ids restarting per document, -100 on each
# document's first label), loss = sum of token cross-entropies / number of targets, AdamW (lr
# 1e-3, betas 0.9/0.999, eps 1e-8, weight decay 0.01 on projection weights, none on norms and
# embeddings), clipping to 1.0, no activation checkpointing. Torch runs the packed row as one
# sequence with packed position_ids (transformers 5 splits it into documents when use_cache=False,
# tools/golden/gen_qwen3.py); the script checks once per config that this equals the documents
# run separately.
#
# Usage: bench/bench_train_step.sh [build_dir]   (default: build; needs bench/bench_train_step)
#   THREADS        threads of both sides (OMP_NUM_THREADS, torch.set_num_threads); default nproc
#   TINY_STEPS, TINY_WARMUP, SMALL_STEPS, SMALL_WARMUP   timed / warm-up steps (20, 3, 3, 1;
#                  the SMALL ones for small, small-1doc and long)
#   CONFIGS        "tiny small small-1doc long" (default) or a subset
# The torch side is skipped, with a message, when torch or transformers cannot be imported
# (pip install torch transformers).
set -euo pipefail

root=$(cd "$(dirname "$0")/.." && pwd)
build=${1:-$root/build}
bin=$build/bench/bench_train_step
[[ -x $bin ]] || { echo "bench_train_step: $bin not built (cmake -DVLM_BUILD_BENCH=ON)" >&2; exit 1; }
threads=${THREADS:-$(nproc)}
export OMP_NUM_THREADS=$threads OPENBLAS_NUM_THREADS=$threads MKL_NUM_THREADS=$threads

declare -A shape=(
  [tiny]="--hidden 64 --layers 2 --heads 4 --kv-heads 2 --head-dim 32 --ffn 128 --vocab 512 --seq 256 --docs 3"
  [small]="--hidden 512 --layers 8 --heads 8 --kv-heads 4 --head-dim 64 --ffn 1536 --vocab 32000 --seq 1024 --docs 4"
  [small-1doc]="--hidden 512 --layers 8 --heads 8 --kv-heads 4 --head-dim 64 --ffn 1536 --vocab 32000 --seq 1024 --docs 1"
  [long]="--hidden 512 --layers 8 --heads 8 --kv-heads 4 --head-dim 64 --ffn 1536 --vocab 32000 --seq 4096 --docs 1"
)
declare -A runs=(
  [tiny]="--steps ${TINY_STEPS:-20} --warmup ${TINY_WARMUP:-3}"
  [small]="--steps ${SMALL_STEPS:-3} --warmup ${SMALL_WARMUP:-1}"
  [small-1doc]="--steps ${SMALL_STEPS:-3} --warmup ${SMALL_WARMUP:-1}"
  [long]="--steps ${SMALL_STEPS:-3} --warmup ${SMALL_WARMUP:-1}"
)

tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
cat >"$tmp/ref.py" <<'EOF'
import json, sys, time
args = sys.argv[1:]
opt = {args[i].lstrip("-").replace("-", "_"): args[i + 1] for i in range(0, len(args), 2)}
try:
    import torch
    import transformers
    from transformers import Qwen3Config, Qwen3ForCausalLM
except ImportError:
    print(json.dumps({"impl": "torch", "skipped": "torch: skipped (pip install torch transformers)"}))
    sys.exit(0)
n = {k: int(v) for k, v in opt.items() if k != "dtype"}
threads = n.pop("threads")
torch.set_num_threads(threads)
torch.manual_seed(0)
S, N, V = n["seq"], n["docs"], n["vocab"]
cfg = Qwen3Config(
    vocab_size=V, hidden_size=n["hidden"], intermediate_size=n["ffn"],
    num_hidden_layers=n["layers"], num_attention_heads=n["heads"],
    num_key_value_heads=n["kv_heads"], head_dim=n["head_dim"], rms_norm_eps=1e-6,
    rope_parameters={"rope_type": "default", "rope_theta": 1e6},
    max_position_embeddings=max(4096, S), tie_word_embeddings=False, attention_bias=False,
    initializer_range=0.02, hidden_act="silu", use_cache=False)
model = Qwen3ForCausalLM._from_config(cfg, attn_implementation="sdpa", dtype=torch.float32)
model = model.float().train()

# The batch of bench_train_step.cpp.
ids, x = [], 1
for _ in range(S):
    x = (x * 6364136223846793005 + 1442695040888963407) % 2**64
    ids.append((x >> 33) % V)
cu = [0] + [S if d + 1 == N else (d + 1) * (S // N) for d in range(N)]
labels = list(ids)
pos = []
for a, b in zip(cu[:-1], cu[1:]):
    labels[a] = -100
    pos += list(range(b - a))
input_ids = torch.tensor(ids)[None]
position_ids = torch.tensor(pos)[None]
targets = torch.tensor(labels[1:] + [-100])
num_targets = int((targets != -100).sum())

def loss_sum():
    logits = model(input_ids=input_ids, position_ids=position_ids, use_cache=False).logits[0]
    return torch.nn.functional.cross_entropy(logits.float(), targets, ignore_index=-100,
                                             reduction="sum")

# The packed row must be the documents run separately (no attention across documents).
with torch.no_grad():
    packed = float(loss_sum())
    separate = 0.0
    for a, b in zip(cu[:-1], cu[1:]):
        lg = model(input_ids=input_ids[:, a:b], position_ids=position_ids[:, a:b],
                   use_cache=False).logits[0]
        separate += float(torch.nn.functional.cross_entropy(lg.float(), targets[a:b],
                                                            ignore_index=-100, reduction="sum"))
if abs(packed - separate) > 1e-4 * abs(separate):
    sys.exit(f"torch reference: the packed row ({packed}) differs from the documents run "
             f"separately ({separate}): packed position_ids not honoured by transformers "
             f"{transformers.__version__}")

decay, no_decay = [], []
for name, p in model.named_parameters():
    (no_decay if name.endswith("norm.weight") or "embed_tokens" in name else decay).append(p)
optim = torch.optim.AdamW([{"params": decay, "weight_decay": 0.01},
                           {"params": no_decay, "weight_decay": 0.0}],
                          lr=1e-3, betas=(0.9, 0.999), eps=1e-8, fused=False)
losses, ms = [], []
for s in range(n["warmup"] + n["steps"]):
    t0 = time.perf_counter()
    l = loss_sum()
    (l / num_targets).backward()
    torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
    optim.step()
    optim.zero_grad(set_to_none=True)
    t1 = time.perf_counter()
    losses.append(float(l.detach()) / num_targets)
    if s >= n["warmup"]:
        ms.append((t1 - t0) * 1e3)
ms_sorted = sorted(ms)
k = len(ms_sorted)
med = ms_sorted[k // 2] if k % 2 else 0.5 * (ms_sorted[k // 2 - 1] + ms_sorted[k // 2])
print(json.dumps({"impl": "torch", "torch": torch.__version__,
                  "transformers": transformers.__version__, "tokens_per_s": S / (med / 1e3),
                  "step_ms": med, "step_ms_min": ms_sorted[0],
                  "threads": torch.get_num_threads(), "loss_first": losses[0],
                  "loss_last": losses[-1]}))
EOF

echo "threads: $threads (OMP_NUM_THREADS, torch.set_num_threads); $(nproc) cores, load $(cut -d' ' -f1-3 /proc/loadavg)"
# The GEMM kernels OpenBLAS uses (most of our step): detected from the CPU unless the environment
# sets OPENBLAS_CORETYPE (e.g. Haswell = AVX2 kernels on an AVX-512 CPU, ~1.45x slower GEMMs here),
# while torch's MKL picks its own. Printed so that runs on different machines can be compared.
blas=$(ldd "$bin" | awk '/openblas/ {print $3; exit}')
if [[ -n $blas ]]; then
  core=$(python3 -c 'import ctypes, sys
lib = ctypes.CDLL(sys.argv[1]); lib.openblas_get_corename.restype = ctypes.c_char_p
print(lib.openblas_get_corename().decode())' "$blas" 2>/dev/null || echo "?")
  echo "openblas: $blas, core $core${OPENBLAS_CORETYPE:+ (OPENBLAS_CORETYPE=$OPENBLAS_CORETYPE)}"
fi
results=()
for cfg in ${CONFIGS:-tiny small small-1doc long}; do
  # shellcheck disable=SC2086
  ours=$("$bin" ${shape[$cfg]} ${runs[$cfg]} | tail -n 1) # its JSON line (the records come first)
  echo "$cfg ours:  $ours"
  # shellcheck disable=SC2086
  ref=$(python3 "$tmp/ref.py" ${shape[$cfg]} ${runs[$cfg]} --threads "$threads")
  echo "$cfg torch: $ref"
  results+=("$cfg" "$ours" "$ref")
done

python3 - "$root/bench" "${results[@]}" <<'EOF'
import json, sys
sys.path.insert(0, sys.argv[1])
import records
a = sys.argv[2:]
print()
print(f"{'config':<10} {'ours tok/s':>12} {'torch tok/s':>12} {'ratio':>7}   "
      f"{'ours ms':>9} {'torch ms':>9} {'best-step ratio':>16}   loss first -> last (ours | torch)")
skipped = None
for i in range(0, len(a), 3):
    cfg, ours, ref = a[i], json.loads(a[i + 1]), json.loads(a[i + 2])
    if "skipped" in ref:
        skipped = ref["skipped"]
        print(f"{cfg:<10} {ours['tokens_per_s']:>12.0f} {'-':>12} {'-':>7}   "
              f"{ours['step_ms']:>9.1f} {'-':>9} {'-':>16}   "
              f"{ours['loss_first']:.3f} -> {ours['loss_last']:.3f}")
        continue
    ratio = ours["tokens_per_s"] / ref["tokens_per_s"]
    records.emit("bench_train_step.sh", cfg, 1, "cpu", "tokens_per_s", ours["tokens_per_s"],
                 ref["tokens_per_s"])
    print(f"{cfg:<10} {ours['tokens_per_s']:>12.0f} {ref['tokens_per_s']:>12.0f} {ratio:>6.2f}x   "
          f"{ours['step_ms']:>9.1f} {ref['step_ms']:>9.1f} "
          f"{ref['step_ms_min'] / ours['step_ms_min']:>15.2f}x   "
          f"{ours['loss_first']:.3f} -> {ours['loss_last']:.3f} | "
          f"{ref['loss_first']:.3f} -> {ref['loss_last']:.3f}")
if skipped:
    print(skipped)
else:
    print("ratio = ours / torch tokens/s, median steps (target >= 1.0, goal 2.0); best-step "
          "ratio: the fastest step of each side (less sensitive to a loaded machine)")
EOF
