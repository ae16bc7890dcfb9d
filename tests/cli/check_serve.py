#!/usr/bin/env python3
"""End-to-end check of `shardlm serve` and `shardlm generate --server`.

1. `shardlm serve` starts on a free local port and becomes ready (polled
   with `shardlm generate --server`, which fails fast while nothing listens).
2. The greedy completion streamed through the server equals the local
   `shardlm generate --model` output for the same prompt, byte for byte.
   With --stop it is that text cut before the stop string (remote and
   local); with --logprobs, stderr has one line per token and each greedy
   token is its own most likely alternative.
3. A bad request through the server exits 1 with the server's message.
4. An unreachable --server address fails fast naming the address.
5. SIGTERM stops the server with exit 0; it is always killed at the end.
6. Drain: with a stream in flight, SIGTERM turns /ready to 503 at once and
   refuses new requests with UNAVAILABLE, while the stream completes with
   every token; then the server exits 0. A second signal during a drain
   stops the server at once (exit 1) and ends the stream.

  check_serve.py --shardlm BIN --gguf MODEL
"""

from __future__ import annotations

import argparse
import os
import re
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))
from testlib import FAILURES, check, free_port, run, start_serve, stop, wait_ready  # noqa: E402


def http_status(port: int, path: str) -> int:
    try:
        return urllib.request.urlopen(f"http://127.0.0.1:{port}{path}",
                                      timeout=5).status
    except urllib.error.HTTPError as e:
        return e.code


def drain(a):
    """Part 6: SIGTERM with a stream in flight, then a second signal."""
    http = free_port()
    server, addr = start_serve(a.shardlm, a.gguf,
                               ["--http-listen", f"127.0.0.1:{http}",
                                "--drain-timeout-s", "120"],
                               stderr=subprocess.PIPE, text=True)
    try:
        if not wait_ready(a.shardlm, addr, server):
            check(False, "drain: the server starts")
            return
        n = 200
        stream = subprocess.Popen(
            [a.shardlm, "generate", "--server", addr, "--prompt",
             "Tell me a story.", "--max-tokens", str(n), "--ignore-eos",
             "--stats"], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
            text=True)
        # Generating: the first token has been streamed.
        first = stream.stdout.read(1)
        server.send_signal(signal.SIGTERM)
        t0 = time.monotonic()
        # The signal reaches the server's signal thread asynchronously: poll
        # briefly rather than race it.
        ready = http_status(http, "/ready")
        while ready != 503 and time.monotonic() - t0 < 5:
            time.sleep(0.01)
            ready = http_status(http, "/ready")
        late = run([a.shardlm, "generate", "--server", addr, "--prompt", "x",
                    "--max-tokens", "2"], timeout=30)
        rest, err = stream.communicate(timeout=120)
        check(ready == 503, f"drain: /ready is 503 within 5 s ({ready})")
        check(late.returncode != 0 and "UNAVAILABLE" in late.stderr
              and "draining" in late.stderr,
              f"drain: a new request is refused ({late.stderr.strip()})")
        m = re.search(r"generated (\d+) tokens", err)
        check(stream.returncode == 0 and first and m and int(m.group(1)) == n,
              f"drain: the stream in flight completes with all {n} tokens "
              f"({err.strip()[-200:]})")
        server.wait(timeout=30)
        log = server.stderr.read()
        check(server.returncode == 0 and "drained" in log,
              f"drain: then the server exits 0 "
              f"(rc {server.returncode}, {time.monotonic() - t0:.1f}s)")
    finally:
        stop(server)

    server, addr = start_serve(a.shardlm, a.gguf, ["--drain-timeout-s", "120"],
                               stderr=subprocess.PIPE, text=True)
    try:
        if not wait_ready(a.shardlm, addr, server):
            check(False, "drain: the second server starts")
            return
        stream = subprocess.Popen(
            [a.shardlm, "generate", "--server", addr, "--prompt", "Go on.",
             "--max-tokens", "5000", "--ignore-eos"], stdout=subprocess.PIPE,
            stderr=subprocess.PIPE, text=True)
        stream.stdout.read(1)
        server.send_signal(signal.SIGTERM)
        time.sleep(0.5)
        server.send_signal(signal.SIGTERM)
        t0 = time.monotonic()
        try:
            server.wait(timeout=15)
        except subprocess.TimeoutExpired:
            pass
        took = time.monotonic() - t0
        stream.communicate(timeout=30)
        check(server.returncode == 1 and took < 5,
              f"drain: a second signal stops the server at once "
              f"(rc {server.returncode}, {took:.1f}s)")
        check(stream.returncode != 0, "drain: ... and ends the stream")
    finally:
        stop(server)


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--shardlm", required=True)
    ap.add_argument("--gguf", required=True)
    a = ap.parse_args()

    server, addr = start_serve(a.shardlm, a.gguf, stdout=subprocess.PIPE,
                               stderr=subprocess.PIPE, text=True)
    try:
        # 1. Ready once a one-token request succeeds.
        remote = [a.shardlm, "generate", "--server", addr]
        ready = wait_ready(a.shardlm, addr, server)
        check(ready, f"shardlm serve is ready on {addr}")
        if not ready:
            return 1

        # 2. Remote text == local text.
        prompt = ["--prompt", "The capital of France is", "--max-tokens", "24"]
        local = run([a.shardlm, "generate", "--model", a.gguf] + prompt)
        got = run(remote + prompt + ["--stats"])
        check(local.returncode == 0, f"local generate exits 0 ({local.stderr.strip()})")
        check(got.returncode == 0, f"remote generate exits 0 ({got.stderr.strip()})")
        check(got.stdout == local.stdout and got.stdout.strip() != "",
              f"remote text equals local: got {got.stdout!r}, "
              f"want {local.stdout!r}")
        check("prompt 5 tokens" in got.stderr and "generated" in got.stderr,
              f"--stats reports usage ({got.stderr.strip()})")
        chat = ["--chat", "--prompt", "Name a planet.", "--max-tokens", "16"]
        local_chat = run([a.shardlm, "generate", "--model", a.gguf] + chat)
        got_chat = run(remote + chat)
        check(got_chat.returncode == 0 and got_chat.stdout == local_chat.stdout,
              f"--chat through the server equals local: got "
              f"{got_chat.stdout!r}, want {local_chat.stdout!r}")

        # Stop strings: the same greedy text, cut before the first
        # occurrence of a word from its middle.
        text = got.stdout.rstrip("\n")
        words = text.split()
        stop_text = next((" " + w for w in words[len(words) // 2:]
                     if " " + w in text), words[len(words) // 2])
        want = text[:text.find(stop_text)] + "\n"
        stopped = run(remote + prompt + ["--stop", stop_text, "--stop", "@@@",
                                         "--stats"])
        check(stopped.returncode == 0 and stopped.stdout == want,
              f"--stop {stop_text!r} cuts the text before it: got "
              f"{stopped.stdout!r}, want {want!r} ({stopped.stderr.strip()})")
        check("finish: stop" in stopped.stderr,
              f"--stop ends with finish_reason stop ({stopped.stderr.strip()})")
        local_stopped = run([a.shardlm, "generate", "--model", a.gguf] + prompt
                            + ["--stop", stop_text])
        check(local_stopped.stdout == want,
              f"local --stop equals it: {local_stopped.stdout!r}")

        # Logprobs: one readable line per token on stderr, greedy tokens are
        # their own top alternative; stdout unchanged.
        six = ["--prompt", "The capital of France is", "--max-tokens", "6"]
        plain = run(remote + six)
        lp = run(remote + six + ["--logprobs", "3"])
        check(lp.returncode == 0 and lp.stdout == plain.stdout,
              f"--logprobs leaves the text alone ({lp.stderr.strip()})")
        line = re.compile(r'^\s*(\d+): (".*?(?<!\\)")\s+(-?\d+\.\d+) '
                          r'\((\d\.\d+)\) \| (".*?(?<!\\)") (-?\d+\.\d+)')
        rows = [m for m in map(line.match, lp.stderr.splitlines()) if m]
        check(len(rows) == 6, f"--logprobs prints 6 token lines ({lp.stderr!r})")
        for m in rows:
            check(m.group(2) == m.group(5) and
                  float(m.group(3)) == float(m.group(6)) and
                  float(m.group(3)) <= 0,
                  f"greedy token is its own top-1: {m.group(0)!r}")

        # 3. The server rejects a bad request with a message.
        bad = run(remote + ["--prompt", "x", "--max-tokens", "9000"])
        check(bad.returncode == 1 and "INVALID_ARGUMENT" in bad.stderr
              and "8192" in bad.stderr,
              f"over-long request is INVALID_ARGUMENT ({bad.stderr.strip()})")

        # 4. Nothing listens on a fresh free port: fail fast, name it.
        nowhere = f"127.0.0.1:{free_port()}"
        t0 = time.monotonic()
        gone = run([a.shardlm, "generate", "--server", nowhere, "--prompt", "x"],
                   timeout=30)
        took = time.monotonic() - t0
        check(gone.returncode == 1 and nowhere in gone.stderr and took < 10,
              f"unreachable {nowhere} fails in {took:.1f}s naming it "
              f"({gone.stderr.strip()})")
        check(server.poll() is None, "the server is still running")
    finally:
        stop(server)
    check(server.returncode == 0,
          f"SIGTERM stops the server cleanly (exit {server.returncode})")
    drain(a)
    print(f"{len(FAILURES)} failed" if FAILURES else "all serve checks passed")
    return 1 if FAILURES else 0


if __name__ == "__main__":
    sys.exit(main())
