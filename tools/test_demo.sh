#!/usr/bin/env bash
# The main job as a test: `vlmtrain train` with no --config creates the demo dataset on its first
# run and trains the tiny Qwen3 on it; the loss falls; the same config gives bit-identical losses
# in metrics.jsonl; activation checkpointing (full, selective) changes nothing numerically; the
# final checkpoint is an HF snapshot that `vlmtrain export` re-exports; the LM head fused with the
# loss in vocabulary chunks (training.loss_vocab_chunk) trains the same; a device that is not
# there is refused before training starts.
#   tools/test_demo.sh <path to vlmtrain>
# Runs share one thread count: OpenBLAS's summation order depends on it (our own kernels do not).
set -euo pipefail
bin="$(cd "$(dirname "$1")" && pwd)/$(basename "$1")"
root="$(cd "$(dirname "$0")/.." && pwd)"
dir="$(mktemp -d)"
trap 'rm -rf "$dir"' EXIT
cd "$dir"
fail() { echo "FAIL: $*"; exit 1; }
run() {
  local name=$1
  shift
  "$bin" train --set training.total_steps=60 --set training.warmup_steps=5 \
    --set training.eval_steps=30 --set training.eval_batches=2 --set logging.log_every=10 \
    --set "checkpoint.output_dir=out_$name" "$@" >"log_$name.txt" 2>&1 ||
    { cat "log_$name.txt"; fail "run $name failed"; }
}
run a --require-loss-drop 0.7
[[ -d demo_data/.nv-meta ]] || fail "the first run did not create demo_data/"
run b
run full --set training.ac_mode=full
run selective --set training.ac_mode=selective
run chunked --set training.loss_vocab_chunk=100
if "$bin" train --set training.device=cuda:7 >log_device.txt 2>&1; then
  fail "training.device = cuda:7 was accepted"
fi
grep -q 'training.device = cuda:7 is not available' log_device.txt ||
  { cat log_device.txt; fail "no clear error for a missing device"; }
losses() { grep -o '"loss":[^,]*' "out_$1/metrics.jsonl"; }
[[ $(losses a | wc -l) -eq 60 ]] || fail "expected 60 step records in out_a/metrics.jsonl"
grep -q '"eval_loss"' out_a/metrics.jsonl || fail "no evaluation record"
diff <(losses a) <(losses b) >/dev/null || fail "the same config gave different losses"
diff <(losses a) <(losses full) >/dev/null || fail "ac_mode = full changed the losses"
diff <(losses a) <(losses selective) >/dev/null || fail "ac_mode = selective changed the losses"
# f32 logsumexp over chunks sums in another order: close, not bit-identical (observed < 1e-7).
paste -d' ' <(losses a | cut -d: -f2) <(losses chunked | cut -d: -f2) | awk '
  { d = $1 - $2; if (d < 0) d = -d; r = d / $1; if (r > worst) worst = r }
  END { if (worst > 1e-3) { print "worst relative loss difference " worst; exit 1 } }' ||
  fail "training.loss_vocab_chunk = 100 changed the losses"
ckpt=out_a/checkpoint-step-60
for f in config.json model.safetensors tokenizer.json; do
  [[ -s $ckpt/$f ]] || fail "checkpoint $ckpt lacks $f"
done
"$bin" export --checkpoint "$ckpt" --out exported --dtype f32 >/dev/null
cmp "$ckpt/model.safetensors" exported/model.safetensors >/dev/null ||
  fail "export of an f32 checkpoint changed the weights"
grep -q "train done" log_a.txt || fail "no run summary"
# The VLM demo's path (configs/demo-vl.toml), short: images through the loader, the tower and
# the caption accuracy (its figure after the full run is in the config's header).
"$bin" train --config "$root/configs/demo-vl.toml" --set training.total_steps=30 \
  --set training.eval_steps=15 --set training.caption_eval_images=5 --set logging.log_every=10 \
  --set checkpoint.output_dir=out_vl --require-loss-drop 0.7 >log_vl.txt 2>&1 ||
  { cat log_vl.txt; fail "the VLM demo config failed"; }
grep -q "caption accuracy on 5 held-out images" log_vl.txt || { cat log_vl.txt; fail "no caption accuracy"; }
[[ -s out_vl/checkpoint-step-30/model.safetensors ]] || fail "the VLM demo wrote no checkpoint"
echo "demo: loss falls, reruns bit-identical, activation checkpointing changes nothing," \
  "chunked loss agrees, missing device refused, export ok, the VLM demo config trains"
