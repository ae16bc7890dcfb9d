#!/usr/bin/env bash
# How fast `shardlm simulate` is, and what the planner costs per step as
# running sequences grow (issue #17 part 4). A benchmark: it prints figures.
#   bash bench/simulator_scale.sh [build/launch/shardlm]
set -euo pipefail
SHARDLM=${1:-build/launch/shardlm}

echo "== a 512-GPU fleet, 10 minutes of Poisson arrivals"
/usr/bin/time -f "wall %e s, peak RSS %M KiB" "$SHARDLM" simulate \
  --model-config llama3-70b --gpu h100 --tp 8 --replicas 64 \
  --poisson 300 --duration 600

for n in 1000 10000; do
  echo "== the planner at $n running sequences (one replica)"
  # KV and load sized so that $n sequences run at once.
  "$SHARDLM" simulate --model-config llama3-8b --gpu h200 \
    --kv-cache-bytes 4000000000000 --max-seqs "$n" \
    --max-batched-tokens 16384 --poisson $((n / 5)) --duration 10 \
    --prompt-len 64 --output-len 1000 | grep -E "most running|planner"
done
