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
# does too).

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
