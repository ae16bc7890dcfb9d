#!/usr/bin/env python3
"""End-to-end check of `shardlm bench` against `shardlm serve`.

1. `shardlm serve` starts on a free local port and becomes ready (polled
   with `shardlm generate --server`).
2. `shardlm bench --concurrency 1,4 --requests 8 --max-tokens 8 --json OUT`
   exits 0 and its JSON is complete and consistent: the server address,
   one entry per level, every request ok with no errors, output tokens =
   requests * max_tokens, positive rates, p50 <= p99 for TTFT and
   inter-token latency. Its figures are checked against what it did not
   compute itself: the server's /metrics must count exactly the requests
   and tokens the bench reports (none more: no hidden warm-up, none
   fewer: no invented tokens), and the levels' wall times must fit in the
   time this script saw the bench run.
3. An unreachable --server fails fast naming it; a bad --concurrency is a
   usage error (exit 2).
4. The server is always killed at the end.

  check_bench.py --shardlm BIN --gguf MODEL --workdir DIR
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
import urllib.request

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))
from testlib import (FAILURES, check, free_port, prometheus_series, run,  # noqa: E402
                     start_serve, stop, wait_ready)


def scrape(http: str) -> dict[str, float]:
    with urllib.request.urlopen(f"http://{http}/metrics", timeout=30) as r:
        return prometheus_series(r.read().decode())


def check_level(level: dict, want_c: int, requests: int, max_tokens: int) -> None:
    c = level.get("concurrency")
    tag = f"concurrency {c}"
    check(c == want_c, f"{tag}: level in order (want {want_c})")
    check(level.get("requests") == requests and level.get("ok") == requests,
          f"{tag}: all {requests} requests ok ({level.get('ok')})")
    check(level.get("errors") == {} and level.get("short_requests") == 0,
          f"{tag}: no errors, none short ({level.get('errors')}, "
          f"{level.get('short_requests')})")
    check(level.get("output_tokens") == requests * max_tokens,
          f"{tag}: output tokens {level.get('output_tokens')} == "
          f"{requests} * {max_tokens}")
    wall = level.get("wall_s", 0)
    check(wall > 0 and level.get("output_tokens_per_s", 0) > 0
          and level.get("requests_per_s", 0) > 0,
          f"{tag}: positive wall time and rates ({wall:.3f}s, "
          f"{level.get('output_tokens_per_s', 0):.1f} tok/s)")
    check(abs(level["output_tokens_per_s"] * wall - level["output_tokens"])
          <= 0.01 * level["output_tokens"] + 1e-6,
          f"{tag}: tokens/s * wall == output tokens")
    check(abs(level["requests_per_s"] * wall - requests) <= 0.01 * requests,
          f"{tag}: requests/s * wall == requests")
    for name in ("ttft_ms", "itl_ms"):
        p = level.get(name, {})
        p50, p99 = p.get("p50", -1), p.get("p99", -1)
        check(0 < p50 <= p99, f"{tag}: {name} 0 < p50 {p50} <= p99 {p99}")
    check(level["ttft_ms"]["p99"] <= wall * 1e3,
          f"{tag}: TTFT p99 within the level's wall time")


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--shardlm", required=True)
    ap.add_argument("--gguf", required=True)
    ap.add_argument("--workdir", required=True)
    a = ap.parse_args()
    os.makedirs(a.workdir, exist_ok=True)
    out = os.path.join(a.workdir, "bench.json")
    if os.path.exists(out):
        os.remove(out)

    http = f"127.0.0.1:{free_port()}"
    server, addr = start_serve(a.shardlm, a.gguf, ["--http-listen", http])
    try:
        ready = wait_ready(a.shardlm, addr, server)
        check(ready, f"shardlm serve is ready on {addr}")
        if not ready:
            return 1

        requests, max_tokens, levels = 8, 8, [1, 4]
        before = scrape(http)
        t0 = time.monotonic()
        bench = run([a.shardlm, "bench", "--server", addr,
                     "--concurrency", ",".join(map(str, levels)),
                     "--requests", str(requests),
                     "--max-tokens", str(max_tokens), "--json", out],
                    timeout=240)
        elapsed = time.monotonic() - t0
        after = scrape(http)
        print(bench.stdout, end="")
        print(bench.stderr, end="", file=sys.stderr)
        check(bench.returncode == 0, f"bench exits 0 in {elapsed:.1f}s")
        try:
            with open(out) as f:
                result = json.load(f)
        except (OSError, ValueError) as e:
            check(False, f"bench wrote valid JSON to {out} ({e})")
            return 1
        check(result.get("server") == addr, f"JSON names the server {addr}")
        check(result.get("max_tokens") == max_tokens
              and result.get("requests_per_level") == requests
              and result.get("prompts") == 16,
              "JSON records max_tokens, requests and the 16 built-in prompts")
        got = result.get("levels", [])
        check(len(got) == len(levels), f"one JSON entry per level ({len(got)})")
        for level, c in zip(got, levels):
            check_level(level, c, requests, max_tokens)

        # The server's own count of what the bench asked of it.
        def moved(name: str) -> float:
            return after.get(name, 0) - before.get(name, 0)

        served = moved('shardlm_requests_total{api="grpc",'
                       'finish_reason="length"}')
        check(served == requests * len(levels),
              f"/metrics: the server finished {served:g} requests at "
              f"max_tokens, the bench reports {requests * len(levels)}")
        generated = moved('shardlm_generation_tokens_total{api="grpc"}')
        reported = sum(level.get("output_tokens", 0) for level in got)
        check(generated == reported,
              f"/metrics: the server generated {generated:g} tokens, the "
              f"bench reports {reported}")
        walls = sum(level.get("wall_s", 0) for level in got)
        check(0 < walls <= elapsed,
              f"the levels' wall times ({walls:.2f}s) fit in the bench's "
              f"run as timed here ({elapsed:.2f}s)")

        # A prompts file: one prompt per line, blank lines skipped.
        prompts = os.path.join(a.workdir, "prompts.txt")
        with open(prompts, "w") as f:
            f.write("Hello there\n\nThe sun is\n")
        out2 = os.path.join(a.workdir, "bench-file.json")
        filed = run([a.shardlm, "bench", "--server", addr, "--concurrency",
                     "2", "--requests", "3", "--max-tokens", "2",
                     "--prompts", prompts, "--json", out2], timeout=60)
        ok = filed.returncode == 0
        if ok:
            with open(out2) as f:
                r2 = json.load(f)
            ok = (r2["prompts"] == 2 and r2["levels"][0]["output_tokens"] == 6)
        check(ok, f"--prompts FILE is used ({filed.stderr.strip()})")

        # Usage error and an unreachable server.
        bad = run([a.shardlm, "bench", "--server", addr, "--concurrency",
                   "1,x"])
        check(bad.returncode == 2 and "--concurrency" in bad.stderr,
              f"bad --concurrency is a usage error ({bad.stderr.splitlines()[:1]})")
        nowhere = f"127.0.0.1:{free_port()}"
        t0 = time.monotonic()
        gone = run([a.shardlm, "bench", "--server", nowhere], timeout=30)
        took = time.monotonic() - t0
        check(gone.returncode == 1 and nowhere in gone.stderr and took < 10,
              f"unreachable {nowhere} fails in {took:.1f}s naming it "
              f"({gone.stderr.strip()})")
        check(server.poll() is None, "the server is still running")
    finally:
        stop(server)
    print(f"{len(FAILURES)} failed" if FAILURES else "all bench checks passed")
    return 1 if FAILURES else 0


if __name__ == "__main__":
    sys.exit(main())
