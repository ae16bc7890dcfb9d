#!/usr/bin/env bash
# Builds the sanitizer tree, build-san/: clang, every library and test under
# AddressSanitizer and UBSan (optimized, for this machine's CPU: see
# SHARDLM_ASAN in CMakeLists.txt) and the libFuzzer targets (SHARDLM_FUZZ).
# One build serves both the unit tests (scripts/test.sh) and the fuzzers
# (scripts/fuzz.sh): two sanitizer builds of every library cost CI a
# quarter of an hour on two cores. CUDA is off (the GPU tests run on a GPU
# machine: tests/gpu/session.sh). Extra arguments go to the build step, e.g.
# `scripts/build-san.sh --target fuzz_gguf`.
set -euo pipefail
cd "$(dirname "$0")/.."
# "Sanitize" is a build type with no flags of its own: SHARDLM_ASAN gives
# the optimization and debug-info levels.
CC=clang CXX=clang++ BUILD_DIR=build-san \
  CMAKE_ARGS="-DSHARDLM_ASAN=ON -DSHARDLM_FUZZ=ON -DSHARDLM_CUDA=OFF -DCMAKE_BUILD_TYPE=Sanitize" \
  bash scripts/build.sh "$@"
