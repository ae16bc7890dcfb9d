#!/usr/bin/env bash
# Installs dependencies, builds everything and runs every test (ctest).
# Extra arguments go to the main ctest run, e.g. `scripts/test.sh -L unit`.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/install-deps.sh
bash scripts/fetch-model.sh

# Every unit test under AddressSanitizer and UBSan (optimized, for this
# machine's CPU as the Release build: see SHARDLM_ASAN in CMakeLists.txt),
# the loaders and kernels as much as the serving path: hostile model files
# must give errors, never memory errors. CUDA is off there (the GPU tests
# run on a GPU machine: tests/gpu/run.sh).
BUILD_DIR=build-asan \
  CMAKE_ARGS="-DSHARDLM_ASAN=ON -DCMAKE_BUILD_TYPE=Debug -DSHARDLM_CUDA=OFF" \
  bash scripts/build.sh
(cd build-asan && ctest --output-on-failure -L unit -LE gpu --timeout 900)

# Coverage-guided fuzzing (tests/fuzz/): every target for FUZZ_SECONDS
# (30) from its seed corpus under ASan and UBSan; any finding fails.
FUZZ_SECONDS=${FUZZ_SECONDS:-30} bash scripts/fuzz.sh

bash scripts/build.sh
(cd "${BUILD_DIR:-build}" && ctest --output-on-failure --timeout 900 "$@")

# The README's first command, as a user runs it: a TP=2 x PP=2 cluster
# under mpirun answering a prompt (it exits non-zero on any failure or an
# empty answer).
bash scripts/quickstart.sh "What is the capital of France?"
