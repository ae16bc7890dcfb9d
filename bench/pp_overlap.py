#!/usr/bin/env python3
"""Pipeline-parallel overlap (issue #12): output tokens/s of an mpirun
cluster at PP = P with one step at a time (--max-steps-in-flight 1) and with
P steps in flight (the default), in the same run, and each stage's busy
share of the measured window (its step time minus the time it waited in
communication, from /metrics), for both.

  bench/pp_overlap.py --shardlm build/launch/shardlm --model M.gguf \
      [--pp 2] [--concurrency 16] [--requests 48] [--max-tokens 64] \
      [--pp-balance decode|prefill]

A benchmark, not a test: it prints figures (and exits 1 only when a run
fails or the two runs' greedy texts differ, which would make the figures
meaningless).
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
import urllib.request

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "tests"))
from testlib import free_port  # noqa: E402

MPIRUN = ["mpirun", "--oversubscribe"]
if os.geteuid() == 0:
    MPIRUN.insert(1, "--allow-run-as-root")


def scrape(port: int) -> dict[str, float]:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics",
                                timeout=10) as r:
        out = {}
        for line in r.read().decode().splitlines():
            if line and not line.startswith("#"):
                name, value = line.rsplit(" ", 1)
                out[name] = float(value)
        return out


def rank_seconds(m: dict[str, float], what: str, rank: int) -> float:
    return m.get(f'shardlm_rank_{what}_seconds_total{{rank="{rank}"}}', 0.0)


def run(a, in_flight: int, workdir: str) -> dict:
    api, http = free_port(), free_port()
    log = open(os.path.join(workdir, f"cluster_{in_flight}.log"), "w")
    proc = subprocess.Popen(
        MPIRUN + ["-np", str(1 + a.pp), a.shardlm, "launch", "--model",
                  a.model, "--pp", str(a.pp), "--listen", f"127.0.0.1:{api}",
                  "--http-listen", f"127.0.0.1:{http}", "--threads", "1",
                  "--max-steps-in-flight", str(in_flight),
                  "--pp-balance", a.pp_balance],
        stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
        start_new_session=True)
    try:
        deadline = time.time() + 120
        while time.time() < deadline:
            try:
                if "ready" in urllib.request.urlopen(
                        f"http://127.0.0.1:{http}/ready", timeout=2).read().decode():
                    break
            except OSError:
                pass
            time.sleep(0.3)
        else:
            raise RuntimeError(f"cluster with {in_flight} in flight did not start")
        # Warm up, then measure one concurrency level.
        subprocess.run([a.shardlm, "bench", "--server", f"127.0.0.1:{api}",
                        "--concurrency", "2", "--requests", "2",
                        "--max-tokens", "8"], capture_output=True, check=True)
        before = scrape(http)
        t0 = time.time()
        out = os.path.join(workdir, f"bench_{in_flight}.json")
        r = subprocess.run(
            [a.shardlm, "bench", "--server", f"127.0.0.1:{api}",
             "--concurrency", str(a.concurrency), "--requests",
             str(a.requests), "--max-tokens", str(a.max_tokens), "--json", out],
            capture_output=True, text=True)
        wall = time.time() - t0
        if r.returncode != 0:
            raise RuntimeError(f"bench failed: {r.stderr[-400:]}")
        after = scrape(http)
        with open(out) as f:
            result = json.load(f)
        level = result["levels"][0] if "levels" in result else result[0]
        busy = []
        for rank in range(1, a.pp + 1):
            step = rank_seconds(after, "step", rank) - rank_seconds(before, "step", rank)
            comm = (rank_seconds(after, "communication", rank)
                    - rank_seconds(before, "communication", rank))
            busy.append((step - comm) / wall)
        texts = subprocess.run(
            [a.shardlm, "generate", "--server", f"127.0.0.1:{api}", "--prompt",
             "The history of the printing press", "--max-tokens", "32",
             "--ignore-eos"], capture_output=True, text=True).stdout
        return {"in_flight": in_flight, "level": level, "busy": busy,
                "max_in_flight": after.get('shardlm_steps_in_flight{which="max"}'),
                "text": texts}
    finally:
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
        log.close()


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--shardlm", required=True)
    ap.add_argument("--model", required=True)
    ap.add_argument("--pp", type=int, default=2)
    ap.add_argument("--concurrency", type=int, default=16)
    ap.add_argument("--requests", type=int, default=48)
    ap.add_argument("--max-tokens", type=int, default=64)
    ap.add_argument("--pp-balance", default="decode",
                    help="launch's --pp-balance: decode or prefill")
    a = ap.parse_args()
    a.shardlm, a.model = os.path.abspath(a.shardlm), os.path.abspath(a.model)
    workdir = tempfile.mkdtemp(prefix="pp_overlap_")
    runs = [run(a, 1, workdir), run(a, a.pp, workdir)]
    print(f"PP={a.pp}, 1 thread per worker, {a.concurrency} concurrent "
          f"streams of {a.max_tokens} tokens, {a.requests} requests "
          f"(cluster logs in {workdir}):")
    for r in runs:
        lv = r["level"]
        tps = lv.get("output_tokens_per_s", lv.get("tokens_per_s"))
        busy = ", ".join(f"stage {i}: {b:.0%}" for i, b in enumerate(r["busy"]))
        print(f"  --max-steps-in-flight {r['in_flight']}: {tps:.1f} output "
              f"tokens/s (max {r['max_in_flight']:g} in flight); busy share "
              f"{busy}")
    t = [r["level"].get("output_tokens_per_s", r["level"].get("tokens_per_s"))
         for r in runs]
    print(f"  overlap speedup: {t[1] / t[0]:.2f}x")
    if runs[0]["text"] != runs[1]["text"] or not runs[0]["text"]:
        print("the two runs' greedy texts differ", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
