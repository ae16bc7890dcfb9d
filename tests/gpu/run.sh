#!/usr/bin/env bash
# Every GPU check in one go, on a machine with a CUDA GPU (sized for one
# H200: well under 5 minutes with 16 cores):
#   1. configure build-gpu with SHARDLM_CUDA=ON for sm_90 and build the GPU
#      targets with all cores;
#   2. run every gpu-labelled test: backend, cross-backend ops against the
#      CPU reference, NCCL collectives on all local GPUs, CudaModelRunner
#      against the CPU ModelRunner (synthetic model, and SmolLM2 parity:
#      32 equal greedy tokens, logits within a bf16 bound);
#   3. the bf16 decode benchmark of a synthetic 1B-class Llama (tokens/s at
#      batch 1 and 16, fraction of the HBM peak and of measured copy
#      bandwidth).
# Usage: bash tests/gpu/run.sh OUTDIR   (logs and results go to OUTDIR)
# Env: SHARDLM_MODEL (SmolLM2 GGUF; default models/SmolLM2-135M-Instruct.
# Q4_1.gguf), CUDA_ARCH (default 90), BUILD_DIR (default build-gpu), JOBS
# (default: all cores).
# Needs no network when the build dependencies are installed already.
set -uo pipefail
OUT=${1:?usage: bash tests/gpu/run.sh OUTDIR}
mkdir -p "$OUT" && OUT=$(cd "$OUT" && pwd)
cd "$(dirname "$0")/../.."
exec > >(tee "$OUT/run.log") 2>&1

BUILD_DIR=${BUILD_DIR:-build-gpu}
CUDA_ARCH=${CUDA_ARCH:-90}
MODEL=${SHARDLM_MODEL:-$PWD/models/SmolLM2-135M-Instruct.Q4_1.gguf}
JOBS=${JOBS:-$(nproc)}
export PATH="/usr/local/cuda/bin:$PATH"
failed=()
stage() { echo; echo "=== $* ($(date -u +%H:%M:%S))"; }

stage "machine"
git rev-parse HEAD 2>/dev/null || true
nvidia-smi 2>&1 | tee "$OUT/nvidia-smi.txt" || echo "nvidia-smi failed"
nvcc --version | tail -2

stage "dependencies"
# scripts/install-deps.sh needs apt (network) only when a package is
# missing; skip it entirely when everything the build needs is there.
missing=0
for p in cmake ninja-build libabsl-dev libopenblas-dev nlohmann-json3-dev \
    libgtest-dev libgmock-dev libopenmpi-dev libgrpc++-dev libprotobuf-dev \
    protobuf-compiler-grpc; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null |
    grep -q "install ok installed" || { echo "missing: $p"; missing=1; }
done
if [ "$missing" = 1 ]; then
  bash scripts/install-deps.sh || failed+=(install-deps)
else
  echo "all build dependencies installed; not running install-deps"
fi
if [ -f "$MODEL" ]; then
  echo "model: $MODEL"
else
  echo "WARNING: no model at $MODEL: the SmolLM2 parity case will SKIP" \
    "(set SHARDLM_MODEL)"
fi

stage "configure + build (sm_$CUDA_ARCH, -j$JOBS)"
TARGETS=(backend_test kernels_cross_backend_test cuda_model_runner_test
  nccl_communicator_test gpu_decode_bench)
start=$SECONDS
if cmake -S . -B "$BUILD_DIR" -G Ninja -DCMAKE_BUILD_TYPE=Release \
    -DSHARDLM_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES="$CUDA_ARCH" \
    -DSHARDLM_MODEL="$MODEL" >"$OUT/configure.log" 2>&1 &&
  cmake --build "$BUILD_DIR" -j"$JOBS" --target "${TARGETS[@]}" \
    >"$OUT/build.log" 2>&1; then
  echo "built in $((SECONDS - start)) s"
else
  echo "BUILD FAILED; tail of the logs:"
  tail -30 "$OUT/configure.log" "$OUT/build.log"
  exit 1
fi

stage "gpu-labelled tests"
(cd "$BUILD_DIR" && ctest -L gpu -V --timeout 600 \
  --output-junit "$OUT/ctest-gpu.xml") >"$OUT/ctest-gpu.log" 2>&1 ||
  failed+=(gpu-tests)
# Per-test results, skip reasons, failures and the parity figures.
grep -E -A1 "^[0-9]+: .*: Skipped$" "$OUT/ctest-gpu.log" | grep -v "^--$" |
  awk 'NR % 2 == 0' | sort | uniq -c | head -20
grep -E "^[0-9]+/[0-9]+ Test|tests passed|tests failed|\[  FAILED  \]|parity:|synthetic:" \
  "$OUT/ctest-gpu.log" | head -80

stage "decode benchmark (synthetic 1B-class Llama, bf16)"
"$BUILD_DIR/bench/gpu_decode_bench" --batches 1,16 --prompt 128 --steps 64 \
  --json "$OUT/decode_bench.json" 2>&1 | tee "$OUT/decode_bench.log" ||
  failed+=(bench)

stage "summary"
echo "logs in $OUT"
if [ "${#failed[@]}" -gt 0 ]; then
  echo "FAILED: ${failed[*]}"
  exit 1
fi
echo "all GPU checks passed"
