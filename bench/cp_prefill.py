#!/usr/bin/env python3
"""Prefill time and decode speed of one long prompt at --cp 1 against
--cp 2 (issue #35 part 2), with `shardlm generate` (CP ranks are threads of
one process, --threads per rank). The prompt is the context_parallel_cli
check's paragraphs, repeated (90 paragraphs: 3,427 SmolLM2 tokens). --cp 1
gets twice the KV pool of each --cp 2 rank, so both hold the prompt.

  bench/cp_prefill.py --shardlm build/launch/shardlm [--shardlm OTHER]
      --gguf models/SmolLM2-135M-Instruct.Q4_1.gguf [--repeats 1]

Each --shardlm binary runs every CP setting in turn, so a binary from
before a change and one from after it compare on the same load.
"""

from __future__ import annotations

import argparse
import re
import subprocess
import sys

# f16 K and V of SmolLM2's 30 layers x 3 KV heads x 64, 16 tokens a block.
BLOCK_BYTES = 2 * 30 * 3 * 64 * 2 * 16
LINE = re.compile(r"prompt (\d+) tokens, prefill ([\d.]+)s .*"
                  r"generated (\d+) tokens, decode ([\d.]+) tok/s")


def prompt(paragraphs: int) -> str:
    return "".join(
        f"Paragraph {i}: the river ran past the old mill, the baker counted "
        f"{i} loaves, and the town slept under a sky of {(i * 37) % 1000} "
        "stars.\n" for i in range(paragraphs))


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--shardlm", action="append", required=True)
    ap.add_argument("--gguf", required=True)
    ap.add_argument("--paragraphs", type=int, default=90)
    ap.add_argument("--blocks", type=int, default=150,
                    help="KV blocks per CP 2 rank (CP 1 gets twice)")
    ap.add_argument("--tokens", type=int, default=32)
    ap.add_argument("--cp", default="1,2")
    ap.add_argument("--repeats", type=int, default=1)
    a = ap.parse_args()
    text = prompt(a.paragraphs)
    print("binary | cp | prompt tokens | prefill s | decode tok/s")
    for _ in range(a.repeats):
        for binary in a.shardlm:
            for cp in (int(c) for c in a.cp.split(",")):
                pool = a.blocks * 2 // cp * BLOCK_BYTES
                r = subprocess.run(
                    [binary, "generate", "--model", a.gguf, "--prompt", text,
                     "--max-tokens", str(a.tokens), "--ignore-eos",
                     "--kv-cache-dtype", "f16", "--device", "cpu",
                     "--threads", "1", "--stats", "--cp", str(cp),
                     "--kv-cache-bytes",
                     str(pool)], capture_output=True, text=True, timeout=1800)
                m = LINE.search(r.stderr)
                if r.returncode != 0 or m is None:
                    print(f"{binary} --cp {cp} failed: {r.stderr[-400:]}")
                    return 1
                print(f"{binary} | {cp} | {m[1]} | {m[2]} | {m[4]}",
                      flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
