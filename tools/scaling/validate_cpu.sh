#!/usr/bin/env bash
# The scaling model's validation on this machine's CPU (SCALABILITY.md): measures the model's
# inputs — bench_collectives on 2 and 4 ranks (collective times by size), bench_fsdp_step on one
# rank (the compute), bench_ops_cpu's GEMM rate (the share of it tensor parallelism divides) —
# and the steps it predicts — bench_fsdp_step on 2 and 4 ranks as FSDP, HSDP, DDP and
# tensor-parallel layouts — into one file of benchmark records, then compares
# (scaling_model.py validate: within 20%).
#   tools/scaling/validate_cpu.sh [build_dir (build)] [records file (a temporary one)]
# One thread per rank; 4 ranks on fewer cores share them (the model counts that).
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
build="${1:-$root/build}"
records="${2:-$(mktemp --suffix=.jsonl)}"
for b in bench_collectives bench_fsdp_step bench_ops_cpu; do
  [[ -x $build/bench/$b ]] || {
    echo "validate_cpu: $build/bench/$b not built (cmake -DVLM_BUILD_BENCH=ON)" >&2
    exit 1
  }
done
: >"$records"
cores=$(nproc) # before OMP_NUM_THREADS, which nproc honours
export VLM_BENCH_RECORDS="$records" OMP_NUM_THREADS=1 OPENBLAS_NUM_THREADS=1
export OMPI_MCA_btl_vader_single_copy_mechanism=none # containers deny the CMA single copy
if ((EUID == 0)); then export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1; fi
run() { # run NP BENCH ARGS...
  local np="$1" bench="$2"
  shift 2
  echo "== mpirun -np $np $bench $*"
  mpirun -np "$np" --oversubscribe "$build/bench/$bench" "$@" | grep -v '^{"benchmark"'
}
start=$SECONDS
for np in 2 4; do run "$np" bench_collectives --max-mib 16 --iters 10; done
step=(--steps 6 --warmup 2) # the bench's model: hidden 256 x 4 layers, vocab 8192, 512 tokens
run 1 bench_ops_cpu --quick # the GEMM rate (linear f32) that splits the compute
run 1 bench_fsdp_step "${step[@]}"
for layout in fsdp ddp; do run 2 bench_fsdp_step "${step[@]}" --layout "$layout"; done
run 2 bench_fsdp_step "${step[@]}" --layout ddp --tp 2
for layout in fsdp hsdp ddp; do run 4 bench_fsdp_step "${step[@]}" --layout "$layout"; done
run 4 bench_fsdp_step "${step[@]}" --layout fsdp --tp 2
run 4 bench_fsdp_step "${step[@]}" --layout ddp --tp 4
echo "measured in $((SECONDS - start)) s; records: $records"
echo
python3 "$root/tools/scaling/scaling_model.py" validate "$records" --cores "$cores"
