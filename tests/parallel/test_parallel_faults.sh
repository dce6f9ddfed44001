#!/usr/bin/env bash
# A failing rank ends the whole job, non-zero, within 60 s (issue 13), through the real command:
# `vlmtrain train --inject-fault KIND:1:3` under mpirun -np 2 fails rank 1 in the middle of step 3
# (after its first forward, while rank 0 waits in the step's collectives):
#   error  an exception: rank 1 prints it and calls MPI_Abort, which ends rank 0;
#   crash  abort() (SIGABRT): mpirun sees a rank die and ends the others;
#   hang   rank 1 sleeps forever: rank 0's collective watchdog (parallel.collective_timeout_s = 5)
#          ends rank 0 with an error naming the collective, and mpirun then ends rank 1.
#   tests/parallel/test_parallel_faults.sh <path to vlmtrain>
set -euo pipefail
bin="$(cd "$(dirname "$1")" && pwd)/$(basename "$1")"
dir="$(mktemp -d)"
trap 'rm -rf "$dir"' EXIT
cd "$dir"
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
export OMPI_MCA_btl_vader_single_copy_mechanism=none OMP_NUM_THREADS=1
ulimit -c 0 # no core file from the injected crash
fail() {
  echo "FAIL: $*"
  exit 1
}

"$bin" data make-demo data --train 200 --val 20 >/dev/null
args=(--set data.data_path=data/ --set model.tokenizer=data/ --set training.total_steps=20
  --set data.seq_len=128 --set training.micro_batch_rows=1 --set training.eval_steps=0
  --set training.caption_eval_images=0 --set parallel.data_parallel=fsdp
  --set parallel.collective_timeout_s=5)

for kind in error crash hang; do
  start=$(date +%s)
  set +e
  timeout 120 mpirun -np 2 --oversubscribe "$bin" train "${args[@]}" \
    --set checkpoint.output_dir="out_$kind" --inject-fault "$kind:1:3" >"$kind.log" 2>&1
  rc=$?
  set -e
  took=$(($(date +%s) - start))
  echo "--inject-fault $kind:1:3: exit code $rc after ${took}s"
  ((rc != 0)) || fail "$kind: the job exited 0"
  ((rc != 124)) || { cat "$kind.log"; fail "$kind: the job hung (killed by timeout after 120 s)"; }
  ((took < 60)) || { cat "$kind.log"; fail "$kind: the job took ${took}s to end (limit 60 s)"; }
  grep -q "\[rank 1/2\] injected fault at step 3" "$kind.log" || { cat "$kind.log"; fail "$kind: no injection"; }
  case $kind in
  error) want="\[rank 1/2\] error: train step 3: injected error on rank 1" ;;
  crash) want="signal 6" ;;
  hang) want="\[rank 0/2\] error: .* did not finish within 5 s" ;;
  esac
  grep -Eq "$want" "$kind.log" || { cat "$kind.log"; fail "$kind: expected '$want' in the output"; }
done
echo "parallel faults: OK"
