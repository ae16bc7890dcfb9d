#!/usr/bin/env bash
# Configures (once) and builds shardlm into build/ with Ninja and ccache.
# Extra arguments go to the build step, e.g. `scripts/build.sh --target shardlm`.
set -euo pipefail
cd "$(dirname "$0")/.."
BUILD_DIR=${BUILD_DIR:-build}
# ccache keys relative to the checkout, so that a clone in another folder
# (CI's clean checkout) hits what this machine's earlier builds cached:
# absolute paths otherwise make every key differ. The debug info of a
# cached object keeps the folder it was first compiled in.
export CCACHE_BASEDIR="$PWD" CCACHE_NOHASHDIR=true
if [ ! -f "$BUILD_DIR/build.ninja" ]; then
  cmake -S . -B "$BUILD_DIR" -G Ninja -DCMAKE_BUILD_TYPE=Release ${CMAKE_ARGS:-}
fi
cmake --build "$BUILD_DIR" "$@"
