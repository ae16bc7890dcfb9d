#!/usr/bin/env python3
"""`shardlm generate --cp` end to end (issue #35 part 2): a ~600-token
prompt with a KV pool of 20 blocks (320 tokens) per rank.

1. --cp 1 refuses it, saying how many blocks it needs and how many the
   cache holds.
2. --cp 2 (two ranks of 20 blocks) serves it, logs the group's blocks and
   each rank's, and prints the greedy text of --cp 1 given 40 blocks.
3. `shardlm serve --cp 2` with the same pools: GetModelInfo reports cp 2
   and 20 blocks per worker, and a remote generate prints the same text.
4. --cp 2 with a host tier, 10 device + 10 host blocks per rank: the
   prompt runs through both ranks' host tiers (each block on its own
   rank) and prints the same text.
5. A value it cannot take is refused naming the flag: --cp 0.

  check_context_parallel.py --shardlm BIN --gguf MODEL
"""

from __future__ import annotations

import argparse
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))
import grpc  # noqa: E402
from testlib import (FAILURES, check, pb_fields, run, start_serve,  # noqa: E402
                     stop, wait_ready)

# ~38 SmolLM2 tokens per paragraph: ~610 tokens.
PROMPT = "".join(
    f"Paragraph {i}: the river ran past the old mill, the baker counted {i} "
    f"loaves, and the town slept under a sky of {(i * 37) % 1000} stars.\n"
    for i in range(16))
# f16 K and V of SmolLM2's 30 layers x 3 KV heads x 64, 16 tokens a block.
BLOCK_BYTES = 2 * 30 * 3 * 64 * 2 * 16


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--shardlm", required=True)
    ap.add_argument("--gguf", required=True)
    a = ap.parse_args()

    def generate(*flags: str):
        return run([a.shardlm, "generate", "--model", a.gguf, "--prompt",
                    PROMPT, "--max-tokens", "12", "--ignore-eos",
                    "--kv-cache-dtype", "f16", "--device", "cpu",
                    "--threads", "2", *flags], timeout=600)

    small = generate("--cp", "1", "--kv-cache-bytes", str(20 * BLOCK_BYTES))
    check(small.returncode != 0 and "but the cache holds 20 (20 device"
          in small.stderr,
          f"--cp 1 with 20 blocks refuses the prompt ({small.stderr[-200:]})")
    twice = generate("--cp", "1", "--kv-cache-bytes", str(40 * BLOCK_BYTES))
    check(twice.returncode == 0 and twice.stdout.strip() != "",
          f"--cp 1 with 40 blocks serves it ({twice.stderr[-200:]})")
    cp = generate("--cp", "2", "--kv-cache-bytes", str(20 * BLOCK_BYTES))
    check(cp.returncode == 0, f"--cp 2 serves it ({cp.stderr[-200:]})")
    check("40 device + 0 host blocks" in cp.stderr and
          "(over 2 CP ranks, 20 each)" in cp.stderr,
          "--cp 2 logs the group's blocks and each rank's")
    check(cp.stdout == twice.stdout,
          f"--cp 2 prints the text of --cp 1 with twice the pool "
          f"({cp.stdout!r} vs {twice.stdout!r})")

    server, addr = start_serve(
        a.shardlm, a.gguf,
        ["--cp", "2", "--kv-cache-bytes", str(20 * BLOCK_BYTES),
         "--kv-cache-dtype", "f16", "--device", "cpu", "--threads", "2"])
    try:
        check(wait_ready(a.shardlm, addr, server), "serve --cp 2 is ready")
        with grpc.insecure_channel(addr) as channel:
            call = channel.unary_unary("/shardlm.v1.Inference/GetModelInfo",
                                       request_serializer=lambda b: b,
                                       response_deserializer=lambda b: b)
            info = dict(pb_fields(call(b"", timeout=30)))
        check(info.get(12) == 2 and info.get(6) == 20,
              f"GetModelInfo: cp 2, 20 KV blocks per worker ({info})")
        remote = run([a.shardlm, "generate", "--server", addr, "--prompt",
                      PROMPT, "--max-tokens", "12", "--ignore-eos"],
                     timeout=600)
        check(remote.returncode == 0 and remote.stdout == twice.stdout,
              f"serve --cp 2 gives the same text ({remote.stdout!r}, "
              f"{remote.stderr[-200:]})")
    finally:
        stop(server)

    zero = generate("--cp", "0")
    check(zero.returncode != 0 and "--cp must be in [1, 64], got 0"
          in zero.stderr, "--cp 0 is refused naming the flag")
    host = generate("--cp", "2", "--kv-cache-bytes", str(10 * BLOCK_BYTES),
                    "--cpu-offload-bytes", str(10 * BLOCK_BYTES))
    check(host.returncode == 0 and "20 device + 20 host blocks" in host.stderr
          and "(over 2 CP ranks, 10 + 10 host each)" in host.stderr
          and host.stdout == twice.stdout,
          f"--cp 2 with 10 device + 10 host blocks per rank prints the text "
          f"of --cp 1 with 40 blocks ({host.stdout!r}, {host.stderr[-200:]})")
    return 1 if FAILURES else 0


if __name__ == "__main__":
    sys.exit(main())
