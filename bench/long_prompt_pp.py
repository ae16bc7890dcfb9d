#!/usr/bin/env python3
"""Time to first token of one long prompt on an mpirun cluster (issue #35,
part 1): PP = 1, PP = P with one step at a time (--max-steps-in-flight 1:
each chunk waits for the previous one to leave the last stage, as every
PP run did before chunks were pipelined), and PP = P with P steps in flight
(the default: a prompt's next chunk enters stage 0 as soon as the previous
one has left it), the latter with launch's default --pp-balance decode
(stage boundaries charge the last stage the output head that decode rows
run: SmolLM2's PP 2 stages hold 19 and 11 layers) and with --pp-balance
prefill (the layers only: 15 and 15). One thread per worker, prefix caching off (every run
computes the whole prompt), the same prompt in all of them.

  bench/long_prompt_pp.py --shardlm build/launch/shardlm --model M.gguf \\
      [--pp 2] [--tokens 2048,7000] [--chunk 512] [--repeats 1]

A benchmark, not a test: it prints figures (and exits 1 only when a run
fails or the runs' greedy continuations differ, which would make the
figures meaningless).

With --ceiling, it also measures what the machine allows: PP copies of a
single-threaded in-process `shardlm generate` computing the same prompt at
once, against one alone. PP x alone / together is the most any PP-way
split of that work can gain on this machine (cores that share caches,
memory bandwidth or a hypervisor's physical cores run two streams slower
than one), so the pipelined column can be read against it.
"""

from __future__ import annotations

import argparse
import os
import re
import signal
import subprocess
import sys
import tempfile
import time
import urllib.request

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "tests"))
from testlib import free_port  # noqa: E402

# What `shardlm generate --stats` prints: the prompt's tokens and the time
# to the first generated token.
STATS = re.compile(r"prompt (\d+) tokens, first token after ([0-9.]+)s")

MPIRUN = ["mpirun", "--oversubscribe"]
if os.geteuid() == 0:
    MPIRUN.insert(1, "--allow-run-as-root")

# About 1.06 tokens per word with SmolLM2's tokenizer; the exact count is
# what the server reports back.
WORDS = ("the river ran past the old mill where the miller kept his accounts "
         "in a ledger bound in green cloth and every evening he counted the "
         "sacks of flour twice before he slept").split()


def prompt_of(words: int) -> str:
    return " ".join(WORDS[i % len(WORDS)] for i in range(words))


def wait_ready(http: int, what: str) -> None:
    deadline = time.time() + 180
    while time.time() < deadline:
        try:
            if "ready" in urllib.request.urlopen(
                    f"http://127.0.0.1:{http}/ready",
                    timeout=2).read().decode():
                return
        except OSError:
            pass
        time.sleep(0.3)
    raise RuntimeError(f"{what} did not start")


# What in-process `shardlm generate --stats` prints.
PREFILL = re.compile(r"prompt (\d+) tokens, prefill ([0-9.]+)s")


def ceiling(a, prompt: str) -> tuple[float, float]:
    """Prefill seconds of one in-process run alone, and the mean of a.pp
    identical runs started at once (one thread each)."""
    cmd = [a.shardlm, "generate", "--model", a.model, "--threads", "1",
           "--prompt", prompt, "--max-tokens", "1", "--stats",
           "--prefix-caching=false", "--max-batched-tokens", str(a.chunk)]

    def wait(procs) -> list[float]:
        out = []
        for p in procs:
            _, err = p.communicate()
            m = PREFILL.search(err)
            if p.returncode != 0 or m is None:
                raise RuntimeError(f"ceiling run: {err[-400:]}")
            out.append(float(m.group(2)))
        return out

    def start():
        return subprocess.Popen(cmd, stdout=subprocess.DEVNULL,
                                stderr=subprocess.PIPE, text=True)

    alone = min(wait([start()])[0] for _ in range(a.repeats))
    together = wait([start() for _ in range(a.pp)])
    return alone, sum(together) / len(together)


def run(a, pp: int, in_flight: int, prompts: list[str], workdir: str,
        balance: str = "decode") -> dict:
    api, http = free_port(), free_port()
    name = f"pp{pp}_inflight{in_flight}_{balance}"
    log = open(os.path.join(workdir, f"{name}.log"), "w")
    proc = subprocess.Popen(
        MPIRUN + ["-np", str(1 + pp), a.shardlm, "launch", "--model", a.model,
                  "--pp", str(pp), "--listen", f"127.0.0.1:{api}",
                  "--http-listen", f"127.0.0.1:{http}", "--threads", "1",
                  "--max-batched-tokens", str(a.chunk),
                  "--prefix-caching=false",
                  "--max-steps-in-flight", str(in_flight),
                  "--pp-balance", balance],
        stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
        start_new_session=True)
    gen = [a.shardlm, "generate", "--server", f"127.0.0.1:{api}"]
    try:
        wait_ready(http, name)
        subprocess.run(gen + ["--prompt", "warm up", "--max-tokens", "4"],
                       capture_output=True, check=True)
        ttft, texts, counted = [], [], []
        for p in prompts:
            best, text = float("inf"), None
            for _ in range(a.repeats):
                r = subprocess.run(gen + ["--prompt", p, "--max-tokens", "8",
                                          "--ignore-eos", "--stats"],
                                   capture_output=True, text=True)
                m = STATS.search(r.stderr)
                if r.returncode != 0 or m is None:
                    raise RuntimeError(f"{name}: {r.stderr[-400:]}")
                best = min(best, float(m.group(2)))
                text = r.stdout
            ttft.append(best)
            texts.append(text)
            counted.append(int(m.group(1)))
        return {"name": name, "ttft": ttft, "texts": texts, "tokens": counted}
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
    ap.add_argument("--tokens", default="2048,7000",
                    help="prompt lengths, in words (about one token each)")
    ap.add_argument("--chunk", type=int, default=512,
                    help="--max-batched-tokens: the prefill chunk")
    ap.add_argument("--repeats", type=int, default=1)
    ap.add_argument("--ceiling", action="store_true",
                    help="also measure the machine's parallel ceiling "
                    "(--pp single-threaded copies of the prefill at once)")
    a = ap.parse_args()
    a.shardlm, a.model = os.path.abspath(a.shardlm), os.path.abspath(a.model)
    lengths = [int(x) for x in a.tokens.split(",")]
    prompts = [prompt_of(n) for n in lengths]
    workdir = tempfile.mkdtemp(prefix="long_prompt_pp_")
    runs = [run(a, 1, 1, prompts, workdir), run(a, a.pp, 1, prompts, workdir),
            run(a, a.pp, a.pp, prompts, workdir),
            run(a, a.pp, a.pp, prompts, workdir, "prefill")]
    print(f"TTFT of one prompt, 1 thread per worker, chunks of {a.chunk} "
          f"tokens, best of {a.repeats}, each with 8 tokens generated (cluster logs in {workdir}):")
    print("| prompt (tokens) | PP 1 | PP %d, chunks one at a time | "
          "PP %d, chunks pipelined | pipelined vs one at a time | "
          "pipelined, --pp-balance prefill | vs one at a time |" %
          (a.pp, a.pp))
    print("|---|---|---|---|---|---|---|")
    for i, n in enumerate(lengths):
        t = [r["ttft"][i] for r in runs]
        print(f"| {runs[0]['tokens'][i]} | {t[0]:.2f} s | {t[1]:.2f} s | "
              f"{t[2]:.2f} s | {t[1] / t[2]:.2f}x | {t[3]:.2f} s | "
              f"{t[1] / t[3]:.2f}x |")
    if a.ceiling:
        print(f"\nThe machine's ceiling: {a.pp} single-threaded in-process "
              "prefills of the same prompt at once, against one alone:")
        print(f"| prompt (tokens) | alone | {a.pp} at once (mean) | "
              f"ceiling ({a.pp} x alone / at once) | pipelined vs one at a "
              "time, of the ceiling |")
        print("|---|---|---|---|---|")
        for i, p in enumerate(prompts):
            alone, together = ceiling(a, p)
            best = a.pp * alone / together
            t = [r["ttft"][i] for r in runs]
            print(f"| {runs[0]['tokens'][i]} | {alone:.2f} s | "
                  f"{together:.2f} s | {best:.2f}x | "
                  f"{t[1] / t[2] / best:.0%} |")
    for i in range(len(lengths)):
        if len({r["texts"][i] for r in runs}) != 1 or not runs[0]["texts"][i]:
            print(f"the runs' greedy continuations of prompt {i} differ: "
                  f"{[r['texts'][i] for r in runs]}", file=sys.stderr)
            return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
