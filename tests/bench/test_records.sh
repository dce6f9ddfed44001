#!/usr/bin/env bash
# Every benchmark prints the common record (bench/record.h, bench/records.py): each C++ benchmark
# this build has runs once on a small problem with VLM_BENCH_RECORDS set, and every line of the
# file must be a record with the nine fields, of the right types, naming that benchmark, with
# ratio = value / reference; the same lines must reach stdout. bench_gpu_ops (CUDA) and
# bench_vl_step (needs a transformers snapshot) are not run here: the first needs a GPU
# (tools/gpu/gpu_check.sh), the second emits through the same emit_step_records as
# bench_train_step and bench_gpu_step. The scripts' paired records (bench_*.sh, with torch) go
# through bench/records.py, checked here on its own.
#   tests/bench/test_records.sh <build dir> <tokenizer dir>
set -euo pipefail
build="$1"
tok="$2"
root="$(cd "$(dirname "$0")/../.." && pwd)"
dir="$(mktemp -d)"
trap 'rm -rf "$dir"' EXIT
fail() { echo "FAIL: $*"; exit 1; }
export OMP_NUM_THREADS=1 OMPI_MCA_btl_vader_single_copy_mechanism=none
if ((EUID == 0)); then export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1; fi

# check BENCHMARK OUT: the records file holds only that benchmark's records, well formed, and
# stdout (OUT) printed the same lines.
check() {
  python3 - "$1" "$dir/records.jsonl" "$2" <<'PY' || fail "records of $1 (above)"
import json, math, sys
name, path, out = sys.argv[1:]
lines = [l for l in open(path).read().splitlines() if l]
assert lines, f"{name}: no record in VLM_BENCH_RECORDS"
fields = ["benchmark", "case", "mesh", "device", "metric", "value", "reference", "ratio", "commit"]
for l in lines:
    r = json.loads(l)
    assert list(r) == fields, f"{name}: fields {list(r)}"
    assert r["benchmark"] == name, f"{name}: record of {r['benchmark']}"
    for k in ("case", "mesh", "device", "metric", "commit"):
        assert isinstance(r[k], str) and r[k], f"{name}: empty {k}: {l}"
    assert isinstance(r["value"], (int, float)) and math.isfinite(r["value"]), l
    if r["reference"] is None:
        assert r["ratio"] is None, l
    elif r["reference"] != 0:
        assert abs(r["ratio"] - r["value"] / r["reference"]) <= 1e-12 * abs(r["ratio"]), l
stdout = set(open(out).read().splitlines())
missing = [l for l in lines if l not in stdout]
assert not missing, f"{name}: records not printed to stdout: {missing[:2]}"
print(f"{name}: {len(lines)} records ok")
PY
}
run() { # run BENCHMARK COMMAND...
  local name="$1"
  shift
  : >"$dir/records.jsonl"
  VLM_BENCH_RECORDS="$dir/records.jsonl" "$@" >"$dir/out.txt" 2>&1 ||
    { cat "$dir/out.txt"; fail "$name failed"; }
  check "$name" "$dir/out.txt"
}
b="$build/bench"
mpi=(mpirun -np 2 --oversubscribe)
run bench_ops_cpu "$b/bench_ops_cpu" --quick
run bench_gated_delta "$b/bench_gated_delta" --quick --reps 1
printf 'Hello world, a small corpus.\nThe second line of it.\n' >"$dir/corpus.txt"
run bench_tokenizer "$b/bench_tokenizer" --tokenizer "$tok" --corpus "$dir/corpus.txt" --reps 1
run bench_loader "$b/bench_loader" --tokenizer "$tok" --samples 8 --seq-len 1024
run bench_train_step "$b/bench_train_step" --hidden 64 --layers 2 --heads 4 --kv-heads 2 \
  --head-dim 16 --ffn 128 --vocab 512 --seq 64 --docs 2 --steps 2 --warmup 1
run bench_gpu_step "$b/bench_gpu_step" --preset tiny --device cpu --steps 2 --warmup 1 --seq-len 64
# The single-device step benchmarks on a training config instead (the trainer's code): the main
# job's tiny Qwen3-VL with selective checkpointing, the Qwen3.5 demo in bf16 with full.
run bench_train_step "$b/bench_train_step" --config "$root/configs/demo.toml" \
  --set model.tokenizer="$tok" --set data.data_path="$dir" --set data.seq_len=96 \
  --set training.ac_mode=selective --docs 3 --steps 2 --warmup 1
grep -q '"case":"[^"]*demo.toml (qwen3_vl), seq 96, f32, ac selective"' "$dir/records.jsonl" ||
  fail "bench_train_step --config: the records do not name the config's step"
run bench_gpu_step "$b/bench_gpu_step" --config "$root/configs/demo-qwen3.5.toml" --device cpu \
  --set model.tokenizer="$tok" --set data.data_path="$dir" --set data.seq_len=48 \
  --set training.ac_mode=full --set training.param_dtype=bf16 --rows 2 --steps 2 --warmup 1
grep -q '"case":"[^"]*demo-qwen3.5.toml (qwen3_5), 2 x 48 tokens, ac full"' "$dir/records.jsonl" ||
  fail "bench_gpu_step --config: the records do not name the config's step"
grep -q '"dtype":"bf16"' "$dir/out.txt" || fail "bench_gpu_step --config: not the config's bf16"
# An option the config stands in for is refused beside it, naming both.
"$b/bench_train_step" --config "$root/configs/demo.toml" --seq 64 >"$dir/out.txt" 2>&1 &&
  fail "bench_train_step --config with --seq ran"
grep -q -- "--seq excludes --config" "$dir/out.txt" ||
  { cat "$dir/out.txt"; fail "bench_train_step --config --seq: the error does not name both"; }
run bench_collectives "${mpi[@]}" "$b/bench_collectives" --max-mib 1 --iters 2
[[ -x $b/bench_checkpoint ]] &&
  run bench_checkpoint "${mpi[@]}" "$b/bench_checkpoint" --mib 4 --tensors 4 --iters 1 --dir "$dir"
run bench_fsdp_step "${mpi[@]}" "$b/bench_fsdp_step" --tp 2 --layout ddp --hidden 64 --layers 2 \
  --head-dim 16 --ffn 128 --vocab 512 --seq 64 --steps 2 --warmup 1
grep -q '"metric":"tp_bytes"' "$dir/records.jsonl" || fail "bench_fsdp_step --tp 2: no tp_bytes record"
# A training config's step instead (the trainer's code): the tiny Qwen3.5 demo on the real Qwen3
# tokenizer, TP 2 with sequence parallelism and full checkpointing from --set.
run bench_fsdp_step "${mpi[@]}" "$b/bench_fsdp_step" --config "$root/configs/demo-qwen3.5.toml" \
  --set model.tokenizer="$tok" --set data.data_path="$dir" --set data.seq_len=64 \
  --set parallel.tp_size=2 --set parallel.sequence_parallel=true --set training.ac_mode=full \
  --steps 2 --warmup 1
grep -q '"case":"[^"]*demo-qwen3.5.toml (qwen3_5), ac full, 64 tokens per rank, [a-z0-9]*, sequence parallel' \
  "$dir/records.jsonl" || fail "bench_fsdp_step --config: the records do not name the config's step"
# The scripts' side: bench/records.py writes the same record.
run bench_x.sh python3 -c "import sys; sys.path.insert(0, '$root/bench'); import records
records.emit('bench_x.sh', 'a case', 1, 'cpu', 'tokens_per_s', 3.0, 2.0)"
grep -q '"ratio": 1.5' "$dir/records.jsonl" || fail "records.py: ratio not value / reference"
echo "every benchmark run here prints well-formed common records"
