#!/usr/bin/env python3
"""Speculative decoding against the same server without it (issue #62).

Benchmark only (never a build or test dependency). Starts `shardlm serve`
on the same machine, one at a time: without speculation (with
--batch-invariant, so that both run the same kernels) and with
--speculative ngram (and any --spec-flags), alternately, --rounds times
(the figures are the rounds' means). Against each:

  code edit, batch 1: prompts holding most of their answer (a function to
    repeat with a small change), one at a time; decode tokens/s from
    `shardlm generate --server ... --stats` (first to last token);
  chat, batch 1: ordinary questions, one at a time, the same way;
  chat, 16 streams: the chat prompts sent 16 at a time over HTTP; tokens
    per second of wall time.

It prints each workload's figure for both servers and their ratio, the
drafts kept (from /metrics), and checks that every greedy text is the
same with and without speculation (exit 1 if not).

  bench/speculative_bench.py --shardlm build/launch/shardlm \\
      --model models/SmolLM2-135M-Instruct.Q4_1.gguf --threads 2
"""
import argparse
import concurrent.futures
import json
import os
import re
import subprocess
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "tests"))
import testlib  # noqa: E402

CODE = [
    ("def area(width, height):\n    return width * height\n\n"
     "def perimeter(width, height):\n    return 2 * (width + height)\n\n"
     "def diagonal(width, height):\n    return (width ** 2 + height ** 2) "
     "** 0.5\n\nRepeat the three functions above exactly, renaming "
     "width to w and height to h."),
    ("class Stack:\n    def __init__(self):\n        self.items = []\n\n"
     "    def push(self, item):\n        self.items.append(item)\n\n"
     "    def pop(self):\n        return self.items.pop()\n\n"
     "    def size(self):\n        return len(self.items)\n\n"
     "Repeat the class above, adding a docstring to each method."),
    ("SELECT name, email FROM users WHERE active = 1 ORDER BY name;\n"
     "SELECT name, total FROM orders WHERE total > 100 ORDER BY total;\n"
     "SELECT name, city FROM stores WHERE open = 1 ORDER BY city;\n\n"
     "Repeat the three queries above with LIMIT 10 added to each."),
]
CHAT = [
    "Write a short story about a cat who learns to swim.",
    "Explain how photosynthesis works to a ten year old.",
    "What are three tips for staying productive when working from home?",
    "Describe the water cycle in a few sentences.",
    "Give me a recipe for a simple tomato soup.",
    "Why is the sky blue?",
    "Write a haiku about autumn leaves.",
    "What is the difference between a virus and a bacterium?",
]


def generate(shardlm, addr, prompt, max_tokens):
    out = testlib.run([shardlm, "generate", "--server", addr, "--chat",
                       "--prompt", prompt, "--max-tokens", str(max_tokens),
                       "--temperature", "0", "--stats"], timeout=600)
    if out.returncode != 0:
        sys.exit(f"generate failed: {out.stderr}")
    m = re.search(r"generated (\d+) tokens, decode ([0-9.]+) tok/s",
                  out.stderr)
    return out.stdout, int(m.group(1)), float(m.group(2))


def batch_one(shardlm, addr, prompts, max_tokens):
    texts, tokens, seconds = [], 0, 0.0
    for p in prompts:
        text, n, rate = generate(shardlm, addr, p, max_tokens)
        texts.append(text)
        if n > 1 and rate > 0:
            tokens += n - 1
            seconds += (n - 1) / rate
    return texts, tokens / seconds if seconds else 0.0


def streams(port, prompts, max_tokens, concurrency):
    def one(p):
        status, body = testlib.http_post_json(
            port, "/v1/chat/completions",
            {"messages": [{"role": "user", "content": p}],
             "max_tokens": max_tokens, "temperature": 0}, timeout=600)
        if status != 200:
            sys.exit(f"HTTP {status}: {body[:200]!r}")
        r = json.loads(body)
        return r["choices"][0]["message"]["content"], \
            r["usage"]["completion_tokens"]
    work = [prompts[i % len(prompts)] for i in range(concurrency)]
    start = time.monotonic()
    with concurrent.futures.ThreadPoolExecutor(concurrency) as pool:
        results = list(pool.map(one, work))
    wall = time.monotonic() - start
    return [t for t, _ in results], sum(n for _, n in results) / wall


def metrics(port):
    """The server's Prometheus series (GET /metrics)."""
    import socket
    with socket.create_connection(("127.0.0.1", port), timeout=30) as s:
        s.sendall(b"GET /metrics HTTP/1.1\r\nHost: x\r\n"
                  b"Connection: close\r\n\r\n")
        data = b""
        while chunk := s.recv(65536):
            data += chunk
    head, _, body = data.partition(b"\r\n\r\n")
    if b"transfer-encoding: chunked" in head.lower():
        body = testlib.dechunk(body)
    return testlib.prometheus_series(body.decode(errors="replace"))


def start(args, extra):
    http = testlib.free_port()
    server, addr = testlib.start_serve(
        args.shardlm, args.model,
        ["--threads", str(args.threads), "--http-listen",
         f"127.0.0.1:{http}", *extra])
    if not testlib.wait_ready(args.shardlm, addr, server):
        sys.exit(f"the server did not start ({' '.join(extra)})")
    return server, addr, http


DRAFTED = 'shardlm_spec_tokens_total{kind="drafted"}'


def measure(args, addr, http):
    """One round of the three workloads against one server: per workload,
    (texts, tokens/s, tokens drafted during it)."""
    runs = {
        "code": lambda: batch_one(args.shardlm, addr, CODE, args.max_tokens),
        "chat": lambda: batch_one(args.shardlm, addr, CHAT[:4],
                                  args.max_tokens),
        "streams": lambda: streams(http, CHAT, args.max_tokens,
                                   args.concurrency),
    }
    out = {}
    for name, run in runs.items():
        before = metrics(http).get(DRAFTED, 0)
        texts, rate = run()
        out[name] = (texts, rate, metrics(http).get(DRAFTED, 0) - before)
    return out


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--shardlm", required=True)
    ap.add_argument("--model", required=True)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--max-tokens", type=int, default=128)
    ap.add_argument("--concurrency", type=int, default=16)
    ap.add_argument("--rounds", type=int, default=2,
                    help="times each workload runs against each server")
    ap.add_argument("--spec-flags", default="",
                    help="more flags for the speculative server")
    ap.add_argument("--json", help="also write the figures here")
    args = ap.parse_args()

    # One server at a time (an idle one's OpenMP threads still spin a
    # while after each step), each round against one then the other: drift
    # in the machine's speed falls on both.
    configs = [["--batch-invariant"],
               ["--speculative", "ngram", *args.spec_flags.split()]]
    rounds, spec_metrics = [], {}
    for _ in range(args.rounds):
        rounds.append([])
        for extra in configs:
            server, addr, http = start(args, extra)
            try:
                rounds[-1].append(measure(args, addr, http))
                if extra is configs[1]:
                    for k, v in metrics(http).items():
                        spec_metrics[k] = spec_metrics.get(k, 0) + v
            finally:
                testlib.stop(server)
    base = {n: (rounds[0][0][n][0],
                sum(r[0][n][1] for r in rounds) / args.rounds)
            for n in ("code", "chat", "streams")}
    spec = {n: (rounds[0][1][n][0],
                sum(r[1][n][1] for r in rounds) / args.rounds)
            for n in ("code", "chat", "streams")}
    spec["metrics"] = spec_metrics
    same = all(r[0][n][0] == r[1][n][0] for r in rounds
               for n in ("code", "chat", "streams"))
    for i, r in enumerate(rounds):
        print(f"round {i + 1}: " + ", ".join(
            f"{n} {r[1][n][1] / r[0][n][1]:.2f}x ({r[1][n][2]:.0f} drafted)"
            for n in ("code", "chat", "streams")))
    print(f"{'workload':<22} {'without':>10} {'ngram':>10} {'ratio':>7}")
    figures = {}
    for name, label in (("code", "code edit, batch 1"),
                        ("chat", "chat, batch 1"),
                        ("streams", f"chat, {args.concurrency} streams")):
        a, b = base[name][1], spec[name][1]
        figures[name] = {"without": a, "ngram": b, "ratio": b / a}
        print(f"{label:<22} {a:>10.1f} {b:>10.1f} {b / a:>6.2f}x")
    m = spec["metrics"]
    drafted = m.get('shardlm_spec_tokens_total{kind="drafted"}', 0)
    kept = m.get('shardlm_spec_tokens_total{kind="kept"}', 0)
    verifications = m.get("shardlm_spec_verifications_total", 0)
    if verifications:
        print(f"drafts kept: {kept:.0f} of {drafted:.0f} "
              f"({100 * kept / max(drafted, 1):.0f}%) in {verifications:.0f} "
              f"verifications ({(kept + verifications) / verifications:.2f} "
              "tokens each)")
    figures["drafted"], figures["kept"] = drafted, kept
    print("greedy texts identical:", "yes" if same else "NO")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"figures": figures, "identical": same}, f, indent=1)
    return 0 if same else 1


if __name__ == "__main__":
    sys.exit(main())
