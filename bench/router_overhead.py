#!/usr/bin/env python3
"""What `shardlm router` adds to a request: one `serve` replica (--threads
1) reached directly and through a router, 1-token requests alternating
between the two paths, so that both see the same replica and the same
machine load. Reports p50/p99 latency of each path and the difference,
the router's own routing decision time (its histogram), and requests per
second with several clients on each path. Exits 1 when a routed answer
differs from the direct one.

The replica is a real engine, not a stub that answers at once, so the
requests per second are the replica's, not the router's ceiling.

  router_overhead.py --shardlm BIN --gguf MODEL [--requests 300]
      [--policy kv] [--clients 4] [--seconds 5] [--workdir DIR]
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import threading
import time
from pathlib import Path

import grpc

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "tests"))
sys.path.insert(0, os.path.join(HERE, "..", "examples", "python"))
from testlib import (free_port, prometheus_series, start_serve,  # noqa: E402
                     stop, wait_ready, wait_until)
import generate  # noqa: E402


def pct(xs: list[float], p: float) -> float:
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(p / 100 * len(xs)))]


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--shardlm", required=True)
    ap.add_argument("--gguf", required=True)
    ap.add_argument("--requests", type=int, default=300)
    ap.add_argument("--policy", default="kv")
    ap.add_argument("--clients", type=int, default=4)
    ap.add_argument("--seconds", type=float, default=5)
    ap.add_argument("--workdir", default="/tmp/router_overhead")
    a = ap.parse_args()
    work = Path(a.workdir)
    work.mkdir(parents=True, exist_ok=True)
    pb2, pb2_grpc = generate.load_stubs(work / "stubs")
    replica, raddr = start_serve(a.shardlm, a.gguf, ["--threads", "1"])
    port, http = free_port(), free_port()
    router = subprocess.Popen(
        [a.shardlm, "router", "--replica", raddr, "--listen",
         f"127.0.0.1:{port}", "--http-listen", f"127.0.0.1:{http}",
         "--policy", a.policy, "--model", a.gguf],
        stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
        stderr=open(work / "router.log", "w"))
    try:
        if not wait_ready(a.shardlm, raddr, replica):
            print("replica did not start")
            return 1
        if not wait_ready(a.shardlm, f"127.0.0.1:{port}", router, 30):
            print("router did not start")
            return 1
        paths = {
            "direct": pb2_grpc.InferenceStub(grpc.insecure_channel(raddr)),
            "router": pb2_grpc.InferenceStub(
                grpc.insecure_channel(f"127.0.0.1:{port}")),
        }
        req = pb2.GenerateRequest(prompt="Hello", max_tokens=1)

        def call(stub) -> str:
            return "".join(r.text for r in stub.Generate(req, timeout=60))

        for _ in range(20):  # Warm both paths.
            for stub in paths.values():
                call(stub)
        want = call(paths["direct"])
        times = {k: [] for k in paths}
        for _ in range(a.requests):
            for name, stub in paths.items():
                t = time.perf_counter()
                got = call(stub)
                times[name].append(time.perf_counter() - t)
                if got != want:
                    print(f"{name} answered {got!r}, direct {want!r}")
                    return 1
        print(f"{a.requests} sequential 1-token requests per path "
              f"(policy {a.policy}):")
        for p in (50, 99):
            d, r = pct(times["direct"], p), pct(times["router"], p)
            print(f"  p{p}: direct {1e3 * d:.2f} ms, router {1e3 * r:.2f} ms,"
                  f" added {1e3 * (r - d):.2f} ms")
        import urllib.request
        with urllib.request.urlopen(f"http://127.0.0.1:{http}/metrics") as f:
            m = prometheus_series(f.read().decode())
        n = m.get("shardlm_router_decision_seconds_count", 0)
        if n:
            print(f"  routing decision: mean "
                  f"{1e6 * m['shardlm_router_decision_seconds_sum'] / n:.1f}"
                  f" us over {n:.0f} decisions")

        for name, stub in paths.items():
            done = [0]
            lock = threading.Lock()
            end = time.monotonic() + a.seconds

            def client():
                while time.monotonic() < end:
                    call(stub)
                    with lock:
                        done[0] += 1

            ts = [threading.Thread(target=client) for _ in range(a.clients)]
            for t in ts:
                t.start()
            for t in ts:
                t.join()
            print(f"  {a.clients} clients, {name}: "
                  f"{done[0] / a.seconds:.0f} requests/s")
    finally:
        stop(router)
        stop(replica)
    return 0


if __name__ == "__main__":
    sys.exit(main())
