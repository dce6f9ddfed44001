#!/usr/bin/env bash
# `vlmtrain train` under mpirun equals one process (issues 13, 35), through the real command: the
# loader's share per rank, the global loss, FSDP / DDP / HSDP / TP / FSDP x TP, the gathered
# checkpoint.
#
# The same global batch: a rank's loader with 1 reader worker reads what global worker `rank`
# reads, so one process with W reader workers and W x k micro-steps of one row per step sees the
# rows that W ranks see with k micro-steps each (io/energon/sampler.h: global worker = rank x workers +
# worker; the loader takes rows round robin over its workers).
#
# Checked: every step's loss (metrics.jsonl) to 1e-6 and every tensor of the final checkpoint to
# 1e-5 (L2; TP: 5e-5) and 1e-3 (element), as tests/parallel/test_fsdp_equivalence_mpi.cpp and
# test_tensor_parallel_mpi.cpp explain; for the text
# demo (Qwen3) and the VLM demo (Qwen3-VL with images and packing).
#   tests/parallel/test_train_parallel.sh <path to vlmtrain>
set -euo pipefail
bin="$(cd "$(dirname "$1")" && pwd)/$(basename "$1")"
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
dir="$(mktemp -d)"
trap 'rm -rf "$dir"' EXIT
cd "$dir"
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
export OMPI_MCA_btl_vader_single_copy_mechanism=none OMP_NUM_THREADS=1
mpi() { mpirun -np "$1" --oversubscribe "${@:2}"; }

"$bin" data make-demo data --train 400 --val 20 >/dev/null
text=(--config "$root/configs/demo-text.toml" --set training.total_steps=12
  --set training.warmup_steps=3 --set training.micro_batch_rows=1 --set data.seq_len=128
  --set training.eval_steps=0 --set logging.log_every=4 --set data.data_path=data/
  --set model.tokenizer=data/)
vlm=(--set training.total_steps=6 --set training.warmup_steps=2 --set training.micro_batch_rows=1
  --set data.seq_len=128 --set training.eval_steps=0 --set training.caption_eval_images=0
  --set logging.log_every=3 --set data.data_path=data/ --set model.tokenizer=data/
  --set model.train_vit=true)

for demo in text vlm; do
  if [[ $demo == text ]]; then args=("${text[@]}"); else args=("${vlm[@]}"); fi
  echo "== $demo demo"
  # 2 ranks x 2 micro-steps = one process with 2 workers x 4 micro-steps
  "$bin" train "${args[@]}" --set data.num_workers=2 --set training.tpi_multiplier=4 \
    --set checkpoint.output_dir="$demo-one-2" >"$demo-one-2.log" 2>&1
  mpi 2 "$bin" train "${args[@]}" --set data.num_workers=1 --set training.tpi_multiplier=2 \
    --set parallel.data_parallel=fsdp --set checkpoint.output_dir="$demo-fsdp-2" \
    >"$demo-fsdp-2.log" 2>&1
  grep -q "dp_replicate 1 x dp_shard 2" "$demo-fsdp-2.log" || { cat "$demo-fsdp-2.log"; exit 1; }
  python3 "$root/tests/parallel/compare_runs.py" "$demo-fsdp-2" "$demo-one-2"
  mpi 2 "$bin" train "${args[@]}" --set data.num_workers=1 --set training.tpi_multiplier=2 \
    --set parallel.data_parallel=ddp --set checkpoint.output_dir="$demo-ddp-2" \
    >"$demo-ddp-2.log" 2>&1
  python3 "$root/tests/parallel/compare_runs.py" "$demo-ddp-2" "$demo-one-2"
  # 4 ranks x 1 micro-step = one process with 4 workers x 4 micro-steps: FSDP 4 and HSDP 2 x 2
  "$bin" train "${args[@]}" --set data.num_workers=4 --set training.tpi_multiplier=4 \
    --set checkpoint.output_dir="$demo-one-4" >"$demo-one-4.log" 2>&1
  mpi 4 "$bin" train "${args[@]}" --set data.num_workers=1 --set training.tpi_multiplier=1 \
    --set parallel.data_parallel=fsdp --set checkpoint.output_dir="$demo-fsdp-4" \
    >"$demo-fsdp-4.log" 2>&1
  python3 "$root/tests/parallel/compare_runs.py" "$demo-fsdp-4" "$demo-one-4"
  mpi 4 "$bin" train "${args[@]}" --set data.num_workers=1 --set training.tpi_multiplier=1 \
    --set parallel.data_parallel=fsdp --set parallel.dp_replicate=2 \
    --set checkpoint.output_dir="$demo-hsdp-4" >"$demo-hsdp-4.log" 2>&1
  grep -q "dp_replicate 2 x dp_shard 2" "$demo-hsdp-4.log" || { cat "$demo-hsdp-4.log"; exit 1; }
  python3 "$root/tests/parallel/compare_runs.py" "$demo-hsdp-4" "$demo-one-4"
  # Tensor parallelism (issue 35): TP 2 (one data-parallel rank) = one process with 1 worker x 2
  # micro-steps; FSDP 2 x TP 2 with sequence parallelism = one process with 2 workers x 4
  # micro-steps (TP peers read the same rows).
  "$bin" train "${args[@]}" --set data.num_workers=1 --set training.tpi_multiplier=2 \
    --set checkpoint.output_dir="$demo-one-1" >"$demo-one-1.log" 2>&1
  mpi 2 "$bin" train "${args[@]}" --set data.num_workers=1 --set training.tpi_multiplier=2 \
    --set parallel.tp_size=2 --set checkpoint.output_dir="$demo-tp-2" >"$demo-tp-2.log" 2>&1
  grep -q "dp_shard 1 x tp 2" "$demo-tp-2.log" || { cat "$demo-tp-2.log"; exit 1; }
  # The parameters to TP's bound, not FSDP's (tests/parallel/test_tensor_parallel_mpi.cpp says why).
  python3 "$root/tests/parallel/compare_runs.py" "$demo-tp-2" "$demo-one-1" --l2-tol 5e-5
  mpi 4 "$bin" train "${args[@]}" --set data.num_workers=1 --set training.tpi_multiplier=2 \
    --set parallel.tp_size=2 --set parallel.data_parallel=fsdp --set parallel.sequence_parallel=true \
    --set checkpoint.output_dir="$demo-fsdp-tp-4" >"$demo-fsdp-tp-4.log" 2>&1
  grep -q "dp_shard 2 x tp 2 (fsdp, sequence parallel)" "$demo-fsdp-tp-4.log" ||
    { cat "$demo-fsdp-tp-4.log"; exit 1; }
  python3 "$root/tests/parallel/compare_runs.py" "$demo-fsdp-tp-4" "$demo-one-2" --l2-tol 5e-5
  # The FSDP 2 x TP 2 checkpoint (each rank's boxes) exports the snapshot the run gathered, bit for
  # bit (the text demo trains in f32).
  if [[ $demo == text ]]; then
    "$bin" export --checkpoint "$demo-fsdp-tp-4/step_000012" --out "$demo-fsdp-tp-4-export" \
      --dtype f32 >/dev/null
    cmp "$demo-fsdp-tp-4-export/model.safetensors" "$demo-fsdp-tp-4/checkpoint-step-12/model.safetensors" ||
      { echo "FAIL: the FSDP x TP checkpoint exports another model than the run's snapshot"; exit 1; }
  fi
done

# Launch errors: a layout the job cannot have names the numbers.
if mpi 2 "$bin" train "${text[@]}" --set parallel.data_parallel=fsdp --set parallel.dp_shard=4 \
  >bad.log 2>&1; then
  echo "FAIL: dp_shard 4 on 2 ranks was accepted"
  exit 1
fi
grep -q "does not divide the 2 data-parallel ranks" bad.log || { cat bad.log; exit 1; }
# A split the model cannot take names the tensor and the numbers: 3 ranks share no head count.
if mpi 3 "$bin" train "${text[@]}" --set parallel.tp_size=3 >bad_tp.log 2>&1; then
  echo "FAIL: tp_size 3 was accepted"
  exit 1
fi
grep -q "tensor parallel: model.embed_tokens.weight: 512 .* do not split over tp = 3" bad_tp.log ||
  { cat bad_tp.log; exit 1; }
echo "train parallel: OK"
