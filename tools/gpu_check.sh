#!/usr/bin/env bash
# The GPU check for a machine with an NVIDIA GPU (sized to finish in < 8 minutes on one H200):
#   1. prints nvidia-smi and, once built, `vlmtrain device-query`;
#   2. checks the prerequisites (cmake, nvcc, OpenBLAS, Catch2; MPI and HDF5 are reported only)
#      and says what is missing; Debian packages carried in .gpu-deps/ (`tools/gpu_deps.sh
#      download` on a machine with apt) are unpacked into build-gpu/deps and used first;
#   3. builds with -DVLM_CUDA=ON into build-gpu/ (only what the check runs);
#   4. runs `ctest -L gpu` with VLM_SYNC=1 (asynchronous faults reported at the op that caused
#      them); fails if a GPU test fails, or is skipped while a GPU is visible;
#   5. runs compute-sanitizer memcheck on one small attention test when the tool exists;
#   6. runs the GPU benchmarks (build-gpu/bench/*gpu*) and prints their tables;
#   7. runs bench/bench_gpu_step.sh: a Qwen3-1.7B training step, ours vs PyTorch eager (tokens/s,
#      MFU; WARN when the issue-5 targets MFU >= 40% and >= 1.2x torch are missed);
#   8. prints a summary table. Exit status 0 only when steps 3-7 pass.
#   tools/gpu_check.sh [--build-dir DIR] [--quick] [--part all|tests|bench]
#     --part tests: steps 1-5 only; --part bench: steps 1-3 and 6-7 only. One device call may run
#     at most 10 minutes: run `--part tests` then `--part bench` (the second build is a no-op on a
#     machine that kept build-gpu/). VLM_BUILD_JOBS: build parallelism.
set -uo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
build_dir="$root/build-gpu"
quick=""
part=all
while (($#)); do
  case "$1" in
  --build-dir)
    build_dir="$2"
    shift
    ;;
  --quick) quick="--quick" ;;
  --part)
    part="$2"
    [[ $part == all || $part == tests || $part == bench ]] || {
      echo "--part: expected all, tests or bench, got '$part'" >&2
      exit 2
    }
    shift
    ;;
  *)
    echo "usage: tools/gpu_check.sh [--build-dir DIR] [--quick] [--part all|tests|bench]" >&2
    exit 2
    ;;
  esac
  shift
done
export PATH="$PATH:/usr/local/cuda/bin"
log_dir="$build_dir/gpu_check_logs"
summary=()
failed=0
start_all=$SECONDS

record() { # record <step> <PASS|FAIL|SKIP|WARN> <seconds> <note>
  summary+=("$(printf '| %-22s | %-4s | %6ss | %s' "$1" "$2" "$3" "$4")")
  [[ $2 == FAIL ]] && failed=1
  return 0
}

# --- 1. the machine ---------------------------------------------------------------------------
if command -v nvidia-smi >/dev/null; then
  echo "nvidia-smi: $(nvidia-smi --query-gpu=name,driver_version,memory.total,compute_cap \
    --format=csv,noheader 2>&1 | paste -sd ';')"
  nvidia-smi 2>&1 | sed 's/^/  /'
else
  echo "nvidia-smi: not found"
fi
have_gpu=0
if command -v nvidia-smi >/dev/null && nvidia-smi -L 2>/dev/null | grep -q '^GPU'; then
  have_gpu=1
fi

# --- 2. prerequisites ---------------------------------------------------------------------------
# A machine without a registry gets the Debian packages carried in .gpu-deps/ (made where apt
# works by `tools/gpu_deps.sh download`), unpacked into the build folder, never into /.
if compgen -G "$root/.gpu-deps/*.deb" >/dev/null; then
  bash "$root/tools/gpu_deps.sh" install "$root/.gpu-deps" "$build_dir/deps" &&
    source "$build_dir/deps/env.sh"
fi
deps=${VLM_DEPS_PREFIX:-/nonexistent}
missing=()
warn=()
command -v cmake >/dev/null || missing+=("cmake (apt-get install cmake)")
command -v nvcc >/dev/null || missing+=("nvcc (CUDA toolkit in /usr/local/cuda)")
command -v ninja >/dev/null || warn+=("ninja (falls back to make)")
if ! ldconfig -p 2>/dev/null | grep -q 'libopenblas' && ! pkg-config --exists openblas 2>/dev/null &&
  ! compgen -G "$deps/lib/*/openblas-openmp/libopenblas.so" >/dev/null; then
  missing+=("OpenBLAS (libopenblas-dev libopenblas-openmp-dev; or tools/gpu_deps.sh)")
fi
have() { # have <file>...: true when any of the files exists
  local f
  for f in "$@"; do [[ -e $f ]] && return 0; done
  return 1
}
have /usr/include/catch2/catch.hpp /usr/local/include/catch2/catch.hpp "$deps/include/catch2/catch.hpp" ||
  missing+=("Catch2 v2 (catch2)")
command -v mpicc >/dev/null || command -v mpicxx >/dev/null || warn+=("MPI (libopenmpi-dev openmpi-bin)")
if ! command -v h5pcc >/dev/null && ! command -v h5cc >/dev/null &&
  ! pkg-config --exists hdf5 hdf5-openmpi 2>/dev/null &&
  ! have /usr/include/hdf5/openmpi/hdf5.h /usr/include/hdf5/serial/hdf5.h /usr/include/hdf5.h; then
  warn+=("HDF5 (libhdf5-openmpi-dev)")
fi
for lib in cudnn nccl; do
  ldconfig -p 2>/dev/null | grep -q "lib$lib" || compgen -G "/usr/local/cuda/lib*/lib$lib.so*" >/dev/null ||
    missing+=("lib$lib (into the CUDA toolkit, or set ${lib^^}_ROOT)")
done
if ((${#missing[@]})); then
  printf 'prerequisites: MISSING %s\n' "${missing[@]}"
  record prerequisites FAIL 0 "missing: $(IFS=', '; echo "${missing[*]}")"
else
  record prerequisites PASS 0 "cmake, nvcc, OpenBLAS, Catch2, cuDNN, NCCL found"
fi
((${#warn[@]})) && printf 'prerequisites: not found (not needed by this check) %s\n' "${warn[@]}" &&
  record "optional deps" WARN 0 "not found: $(IFS=', '; echo "${warn[*]}")"

# --- 3. build -----------------------------------------------------------------------------------
mkdir -p "$log_dir"
t0=$SECONDS
jobs="${VLM_BUILD_JOBS:-$(nproc)}"
generator=()
command -v ninja >/dev/null && generator=(-G Ninja)
built=0
if ((${#missing[@]} == 0)) &&
  cmake -S "$root" -B "$build_dir" "${generator[@]}" -DVLM_CUDA=ON -DCMAKE_BUILD_TYPE=Release \
    >"$log_dir/configure.log" 2>&1; then
  targets=(test_gpu vlmtrain)
  compgen -G "$root/bench/*gpu*" >/dev/null && targets+=(bench_gpu_ops)
  [[ -f $root/bench/bench_gpu_step.cpp ]] && targets+=(bench_gpu_step)
  if timeout 420 cmake --build "$build_dir" -j "$jobs" --target "${targets[@]}" \
    >"$log_dir/build.log" 2>&1; then
    built=1
    record build PASS $((SECONDS - t0)) "${targets[*]} in $build_dir"
  else
    tail -30 "$log_dir/build.log"
    record build FAIL $((SECONDS - t0)) "see $log_dir/build.log"
  fi
else
  [[ -f $log_dir/configure.log ]] && tail -30 "$log_dir/configure.log"
  record build FAIL $((SECONDS - t0)) "configure failed or prerequisites missing"
fi
if ((built)); then
  echo "device-query: $("$build_dir/vlmtrain" device-query 2>&1 | paste -sd ' ')"
fi

run_tests=0 run_benches=0
[[ $part != bench ]] && run_tests=1
[[ $part != tests ]] && run_benches=1

# --- 4. ctest -L gpu ----------------------------------------------------------------------------
if ((!run_tests)); then
  record "ctest -L gpu" SKIP 0 "--part bench"
elif ((built)); then
  t0=$SECONDS
  VLM_SYNC=1 timeout 300 ctest --test-dir "$build_dir" -L gpu --output-on-failure -j 4 \
    >"$log_dir/ctest.log" 2>&1
  rc=$?
  total=$(grep -Eo 'out of [0-9]+' "$log_dir/ctest.log" | tail -1 | grep -Eo '[0-9]+')
  skipped=$(grep -c '\*\*\*Skipped' "$log_dir/ctest.log")
  failing=$(grep -E 'Failed|Exception|Timeout|Not Run' "$log_dir/ctest.log" | grep -c 'Test *#')
  grep -E 'Test *#' "$log_dir/ctest.log" | sed 's/^/  /'
  note="${total:-0} tests, $failing failed, $skipped skipped"
  if ((rc == 124)); then
    record "ctest -L gpu" FAIL $((SECONDS - t0)) "timed out after 300 s; $note"
  elif ((rc != 0 || failing > 0)) || [[ -z $total || $total == 0 ]]; then
    grep -A40 -E '\*\*\*Failed|\*\*\*Exception' "$log_dir/ctest.log" | head -80
    record "ctest -L gpu" FAIL $((SECONDS - t0)) "$note (log: $log_dir/ctest.log)"
  elif ((have_gpu && skipped > 0)); then
    grep -B2 -A3 'SKIPPED' "$log_dir/ctest.log" | head -20
    record "ctest -L gpu" FAIL $((SECONDS - t0)) "$note: a GPU is visible, nothing may skip"
  elif ((!have_gpu)); then
    record "ctest -L gpu" WARN $((SECONDS - t0)) "$note (no GPU visible)"
  else
    record "ctest -L gpu" PASS $((SECONDS - t0)) "$note"
  fi
else
  record "ctest -L gpu" FAIL 0 "not built"
fi

# --- 5. compute-sanitizer on one small attention test ------------------------------------------
sanitizer=$(command -v compute-sanitizer || true)
if ((!run_tests)); then
  record "memcheck attention" SKIP 0 "--part bench"
elif ((built && have_gpu)) && [[ -n $sanitizer ]]; then
  t0=$SECONDS
  timeout 150 "$sanitizer" --tool memcheck --error-exitcode 3 "$build_dir/tests/test_gpu" \
    "gpu attention: odd head dims and a single long document" >"$log_dir/memcheck.log" 2>&1
  rc=$?
  if ((rc == 0)); then
    record "memcheck attention" PASS $((SECONDS - t0)) "no memory errors"
  elif ((rc == 124)); then
    record "memcheck attention" WARN $((SECONDS - t0)) "timed out (not counted)"
  else
    tail -40 "$log_dir/memcheck.log"
    record "memcheck attention" FAIL $((SECONDS - t0)) "see $log_dir/memcheck.log"
  fi
else
  record "memcheck attention" SKIP 0 "needs a GPU, the build and compute-sanitizer"
fi

# --- 6. benchmarks ------------------------------------------------------------------------------
benches=()
if ((built && run_benches)); then
  for b in "$build_dir"/bench/*gpu*; do
    # bench_gpu_step runs in step 7, through its script (the torch side and the table).
    [[ -x $b && -f $b && $(basename "$b") != bench_gpu_step ]] && benches+=("$b")
  done
fi
if ((!run_benches)); then
  record benchmarks SKIP 0 "--part tests"
elif ((${#benches[@]} == 0)); then
  record benchmarks SKIP 0 "no build-gpu/bench/*gpu* binary"
fi
for b in "${benches[@]}"; do
  t0=$SECONDS
  name=$(basename "$b")
  echo "== $name =="
  if timeout 180 "$b" $quick 2>&1 | tee "$log_dir/$name.log"; then
    record "$name" PASS $((SECONDS - t0)) "table above; log $log_dir/$name.log"
  else
    record "$name" FAIL $((SECONDS - t0)) "failed or timed out (180 s)"
  fi
done

# --- 7. training step: ours vs PyTorch eager --------------------------------------------------
if ((!run_benches)); then
  record bench_gpu_step SKIP 0 "--part tests"
elif ((built && have_gpu)) && [[ -x $build_dir/bench/bench_gpu_step ]]; then
  t0=$SECONDS
  echo "== bench_gpu_step.sh =="
  # --quick: fewer steps and only the torch amp recipe.
  quick_env=()
  [[ -n $quick ]] && quick_env=(STEPS=5 WARMUP=2 TORCH_RECIPES=amp)
  env "${quick_env[@]}" timeout 240 bash "$root/bench/bench_gpu_step.sh" "$build_dir" 2>&1 |
    tee "$log_dir/bench_gpu_step.log"
  rc=${PIPESTATUS[0]}
  figures=$(grep '^summary: ' "$log_dir/bench_gpu_step.log" | tail -1 | sed 's/^summary: //')
  if ((rc == 124)); then
    record bench_gpu_step FAIL $((SECONDS - t0)) "timed out after 240 s (log $log_dir/bench_gpu_step.log)"
  elif ((rc != 0)); then
    record bench_gpu_step FAIL $((SECONDS - t0)) "${figures:-no result} (log $log_dir/bench_gpu_step.log)"
  elif grep -q '^targets: met' "$log_dir/bench_gpu_step.log"; then
    record bench_gpu_step PASS $((SECONDS - t0)) "$figures"
  else
    record bench_gpu_step WARN $((SECONDS - t0)) \
      "$figures; $(grep '^targets: ' "$log_dir/bench_gpu_step.log" | tail -1)"
  fi
else
  record bench_gpu_step SKIP 0 "needs a GPU and build-gpu/bench/bench_gpu_step"
fi

# --- 8. summary ---------------------------------------------------------------------------------
echo
printf '| %-22s | %-4s | %7s | %s\n' step res time note
printf '%s\n' "${summary[@]}"
echo "gpu_check: $([[ $failed == 0 ]] && echo PASS || echo FAIL) in $((SECONDS - start_all)) s"
exit $failed
