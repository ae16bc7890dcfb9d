#!/usr/bin/env bash
# Starts a coordinator and TP x PP workers on this machine under mpirun and
# serves the public API on a local port until Ctrl-C.
#   launch/run-local-cluster.sh [--tp 2] [--pp 2] [--listen 127.0.0.1:50051]
#                               [--model PATH] [extra shardlm launch flags]
# Then, from another terminal:
#   build/launch/shardlm generate --server 127.0.0.1:50051 --prompt "Hello"
set -euo pipefail
cd "$(dirname "$0")/.."
TP=2 PP=2 LISTEN=127.0.0.1:50051 MODEL=models/SmolLM2-135M-Instruct.Q4_1.gguf
EXTRA=()
while [ $# -gt 0 ]; do
  case "$1" in
    --tp) TP=$2; shift 2 ;;
    --pp) PP=$2; shift 2 ;;
    --listen) LISTEN=$2; shift 2 ;;
    --model) MODEL=$2; shift 2 ;;
    *) EXTRA+=("$1"); shift ;;
  esac
done
NP=$((1 + TP * PP))
# --enable-recovery keeps the coordinator up when a worker dies, so that it
# can fail requests with UNAVAILABLE and name the rank instead of vanishing.
# --oversubscribe: more ranks than cores is fine for a CPU demo.
ROOT_FLAG=()
[ "$(id -u)" -eq 0 ] && ROOT_FLAG=(--allow-run-as-root)
exec mpirun "${ROOT_FLAG[@]}" --oversubscribe --enable-recovery -np "$NP" \
  build/launch/shardlm launch --model "$MODEL" --tp "$TP" --pp "$PP" \
  --listen "$LISTEN" "${EXTRA[@]}"
