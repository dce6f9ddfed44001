#!/usr/bin/env bash
# The cluster jobs (issue 36) on this machine: shellcheck, then jobs/mn5.sbatch and
# jobs/jupiter.sbatch through stand-ins for sbatch / srun / scontrol (tests/jobs/standin/), whose
# srun runs the ranks under mpirun: the config and --set values and the bindings reach srun, bad
# arguments are named, and the requeue path — SIGUSR1 to every rank during the run, a save, exit
# 75, `scontrol requeue`, the requeued job resuming from latest — ends with the same losses and
# checkpoint as an uninterrupted job.
#   tests/jobs/test_jobs.sh <path to vlmtrain>
set -euo pipefail
bin="$(cd "$(dirname "$1")" && pwd)/$(basename "$1")"
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
fail() { echo "FAIL: $*"; exit 1; }
# need FILE TEXT: FILE holds TEXT (need_line: as a whole line).
need() { grep -qF -- "$2" "$1" || { cat "$1"; fail "$1 has no '$2'"; }; }
need_line() { grep -qxF -- "$2" "$1" || { cat "$1"; fail "$1 has no line '$2'"; }; }
command -v shellcheck >/dev/null || fail "no shellcheck (tools/deps/install_deps.sh installs it)"
# From the root: the jobs' `source` directives name jobs/launch.sh.
(cd "$root" && shellcheck -x jobs/*.sbatch jobs/launch.sh tests/jobs/standin/* tests/jobs/test_jobs.sh)
echo "shellcheck: the jobs, their stand-ins and this test are clean"

dir="$(mktemp -d)"
trap 'rm -rf "$dir"' EXIT
cd "$dir"
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
export OMPI_MCA_btl_vader_single_copy_mechanism=none
export PATH="$root/tests/jobs/standin:$PATH" VLM_ROOT="$root" VLM_BIN="$bin"
export STANDIN_RANK_PATTERN="$bin train" STANDIN_CPUS_PER_TASK=1 STANDIN_STATE="$dir/state"
mkdir state
"$bin" data make-demo data --train 200 --val 10 >/dev/null
# The text demo on this data, 120 steps, a checkpoint every 40 (absolute paths: the job runs in the
# folder it was submitted from, like sbatch). The signal comes after step 6: the steps after it
# leave the stand-in's watcher (it polls every 0.2 s) seconds to deliver it before the run could
# end on its own (12 steps were too few on an idle machine).
run=("$root/configs/demo-text.toml" --set data.data_path="$dir/data/"
  --set model.tokenizer="$dir/data/" --set training.total_steps=120 --set training.warmup_steps=2
  --set checkpoint.save_steps=40 --set training.eval_steps=0 --set logging.log_every=1)

# Arguments: none, a missing config.
if sbatch "$root/jobs/mn5.sbatch" >none.log 2>&1; then fail "a job without a config ran"; fi
need none.log "usage: sbatch jobs/<site>.sbatch CONFIG.toml"
if sbatch "$root/jobs/mn5.sbatch" missing.toml >missing.log 2>&1; then fail "missing config ran"; fi
need missing.log "config 'missing.toml' not found"

# Uninterrupted, on MN5's 4 ranks per node.
: >state/log
sbatch "$root/jobs/mn5.sbatch" "${run[@]}" --set checkpoint.output_dir="$dir/straight" \
  >straight.log 2>&1 || { cat straight.log; fail "the uninterrupted job failed"; }
# The bindings, the config, then the resume and the --set values in order.
need state/log "srun --cpu-bind=cores --mem-bind=local $bin train --config $root/configs/demo-text.toml --set checkpoint.resume=latest --set data.data_path=$dir/data/"
need straight.log "parallel: dp_replicate 4 x dp_shard 1 x tp 1"

# Interrupted: SIGUSR1 to every rank once 6 steps are in metrics.jsonl; the job saves, exits 75,
# requeues itself, and the second run resumes from latest.
: >state/log
STANDIN_SIGNAL_WHEN="$dir/requeued/metrics.jsonl:6" sbatch "$root/jobs/mn5.sbatch" "${run[@]}" \
  --set checkpoint.output_dir="$dir/requeued" >requeued.log 2>&1 ||
  { cat requeued.log; fail "the requeued job failed"; }
need_line state/log "run 0: exit 75"
need_line state/log "scontrol requeue 4242"
need_line state/log "run 1: exit 0"
need requeued.log "stopped before the time limit with a checkpoint saved; requeueing"
need requeued.log "job 4242 (restart 1)"
need requeued.log "resume: from $dir/requeued/step_"
/usr/bin/python3 "$root/tests/train/compare_checkpoints.py" requeued straight --metrics # Debian's, with h5py

# JUPITER's script: the same launch, its own bindings (2 steps).
: >state/log
sbatch "$root/jobs/jupiter.sbatch" "${run[@]}" --set training.total_steps=2 \
  --set training.warmup_steps=0 --set checkpoint.output_dir="$dir/jupiter" >jupiter.log 2>&1 ||
  { cat jupiter.log; fail "the JUPITER job failed"; }
need state/log "srun --cpu-bind=cores --mem-bind=local $bin train"
# The benchmark launcher: one records file over a sweep of node counts (`sbatch --nodes=2`: two
# "nodes" of 4 ranks, all on this machine).
benches="$(dirname "$bin")/bench"
sweep="the benchmark sweep's one records file"
if [[ ! -x $benches/bench_collectives ]]; then
  sweep="no benchmarks in this build (-DVLM_BUILD_BENCH=OFF): the sweep is not checked here"
  echo "jobs: $sweep"
else
  : >state/log
  sbatch --nodes=2 "$root/jobs/mn5.sbatch" bench --out "$dir/sweep.jsonl" bench_collectives \
    --max-mib 1 --iters 2 >sweep.log 2>&1 || { cat sweep.log; fail "the benchmark sweep failed"; }
  need state/log "srun --cpu-bind=cores --mem-bind=local --nodes=1 --ntasks=4 $benches/bench_collectives --max-mib 1 --iters 2"
  need state/log "srun --cpu-bind=cores --mem-bind=local --nodes=2 --ntasks=8 $benches/bench_collectives"
  need sweep.log "records of bench_collectives on 1,2 node(s) in $dir/sweep.jsonl"
  python3 - "$dir/sweep.jsonl" <<'PY' || fail "the sweep's records file"
import json, sys
meshes = {json.loads(l)["mesh"] for l in open(sys.argv[1]) if l.strip()}
assert meshes == {"4 ranks", "8 ranks"}, meshes
PY
  if sbatch "$root/jobs/mn5.sbatch" bench >bench_usage.log 2>&1; then fail "bench without a benchmark ran"; fi
  need bench_usage.log "usage: sbatch --nodes=N jobs/<site>.sbatch bench"
  if sbatch --nodes=2 "$root/jobs/mn5.sbatch" bench --nodes 1,4 bench_collectives >bench_nodes.log 2>&1; then
    fail "a sweep beyond the allocation ran"
  fi
  need bench_nodes.log "--nodes 1,4 asks for 4 of the job's 2 nodes"
fi

# Makefile.hpc builds with the modules each job loads.
for site in mn5 jupiter; do
  # shellcheck disable=SC2016 # the ${...} is the job's text, matched literally
  want="module load $(sed -n 's/^VLM_MODULES="${VLM_MODULES-\(.*\)}"$/\1/p' "$root/jobs/$site.sbatch")"
  [[ $want != "module load " && $(make -s -C "$root" -f Makefile.hpc SYSTEM=$site modules) == "$want" ]] ||
    fail "Makefile.hpc SYSTEM=$site does not load the modules of jobs/$site.sbatch"
done
echo "jobs: shellcheck, arguments, bindings, SIGUSR1 -> save -> exit 75 -> requeue -> resume =" \
  "uninterrupted; $sweep"
