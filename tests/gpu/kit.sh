#!/usr/bin/env bash
# Builds the GPU kit: everything tests/gpu/session.sh needs on a bare GPU machine
# (CUDA toolkit, cmake, ninja and Python; none of our Debian packages, no
# network, at most 64 MiB copied), so that nothing compiles there.
#   DIR/kit.tar.xz  bin/: the GPU tests, benches and shardlm, stripped;
#                   lib/: every shared library they load beyond the
#                   allow-list below (OpenBLAS alone is 35 MiB raw, 4 packed;
#                   the binaries' sm_80 + sm_90 kernels pack 3:1)
#   DIR/models/     SmolLM2-135M cut to its first 4 blocks (real weights)
#   DIR/MANIFEST    commit, build flags and what is in the kit
# The allow-list is what the GPU machine has: glibc, libstdc++, libgcc_s, the
# CUDA driver, cudart and cuBLAS from its toolkit, and NCCL from its Python
# package nvidia-nccl-cu13 (218 MB: far too big to carry).
# Usage: bash tests/gpu/kit.sh DIR   (BUILD_DIR: default build-gpu-kit,
# configured here with the CUDA backend for sm_90 and the CPU code for
# x86-64-v3, so that the kit runs on any GPU host's CPU: a kit built for
# this machine (-march=native, the default elsewhere) can die of an illegal
# instruction there. SKIP_BUILD=1 packs what BUILD_DIR has, as the kit's
# ctest does; KIT_ISA=native then allows a native build, and the MANIFEST
# says so.)
set -euo pipefail
DIR=${1:?usage: bash tests/gpu/kit.sh DIR}
cd "$(dirname "$0")/../.."
ROOT=$PWD
BUILD_DIR=${BUILD_DIR:-build-gpu-kit}
KIT_ISA=${KIT_ISA:-x86-64-v3}
MODEL=${SHARDLM_MODEL:-$ROOT/models/SmolLM2-135M-Instruct.Q4_1.gguf}
BLOCKS=4
TARGETS=(cuda_backend_test kernels_cross_backend_test forward_ops_gpu_test
  cuda_model_runner_test nccl_communicator_test cuda_engine_test
  gpu_decode_bench gpu_probe shardlm)
# Shared objects the GPU machine provides (matched against the soname).
ALLOWED='^(linux-vdso|ld-linux-x86-64|libc|libm|libpthread|libdl|librt|libstdc\+\+|libgcc_s|libcuda|libcudart|libcublas|libcublasLt|libnccl)\.so'

[ -f "$MODEL" ] || { echo "kit: no model at $MODEL (scripts/fetch-model.sh)" >&2; exit 1; }
[ -x .venv/bin/python ] || { echo "kit: no .venv (scripts/install-deps.sh)" >&2; exit 1; }

if [ "${SKIP_BUILD:-0}" != 1 ]; then
  CMAKE_ARGS="-DSHARDLM_CUDA=ON -DSHARDLM_MARCH=$KIT_ISA ${CMAKE_ARGS:-}" \
    BUILD_DIR="$BUILD_DIR" bash scripts/build.sh --target "${TARGETS[@]}"
fi
# The CPU code must be for the ISA asked for (scripts/build.sh configures a
# build folder once and ignores flags afterwards).
march=$(sed -n 's/^SHARDLM_MARCH:[A-Z]*=//p' "$BUILD_DIR/CMakeCache.txt")
if [ "$march" != "$KIT_ISA" ]; then
  echo "kit: $BUILD_DIR is configured for -march=${march:-?}, not $KIT_ISA" \
    "(remove it, or KIT_ISA=$march to pack it anyway)" >&2
  exit 1
fi
# The kernels must carry sm_90 machine code (nvcc flags in build.ninja).
archs=$(grep -o 'generate-code=arch=compute_[0-9a-z]*,code=\[[^]]*\]' \
  "$BUILD_DIR/build.ninja" | sed 's/.*code=\[//; s/\]//' | sort -u | tr '\n' ' ')
case " $archs" in
  *sm_90*) ;;
  *) echo "kit: $BUILD_DIR builds CUDA for '$archs', not sm_90" >&2; exit 1 ;;
esac

rm -rf "$DIR"
mkdir -p "$DIR/models"
DIR=$(cd "$DIR" && pwd)
stage=$(mktemp -d)
trap 'rm -rf "$stage"' EXIT
mkdir "$stage/bin" "$stage/lib"
for t in "${TARGETS[@]}"; do
  bin=$(find "$BUILD_DIR" -type f -name "$t" -perm -u+x | head -1)
  [ -n "$bin" ] || { echo "kit: $t was not built" >&2; exit 1; }
  strip --strip-unneeded -o "$stage/bin/$t" "$bin"
done

# Every library the binaries load, transitively (ldd), minus the allow-list.
libs=$stage/lib
for b in "$stage"/bin/*; do
  ldd "$b" | awk '$2 == "=>" && $3 ~ /^\// {print $1, $3}
                  $2 == "=>" && $3 == "not" {print $1, "MISSING"}'
done | sort -u | while read -r soname path; do
  if [[ "$soname" =~ $ALLOWED ]]; then continue; fi
  [ "$path" != MISSING ] || { echo "kit: $soname not found" >&2; exit 1; }
  cp -L "$path" "$libs/$soname"
done
tar -C "$stage" -cf - bin lib | xz -T0 -9 >"$DIR/kit.tar.xz"

.venv/bin/python tests/cut_gguf.py "$MODEL" \
  "$DIR/models/smollm2-${BLOCKS}blocks.gguf" --blocks "$BLOCKS"

{
  echo "commit: $(git rev-parse HEAD 2>/dev/null || echo unknown)$(git diff --quiet 2>/dev/null || echo ' (dirty)')"
  echo "built: $(date -u +%FT%TZ) on $(uname -m), CUDA archs $archs"
  if [ "$KIT_ISA" = native ]; then
    echo "isa: native ($(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2- | sed 's/^ //'); runs only on CPUs with its extensions)"
  else
    echo "isa: $KIT_ISA"
  fi
  echo "nvcc: $(nvcc --version 2>/dev/null | tail -1)"
  echo "model: $(basename "$MODEL") cut to $BLOCKS blocks"
  echo "bin: $(cd "$stage/bin" && echo *)"
  echo "lib: $(cd "$stage/lib" && echo *)"
} >"$DIR/MANIFEST"
echo "kit: $DIR, $(du -sm "$DIR" | cut -f1) MiB"
