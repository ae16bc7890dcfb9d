#!/usr/bin/env bash
# Installs dependencies, builds everything and runs every test (ctest).
# Extra arguments go to the main ctest run, e.g. `scripts/test.sh -L unit`.
set -euo pipefail
cd "$(dirname "$0")/.."
# Runs one phase and says how long it took (CI must stay under 45 minutes
# on two cores; the figures say where the time goes).
# The free disk after each phase is printed too: a CI machine's disk is
# not ours to size, and one run failed with it full (about 6 GB in all
# here: build-san/ 1.2 GB, build/ 3.6 GB at its peak, the venv 0.4 GB).
phase() {
  local name=$1 start=$SECONDS
  shift
  "$@"
  echo "test.sh: $name took $((SECONDS - start)) s" \
    "($(df -h --output=avail . | tail -1 | tr -d ' ') free on disk)"
}
# SHARDLM_PRUNE=1 (.ci/run sets it): each build folder and cache is removed
# once the phases that read it are over, so that the run's peak is lower.
# A developer's run keeps them, to rerun a phase without rebuilding.
prune() {
  if [ "${SHARDLM_PRUNE:-0}" = 1 ]; then
    echo "test.sh: pruning $* (SHARDLM_PRUNE=1)"
    rm -rf "$@"
  fi
}
# ctest in build tree $1 (results tagged $2) with the remaining arguments,
# then the skip gate over its JUnit results (scripts/ctest_gate.py): the
# phase fails when a test failed, or did not run or skipped outside the
# gate's allow-list (on a machine without a GPU: the gpu label). The gate
# runs, and prints what skipped and why, even when ctest failed.
ctest_phase() {
  local dir=$1 tag=$2 rc=0
  shift 2
  local junit
  junit=$(cd "$dir" && pwd)/ctest-$tag.xml
  rm -f "$junit"
  (cd "$dir" && ctest --output-on-failure --timeout 900 \
    --output-junit "$junit" "$@") || rc=$?
  python3 scripts/ctest_gate.py --build-dir "$dir" --junit "$junit" \
    --phase "$tag" || rc=1
  return $rc
}
phase "dependencies" bash scripts/install-deps.sh
# llama.cpp for the checks against it (install-deps.sh --tests: 5-6 CPU
# minutes to compile on a fresh machine) builds in the background at the
# lowest priority, on what the builds and tests below leave idle; only the
# tests that need it (label llama_cpp: its quantizer, forward pass and
# tokenizer, and the checks of the models it makes) wait for it, last.
# At nice 19 it gets little CPU while the builds keep both cores busy (a
# CI run had a third of it compiled after 25 minutes), so its timeout is
# CI's whole budget; once waited for, it has the machine to itself.
LLAMA_LOG=$(mktemp)
LLAMA_CPP_TIMEOUT=5400 nice -n 19 bash scripts/install-deps.sh --tests \
  >"$LLAMA_LOG" 2>&1 &
LLAMA_PID=$!
trap 'kill "$LLAMA_PID" 2>/dev/null || true; rm -f "$LLAMA_LOG"' EXIT
wait_llama_cpp() {
  local rc=0
  wait "$LLAMA_PID" || rc=$?
  cat "$LLAMA_LOG"
  return $rc
}
phase "model" bash scripts/fetch-model.sh

# Every unit test under AddressSanitizer and UBSan (leaks included), the
# loaders and kernels as much as the serving path: hostile model files
# must give errors, never memory errors. The CPU cases of every unit
# binary run here (GPU-only cases are binaries of their own, label gpu),
# and so do the MPI communicator's ranks (label sanitize: two ranks under
# mpirun). The same clang build (build-san/) holds the fuzz targets.
phase "sanitizer build" bash scripts/build-san.sh
# Side by side, one per core: in-process tests that wait on conditions,
# not on the clock (tests/testlib.py, WaitFor), so load slows them but
# does not fail them; on two cores this phase took 346 s instead of 560.
phase "unit tests under ASan/UBSan" \
  ctest_phase build-san sanitizers -j "$(nproc)" -L '^(unit|sanitize)$' -LE '^gpu$'

# Coverage-guided fuzzing (tests/fuzz/): every target for FUZZ_SECONDS
# (30) from its seed corpus under ASan and UBSan; any finding fails.
phase "fuzzing" env FUZZ_SECONDS="${FUZZ_SECONDS:-30}" bash scripts/fuzz.sh
prune build-san

phase "release build" bash scripts/build.sh
# The kernels as the Docker image and the GPU kit build them (x86-64-v3:
# AVX2, no AVX-512 at compile time): the build must compile (AVX-512 code
# lives behind target attributes), and its kernel tests pass, the
# portable code compiled for AVX2 among them. The GEMV and the attention
# pick their ISA at run time (kernels/cpu_isa.h) and their tests run
# every ISA this CPU supports, in either build.
phase "kernels built for x86-64-v3" env BUILD_DIR=build-v3 \
  CMAKE_ARGS="-DSHARDLM_MARCH=x86-64-v3 -DSHARDLM_CUDA=OFF" \
  bash -c 'bash scripts/build.sh --target kernels_test && build-v3/kernels/kernels_test'
prune build-v3
# The release tests. Without arguments in three runs: the ones that need
# a machine to themselves (clusters under mpirun, servers, fixed timeouts)
# one at a time; then the in-process ones (the unit tests, as under ASan
# above, and tests/reference/'s checks, label parallel) one per core; then,
# once llama.cpp is built, the checks that need it, one per core. With
# arguments, one run of ctest with them.
if [ "$#" -gt 0 ]; then
  phase "waiting for llama.cpp" wait_llama_cpp
  phase "all tests (release)" ctest_phase "${BUILD_DIR:-build}" release "$@"
else
  phase "all other tests (release)" \
    ctest_phase "${BUILD_DIR:-build}" release -LE '^(unit|parallel)$'
  phase "unit and reference checks (release, side by side)" \
    ctest_phase "${BUILD_DIR:-build}" release-parallel -j "$(nproc)" \
    -L '^(unit|parallel)$' -LE '^llama_cpp$'
  phase "waiting for llama.cpp" wait_llama_cpp
  phase "checks against llama.cpp (release, side by side)" \
    ctest_phase "${BUILD_DIR:-build}" llama-cpp -j "$(nproc)" -L '^llama_cpp$'
  # The numpy reference's runs (shared by a model's layouts, and read by
  # the checks against llama.cpp too).
  prune "${BUILD_DIR:-build}/tests/reference/reference_cache"
fi

# The README's first command, as a user runs it: a TP=2 x PP=2 cluster
# under mpirun answering a prompt (it exits non-zero on any failure, or
# when the answer does not name Paris).
phase "quickstart" env EXPECT=Paris \
  bash scripts/quickstart.sh "What is the capital of France?"
