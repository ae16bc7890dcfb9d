#!/usr/bin/env python3
"""End-to-end check of the Python client example (examples/python/).

1. `shardlm serve` starts on a free local port and becomes ready.
2. `examples/python/generate.py` (its stubs generated from the .proto with
   grpcio-tools into --stubs-dir) streams the same text as
   `shardlm generate --server` for the same prompt and max tokens, plain,
   with --chat, and with --stop and --logprobs.
3. An unreachable server is a clear error: exit 1, naming the address.
4. The server is always killed at the end.

  check_python_client.py --shardlm BIN --gguf MODEL --example PY --workdir DIR
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import subprocess
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))
from testlib import (check, exit_code, free_port, run,  # noqa: E402
                     start_serve, stop, wait_ready)


def logprob_lines(stderr: str) -> list[tuple[int, list[str]]]:
    """Each token's line of a --logprobs listing: its index and its
    log-probabilities as printed (4 decimals: the sampled token's, then
    each alternative's), whichever client printed it (the two quote the
    token texts differently; shardlm's probability has 3 decimals)."""
    out = []
    for line in stderr.splitlines():
        m = re.match(r"\s*(\d+): ", line)
        if m:
            out.append((int(m.group(1)),
                        re.findall(r"(?<![\d.(])-?\d+\.\d{4}(?!\d)", line)))
    return out


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--shardlm", required=True)
    ap.add_argument("--gguf", required=True)
    ap.add_argument("--example", required=True, help="examples/python/generate.py")
    ap.add_argument("--workdir", required=True)
    a = ap.parse_args()
    stubs = os.path.join(a.workdir, "stubs")
    shutil.rmtree(stubs, ignore_errors=True)  # Generated afresh every run.
    example = [sys.executable, a.example, "--stubs-dir", stubs]

    server, addr = start_serve(a.shardlm, a.gguf)
    try:
        remote = [a.shardlm, "generate", "--server", addr]
        ready = wait_ready(a.shardlm, addr, server)
        check(ready, f"shardlm serve is ready on {addr}")
        if not ready:
            return 1

        cases = [
            ["--prompt", "The capital of France is", "--max-tokens", "24"],
            ["--chat", "--prompt", "Name a planet.", "--max-tokens", "16"],
            ["--prompt", "Once upon a time", "--max-tokens", "12",
             "--ignore-eos"],
            ["--prompt", "The capital of France is", "--max-tokens", "24",
             "--stop", " answer", "--stop", "\n\n", "--logprobs", "2"],
        ]
        for args in cases:
            want = run(remote + args)
            got = run(example + ["--server", addr] + args)
            check(want.returncode == 0 and want.stdout.strip() != "",
                  f"shardlm generate --server {args} exits 0 "
                  f"({want.stderr.strip()})")
            check(got.returncode == 0 and got.stdout == want.stdout,
                  f"generate.py {args} equals it: got {got.stdout!r}, want "
                  f"{want.stdout!r} ({got.stderr.strip()})")
            if "--logprobs" in args:
                n = int(args[args.index("--logprobs") + 1])
                lp_got = logprob_lines(got.stderr)
                lp_want = logprob_lines(want.stderr)
                check(len(lp_want) > 0 and
                      all(len(v) == n + 1 for _, v in lp_want) and
                      lp_got == lp_want,
                      f"generate.py {args} prints the same {len(lp_want)} "
                      f"tokens' logprobs (1 + {n} each): got {lp_got}, "
                      f"want {lp_want}")
        check(os.path.exists(os.path.join(stubs, "shardlm", "v1",
                                          "inference_pb2_grpc.py")),
              f"stubs were generated into {stubs}")

        nowhere = f"127.0.0.1:{free_port()}"
        t0 = time.monotonic()
        gone = run(example + ["--server", nowhere, "--prompt", "x"], timeout=60)
        took = time.monotonic() - t0
        check(gone.returncode == 1 and nowhere in gone.stderr
              and "cannot reach" in gone.stderr
              and "Traceback" not in gone.stderr and took < 20,
              f"unreachable {nowhere}: exit {gone.returncode} in {took:.1f}s "
              f"({gone.stderr.strip()})")
        check(server.poll() is None, "the server is still running")
    finally:
        stop(server)
    return exit_code("all python client checks passed")


if __name__ == "__main__":
    sys.exit(main())
