#!/usr/bin/env python3
"""The routing policies side by side on a shared-prefix workload (issue
36): three `shardlm serve` replicas (--threads 1, --metrics-prefix-cache)
behind `shardlm router`, `shardlm bench` through the router with prompts
that share one of G long prefixes (distinct suffixes, the prefixes
interleaved), fresh replicas for each policy. Prints, per policy, requests/s,
time to first token p50/p99 (from shardlm bench) and the prefix-cache hit
tokens the replicas report (one replica holding every prompt would hit
each prompt's shared part but the first of each group's). Exits 1 when a
request failed.

  router_policies.py --shardlm BIN --gguf MODEL [--groups 8] [--per-group 4]
      [--concurrency 4] [--max-tokens 8] [--policies kv,least-load,round-robin]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import urllib.request
from pathlib import Path

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "tests"))
from testlib import (free_port, prometheus_series, start_serve,  # noqa: E402
                     stop, wait_ready, wait_until)

BASE = ("You are the support assistant of a regional rail operator. You "
        "answer questions about timetables, fares, season tickets, refunds, "
        "accessibility assistance, bicycles on trains, lost property and "
        "engineering works. Keep answers short, quote the relevant rule, "
        "and never promise compensation that the rules do not grant. ")


def metrics(port: int) -> dict[str, float]:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics",
                                    timeout=10) as r:
            return prometheus_series(r.read().decode())
    except OSError:
        return {}


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--shardlm", required=True)
    ap.add_argument("--gguf", required=True)
    ap.add_argument("--groups", type=int, default=8)
    ap.add_argument("--per-group", type=int, default=4)
    ap.add_argument("--concurrency", type=int, default=4)
    ap.add_argument("--max-tokens", type=int, default=8)
    ap.add_argument("--policies", default="kv,least-load,round-robin")
    ap.add_argument("--workdir", default="/tmp/router_policies")
    a = ap.parse_args()
    work = Path(a.workdir)
    work.mkdir(parents=True, exist_ok=True)
    prompts = [f"Desk {g}. " + BASE * 2 + f"Rule {g}: see section {g}. "
               f"Question {s}: may I bring item {g}{s} on board?"
               for s in range(a.per_group) for g in range(a.groups)]
    (work / "prompts.txt").write_text("\n".join(prompts) + "\n")
    rows, failed = [], False
    for policy in a.policies.split(","):
        replicas, addrs, https = [], [], []
        for i in range(3):
            http = free_port()
            proc, addr = start_serve(
                a.shardlm, a.gguf,
                ["--threads", "1", "--metrics-prefix-cache",
                 "--http-listen", f"127.0.0.1:{http}"])
            replicas.append(proc)
            addrs.append(addr)
            https.append(http)
        port, rhttp = free_port(), free_port()
        cmd = [a.shardlm, "router", "--listen", f"127.0.0.1:{port}",
               "--http-listen", f"127.0.0.1:{rhttp}", "--policy", policy,
               "--model", a.gguf]
        for r in addrs:
            cmd += ["--replica", r]
        router = subprocess.Popen(cmd, stdin=subprocess.DEVNULL,
                                  stdout=subprocess.DEVNULL,
                                  stderr=open(work / f"{policy}.log", "w"))
        try:
            for proc, addr in zip(replicas, addrs):
                if not wait_ready(a.shardlm, addr, proc):
                    print(f"replica {addr} did not start")
                    return 1
            wait_until(lambda: metrics(rhttp).get(
                "shardlm_router_replicas_ready") == 3, timeout=30)
            hits0 = sum(metrics(h).get(
                'shardlm_prefix_cache_tokens_total{result="hit"}', 0)
                for h in https)
            out = work / f"{policy}.json"
            r = subprocess.run(
                [a.shardlm, "bench", "--server", f"127.0.0.1:{port}",
                 "--prompts", str(work / "prompts.txt"), "--concurrency",
                 str(a.concurrency), "--requests", str(len(prompts)),
                 "--max-tokens", str(a.max_tokens), "--json", str(out)],
                capture_output=True, text=True, timeout=900)
            if r.returncode != 0:
                print(f"{policy}: shardlm bench failed:\n{r.stdout}{r.stderr}")
                failed = True
                continue
            hits = sum(metrics(h).get(
                'shardlm_prefix_cache_tokens_total{result="hit"}', 0)
                for h in https) - hits0
            rows.append((policy, json.loads(out.read_text()), hits))
        finally:
            stop(router)
            for p in replicas:
                stop(p)
    print(f"{len(prompts)} prompts, {a.groups} prefixes, concurrency "
          f"{a.concurrency}, {a.max_tokens} tokens each")
    for policy, res, hits in rows:
        level = res["levels"][0] if "levels" in res else res
        print(f"  {policy:12s} {json.dumps(level)[:300]}")
        print(f"  {'':12s} prefix-cache hit tokens: {hits:.0f}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
