#!/usr/bin/env bash
# Resumable checkpoints through the real command (issue 14; src/train/checkpoint.h):
#   * stopped at step k (SIGUSR1, as SLURM's pre-timeout signal: exit 75), killed (SIGKILL after a
#     save, one process and a 2-rank FSDP job) or crashed during a save (at each save point), a run
#     resumed with checkpoint.resume = "latest" ends bit-identical to one that never stopped:
#     every tensor of the final checkpoint and every step's loss, for the VLM demo (Qwen3-VL,
#     images, packing), with the vision tower trained (f32) and frozen (bf16, f32 masters);
#     unfreezing it on resume starts its AdamW state fresh;
#   * a save interrupted at any point leaves the previous checkpoint as `latest` (a save counts
#     once `latest` names it), its .tmp folder is never taken and a step_N renamed but not yet
#     linked is moved to abandoned/ by the resume, not lost; a failed save (an injected error on
#     one rank, a full disk) ends every rank with the error, naming the file;
#   * the run rules of an output_dir (src/train/checkpoint_folder.h): a new run never replaces an
#     earlier one's checkpoints; resuming from an older step moves the newer ones to abandoned/
#     and `latest` follows; resume = "latest" follows the link, not the highest step_N;
#   * a checkpoint of 4 FSDP ranks resumes on 1 and 2 ranks and as HSDP 2 x 2 (the same data
#     position where the data-parallel count is the same);
#   * Debian's h5py reads /model/<name> as the whole tensor, equal to `vlmtrain export`'s;
#     training starts from a checkpoint's weights (model.model_dir); keep_last rotates;
#   * a resume reads the checkpoint alone: runs started from an HF snapshot resume (1 process,
#     2 FSDP ranks, 2 TP ranks) bit-identically with the snapshot moved away;
#   * a truncated or corrupt file, another model, a missing tensor, another dtype or data config,
#     a path that is not a checkpoint: errors naming it.
#   tests/train/test_checkpoint_resume.sh <path to vlmtrain>
set -euo pipefail
bin="$(cd "$(dirname "$1")" && pwd)/$(basename "$1")"
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
dir="$(mktemp -d)"
trap '[[ -n "${KEEP:-}" ]] || rm -rf "$dir"' EXIT
cd "$dir"
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
export OMPI_MCA_btl_vader_single_copy_mechanism=none OMP_NUM_THREADS=1
py=/usr/bin/python3 # Debian's, with python3-h5py (tools/deps/install_deps.sh)
fail() { echo "FAIL: $*"; exit 1; }
mpi() { mpirun -np "$1" --oversubscribe "${@:2}"; }
same() { $py "$root/tests/train/compare_checkpoints.py" "$@" --metrics; }

"$bin" data make-demo data --train 300 --val 20 >/dev/null
# The built-in VLM demo, tiny and short: 8 steps, a checkpoint every 3 and at the end; a new run
# unless a case asks to resume (the demo itself resumes from its output_dir).
common=(--set data.data_path=data/ --set model.tokenizer=data/ --set training.total_steps=8
  --set training.warmup_steps=2 --set training.eval_steps=0 --set logging.log_every=1
  --set data.seq_len=128 --set training.micro_batch_rows=2 --set training.caption_eval_images=0
  --set checkpoint.save_steps=3 --set checkpoint.hf_snapshot=never --set checkpoint.resume=)
train() { "$bin" train "${common[@]}" "$@"; }
# expect_rc CODE LOG COMMAND...: runs COMMAND into LOG; fails unless it exits with CODE.
expect_rc() {
  local want=$1 log=$2 rc=0
  shift 2
  "$@" >"$log" 2>&1 || rc=$?
  [[ $rc -eq $want ]] || { cat "$log"; fail "exit code $rc, expected $want: $*"; }
}
resumed_from() { # resumed_from LOG DIR: the run of LOG resumed from checkpoint DIR
  grep -q "resume: from $2 at step" "$1" || { cat "$1"; fail "$1: did not resume from $2"; }
}

for vit in true false; do
  echo "== train_vit = $vit"
  v=(--set model.train_vit=$vit)
  [[ $vit == false ]] && v+=(--set training.param_dtype=bf16) # bf16 weights, f32 masters
  train "${v[@]}" --set checkpoint.output_dir=straight_$vit >straight_$vit.log 2>&1 ||
    { cat straight_$vit.log; fail "the uninterrupted run failed"; }
  # Normal stop: SIGUSR1 during step 4 -> saves step 4, exits 75; then resume.
  expect_rc 75 stop_$vit.log train "${v[@]}" --set checkpoint.output_dir=stop_$vit \
    --inject-fault signal:0:4
  grep -q "train: SIGUSR1 received: stopping after step 4 of 8" stop_$vit.log ||
    { cat stop_$vit.log; fail "no stop message"; }
  [[ $(readlink stop_$vit/latest) == step_000004 ]] || fail "latest is not step_000004"
  expect_rc 0 stop2_$vit.log train "${v[@]}" --set checkpoint.output_dir=stop_$vit \
    --set checkpoint.resume=latest
  resumed_from stop2_$vit.log stop_$vit/step_000004
  same stop_$vit straight_$vit
  # kill -9 during step 5, after the save of step 3; the reference trainer's switch resumes.
  expect_rc 137 kill_$vit.log train "${v[@]}" --set checkpoint.output_dir=kill_$vit \
    --inject-fault kill:0:5
  expect_rc 0 kill2_$vit.log train "${v[@]}" --set checkpoint.output_dir=kill_$vit \
    --set checkpoint.resume_checkpoint=true
  resumed_from kill2_$vit.log kill_$vit/step_000003
  same kill_$vit straight_$vit
done

echo "== unfreezing the vision tower on resume"
expect_rc 0 unfreeze.log train --set model.train_vit=true --set training.param_dtype=bf16 \
  --set checkpoint.output_dir=stop_false --set checkpoint.resume=stop_false/step_000006
grep -q "have no optimizer state in the checkpoint (frozen when it was saved) and start with" \
  unfreeze.log || { cat unfreeze.log; fail "no fresh AdamW state for the unfrozen tower"; }

echo "== a save interrupted at each point"
for point in save-writing save-closed save-renamed; do
  out=cut_$point
  expect_rc 134 $out.log train --set checkpoint.output_dir=$out --inject-fault crash:0:6:$point
  [[ $(readlink $out/latest) == step_000003 ]] || fail "$point: latest moved on"
  if [[ $point != save-renamed ]]; then
    [[ -d $out/step_000006.tmp && ! -e $out/step_000006 ]] ||
      fail "$point: expected a step_000006.tmp and no step_000006"
  fi
  expect_rc 0 $out-2.log train --set checkpoint.output_dir=$out --set checkpoint.resume=latest
  resumed_from $out-2.log $out/step_000003
  [[ ! -e $out/step_000006.tmp ]] || fail "$point: the stale step_000006.tmp was left"
  if [[ $point == save-renamed ]]; then # complete but never linked: kept aside, not deleted
    [[ -f $out/abandoned/after_step_000003/step_000006/state.h5 ]] ||
      { ls -R $out; fail "$point: the unlinked step_000006 was not moved to abandoned/"; }
  fi
  same $out straight_true
done

echo "== run rules: a new run never replaces another; resume follows latest; branches kept"
before=$(cd straight_true && find . -type f -exec sha256sum {} + | sort)
expect_rc 1 fresh.log train --set checkpoint.output_dir=straight_true
grep -q 'checkpoint.output_dir = "straight_true" holds an earlier run (step_000003, step_000006' \
  fresh.log || { cat fresh.log; fail "a fresh run into a used output_dir was not refused"; }
[[ $(cd straight_true && find . -type f -exec sha256sum {} + | sort) == "$before" ]] ||
  fail "the refused fresh run changed the earlier run's files"
# Resume from step 3 while 6 and 8 exist, killed at step 5 after no new save: resume = "latest"
# takes step 3 (what latest names), not the abandoned branch's step 8.
mkdir -p branch && cp -r straight_true/step_00000{3,6,8} straight_true/metrics.jsonl branch/
ln -s step_000008 branch/latest
expect_rc 137 branch.log train --set checkpoint.output_dir=branch \
  --set checkpoint.resume=branch/step_000003 --inject-fault kill:0:5
grep -q "are a branch this run abandons: moved to branch/abandoned/after_step_000003" branch.log ||
  { cat branch.log; fail "the newer branch was not moved aside"; }
[[ $(readlink branch/latest) == step_000003 ]] || fail "latest does not name the resumed step"
for s in 6 8; do
  [[ -f branch/abandoned/after_step_000003/step_00000$s/state.h5 ]] || fail "step $s was lost"
done
[[ $(wc -l <branch/abandoned/after_step_000003/metrics.jsonl) -ge 8 ]] ||
  fail "the abandoned branch's metrics were not kept"
expect_rc 0 branch2.log train --set checkpoint.output_dir=branch --set checkpoint.resume=latest
resumed_from branch2.log branch/step_000003
same branch straight_true
# Damage is named, never skipped: latest naming a missing folder; step_N without state.h5.
mkdir -p dangling && cp -r straight_true/step_000003 dangling/ && ln -s step_000009 dangling/latest
expect_rc 1 dangling.log train --set checkpoint.output_dir=dangling --set checkpoint.resume=latest
grep -q "dangling/latest names .*step_000009, which is not there" dangling.log ||
  { cat dangling.log; fail "a dangling latest was not named"; }
mkdir -p damaged/step_000003 damaged/step_000006
expect_rc 1 damaged.log train --set checkpoint.output_dir=damaged --set checkpoint.resume=latest
grep -q "damaged checkpoint folders (step_N without state.h5): step_000003, step_000006" \
  damaged.log || { cat damaged.log; fail "damaged checkpoints were not named"; }
mkdir -p latestdir/latest
expect_rc 1 latestdir.log train --set checkpoint.output_dir=latestdir
grep -q "its 'latest' is a file or folder, not the link" latestdir.log ||
  { cat latestdir.log; fail "a folder named latest was not refused at start"; }
echo "== a failed save ends every rank with the error, the previous checkpoint stays"
expect_rc 1 fsave.log mpi 2 "$bin" train "${common[@]}" --set parallel.data_parallel=fsdp \
  --set data.num_workers=1 --set checkpoint.output_dir=fsave --inject-fault error:1:6:save-closed
grep -q "injected error on rank 1 at save-closed" fsave.log || { cat fsave.log; fail "no error"; }
[[ $(readlink fsave/latest) == step_000003 && ! -e fsave/step_000006 ]] ||
  fail "the failed save changed latest"

echo "== a save that runs out of space fails naming the file; latest stays"
expect_rc 75 full.log train --set checkpoint.output_dir=full --inject-fault signal:0:3
# A file-size limit below state.h5's ~10 MB: writes fail with EFBIG as on a full disk (SIGXFSZ
# ignored, so the write returns the error instead of killing the process). One process: no MPI
# is initialized (OpenMPI's own start would fail under the limit).
expect_rc 1 full2.log bash -c 'trap "" XFSZ; ulimit -f 6144; exec "$@"' _ "$bin" train \
  "${common[@]}" --set checkpoint.output_dir=full --set checkpoint.resume=latest
grep -q "error: checkpoint: cannot write 'full/step_000006.tmp/state.h5': File too large" full2.log ||
  { cat full2.log; fail "the failed save is not named with the file and the OS reason"; }
[[ $(readlink full/latest) == step_000003 && ! -e full/step_000006 ]] ||
  fail "the failed save changed latest"

echo "== 2-rank FSDP: kill -9 of the job after a save, resume"
fsdp2=("${common[@]}" --set parallel.data_parallel=fsdp --set data.num_workers=1
  --set model.train_vit=true)
mpi 2 "$bin" train "${fsdp2[@]}" --set checkpoint.output_dir=f2 >f2.log 2>&1 ||
  { cat f2.log; fail "the 2-rank run failed"; }
if mpi 2 "$bin" train "${fsdp2[@]}" --set checkpoint.output_dir=f2kill --inject-fault kill:1:5 \
  >f2kill.log 2>&1; then fail "the killed job exited 0"; fi
expect_rc 0 f2kill2.log mpi 2 "$bin" train "${fsdp2[@]}" --set checkpoint.output_dir=f2kill \
  --set checkpoint.resume=latest
resumed_from f2kill2.log f2kill/step_000003
same f2kill f2

echo "== resharding: 4 FSDP ranks -> 1 rank, 2 FSDP ranks, HSDP 2 x 2"
mpi 4 "$bin" train "${fsdp2[@]}" --set training.micro_batch_rows=1 \
  --set checkpoint.output_dir=f4 >f4.log 2>&1 || { cat f4.log; fail "the 4-rank run failed"; }
for layout in "1 fsdp 1" "2 fsdp 1" "4 fsdp 2"; do
  read -r np mode replicate <<<"$layout"
  out=re_${np}_$replicate
  mkdir -p $out && cp -r f4/step_000003 f4/metrics.jsonl $out/
  expect_rc 0 $out.log mpi "$np" "$bin" train "${fsdp2[@]}" --set training.micro_batch_rows=1 \
    --set parallel.dp_replicate=$replicate --set checkpoint.output_dir=$out \
    --set checkpoint.resume=latest
  resumed_from $out.log $out/step_000003
done
grep -q "the data starts over" re_2_1.log || { cat re_2_1.log; fail "no data-position warning"; }
# HSDP 2 x 2 has 4 data-parallel ranks: the same data; only the summation order differs.
$py "$root/tests/train/compare_checkpoints.py" re_4_2 f4 --tol 1e-5 --metrics

echo "== h5py reads whole tensors; export; training from a checkpoint's weights; keep_last"
"$bin" export --checkpoint f2 --out hf --dtype f32 >export.log 2>&1 ||
  { cat export.log; fail "export failed"; }
$py - f2/latest/state.h5 hf/model.safetensors <<'EOF'
import json, struct, sys
import h5py, numpy as np
h5, st = sys.argv[1:]
with open(st, "rb") as f:
    n = struct.unpack("<Q", f.read(8))[0]
    header = json.loads(f.read(n))
    data = f.read()
checked = 0
with h5py.File(h5, "r") as f:
    for name, info in header.items():
        if name == "__metadata__":
            continue
        a, b = info["data_offsets"]
        exported = np.frombuffer(data[a:b], dtype="<f4").reshape(info["shape"])
        stored = f["model/" + name][()]
        assert stored.shape == tuple(info["shape"]), (name, stored.shape, info["shape"])
        assert np.array_equal(stored, exported), name
        checked += 1
assert checked > 100, checked
print("h5py: %d whole tensors of the 2-rank FSDP checkpoint equal the export" % checked)
EOF
expect_rc 0 from_ckpt.log train --set model.preset= --set model.model_dir=f2/step_000008 \
  --set checkpoint.output_dir=from_ckpt --set training.total_steps=2 --set checkpoint.keep_last=1 \
  --set checkpoint.save_steps=1
[[ $(ls -d from_ckpt/step_* | wc -l) -eq 1 && -d from_ckpt/step_000002 ]] ||
  { ls from_ckpt; fail "keep_last = 1 kept other checkpoints"; }

# Its weights by parts: under FSDP 2 x TP 2 each rank reads only its boxes of state.h5; at a zero
# learning rate the run's final snapshot is the checkpoint's export, bit for bit.
expect_rc 0 from_ckpt_tp.log mpi 4 "$bin" train "${common[@]}" --set model.preset= \
  --set model.model_dir=f2/step_000008 --set checkpoint.output_dir=from_ckpt_tp \
  --set training.total_steps=1 --set training.warmup_steps=0 --set training.lr_llm=0 \
  --set training.lr_mlp=0 --set training.lr_vit=0 --set parallel.tp_size=2 \
  --set parallel.data_parallel=fsdp --set checkpoint.hf_snapshot=final
grep -q "state.h5, this rank's parts" from_ckpt_tp.log || { cat from_ckpt_tp.log; fail "not read by parts"; }
cmp from_ckpt_tp/checkpoint-step-1/model.safetensors hf/model.safetensors ||
  fail "the FSDP x TP run did not start from the checkpoint's weights"

echo "== a resume reads the checkpoint alone: no byte of the HF snapshot the run started from"
# Runs that start from an HF snapshot (the f32 export above, with its tokenizer) stop at step 4;
# the snapshot is moved away before each resume, so a read of any of its files would fail the run.
# One process, 2 FSDP ranks and 2 TP ranks; each ends bit-identical to its run that never stopped,
# and its final snapshot carries the tokenizer files (from the checkpoint's copy).
mkdir -p snap && cp hf/* snap/
snap=(--set model.preset= --set model.model_dir=snap --set model.tokenizer=
  --set checkpoint.hf_snapshot=final --set model.train_vit=true)
for layout in "1 -" "2 fsdp" "2 tp"; do
  read -r np mode <<<"$layout"
  lay=()
  [[ $mode == fsdp ]] && lay=(--set parallel.data_parallel=fsdp --set data.num_workers=1)
  [[ $mode == tp ]] && lay=(--set parallel.tp_size=2)
  launch=("$bin")
  ((np > 1)) && launch=(mpirun -np "$np" --oversubscribe "$bin")
  out=snap_${np}_$mode
  expect_rc 0 ${out}_straight.log "${launch[@]}" train "${common[@]}" "${snap[@]}" "${lay[@]}" \
    --set checkpoint.output_dir=${out}_straight
  expect_rc 75 ${out}_stop.log "${launch[@]}" train "${common[@]}" "${snap[@]}" "${lay[@]}" \
    --set checkpoint.output_dir=$out --inject-fault signal:0:4
  mv snap snap.away
  expect_rc 0 ${out}_resume.log "${launch[@]}" train "${common[@]}" "${snap[@]}" "${lay[@]}" \
    --set checkpoint.output_dir=$out --set checkpoint.resume=latest
  mv snap.away snap
  resumed_from ${out}_resume.log $out/step_000004
  grep -q "model.model_dir (snap) is not read" ${out}_resume.log ||
    { cat ${out}_resume.log; fail "$out: the resume does not say what it read"; }
  same $out ${out}_straight
  cmp $out/checkpoint-step-8/tokenizer.json snap/tokenizer.json ||
    fail "$out: the final snapshot's tokenizer.json is not the run's"
done

echo "== default settings: a run of a config resumes with --set checkpoint.resume=latest"
# configs/demo-text.toml as a user has it: no [checkpoint] key but output_dir (save_steps = 0).
sed -e 's|"demo_data/"|"data/"|' -e 's|"demo_text_out"|"defaults"|' \
  "$root/configs/demo-text.toml" >c.toml
expect_rc 75 d1.log "$bin" train --config c.toml --set training.total_steps=40 \
  --set training.eval_steps=0 --inject-fault signal:0:15
expect_rc 0 d2.log "$bin" train --config c.toml --set training.total_steps=40 \
  --set training.eval_steps=0 --set checkpoint.resume=latest
resumed_from d2.log defaults/step_000015
expect_rc 0 d3.log "$bin" train --config c.toml --set training.total_steps=40 \
  --set training.eval_steps=0 --set checkpoint.output_dir=defaults_straight
same defaults defaults_straight
[[ -f defaults/checkpoint-step-40/model.safetensors && ! -e defaults/checkpoint-step-15 ]] ||
  { ls defaults; fail "no final HF snapshot (or one at the stop)"; }
# `generate` reads the HF snapshot and, through `latest`, the step_000040 checkpoint: one answer.
"$bin" generate --model defaults/checkpoint-step-40 --prompt "a red circle" --max-new-tokens 4 \
  >gen.txt 2>gen.log || { cat gen.log; fail "generate from the HF snapshot failed"; }
"$bin" generate --model defaults --prompt "a red circle" --max-new-tokens 4 >gen2.txt \
  2>gen2.log || { cat gen2.log; fail "generate from the output folder failed"; }
cmp -s <(grep -v '^loaded ' gen.txt) <(grep -v '^loaded ' gen2.txt) ||
  fail "generate from the HF snapshot and from step_000040 differ"

echo "== bad checkpoints: clear errors"
bad() { # bad NAME EXPECTED_MESSAGE ARGS...: training with ARGS fails, naming it
  local name=$1 want=$2
  shift 2
  expect_rc 1 bad_$name.log "$@"
  grep -qF -- "$want" bad_$name.log || { cat bad_$name.log; fail "$name: no '$want'"; }
}
mkdir -p trunc && cp -r straight_true/step_000008 trunc/
truncate -s 100000 trunc/step_000008/state.h5
bad truncated "trunc/step_000008/state.h5" train --set checkpoint.output_dir=trunc \
  --set checkpoint.resume=latest
mkdir -p corrupt && cp -r straight_true/step_000008 corrupt/
printf 'garbage!' | dd of=corrupt/step_000008/state.h5 bs=1 seek=0 conv=notrunc 2>/dev/null
bad corrupt "corrupt/step_000008/state.h5" train --set checkpoint.output_dir=corrupt \
  --set checkpoint.resume=latest
mkdir -p missing && cp -r straight_true/step_000008 missing/
$py -c "import h5py; f = h5py.File('missing/step_000008/state.h5', 'r+'); \
del f['model/model.language_model.layers.1.mlp.up_proj.weight']"
bad missing "model/model.language_model.layers.1.mlp.up_proj.weight" train \
  --set checkpoint.output_dir=missing --set checkpoint.resume=latest
bad other_model "was saved for another model" "$bin" train --config "$root/configs/demo-text.toml" \
  "${common[@]}" --set checkpoint.output_dir=other --set checkpoint.resume=straight_true
bad dtype 'training.param_dtype = "f32" and this run has "bf16"' train \
  --set training.param_dtype=bf16 --set checkpoint.output_dir=dt \
  --set checkpoint.resume=straight_true
bad data_config "seq_len" train --set data.seq_len=96 --set checkpoint.output_dir=dc \
  --set checkpoint.resume=straight_true
bad not_a_checkpoint 'checkpoint.resume = "data" is not a checkpoint' train \
  --set checkpoint.output_dir=nc --set checkpoint.resume=data
echo "checkpoints: stop/kill/crash-in-save resume bit-identically, failed saves end the job," \
  "4 ranks reshard to 1, 2 and HSDP, h5py and export agree, bad checkpoints named"
