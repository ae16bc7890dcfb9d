#!/usr/bin/env bash
# Builds the libFuzzer targets (tests/fuzz/) with clang under ASan and
# UBSan in build-san/ (scripts/build-san.sh) and runs each for FUZZ_SECONDS (default 30) from its
# seed corpus (tests/fuzz/corpus/<target>, copied so the tree stays clean).
# Fails on any finding, leaks included (tests/fuzz/lsan.supp lists the
# intentional process-lifetime allocations, each with its reason); the
# crashing input is left in build-san/findings/.
# FUZZ_SEED (default 1) fixes the mutation sequence; 0 takes the clock.
#   scripts/fuzz.sh [target ...]
set -euo pipefail
cd "$(dirname "$0")/.."
TARGETS=(fuzz_gguf fuzz_safetensors fuzz_tokenizer_json
  fuzz_tokenizer_roundtrip fuzz_stop_strings fuzz_http_api fuzz_grpc_api
  fuzz_step_plan)
[ "$#" -gt 0 ] && TARGETS=("$@")
SECONDS_EACH=${FUZZ_SECONDS:-30}
# libFuzzer's mutation seed: fixed by default, so that a run explores the
# same inputs each time (CI cannot fail at random); FUZZ_SEED=0 picks one
# from the clock for deeper local runs.
SEED=${FUZZ_SEED:-1}
BUILD=build-san
export SHARDLM_MODEL=${SHARDLM_MODEL:-$PWD/models/SmolLM2-135M-Instruct.Q4_1.gguf}

bash scripts/build-san.sh --target "${TARGETS[@]}"

mkdir -p "$BUILD/findings"
# One target, its log in $BUILD/findings/<target>.log; exit status 1 on a
# finding.
fuzz_one() {
  local t=$1 corpus="$BUILD/corpus/$1"
  mkdir -p "$corpus"
  [ -d "tests/fuzz/corpus/$t" ] && cp -n "tests/fuzz/corpus/$t"/* "$corpus"/ 2>/dev/null || true
  ASAN_OPTIONS=detect_leaks=1:abort_on_error=1 \
    LSAN_OPTIONS="suppressions=$PWD/tests/fuzz/lsan.supp:print_suppressions=0" \
    UBSAN_OPTIONS=halt_on_error=1:print_stacktrace=1 \
    "$BUILD/tests/fuzz/$t" -max_total_time="$SECONDS_EACH" -timeout=10 -seed="$SEED" \
    -rss_limit_mb=4096 -max_len=65536 -print_final_stats=1 \
    -artifact_prefix="$BUILD/findings/$t-" "$corpus" \
    > "$BUILD/findings/$t.log" 2>&1
}
# Each libFuzzer process is single-threaded: FUZZ_JOBS targets (default:
# one per core) run side by side, each for its full FUZZ_SECONDS, so two
# cores fuzz as long per target in half the wall time.
JOBS=${FUZZ_JOBS:-$(nproc)}
failed=()
for ((i = 0; i < ${#TARGETS[@]}; i += JOBS)); do
  batch=("${TARGETS[@]:i:JOBS}")
  pids=()
  for t in "${batch[@]}"; do
    echo "fuzz: $t for ${SECONDS_EACH}s"
    fuzz_one "$t" &
    pids+=($!)
  done
  for k in "${!batch[@]}"; do
    t=${batch[$k]}
    if ! wait "${pids[$k]}"; then
      failed+=("$t")
      tail -40 "$BUILD/findings/$t.log"
    else
      grep -E "^stat::number_of_executed_units|^stat::peak_rss_mb" "$BUILD/findings/$t.log" |
        tr '\n' ' ' | sed "s/^/fuzz: $t: /"
      echo
    fi
  done
done
if [ "${#failed[@]}" -gt 0 ]; then
  echo "fuzz: findings in ${failed[*]} (inputs in $BUILD/findings/)" >&2
  exit 1
fi
echo "fuzz: no findings in ${#TARGETS[@]} targets"
