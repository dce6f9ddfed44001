#!/usr/bin/env bash
# The GPU check, in ONE command of the device tool (at most 10 minutes a command; the plan keeps
# the run within 450 s, so a rerun fits the session's device time too): one build of what it runs,
# the `gpu` tests without and then with VLM_SYNC=1, the kernel and step benchmarks, and every log
# packed into one tarball next to summary.md.
#
# Here (where apt and PyPI work), once:
#   bash tools/gpu/gpu_check.sh --prepare   .gpu-deps/ (tools/gpu/gpu_deps.sh download), .deps/
#                                           (tools/deps/fetch_cudnn_frontend.sh, required) and the
#                                           newest CMake from PyPI in build-tools/cmake/
#   bash tools/gpu/gpu_check.sh --dry-run   the plan, and the GPU call's configure step run here
#                                           with the newest CMake (arch 90) into build-gpu-dryrun/
# Then the device tool's call (both folders are gitignored, so they travel only when carried):
#   run(command="bash tools/gpu/gpu_check.sh", carry=[".gpu-deps", ".deps"], timeout_s=600)
# and read summary.md (also printed at the end of the output) and gpu_check_logs.tar.gz from $OUT.
# Without .gpu-deps/*.deb or the cuDNN frontend headers in .deps/ the run refuses at once, naming
# what is missing (the GPU machine has no package registry and no PyPI).
#
# Steps, each with a time budget (--dry-run prints them; they add up to at most 420 s). A step's
# timeout is what is left of the whole budget (VLM_CHECK_BUDGET, default 450 s) after keeping the
# planned seconds of the steps after it and a 30 s reserve: time a step saves goes to the next.
#   machine      nvidia-smi; no visible GPU is a FAIL (stops before the build) unless --allow-no-gpu
#   deps         the Debian packages carried in .gpu-deps/ unpacked into BUILD_DIR/deps (never /),
#                then the prerequisites: cmake >= 3.25, nvcc, a C++ compiler, OpenBLAS, Catch2
#                (MPI and HDF5 optional: without MPI the build uses parallel/comm/mpi.h's one rank)
#   configure    BUILD_DIR with -DVLM_CUDA=ON, Release, CMAKE_CUDA_ARCHITECTURES from the GPU (90)
#   build        -j$(nproc), only the targets it runs: the test binaries with `gpu` tests
#                (test_<folder>_gpu for every tests/<folder>/**/*_gpu.cpp), vlmtrain,
#                bench_gpu_ops and bench_gpu_step; then `vlmtrain device-query`
#   ctest        ctest -L gpu -j$(nproc) (VLM_SYNC unset): asynchronous execution, graph capture
#   ctest-sync   the same with VLM_SYNC=1: every launch synchronizes, faults at their op
#                Each ctest step FAILs when a test fails, or skips while a GPU is visible (a skip
#                for a library not in this build, e.g. NCCL, is a WARN naming it).
#   ops-bench    bench_gpu_ops: GEMM vs cuBLASLt, attention (and torch SDPA on the same shapes),
#                RMSNorm vs a device copy
#   step-bench   bench/bench_gpu_step.sh: a Qwen3-1.7B step (1 x 4096 tokens: fits 78 GiB) vs
#                PyTorch eager AMP (WARN when the issue-5 targets are missed); quick (STEPS=5
#                WARMUP=2) unless the time left holds the full form (10 + 3 steps) with room
#   pack         summary.md and gpu_check_logs.tar.gz (every log, both ctest junit files, the
#                console output) into OUT_DIR: two files, within the device tool's 8
# Exit status 0 only when nothing FAILed (2 for a usage error or a missing carried folder).
#
# Usage: tools/gpu/gpu_check.sh [--prepare | --dry-run [--no-configure | --build-cuda]]
#                           [--build-dir DIR] [--log-dir DIR] [--out DIR] [--quick]
#                           [--allow-no-gpu] [--part all|tests|bench] [--memcheck]
#   --prepare      here, where apt and PyPI work: fill .gpu-deps/ and .deps/ (what the call
#                  carries) and install the newest CMake from PyPI into build-tools/cmake/
#   --dry-run      print the plan (steps, commands, time budgets), check what can be checked
#                  without a GPU (tools, carried packages, targets), then run the GPU call's
#                  configure step (same generator and options, arch 90) with the newest CMake from
#                  PyPI (installed into build-tools/cmake/ when absent; no PyPI is a FAIL) into
#                  build-gpu-dryrun/; exit 1 when the plan exceeds 420 s or a check fails
#   --no-configure with --dry-run: the plan and the checks only (offline; the ctest)
#   --build-cuda   with --dry-run: also compile vlm_kernels_cuda's .cu sources in that tree (CI,
#                  .ci/run: the CUDA sources as the newest CMake builds them)
#   --build-dir    default build-gpu/
#   --log-dir      where the logs are written (default BUILD_DIR/gpu_check_logs, emptied first)
#   --out          where summary.md and gpu_check_logs.tar.gz go (default $OUT, else BUILD_DIR)
#   --quick        fewer bench_gpu_ops repetitions; the step benchmark's quick form always
#   --part         tests: the ctest steps only; bench: the benchmarks only; all (default)
#   --memcheck     also compute-sanitizer memcheck on one small attention test (not in the
#                  budget: 60 s more; WARN when the tool refuses the device)
# Environment: VLM_BUILD_JOBS (default: nproc), VLM_CUDA_ARCH (default: the GPU's, else 90),
# VLM_CHECK_BUDGET (seconds for the whole run, default 450). Never reads stdin.
set -uo pipefail
exec </dev/null
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
build_dir="$root/build-gpu"
log_dir=""
out_dir=""
quick=""
part=all
allow_no_gpu=0
dry_run=0
prepare=0
dry_configure=1
dry_build_cuda=0
memcheck=0
usage() {
  sed -n '/^# Usage:/,/^# VLM_CHECK_BUDGET/p' "${BASH_SOURCE[0]}" | sed 's/^# \{0,1\}//' >&2
  exit 2
}
while (($#)); do
  case "$1" in
  --build-dir | --log-dir | --part | --out)
    (($# >= 2)) || usage
    case "$1" in
    --build-dir) build_dir="$2" ;;
    --log-dir) log_dir="$2" ;;
    --out) out_dir="$2" ;;
    --part) part="$2" ;;
    esac
    shift
    ;;
  --quick) quick="--quick" ;;
  --allow-no-gpu) allow_no_gpu=1 ;;
  --dry-run) dry_run=1 ;;
  --prepare) prepare=1 ;;
  --no-configure) dry_configure=0 ;;
  --build-cuda) dry_build_cuda=1 ;;
  --memcheck) memcheck=1 ;;
  *) usage ;;
  esac
  shift
done
# --no-configure and --build-cuda belong to --dry-run, and exclude each other.
if ((dry_run && prepare)) || ((!dry_run && (!dry_configure || dry_build_cuda))) ||
  ((!dry_configure && dry_build_cuda)); then
  usage
fi
[[ $part == all || $part == tests || $part == bench ]] || {
  echo "--part: expected all, tests or bench, got '$part'" >&2
  exit 2
}

# --- the plan ---------------------------------------------------------------------------------
# Seconds per step, each from its work: measured on a 2-core x86-64 CI-like machine (no GPU),
# scaled to the device tool's 16 cores at the same speed per core, then >= 30% added. GPU-side
# times cannot be measured without a GPU: those rows say what they assume for an H100.
#   step        here                        scaled (16 cores, H100)                      budget
#   machine     -                           nvidia-smi twice, ~3 s                         10
#   deps        1.1 s (dpkg -x of 22 .debs) ~2 s (x2 for slower container I/O)              5
#   configure   6-10 s, cmake 4.4.5, sm_90  ~12 s (one core's work; x1.5 for spawn cost)    20
#   build       583 s of jobs at -j1; the   ~100 s: -j16 simulated from the -j1 log and   140
#               cuDNN frontend object       the build graph = 98 s, the critical path (that
#               (kernels/cuda/attention_    one object, its archive, a link); the rest of
#               cudnn.cpp) alone 97 s       the jobs would fit in ~45 s
#   ctest       117 tests (ctest -L gpu     ~33 s: 117 processes x ~2.5 s (CUDA, cuBLASLt,   60
#               -N), 0.19 CPU-s each when   cuDNN start and the test) / 16 = 18 s, + the
#               skipping; CPU references:   longest test (the demos: ~15 s) started last
#               the demo configs' 30-step
#               CPU runs 4.1 s + 0.7 s at
#               one thread, the rest < 2 s
#   ctest-sync  as ctest                    ~43 s: every launch synchronizes (+30%)          65
#   ops-bench   0.1 s to start              ~30 s: torch import ~10 s, the GEMMs, attention  40
#                                           at 4k/8k and torch SDPA, a few s of GPU each
#   step-bench  host init of the 1.7B       ~50 s quick (5 + 2 steps a side): ours ~27 s     65
#               shapes: 21 s for 361M       (the embedding's 311M values are one host
#               values on one thread        thread's draw, ~18 s; CUDA start; 7 steps of
#               (--layers 1)                ~0.3 s), torch amp ~20 s (import, init on GPU)
#   pack        -                           tar of the logs, ~1 s                             5
#   total                                                                                  410
# The whole run is held to 450 s (the steps and a 30 s reserve): a rerun fits the session's
# 15 minutes of device time too. The first real run's summary.md gives the times to revise these.
steps=(machine deps configure build ctest ctest-sync ops-bench step-bench pack)
declare -A plan=([machine]=10 [deps]=5 [configure]=20 [build]=140 [ctest]=60 [ctest-sync]=65
  [ops-bench]=40 [step-bench]=65 [pack]=5)
steps_limit=420 # the plan's ceiling (tests/CMakeLists.txt checks the dry run against it)
budget=${VLM_CHECK_BUDGET:-450}
reserve=30 # nvidia-smi queries, ldd, summary: outside the steps
if [[ $part == tests ]]; then
  plan[ops-bench]=0 plan[step-bench]=0
elif [[ $part == bench ]]; then
  plan[ctest]=0 plan[ctest-sync]=0
fi
step_cmd() {
  case "$1" in
  machine) echo "nvidia-smi; nvidia-smi --query-gpu=name,driver_version,memory.total,compute_cap" ;;
  deps) echo "tools/gpu/gpu_deps.sh install .gpu-deps BUILD_DIR/deps; source BUILD_DIR/deps/env.sh" ;;
  configure)
    configure_cmd cmake BUILD_DIR ARCH
    echo "${cfg[*]}" | sed -e "s| -S $root | -S . |" -e 's| -DCMAKE_CUDA_COMPILER=[^ ]*||'
    ;;
  build) echo "cmake --build BUILD_DIR -j NPROC --target ${targets[*]}" ;;
  ctest) echo "ctest --test-dir BUILD_DIR -L gpu -j NPROC (VLM_SYNC unset)" ;;
  ctest-sync) echo "VLM_SYNC=1 ctest --test-dir BUILD_DIR -L gpu -j NPROC" ;;
  ops-bench) echo "BUILD_DIR/bench/bench_gpu_ops $quick" ;;
  step-bench)
    echo "TORCH_RECIPES=amp STEPS=5 WARMUP=2 bash bench/bench_gpu_step.sh BUILD_DIR" \
      "(10 + 3 steps when the time left allows)"
    ;;
  pack) echo "tar -czf OUT/gpu_check_logs.tar.gz LOG_DIR; cp LOG_DIR/summary.md OUT/" ;;
  esac
}
# configure_cmd <cmake> <build dir> <arch>: the configure step's command in cfg[], the same for
# the GPU call and the dry run (Ninja where it is on PATH: on the GPU machine from .gpu-deps/).
configure_cmd() {
  local generator=()
  command -v ninja >/dev/null && generator=(-G Ninja)
  cfg=("$1" -S "$root" -B "$2" "${generator[@]}" -DVLM_CUDA=ON -DCMAKE_CUDA_COMPILER="${nvcc:-nvcc}"
    -DCMAKE_CUDA_ARCHITECTURES="$3" -DCMAKE_BUILD_TYPE=Release -DVLM_SANITIZE=OFF
    -DVLM_BUILD_TESTS=ON -DVLM_BUILD_BENCH=ON)
}
# later <step>: the planned seconds of the steps after <step>.
later() {
  local s found=0 sum=0
  for s in "${steps[@]}"; do
    ((found)) && sum=$((sum + plan[$s]))
    [[ $s == "$1" ]] && found=1
  done
  echo "$sum"
}
start_all=$SECONDS
# timeout_for <step>: what is left for <step> (at least 5 s).
timeout_for() {
  local t=$((budget - reserve - (SECONDS - start_all) - $(later "$1")))
  ((t < 5)) && t=5
  echo "$t"
}

# The test binaries with `gpu` tests: tests/CMakeLists.txt makes test_<folder>_gpu of the
# *_gpu.cpp files under each top folder of tests/.
gpu_test_targets() {
  find "$root/tests" -name '*_gpu.cpp' | sed -E "s|^$root/tests/([^/]+)/.*|test_\1_gpu|" | sort -u
}
mapfile -t targets < <(gpu_test_targets)
targets+=(vlmtrain bench_gpu_ops bench_gpu_step)

print_plan() {
  local s total=0
  printf '%-11s %6s  %s\n' step budget command
  for s in "${steps[@]}"; do
    ((plan[$s] > 0)) || continue
    printf '%-11s %5ss  %s\n' "$s" "${plan[$s]}" "$(step_cmd "$s")"
    total=$((total + plan[$s]))
  done
  echo "total: $total s of steps (limit $steps_limit s; whole run at most $budget s with the" \
    "${reserve} s reserve; the device tool's command limit is 600 s)"
  ((total <= steps_limit))
}

have() { # have <file>...: true when any of the files exists
  local f
  for f in "$@"; do [[ -e $f ]] && return 0; done
  return 1
}
join() { # join <items>...: "a, b, c"
  local IFS=';' s
  s="$*"
  echo "${s//;/, }"
}
find_nvcc() {
  nvcc=$(command -v nvcc || true)
  local c
  for c in "${CUDA_HOME:-/nonexistent}/bin/nvcc" /usr/local/cuda/bin/nvcc /usr/local/cuda-*/bin/nvcc; do
    [[ -z $nvcc && -x $c ]] && nvcc=$c
  done
}

# check_prereqs <deps prefix>: fills missing[] and warn[]; cv = cmake's version.
check_prereqs() {
  local deps=$1
  missing=() warn=() cv=""
  find_nvcc
  if [[ -n $nvcc ]]; then
    PATH="$PATH:${nvcc%/*}"
  else
    missing+=("nvcc (the CUDA toolkit: not on PATH, in \$CUDA_HOME/bin or /usr/local/cuda*/bin)")
  fi
  if ! command -v cmake >/dev/null; then
    missing+=("cmake >= 3.25 (not on PATH)")
  else
    cv=$(cmake --version 2>/dev/null | head -1 | grep -Eo '[0-9]+\.[0-9]+(\.[0-9]+)?' | head -1)
    if [[ -z $cv ]]; then
      missing+=("cmake >= 3.25 ($(command -v cmake) does not run)")
    elif [[ $(printf '%s\n' 3.25 "$cv" | sort -V | head -1) != 3.25 ]]; then
      missing+=("cmake >= 3.25 (found $cv at $(command -v cmake))")
    fi
  fi
  command -v "${CXX:-c++}" >/dev/null || command -v g++ >/dev/null ||
    missing+=("a C++20 compiler (g++ >= 11)")
  command -v ninja >/dev/null || warn+=("ninja (falls back to make)")
  if ! ldconfig -p 2>/dev/null | grep -q 'libopenblas' && ! pkg-config --exists openblas 2>/dev/null &&
    ! compgen -G "$deps/lib/*/openblas-openmp/libopenblas.so" >/dev/null; then
    missing+=("OpenBLAS (libopenblas-dev libopenblas-openmp-dev; or carry .gpu-deps/)")
  fi
  have /usr/include/catch2/catch.hpp /usr/local/include/catch2/catch.hpp "$deps/include/catch2/catch.hpp" ||
    missing+=("Catch2 v2 (catch2; or carry .gpu-deps/)")
  command -v mpicc >/dev/null || command -v mpicxx >/dev/null || warn+=("MPI")
  if ! command -v h5pcc >/dev/null && ! command -v h5cc >/dev/null &&
    ! pkg-config --exists hdf5 hdf5-openmpi 2>/dev/null &&
    ! have /usr/include/hdf5/openmpi/hdf5.h /usr/include/hdf5/serial/hdf5.h /usr/include/hdf5.h; then
    warn+=("HDF5")
  fi
  command -v python3 >/dev/null || warn+=("python3 (the torch sides of the benchmarks)")
}

# The newest CMake from PyPI, for the dry run's configure (CMake 4 changed defaults that broke the
# CUDA build once: kernels/cuda/CMakeLists.txt): pip's --target folder build-tools/cmake/
# (gitignored as build*/; never carried: the GPU machine uses its own cmake).
newest_cmake_dir=$root/build-tools/cmake
newest_cmake=$newest_cmake_dir/cmake/data/bin/cmake
# install_newest_cmake [--upgrade]: installs it when absent (always with --upgrade); 1, with pip's
# words, when it cannot (no pip, no PyPI): never a silent fallback to another cmake.
install_newest_cmake() {
  if [[ ${1:-} != --upgrade && -x $newest_cmake ]] && "$newest_cmake" --version >/dev/null 2>&1; then
    return 0
  fi
  local tmp=$newest_cmake_dir.new log
  rm -rf "$tmp"
  mkdir -p "$tmp"
  log=$tmp.log
  echo "gpu_check: installing the newest CMake from PyPI into ${newest_cmake_dir#"$root"/}"
  # --target: no venv needed, and Debian's pip (PEP 668) allows it.
  if ! PIP_ROOT_USER_ACTION=ignore PIP_DISABLE_PIP_VERSION_CHECK=1 timeout 300 python3 -m pip install \
    --quiet --no-input --no-deps --only-binary=:all: --upgrade --target "$tmp" cmake >"$log" 2>&1 ||
    ! "$tmp/cmake/data/bin/cmake" --version >/dev/null 2>>"$log"; then
    echo "gpu_check: FAILED to install the newest CMake from PyPI (python3 -m pip install --target" \
      "${tmp#"$root"/} cmake): $(tail -4 "$log" | paste -sd ' ')" >&2
    rm -rf "$tmp" "$log"
    return 1
  fi
  rm -rf "$newest_cmake_dir" "$log"
  mv "$tmp" "$newest_cmake_dir"
}

# --- --prepare ----------------------------------------------------------------------------------
# Everything the GPU call carries, made here; loud about what fails.
if ((prepare)); then
  rc=0
  echo "== .gpu-deps/: bash tools/gpu/gpu_deps.sh download"
  bash "$root/tools/gpu/gpu_deps.sh" download || rc=1
  echo "== .deps/cudnn_frontend: VLM_REQUIRE_CUDNN_FRONTEND=1 bash tools/deps/fetch_cudnn_frontend.sh"
  VLM_REQUIRE_CUDNN_FRONTEND=1 bash "$root/tools/deps/fetch_cudnn_frontend.sh" || rc=1
  echo "== ${newest_cmake_dir#"$root"/}: the newest CMake from PyPI (for --dry-run)"
  if install_newest_cmake --upgrade; then
    "$newest_cmake" --version | head -1
  else
    rc=1
  fi
  if ((rc)); then
    echo "gpu_check --prepare: FAILED (above)"
    exit 1
  fi
  echo "gpu_check --prepare: OK ($(du -sh "$root/.gpu-deps" | cut -f1) in .gpu-deps, $(du -sh \
    "$root/.deps" | cut -f1) in .deps). Then: bash tools/gpu/gpu_check.sh --dry-run, and the call"
  echo '  run(command="bash tools/gpu/gpu_check.sh", carry=[".gpu-deps", ".deps"], timeout_s=600)'
  exit 0
fi

# --- the carried folders: the real run refuses at once without them -----------------------------
if ((!dry_run)); then
  carry_missing=()
  compgen -G "$root/.gpu-deps/*.deb" >/dev/null ||
    carry_missing+=("no .gpu-deps/*.deb (the Debian packages: OpenBLAS, Catch2, ninja, ...)")
  bash "$root/tools/deps/fetch_cudnn_frontend.sh" --check >/dev/null 2>&1 ||
    carry_missing+=("no .deps/cudnn_frontend headers (the pinned cuDNN frontend)")
  if ((${#carry_missing[@]})); then
    echo "gpu_check: REFUSED before any step: $(join "${carry_missing[@]}")."
    echo "  Where apt and PyPI work, run: bash tools/gpu/gpu_check.sh --prepare"
    echo '  then: run(command="bash tools/gpu/gpu_check.sh", carry=[".gpu-deps", ".deps"], timeout_s=600)'
    exit 2
  fi
fi

# --- --dry-run ----------------------------------------------------------------------------------
if ((dry_run)); then
  echo "gpu_check --dry-run: build $build_dir, part $part, budget ${budget}s"
  print_plan
  plan_ok=$?
  echo
  echo "checks (what can be checked without a GPU):"
  problems=0
  note() { printf '  %-5s %s\n' "$1" "${*:2}"; }
  # The test binaries exist as folders tests/CMakeLists.txt builds.
  for t in "${targets[@]}"; do
    [[ $t == test_*_gpu ]] || continue
    folder=${t#test_}
    folder=${folder%_gpu}
    if grep -qE "^foreach\(folder .*\b$folder\b" "$root/tests/CMakeLists.txt"; then
      note ok "target $t (tests/$folder/)"
    else
      note FAIL "target $t: tests/$folder is not a test folder of tests/CMakeLists.txt"
      problems=1
    fi
  done
  for f in bench/bench_gpu_ops.cpp bench/bench_gpu_step.cpp bench/bench_gpu_step.sh \
    bench/bench_gpu_step.py bench/bench_attention_torch.py tools/gpu/gpu_deps.sh; do
    if [[ -f $root/$f ]]; then note ok "$f"; else
      note FAIL "$f missing"
      problems=1
    fi
  done
  # The carried packages: there is no registry on the GPU machine.
  ndeb=$(find "$root/.gpu-deps" -maxdepth 1 -name '*.deb' 2>/dev/null | wc -l)
  if ((ndeb > 0)); then
    note ok ".gpu-deps/: $ndeb packages, $(du -sh "$root/.gpu-deps" | cut -f1) (carry it)"
    if git -C "$root" check-ignore -q .gpu-deps/x.deb 2>/dev/null; then
      note ok ".gpu-deps/ is gitignored: it travels only through carry"
    else
      note WARN ".gpu-deps/ is not gitignored: it would travel (and count) with every call"
    fi
  else
    note WARN ".gpu-deps/ holds no packages: the GPU call refuses to start without them
        (bash tools/gpu/gpu_check.sh --prepare; the GPU machine has no package registry)"
  fi
  if bash "$root/tools/deps/fetch_cudnn_frontend.sh" --check >/dev/null 2>&1; then
    note ok ".deps/cudnn_frontend: the pinned cuDNN frontend headers (carry .deps too)"
  else
    note WARN ".deps/cudnn_frontend lacks the pinned headers: the GPU call refuses to start
        without them (bash tools/gpu/gpu_check.sh --prepare)"
  fi
  # The travelling tree: the device tool takes at most 64 MiB with the carried folders.
  if command -v git >/dev/null; then
    tree_kib=$(git -C "$root" ls-files -z --cached --others --exclude-standard |
      (cd "$root" && xargs -0 du -ck 2>/dev/null) | awk '/\ttotal$/ {s += $1} END {print s + 0}')
    carry_kib=$(du -sk "$root/.gpu-deps" "$root/.deps" 2>/dev/null | awk '{s += $1} END {print s + 0}')
    if (((tree_kib + carry_kib) / 1024 < 64)); then
      note ok "travelling tree $((tree_kib / 1024)) MiB + carried $((carry_kib / 1024)) MiB (limit 64 MiB)"
    else
      note FAIL "travelling tree $((tree_kib / 1024)) MiB + carried $((carry_kib / 1024)) MiB: over 64 MiB"
      problems=1
    fi
  fi
  check_prereqs "$root/.gpu-deps-unpacked-there"
  note info "here: cmake ${cv:-missing}, nvcc ${nvcc:-missing}$( ((${#missing[@]})) &&
    echo "; missing here: $(join "${missing[@]}")")"
  # The GPU call's configure step, run here with the newest CMake, arch 90, into a throwaway tree.
  if ((dry_configure)); then
    dry_dir=$root/build-gpu-dryrun
    if ! install_newest_cmake; then
      note FAIL "configure did not run: the newest CMake could not be installed from PyPI (above)"
      problems=1
    elif [[ -z $nvcc ]]; then
      note FAIL "configure did not run: no nvcc here (the CUDA toolkit)"
      problems=1
    else
      ncv=$("$newest_cmake" --version | head -1 | awk '{print $3}')
      rm -rf "$dry_dir"
      mkdir -p "$dry_dir"
      configure_cmd "$newest_cmake" "$dry_dir" 90
      t0=$SECONDS
      timeout 300 "${cfg[@]}" >"$dry_dir/configure.log" 2>&1
      rc=$?
      dt=$((SECONDS - t0))
      if ((rc == 0)); then
        note ok "configure ran and passed in $dt s (budget ${plan[configure]} s): cmake $ncv (newest" \
          "on PyPI), $(command -v ninja >/dev/null && echo Ninja || echo make), sm_90 (${dry_dir#"$root"/})"
        sed -nE 's/^-- vlmtrain: (cuDNN|NCCL)(.*)/        \1\2/p' "$dry_dir/configure.log"
        ((dt <= plan[configure])) ||
          note WARN "configure took $dt s here, over its budget of ${plan[configure]} s on the GPU machine"
        nwarn=$(grep -cE '^CMake (Warning|Deprecation Warning)' "$dry_dir/configure.log")
        ((nwarn == 0)) || note WARN "cmake $ncv: $nwarn warnings (${dry_dir#"$root"/}/configure.log)"
      else
        grep -A12 -E 'CMake Error' "$dry_dir/configure.log" | head -40
        note FAIL "configure with cmake $ncv failed after $dt s$( ((rc == 124)) && echo ' (timed out)')" \
          "(${dry_dir#"$root"/}/configure.log)"
        problems=1
      fi
      # CI (.ci/run): the CUDA sources compiled as the newest CMake builds them, so that a CMake
      # release that changes how .cu files are built (unity batches, flags) breaks CI, not the GPU
      # call. Only vlm_kernels_cuda's .cu objects (whatever their batching): its one C++ object,
      # the cuDNN frontend's (97 s of one core), is CI's main build's already.
      if ((rc == 0 && dry_build_cuda)); then
        jobs=${VLM_BUILD_JOBS:-$(nproc)}
        build_what=(--target vlm_kernels_cuda)
        if [[ -f $dry_dir/build.ninja ]]; then
          mapfile -t cu_objs < <(ninja -C "$dry_dir" -t targets all |
            grep -oE '^kernels/cuda/CMakeFiles/vlm_kernels_cuda\.dir/[^:]*\.cu\.o')
          build_what=(-- "${cu_objs[@]}")
        fi
        t0=$SECONDS
        if [[ ${build_what[0]} == -- && ${#build_what[@]} -lt 2 ]]; then
          rc=1
          echo "no .cu objects of vlm_kernels_cuda in ${dry_dir#"$root"/}/build.ninja" \
            >"$dry_dir/build_cuda.log"
        else
          timeout 1500 "$newest_cmake" --build "$dry_dir" -j "$jobs" "${build_what[@]}" \
            >"$dry_dir/build_cuda.log" 2>&1
          rc=$?
        fi
        what=vlm_kernels_cuda
        [[ ${build_what[0]} == -- ]] && what+="'s $((${#build_what[@]} - 1)) .cu objects"
        if ((rc == 0)); then
          note ok "$what compiled as cmake $ncv builds them in $((SECONDS - t0)) s (-j$jobs)"
        else
          grep -E -B2 -A12 'error|FAILED' "$dry_dir/build_cuda.log" | head -60
          note FAIL "$what with cmake $ncv failed after $((SECONDS - t0)) s" \
            "(${dry_dir#"$root"/}/build_cuda.log)"
          problems=1
        fi
      fi
    fi
  fi
  ((plan_ok == 0)) || {
    echo "gpu_check --dry-run: the plan exceeds $steps_limit s"
    exit 1
  }
  ((problems == 0)) || {
    echo "gpu_check --dry-run: problems above"
    exit 1
  }
  echo "gpu_check --dry-run: OK"
  exit 0
fi

# --- the run --------------------------------------------------------------------------------
[[ -n $log_dir ]] || log_dir="$build_dir/gpu_check_logs"
[[ -n $out_dir ]] || out_dir="${OUT:-$build_dir}"
mkdir -p "$build_dir" "$log_dir" "$out_dir" || {
  echo "gpu_check: cannot create the build, log or output folder" >&2
  exit 2
}
build_dir=$(cd "$build_dir" && pwd)
log_dir=$(cd "$log_dir" && pwd)
out_dir=$(cd "$out_dir" && pwd)
[[ $out_dir != "$log_dir" ]] || out_dir=$(dirname "$log_dir") # the tarball cannot hold itself
# Logs of an earlier run on a kept machine would be packed again.
find "$log_dir" -mindepth 1 -maxdepth 1 -exec rm -rf {} +

summary=()
failed=0
record() { # record <step> <PASS|FAIL|SKIP|WARN> <seconds> <note>
  summary+=("$(printf '| %-24s | %-4s | %5ss | %s |' "$1" "$2" "$3" "$4")")
  [[ $2 == FAIL ]] && failed=1
  return 0
}

main() {
  echo "gpu_check: part $part, build $build_dir, logs $log_dir, out $out_dir, budget ${budget}s"
  print_plan
  local t0 rc
  # --- machine ------------------------------------------------------------------------------
  have_gpu=0
  gpu_note="nvidia-smi not found (no NVIDIA driver on this machine)"
  if command -v nvidia-smi >/dev/null; then
    timeout "$(timeout_for machine)" nvidia-smi >"$log_dir/nvidia-smi.log" 2>&1
    rc=$?
    sed 's/^/  /' "$log_dir/nvidia-smi.log"
    if ((rc == 124)); then
      gpu_note="nvidia-smi hung: the driver is not usable"
    elif timeout 10 nvidia-smi -L 2>/dev/null | grep -q '^GPU'; then
      have_gpu=1
      gpu_note=$(timeout 10 nvidia-smi --query-gpu=name,driver_version,memory.total,compute_cap \
        --format=csv,noheader 2>&1 | paste -sd ';')
    else
      gpu_note="nvidia-smi lists no GPU: $(head -c 300 "$log_dir/nvidia-smi.log" | paste -sd ' ')"
    fi
  fi
  echo "GPU: $gpu_note"
  if ((have_gpu)); then
    record GPU PASS 0 "$gpu_note"
  elif ((allow_no_gpu)); then
    record GPU WARN 0 "$gpu_note (--allow-no-gpu: GPU tests skip)"
  else
    record GPU FAIL 0 "$gpu_note"
  fi
  local arch=${VLM_CUDA_ARCH:-}
  if [[ -z $arch ]] && ((have_gpu)); then
    arch=$(timeout 10 nvidia-smi --query-gpu=compute_cap --format=csv,noheader 2>/dev/null |
      head -1 | tr -d ' .')
  fi
  [[ $arch =~ ^[0-9]+[a-z]?$ ]] || arch=90

  # --- deps: carried Debian packages into BUILD_DIR/deps (never into /) ----------------------
  if compgen -G "$root/.gpu-deps/*.deb" >/dev/null; then
    t0=$SECONDS
    if timeout "$(timeout_for deps)" bash "$root/tools/gpu/gpu_deps.sh" install "$root/.gpu-deps" \
      "$build_dir/deps" >"$log_dir/deps.log" 2>&1; then
      # shellcheck source=/dev/null
      source "$build_dir/deps/env.sh"
      record "carried deps" PASS $((SECONDS - t0)) "$(tail -1 "$log_dir/deps.log" | sed 's/ (source.*//')"
    else
      cat "$log_dir/deps.log"
      record "carried deps" FAIL $((SECONDS - t0)) "tools/gpu/gpu_deps.sh install failed (log deps.log)"
    fi
  else
    record "carried deps" WARN 0 "no .gpu-deps/*.deb (tools/gpu/gpu_deps.sh download here, carry .gpu-deps)"
  fi
  check_prereqs "${VLM_DEPS_PREFIX:-/nonexistent}"
  if ((${#missing[@]})); then
    printf 'gpu_check: MISSING %s\n' "${missing[@]}"
    record prerequisites FAIL 0 "missing: $(join "${missing[@]}")"
  else
    record prerequisites PASS 0 "cmake $cv, $nvcc, OpenBLAS, Catch2"
  fi
  if ((${#warn[@]})); then
    printf 'gpu_check: not found (not needed by this check) %s\n' "${warn[@]}"
    record "optional deps" WARN 0 "not found: $(join "${warn[@]}")"
  fi

  # --- configure ------------------------------------------------------------------------------
  built=0
  if ((${#missing[@]})); then
    record configure SKIP 0 "prerequisites missing"
    record build SKIP 0 "prerequisites missing"
    return
  fi
  t0=$SECONDS
  # Release, sm_$arch only, no sanitizer build; cuDNN/NCCL AUTO (kernels/cuda/CMakeLists.txt).
  configure_cmd cmake "$build_dir" "$arch"
  timeout "$(timeout_for configure)" "${cfg[@]}" >"$log_dir/configure.log" 2>&1
  rc=$?
  grep -E '^-- vlmtrain: ' "$log_dir/configure.log"
  if ((rc != 0)); then
    grep -A12 -E 'CMake Error|not found' "$log_dir/configure.log" | head -60
    record configure FAIL $((SECONDS - t0)) "$( ((rc == 124)) && echo 'timed out; ')log configure.log"
    record build SKIP 0 "not configured"
    return
  fi
  record configure PASS $((SECONDS - t0)) "sm_$arch, $(command -v ninja >/dev/null && echo Ninja || echo make)"
  local libs
  libs=$(sed -nE 's/^-- vlmtrain: (cuDNN|NCCL|cuDNN frontend)(.*)/\1\2/p' "$log_dir/configure.log" |
    paste -sd ';' | sed 's/;/; /g')
  if grep -qE '^-- vlmtrain: (cuDNN|NCCL) (not found|off)' "$log_dir/configure.log"; then
    record "cuDNN, NCCL" WARN 0 "${libs:-?}"
  else
    record "cuDNN, NCCL" PASS 0 "${libs:-?}"
  fi
  if ((!have_gpu && !allow_no_gpu)); then
    echo "gpu_check: no GPU visible: stopping before the build (--allow-no-gpu builds and runs anyway)"
    record build SKIP 0 "no GPU visible"
    return
  fi

  # --- build ----------------------------------------------------------------------------------
  t0=$SECONDS
  local jobs=${VLM_BUILD_JOBS:-$(nproc)} limit
  limit=$(timeout_for build)
  echo "gpu_check: building ${targets[*]} (-j$jobs, at most ${limit}s)"
  timeout "$limit" cmake --build "$build_dir" -j "$jobs" --target "${targets[@]}" \
    >"$log_dir/build.log" 2>&1
  rc=$?
  if ((rc == 0)); then
    built=1
    record build PASS $((SECONDS - t0)) "${targets[*]} (-j$jobs)"
  else
    if grep -qE 'error|FAILED' "$log_dir/build.log"; then
      grep -E -B2 -A12 'error|FAILED' "$log_dir/build.log" | head -60
    else
      tail -30 "$log_dir/build.log"
    fi
    record build FAIL $((SECONDS - t0)) "$( ((rc == 124)) && echo "timed out after ${limit}s; ")log build.log"
  fi
  # Libraries a binary cannot find at run time (e.g. a wheel's libcudnn.so.9 without RUNPATH):
  # also the usual cause of a failing test discovery at the end of the build.
  local bin unresolved=""
  for bin in "$build_dir"/vlmtrain "$build_dir"/tests/test_*_gpu "$build_dir"/bench/bench_gpu_*; do
    [[ -x $bin ]] || continue
    unresolved+=$(ldd "$bin" 2>/dev/null | awk -v b="$(basename "$bin")" '/not found/ {printf "%s: %s; ", b, $1}')
  done
  if [[ -n $unresolved ]]; then
    echo "gpu_check: libraries not found at run time: $unresolved"
    record "runtime libraries" FAIL 0 "not found: $unresolved"
    built=0
  fi
  if [[ -x $build_dir/vlmtrain ]]; then
    echo "device-query: $(timeout 30 "$build_dir/vlmtrain" device-query 2>&1 | paste -sd ' ')" |
      tee "$log_dir/device-query.log"
  fi
}

# run_ctest <step> <sync 0|1>: ctest -L gpu, with VLM_SYNC=1 when <sync>.
run_ctest() {
  local step=$1 sync=$2 name log xml t0 rc
  name="ctest -L gpu$( ((sync)) && echo ' VLM_SYNC=1')"
  log="$log_dir/$step.log"
  xml="$log_dir/$step.xml"
  if ((!built)); then
    record "$name" SKIP 0 "not built"
    return
  fi
  t0=$SECONDS
  # As many tests at a time as cores, all on the one GPU: most of a test's time is its process's
  # CUDA/cuDNN start and small launches, and the CPU references (the demo runs, ~4 s at one
  # thread) take one thread each.
  local par threads=1 limit
  par=$(nproc)
  limit=$(timeout_for "$step")
  local env_sync=(env -u VLM_SYNC)
  ((sync)) && env_sync=(env VLM_SYNC=1)
  echo "== $name (at most ${limit}s) =="
  "${env_sync[@]}" OMP_NUM_THREADS="${OMP_NUM_THREADS:-$threads}" timeout "$limit" \
    ctest --test-dir "$build_dir" -L gpu --output-on-failure -j "$par" --timeout "$limit" \
    --output-junit "$xml" >"$log" 2>&1
  rc=$?
  local total skipped failing note
  total=$(grep -Eo 'out of [0-9]+' "$log" | tail -1 | grep -Eo '[0-9]+')
  skipped=$(grep -c '\*\*\*Skipped' "$log")
  failing=$(grep -E 'Failed|Exception|Timeout|Not Run' "$log" | grep -c 'Test *#')
  grep -E 'Test *#' "$log" | sed 's/^/  /'
  note="${total:-0} tests, $failing failed, $skipped skipped"
  # Why tests skipped: their "SKIPPED: <reason>" lines (tests/skip.h) in the junit file.
  local reasons="" unexplained=0
  if ((skipped > 0)); then
    reasons=$(grep -ho 'SKIPPED: [^<&]*' "$xml" 2>/dev/null | sort | uniq -c | sed 's/^ *//' | paste -sd ';')
    # Allowed while a GPU is visible: a library this build does not have (NCCL, cuDNN).
    unexplained=$(grep -ho 'SKIPPED: [^<&]*' "$xml" 2>/dev/null | grep -vc 'not in this build')
    [[ -z $reasons ]] && unexplained=$skipped
  fi
  if ((rc == 124)); then
    record "$name" FAIL $((SECONDS - t0)) "timed out after ${limit}s; $note (log $step.log)"
  elif ((rc != 0 || failing > 0)) || [[ -z $total || $total == 0 ]]; then
    grep -A40 -E '\*\*\*Failed|\*\*\*Exception|\*\*\*Timeout' "$log" | head -80
    record "$name" FAIL $((SECONDS - t0)) "$note (log $step.log)"
  elif ((have_gpu && unexplained > 0)); then
    record "$name" FAIL $((SECONDS - t0)) "$note: a GPU is visible, nothing may skip ($reasons)"
  elif ((have_gpu && skipped > 0)); then
    record "$name" WARN $((SECONDS - t0)) "$note: $reasons"
  elif ((!have_gpu)); then
    record "$name" WARN $((SECONDS - t0)) "$note (no GPU visible)"
  else
    record "$name" PASS $((SECONDS - t0)) "$note"
  fi
}

memcheck_attention() {
  local sanitizer t0 rc limit=120
  sanitizer=$(command -v compute-sanitizer || true)
  [[ -z $sanitizer && -x $(dirname "${nvcc:-/x/x}")/compute-sanitizer ]] &&
    sanitizer=$(dirname "$nvcc")/compute-sanitizer
  if ((!built || !have_gpu)) || [[ -z $sanitizer ]]; then
    record "memcheck attention" SKIP 0 "needs the build, a GPU and compute-sanitizer"
    return
  fi
  t0=$SECONDS
  timeout "$limit" "$sanitizer" --tool memcheck --error-exitcode 3 "$build_dir/tests/test_core_gpu" \
    "gpu attention: odd head dims and a single long document" >"$log_dir/memcheck.log" 2>&1
  rc=$?
  local log=$log_dir/memcheck.log
  # Seen on some machines: the sanitizer refuses the device ("Device not supported"), then error
  # 999: that says nothing about our kernels (WARN).
  if grep -qiE 'device not supported|not supported on this device' "$log" ||
    { ((rc != 0 && rc != 124)) && grep -qiE 'cudaErrorUnknown|unknown error|error 999' "$log" &&
      ! grep -qE 'Invalid (__global__|__shared__|__local__)|out of bounds|ERROR SUMMARY: [1-9]' "$log"; }; then
    record "memcheck attention" WARN $((SECONDS - t0)) "compute-sanitizer cannot check this device (log memcheck.log)"
  elif ((rc == 0)); then
    record "memcheck attention" PASS $((SECONDS - t0)) "no memory errors"
  elif ((rc == 124)); then
    record "memcheck attention" WARN $((SECONDS - t0)) "timed out after ${limit}s"
  else
    tail -40 "$log"
    record "memcheck attention" FAIL $((SECONDS - t0)) "log memcheck.log"
  fi
}

ops_bench() {
  local b=$build_dir/bench/bench_gpu_ops t0 rc limit
  if ((!built || !have_gpu)) || [[ ! -x $b ]]; then
    record bench_gpu_ops SKIP 0 "needs a GPU and the build"
    return
  fi
  t0=$SECONDS
  limit=$(timeout_for ops-bench)
  echo "== bench_gpu_ops (at most ${limit}s) =="
  timeout "$limit" "$b" $quick 2>&1 | tee "$log_dir/bench_gpu_ops.log"
  rc=${PIPESTATUS[0]}
  local vs_torch
  vs_torch=$(grep '^attention vs torch SDPA' "$log_dir/bench_gpu_ops.log" | tail -1)
  if ((rc == 0)); then
    record bench_gpu_ops PASS $((SECONDS - t0)) "${vs_torch:-torch SDPA: n/a} (log bench_gpu_ops.log)"
  else
    record bench_gpu_ops FAIL $((SECONDS - t0)) "$( ((rc == 124)) && echo "timed out after ${limit}s; ")log bench_gpu_ops.log"
  fi
}

step_bench() {
  local t0 rc limit figures
  if ((!built || !have_gpu)) || [[ ! -x $build_dir/bench/bench_gpu_step ]]; then
    record bench_gpu_step SKIP 0 "needs a GPU and the build"
    return
  fi
  t0=$SECONDS
  limit=$(timeout_for step-bench)
  echo "== bench_gpu_step.sh (at most ${limit}s) =="
  # The torch amp recipe only (the issue's baseline), in the quick form (5 + 2 steps a side) unless
  # the time left holds the full one (10 + 3: ~4 s more) with 30 s to spare.
  local env_args=(TORCH_RECIPES=amp STEPS=5 WARMUP=2)
  ((limit >= plan[step-bench] + 30)) && [[ -z $quick ]] && env_args=(TORCH_RECIPES=amp)
  env "${env_args[@]}" timeout "$limit" bash "$root/bench/bench_gpu_step.sh" "$build_dir" 2>&1 |
    tee "$log_dir/bench_gpu_step.log"
  rc=${PIPESTATUS[0]}
  figures=$(grep '^summary: ' "$log_dir/bench_gpu_step.log" | tail -1 | sed 's/^summary: //')
  if ((rc == 124)); then
    record bench_gpu_step FAIL $((SECONDS - t0)) "timed out after ${limit}s (log bench_gpu_step.log)"
  elif ((rc != 0)); then
    record bench_gpu_step FAIL $((SECONDS - t0)) "${figures:-no result} (log bench_gpu_step.log)"
  elif grep -q '^targets: met' "$log_dir/bench_gpu_step.log"; then
    record bench_gpu_step PASS $((SECONDS - t0)) "$figures"
  else
    record bench_gpu_step WARN $((SECONDS - t0)) \
      "$figures; $(grep '^targets: ' "$log_dir/bench_gpu_step.log" | tail -1)"
  fi
}

run_all() {
  main
  if [[ $part != bench ]]; then
    run_ctest ctest 0
    run_ctest ctest-sync 1
    ((memcheck)) && memcheck_attention
  fi
  if [[ $part != tests ]]; then
    ops_bench
    step_bench
  fi
  {
    echo
    echo "gpu_check (part $part) on $(uname -n) at $(date -u '+%Y-%m-%d %H:%M UTC'): every log in" \
      "gpu_check_logs.tar.gz"
    echo
    printf '| %-24s | %-4s | %6s | %s |\n' step res time note
    printf '|%s|%s|%s|%s|\n' -------------------------- ------ -------- ------
    printf '%s\n' "${summary[@]}"
    echo
    echo "gpu_check: $([[ $failed == 0 ]] && echo PASS || echo FAIL) in $((SECONDS - start_all)) s"
  } | tee "$log_dir/summary.md"
  return $failed
}

# One tarball of the logs and summary.md in OUT_DIR: two files of the device tool's 8.
pack() {
  [[ -f $log_dir/summary.md ]] || echo "gpu_check: stopped before the summary" >"$log_dir/summary.md"
  tar -czf "$out_dir/gpu_check_logs.tar.gz.part" -C "$(dirname "$log_dir")" "$(basename "$log_dir")" &&
    mv -f "$out_dir/gpu_check_logs.tar.gz.part" "$out_dir/gpu_check_logs.tar.gz"
  cp -f "$log_dir/summary.md" "$out_dir/summary.md"
  echo "gpu_check: $out_dir/summary.md and $out_dir/gpu_check_logs.tar.gz" \
    "($(du -h "$out_dir/gpu_check_logs.tar.gz" 2>/dev/null | cut -f1))"
}
trap 'pack; exit 143' TERM INT

run_all 2>&1 | tee "$log_dir/gpu_check.log"
status=${PIPESTATUS[0]}
pack
exit "$status"
