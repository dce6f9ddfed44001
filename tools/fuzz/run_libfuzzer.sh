#!/usr/bin/env bash
# Builds the libFuzzer targets (tools/fuzz/build.sh) and runs each for a fixed time under
# ASan + UBSan, from seed corpora made from tests/data (tools/fuzz/make_seeds.py).
#   tools/fuzz/run_libfuzzer.sh [seconds per target (30)] [target ...]
# First the kept findings (tools/fuzz/findings/<target>-*) are replayed once each: they stay
# failures until the bug is fixed. A finding is a crash, an ASan/UBSan report, an exception
# other than vlm::Error, a hang over 10 s, or an allocation or RSS over 2 GB; its input lands
# in build-fuzz/findings/<target>/. Prints "target T: N execs" per target; exits 1 on findings.
set -uo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
secs="${1:-30}"
shift || true
targets=("$@")
((${#targets[@]})) || targets=(tar safetensors chat tokenizer)
out="$root/build-fuzz"

bash "$root/tools/fuzz/build.sh" "$out" || exit 1
rm -rf "$out/seeds"
python3 "$root/tools/fuzz/make_seeds.py" "$out/seeds" || exit 1

# The chat and tokenizer targets encode with the real Qwen tokenizer (tests/data/qwen3-tokenizer).
cmake -E make_directory "$out/qwen3-tokenizer" &&
  (cd "$out/qwen3-tokenizer" && cmake -E tar xf "$root/tests/data/qwen3-tokenizer/tokenizer.json.tar.xz") ||
  exit 1
tok="$out/qwen3-tokenizer/tokenizer.json"
export VLM_FUZZ_TOKENIZER="${VLM_FUZZ_TOKENIZER:-$tok}"
# Leak checking needs ptrace, which containers often lack; every other report aborts.
export ASAN_OPTIONS="${ASAN_OPTIONS:-detect_leaks=0:abort_on_error=1}"
export UBSAN_OPTIONS="${UBSAN_OPTIONS:-print_stacktrace=1:halt_on_error=1}"
limits=(-rss_limit_mb=2048 -malloc_limit_mb=2048 -timeout=10 -detect_leaks=0)
# Value profiling lets comparisons guide mutations (it finds the wrong-type JSON values).
search=(-use_value_profile=1 -print_final_stats=1)

failed=()
summary=()
for t in "${targets[@]}"; do
  bin="$out/fuzz_$t"
  log="$out/fuzz_$t.log"
  # Kept findings: each input runs once.
  kept=("$root"/tools/fuzz/findings/"$t"-*)
  [[ -e ${kept[0]} ]] || kept=()
  for f in "${kept[@]}"; do
    if ! "$bin" "${limits[@]}" "$f" >"$out/replay.log" 2>&1; then
      echo "target $t: kept finding ${f#"$root"/} still fails:"
      grep -m2 -E 'ERROR|FINDING' "$out/replay.log" | sed 's/^/    /'
      grep -m2 -E '^ *#[0-9]+ 0x[0-9a-f]+ in vlm::' "$out/replay.log" | sed 's/^/    /'
      failed+=("$t (kept ${f##*/})")
    fi
  done
  # Fresh corpus each run (seeds are read-only inputs; new units go to work/).
  mkdir -p "$out/corpus/$t" "$out/findings/$t"
  rm -rf "$out/corpus/$t"/*
  "$bin" "${limits[@]}" "${search[@]}" -max_total_time="$secs" \
    -dict="$root/tools/fuzz/dict/$t.dict" \
    -artifact_prefix="$out/findings/$t/" "$out/corpus/$t" "$out/seeds/$t" >"$log" 2>&1
  rc=$?
  execs=$(grep -m1 -o 'stat::number_of_executed_units: [0-9]*' "$log" | grep -o '[0-9]*$')
  [[ -n $execs ]] || execs=$(grep -o '^#[0-9]*' "$log" | tail -1 | tr -d '#')
  line="target $t: ${execs:-?} execs in ${secs}s"
  if ((rc != 0)); then
    artifact=$(grep -m1 -o "Test unit written to [^ ]*" "$log" | sed 's/Test unit written to //')
    line+=", FINDING (rc $rc): ${artifact:-see $log}"
    failed+=("$t")
    echo "$line"
    grep -m4 -E 'ERROR: (AddressSanitizer|libFuzzer|UndefinedBehavior)|runtime error|FINDING|terminate called|what\(\)' "$log" | sed 's/^/    /'
    grep -m4 -E '^ *#[0-9]+ 0x[0-9a-f]+ in (vlm|LLVMFuzzer|nlohmann|std::__throw)' "$log" | sed 's/^/    /'
  else
    echo "$line"
  fi
  summary+=("$line")
done
echo "libfuzzer: ${#targets[@]} targets, ${#failed[@]} with findings${failed:+: ${failed[*]}}"
((${#failed[@]} == 0))
