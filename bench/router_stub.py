#!/usr/bin/env python3
"""The router's own ceiling (issue #36): requests per second one `shardlm
router` sustains and the latency it adds, against stub replicas that
answer at once (bench/router_stub_bench.cc: a C++ gRPC server serving
Generate with one token and WatchState; and a C++ closed-loop load
generator).

For each concurrency, the same load runs against one stub directly (the
floor: client + stub + loopback) and through the router in front of
--stubs stubs; added latency = router - direct at each percentile. The
load generator, the stubs and the router share this machine's cores, so
the latencies bound the router's cost from above; its CPU time per
request (from /proc, all its threads) gives the requests/s one core of
its own would sustain. Prints a Markdown table and the CPU (lscpu).

  bench/router_stub.py --build build [--policy kv] [--stubs 2]
      [--concurrency 1,4,16,64] [--seconds 5]
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import subprocess
import sys
import time


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_port(port: int, timeout: float = 10) -> bool:
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=1).close()
            return True
        except OSError:
            time.sleep(0.05)
    return False


def cpu_name() -> str:
    out = subprocess.run(["lscpu"], capture_output=True, text=True).stdout
    fields = dict(line.split(":", 1) for line in out.splitlines()
                  if ":" in line)
    return (f"{fields.get('Model name', '?').strip()}, "
            f"{fields.get('CPU(s)', '?').strip()} CPUs")


def cpu_seconds(pid: int) -> float:
    """User + system CPU time of process `pid` so far."""
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def load(bench: str, target: str, concurrency: int, seconds: float) -> dict:
    r = subprocess.run([bench, "load", "--target", target, "--concurrency",
                        str(concurrency), "--seconds", str(seconds)],
                       capture_output=True, text=True, timeout=seconds + 60)
    if r.returncode != 0:
        sys.exit(f"load against {target} failed: {r.stderr.strip()}")
    return json.loads(r.stdout.strip().splitlines()[-1])


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--build", default="build")
    ap.add_argument("--policy", default="kv")
    ap.add_argument("--stubs", type=int, default=2)
    ap.add_argument("--concurrency", default="1,4,16,64")
    ap.add_argument("--seconds", type=float, default=5)
    a = ap.parse_args()
    bench = os.path.join(a.build, "bench", "router_stub_bench")
    shardlm = os.path.join(a.build, "launch", "shardlm")
    procs = []
    try:
        stubs = []
        for _ in range(a.stubs):
            port = free_port()
            procs.append(subprocess.Popen(
                [bench, "stub", "--listen", f"127.0.0.1:{port}"],
                stderr=subprocess.DEVNULL))
            if not wait_port(port):
                sys.exit(f"stub on {port} did not start")
            stubs.append(f"127.0.0.1:{port}")
        rport, hport = free_port(), free_port()
        cmd = [shardlm, "router", "--listen", f"127.0.0.1:{rport}",
               "--http-listen", f"127.0.0.1:{hport}", "--policy", a.policy]
        for s in stubs:
            cmd += ["--replica", s]
        router = subprocess.Popen(cmd, stderr=subprocess.DEVNULL)
        procs.append(router)
        if not wait_port(rport):
            sys.exit("the router did not start")
        time.sleep(1)  # Its state streams up.
        load_avg = os.getloadavg()[0]
        rows = []
        for c in [int(x) for x in a.concurrency.split(",")]:
            direct = load(bench, stubs[0], c, a.seconds)
            cpu0 = cpu_seconds(router.pid)
            routed = load(bench, f"127.0.0.1:{rport}", c, a.seconds)
            # The router's CPU per request. The CPU time spans the load's
            # 1 s warm-up too, so the measured requests are scaled by
            # (seconds + 1) / seconds.
            routed["cpu_us"] = (cpu_seconds(router.pid) - cpu0) * 1e6 / max(
                1, routed["requests"] * (1 + 1 / a.seconds))
            rows.append((c, direct, routed))
    finally:
        for p in procs:
            p.terminate()
        for p in procs:
            p.wait()
    print(f"CPU: {cpu_name()}; load average before: {load_avg:.2f}; "
          f"policy {a.policy}, {a.stubs} stubs, {a.seconds:g} s per point")
    print("| concurrency | direct req/s | router req/s | direct p50 / p99 us "
          "| router p50 / p99 us | added p50 / p99 us | router CPU us/req "
          "(req/s per core) |")
    print("|---|---|---|---|---|---|---|")
    for c, d, r in rows:
        print(f"| {c} | {d['rps']:.0f} | {r['rps']:.0f} | {d['p50_us']} / "
              f"{d['p99_us']} | {r['p50_us']} / {r['p99_us']} | "
              f"{r['p50_us'] - d['p50_us']} / {r['p99_us'] - d['p99_us']} | "
              f"{r['cpu_us']:.0f} ({1e6 / max(r['cpu_us'], 1):.0f}) |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
