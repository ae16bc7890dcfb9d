#!/usr/bin/env bash
# Installs dependencies, builds everything and runs every test (ctest).
# Extra arguments go to the main ctest run, e.g. `scripts/test.sh -L unit`.
set -euo pipefail
cd "$(dirname "$0")/.."
# Runs one phase and says how long it took (CI must stay under 45 minutes
# on two cores; the figures say where the time goes).
phase() {
  local name=$1 start=$SECONDS
  shift
  "$@"
  echo "test.sh: $name took $((SECONDS - start)) s"
}
phase "dependencies" bash scripts/install-deps.sh
phase "model" bash scripts/fetch-model.sh

# Every unit test under AddressSanitizer and UBSan, the loaders and kernels
# as much as the serving path: hostile model files must give errors, never
# memory errors. The same clang build (build-san/) holds the fuzz targets.
phase "sanitizer build" bash scripts/build-san.sh
phase "unit tests under ASan/UBSan" \
  bash -c 'cd build-san && ctest --output-on-failure -L unit -LE gpu --timeout 900'

# Coverage-guided fuzzing (tests/fuzz/): every target for FUZZ_SECONDS
# (30) from its seed corpus under ASan and UBSan; any finding fails.
phase "fuzzing" env FUZZ_SECONDS="${FUZZ_SECONDS:-30}" bash scripts/fuzz.sh

phase "release build" bash scripts/build.sh
phase "all tests (release)" \
  bash -c 'cd "${BUILD_DIR:-build}" && ctest --output-on-failure --timeout 900 "$@"' ctest "$@"

# The README's first command, as a user runs it: a TP=2 x PP=2 cluster
# under mpirun answering a prompt (it exits non-zero on any failure or an
# empty answer).
phase "quickstart" bash scripts/quickstart.sh "What is the capital of France?"
