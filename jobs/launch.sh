# shellcheck shell=bash
# The part of every cluster job that is not the site's (sourced by jobs/<site>.sbatch after its
# #SBATCH lines and site settings): one `vlmtrain train` rank per GPU through srun, and the
# requeue. `#SBATCH --signal=USR1@<s>` has Slurm send SIGUSR1 to every rank <s> seconds before the
# time limit; the trainer finishes its step on every rank, saves step_N/, and exits with 75; this
# script then requeues the job, and the requeued job resumes from output_dir/latest (the run
# always starts with checkpoint.resume = "latest", which starts fresh when there is none yet).
#
# The site script sets: VLM_ROOT (the checkout), VLM_BIN (vlmtrain), VLM_MODULES (module names,
# may be empty), VLM_SRUN_ARGS (an array: CPU / memory binding) and exports its environment.
# Arguments: CONFIG.toml [--set key=value ...] (later --set win, so a user's checkpoint.resume
# does too), or `bench ...`: a benchmark over a sweep of node counts (vlm_bench_sweep).

vlm_load_modules() {
  [[ -n ${VLM_MODULES:-} ]] || return 0
  if ! type module >/dev/null 2>&1; then
    echo "$SLURM_JOB_NAME: no 'module' command on this node; not loading: $VLM_MODULES" >&2
    return 0
  fi
  # shellcheck disable=SC2086 # a list of module names
  module load $VLM_MODULES
}

vlm_launch() {
  local config="${1:-}"
  if [[ -z $config || $config == --* ]]; then
    echo "usage: sbatch jobs/<site>.sbatch CONFIG.toml [--set key=value ...]" >&2
    return 2
  fi
  shift
  [[ -f $config ]] || {
    echo "$SLURM_JOB_NAME: config '$config' not found (relative to $PWD)" >&2
    return 2
  }
  [[ -x $VLM_BIN ]] || {
    echo "$SLURM_JOB_NAME: $VLM_BIN is not built (make -f Makefile.hpc, or set VLM_BIN)" >&2
    return 2
  }
  echo "job $SLURM_JOB_ID (restart ${SLURM_RESTART_COUNT:-0}): ${SLURM_NNODES} node(s) x" \
    "${SLURM_NTASKS_PER_NODE} ranks, ${SLURM_CPUS_PER_TASK} CPUs each; config $config"
  local rc=0
  srun "${VLM_SRUN_ARGS[@]}" "$VLM_BIN" train --config "$config" \
    --set checkpoint.resume=latest "$@" || rc=$?
  if ((rc == 75)); then
    echo "job $SLURM_JOB_ID: stopped before the time limit with a checkpoint saved; requeueing"
    scontrol requeue "$SLURM_JOB_ID"
  fi
  return "$rc"
}

# The benchmarks under the same settings: `sbatch --nodes=N jobs/<site>.sbatch bench [--nodes
# 1,2,4] [--out FILE] BENCHMARK [its options]` runs build/bench/BENCHMARK (bench_collectives,
# bench_fsdp_step, bench_checkpoint, ...; add `--device cuda` for the GPUs) once on each node count
# of the sweep (default 1, 2, 4, ... up to the allocation's nodes), a full node of ranks each, all
# writing their common records (bench/record.h) into one file: FILE, default
# logs/bench-<job id>.jsonl. tools/scaling/scaling_model.py and `vlmtrain report --records FILE`
# read it.
vlm_bench_sweep() {
  local sweep="" out="logs/bench-$SLURM_JOB_ID.jsonl"
  while [[ ${1:-} == --nodes || ${1:-} == --out ]]; do
    if [[ $1 == --nodes ]]; then sweep="${2:-}"; else out="${2:-}"; fi
    shift 2 || true
  done
  local bench="${1:-}"
  if [[ -z $bench || $bench == -* ]]; then
    echo "usage: sbatch --nodes=N jobs/<site>.sbatch bench [--nodes 1,2,4] [--out FILE]" \
      "BENCHMARK [options]" >&2
    return 2
  fi
  shift
  local bin="${VLM_BENCH_DIR:-$(dirname "$VLM_BIN")/bench}/$bench"
  [[ -x $bin ]] || {
    echo "$SLURM_JOB_NAME: benchmark $bin is not built (VLM_BENCH_DIR names their folder)" >&2
    return 2
  }
  if [[ -z $sweep ]]; then
    local n=1
    while ((n <= SLURM_NNODES)); do sweep+="${sweep:+,}$n" n=$((n * 2)); done
  fi
  mkdir -p "$(dirname "$out")"
  local nodes rc=0
  for nodes in ${sweep//,/ }; do
    if ((nodes < 1 || nodes > SLURM_NNODES)); then
      echo "$SLURM_JOB_NAME: --nodes $sweep asks for $nodes of the job's $SLURM_NNODES nodes" >&2
      return 2
    fi
    echo "job $SLURM_JOB_ID: $bench on $nodes node(s) x $SLURM_NTASKS_PER_NODE ranks -> $out"
    VLM_BENCH_RECORDS="$out" srun "${VLM_SRUN_ARGS[@]}" --nodes="$nodes" \
      --ntasks=$((nodes * SLURM_NTASKS_PER_NODE)) "$bin" "$@" || rc=$?
    ((rc == 0)) || {
      echo "$SLURM_JOB_NAME: $bench failed on $nodes node(s) (exit $rc)" >&2
      return "$rc"
    }
  done
  echo "job $SLURM_JOB_ID: records of $bench on ${sweep} node(s) in $out"
}

# The job's command: a training run, or `bench ...`.
vlm_main() {
  if [[ ${1:-} == bench ]]; then
    shift
    vlm_bench_sweep "$@"
  else
    vlm_launch "$@"
  fi
}
