#!/usr/bin/env bash
# Configures (once) and builds shardlm into build/ with Ninja and ccache.
# Extra arguments go to the build step, e.g. `scripts/build.sh --target shardlm`.
set -euo pipefail
cd "$(dirname "$0")/.."
BUILD_DIR=${BUILD_DIR:-build}
if [ ! -f "$BUILD_DIR/build.ninja" ]; then
  cmake -S . -B "$BUILD_DIR" -G Ninja -DCMAKE_BUILD_TYPE=Release ${CMAKE_ARGS:-}
fi
cmake --build "$BUILD_DIR" "$@"
