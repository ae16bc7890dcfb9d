#!/usr/bin/env python3
"""A ~3,500-token prompt through `shardlm serve` with a device KV pool that
holds under half of it, a host tier and the prefix cache, against
`shardlm generate` with a pool that holds it all (both f16 KV, the
default on CPUs).

1. The served greedy completion equals the local one, byte for byte, while
   the sequence's older blocks live in the host tier (blocks spilled > 0).
2. The same prompt again: the same text, with most of the prompt found in
   the prefix cache (hit tokens in /metrics) and not recomputed.

  check_long_context.py --shardlm BIN --gguf MODEL
"""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
import urllib.request

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))
from testlib import FAILURES, check, free_port, run, start_serve, stop, wait_ready  # noqa: E402

PARAGRAPH = ("Paragraph {i}: the river ran past the old mill, the baker "
             "counted {i} loaves, and the town slept under a sky of {c} "
             "stars.\n")
# SmolLM2's tokenizer makes ~38 tokens of each paragraph: ~3,500 tokens.
# (It was 7,000: the same checks, at a quarter of the attention work and
# under a minute of CI on two cores; bench/long_context.py measures long
# prompts.)
PROMPT = "".join(PARAGRAPH.format(i=i, c=(i * 37) % 1000) for i in range(91))


def metric(text: str, name: str, labels: str) -> float:
    m = re.search(rf"^{name}\{{{re.escape(labels)}\}} ([0-9.e+]+)$", text,
                  re.MULTILINE)
    return float(m[1]) if m else -1.0


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--shardlm", required=True)
    ap.add_argument("--gguf", required=True)
    a = ap.parse_args()
    gen = ["--prompt", PROMPT, "--max-tokens", "16", "--ignore-eos"]

    local = run([a.shardlm, "generate", "--model", a.gguf, "--stats"] + gen,
                timeout=600)
    check(local.returncode == 0, f"local generate ran ({local.stderr[-300:]})")
    n = re.search(r"prompt (\d+) tokens", local.stderr)
    n = int(n[1]) if n else 0
    check(3000 <= n <= 4000, f"the prompt is {n} tokens")
    kib = re.search(r"([0-9.]+) KiB per token", local.stderr)
    check(kib is not None, "generate logs the KV bytes per token")
    if FAILURES:
        return 1

    http = f"127.0.0.1:{free_port()}"
    device = int(1500 * float(kib[1]) * 1024)  # Under half the prompt.
    server, addr = start_serve(
        a.shardlm, a.gguf,
        ["--kv-cache-bytes", str(device),
         "--cpu-offload-bytes", str(4 * device), "--http-listen", http,
         "--metrics-prefix-cache"],
        stderr=subprocess.PIPE, text=True)
    try:
        check(wait_ready(a.shardlm, addr, server), f"serve is ready on {addr}")
        remote = [a.shardlm, "generate", "--server", addr] + gen

        def served(what: str) -> str:
            """Runs the prompt through the server; returns /metrics after."""
            got = run(remote, timeout=600)
            check(got.returncode == 0 and got.stdout == local.stdout,
                  f"{what}: served text equals local text ({got.stdout!r} "
                  f"vs {local.stdout!r}; {got.stderr[-300:]})")
            with urllib.request.urlopen(f"http://{http}/metrics") as r:
                return r.read().decode()

        m1 = served("first request")
        spilled = metric(m1, "shardlm_kv_blocks_moved_total", 'kind="spill"')
        check(spilled > 0, f"older blocks spilled to the host tier ({spilled})")
        m2 = served("the same prompt again")
        hits = (metric(m2, "shardlm_prefix_cache_tokens_total", 'result="hit"')
                - metric(m1, "shardlm_prefix_cache_tokens_total",
                         'result="hit"'))
        check(hits >= n - 2 * 16 - 16,
              f"the second request found {hits:.0f} of {n} prompt tokens in "
              f"the prefix cache")
    finally:
        stop(server)
    if FAILURES:
        print(f"{len(FAILURES)} check(s) failed")
        return 1
    print("all checks passed")
    return 0


if __name__ == "__main__":
    sys.exit(main())
