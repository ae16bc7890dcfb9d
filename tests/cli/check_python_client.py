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
import shutil
import subprocess
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))
from testlib import FAILURES, check, free_port, run, start_serve, stop, wait_ready  # noqa: E402


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
    print(f"{len(FAILURES)} failed" if FAILURES else "all python client checks passed")
    return 1 if FAILURES else 0


if __name__ == "__main__":
    sys.exit(main())
