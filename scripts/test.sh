#!/usr/bin/env bash
# Installs dependencies, builds everything and runs every test (ctest).
# Extra arguments go to the main ctest run, e.g. `scripts/test.sh -L unit`.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/install-deps.sh
bash scripts/fetch-model.sh

# Under AddressSanitizer and UBSan: the loaders, the tokenizer and core
# (hostile model files must give errors, never memory errors), and the
# serving path (engine, scheduler, block manager, gRPC and HTTP handlers,
# step codec, flags; the planner alone and the simulator). The kernel and
# every-layout tests take minutes each
# unoptimized and are left out.
ASAN_TESTS=(core_test model_test loader_test tokenizer_test
  serving_metrics_test inference_service_test openai_api_test
  http_server_test step_codec_test llama_weights_test flags_test
  node_address_test gloo_communicator_test control_store_test
  batch_planner_test simulator_test)
BUILD_DIR=build-asan CMAKE_ARGS="-DSHARDLM_ASAN=ON -DCMAKE_BUILD_TYPE=Debug" \
  bash scripts/build.sh --target "${ASAN_TESTS[@]}"
(cd build-asan && ctest --output-on-failure \
  -R "^($(IFS='|'; echo "${ASAN_TESTS[*]}"))\$")

# Coverage-guided fuzzing (tests/fuzz/): every target for FUZZ_SECONDS
# (30) from its seed corpus under ASan and UBSan; any finding fails.
FUZZ_SECONDS=${FUZZ_SECONDS:-30} bash scripts/fuzz.sh

bash scripts/build.sh
(cd "${BUILD_DIR:-build}" && ctest --output-on-failure --timeout 900 "$@")

# The README's first command, as a user runs it: a TP=2 x PP=2 cluster
# under mpirun answering a prompt (it exits non-zero on any failure or an
# empty answer).
bash scripts/quickstart.sh "What is the capital of France?"
