#!/usr/bin/env python3
"""Decode over slow links: TP=2 versus PP=2, across two hosts and within one.

Benchmark only (never a test). Hosts are network namespaces joined by a
bridge (tests/multinode/netns.py; needs root and iproute2); every host's
link is shaped with `tc ... tbf` to each rate in turn (both directions).
For each placement and rate, one `mpirun ... shardlm launch` answers a
client on the coordinator's host with --tokens greedy tokens (best of
--runs), and the table gives:

  decode tok/s        the client's decode rate (`generate --stats`)
  comm ms/step        per worker: seconds in communication / steps (the
                      slowest worker; from the launch's exit report)
  vs unshaped         decode tok/s over the same placement's unshaped run

Placements (the coordinator alone on host 0 in each):
  tp2-across   TP=2, ranks 1 and 2 on hosts 1 and 2 (all-reduces cross)
  pp2-across   PP=2, stages on hosts 1 and 2 (one activation send crosses)
  tp2-within   TP=2, both ranks on host 1
  pp2-within   PP=2, both stages on host 1

  bench/multinode_links.py --shardlm build/launch/shardlm \\
      --model models/SmolLM2-135M-Instruct.Q4_1.gguf
"""
from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)),
                                "..", "tests", "multinode"))
import netns  # noqa: E402
from check_multinode import Cluster  # noqa: E402

PLACEMENTS = {  # name: (tp, pp, hosts, slots)
    "tp2-across": (2, 1, [0, 1, 2], [1, 1, 1]),
    "pp2-across": (1, 2, [0, 1, 2], [1, 1, 1]),
    "tp2-within": (2, 1, [0, 1], [1, 2]),
    "pp2-within": (1, 2, [0, 1], [1, 2]),
}
PROMPT = "Write a long story about a lighthouse keeper and the sea."
DECODE = re.compile(r"decode ([0-9.]+) tok/s")
COMM = re.compile(r"worker rank (\d+): (\d+) steps, ([0-9.]+) s in steps, "
                  r"([0-9.]+) s")


def run_one(h: netns.Hosts, a, tp: int, pp: int, hosts: list[int],
            slots: list[int]) -> tuple[float, float]:
    """(best decode tok/s, slowest worker's communication ms per step)."""
    c = Cluster(h, a, hosts, slots, tp, pp,
                os.path.join("/tmp", f"{h.tag}-bench.log"),
                ["--threads", str(a.threads)])
    try:
        if not c.wait_serving():
            raise RuntimeError("cluster did not start:\n" + c.tail())
        best = 0.0
        for _ in range(a.runs):
            r = h.run(hosts[0], [a.shardlm, "generate", "--server", c.server,
                                 "--prompt", PROMPT, "--max-tokens",
                                 str(a.tokens), "--ignore-eos", "--stats"],
                      timeout=600)
            m = DECODE.search(r.stderr)
            if r.returncode != 0 or not m:
                raise RuntimeError(f"generate failed: {r.stderr[-500:]}")
            best = max(best, float(m.group(1)))
    finally:
        c.stop()  # The workers print their communication time as they go.
    comm = 0.0
    for m in COMM.finditer(c.text()):
        steps, comm_s = int(m.group(2)), float(m.group(4))
        if steps:
            comm = max(comm, 1000 * comm_s / steps)
    return best, comm


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--shardlm", required=True)
    ap.add_argument("--model", required=True)
    ap.add_argument("--rates", default="none,10gbit,1gbit,100mbit")
    ap.add_argument("--placements", default=",".join(PLACEMENTS))
    ap.add_argument("--tokens", type=int, default=128)
    ap.add_argument("--runs", type=int, default=2)
    ap.add_argument("--threads", type=int, default=1)
    a = ap.parse_args()
    a.shardlm = os.path.abspath(a.shardlm)
    a.gguf = os.path.abspath(a.model)  # As check_multinode.Cluster names it.
    why = netns.unavailable()
    if why:
        print(f"cannot run: {why}")
        return 1
    rates = a.rates.split(",")
    print(f"| placement | link | decode tok/s | comm ms/step | vs unshaped |")
    print(f"|---|---|---|---|---|")
    with netns.Hosts(3) as h:
        for name in a.placements.split(","):
            tp, pp, hosts, slots = PLACEMENTS[name]
            base = None
            for rate in rates:
                for i in range(h.n):
                    h.shape(i, None if rate == "none" else rate)
                tok_s, comm = run_one(h, a, tp, pp, hosts, slots)
                base = base or tok_s
                print(f"| {name} | {rate} | {tok_s:.1f} | {comm:.2f} | "
                      f"{tok_s / base:.2f} |", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
