#!/usr/bin/env python3
"""Context parallelism in a cluster (issue #35 part 2, benchmark): time to
first token and decode tok/s of one long prompt at CP 1 and CP 2, the bytes
each CP rank sends per step, and the cost model's prediction beside them.

For each prompt length (--tokens, default 4096,16384,32768: the prompt is
48 tokens shorter, so that it and the 32 generated tokens fit the context),
each placement and each CP, one cluster serves one request (no warm-up: the
workers' counters then hold that request's steps alone):

  mpi    `mpirun --oversubscribe -np 1+CP shardlm launch --cp CP` on this
         host (Open MPI's shared memory between the ranks).
  netns  two hosts (network namespaces on a bridge, tests/multinode/netns.py,
         TCP only, no route out), both links shaped by tc tbf to --rate
         (1gbit): the coordinator and CP rank 0 on host 0, CP rank 1 on
         host 1 (at CP 1 the one worker is on host 1).

One thread per worker, f16 KV, prefill chunks of --chunk tokens, prefix
caching off; CP 1's worker gets twice the KV pool of each CP 2 worker (just
enough for the prompt at CP 1). Measured: the client's `generate --stats`
(time to first token, decode tok/s), and each worker's exit report (seconds
in communication, and the bytes it sent over its CP group in
sequence-parallel steps, the prefill chunks, and in whole steps, the lone
decode steps: `CommBytes`). Predicted:

  bytes  the built scheme's formula (docs/design-notes.md, "Cost model"):
         per layer and sequence-parallel step of n tokens, each CP rank
         sends (C - 1) x [ceil(n / C) x (heads + 2 kv_heads) x head_dim x 4
         (its Q/K/V slice) + n x heads x (head_dim + 1) x 4 (the partial
         outputs and lse of every row)], plus the logit-row sum of the
         sampled row (hidden x 4) after the last chunk; a whole step (one
         decode) sends (C - 1) x heads x (head_dim + 1) x 4 per layer.
         Computed here from the formula, independently of `shardlm
         simulate --cp`, which models the same scheme and prints its own
         bytes per rank (kept in the JSON as cp_lines).
  time   `shardlm simulate --gpu cpu-this-machine --cp C` for the same
         request (the cost model, uncalibrated for this machine: each rank
         its own device, CP traffic over its `shm` link), and for netns:
         the mpi run's measured time plus the predicted bytes at --rate
         (communication added to compute, no overlap, as the model does).

  bench/cp_bench.py --shardlm build/launch/shardlm \\
      --model /work/ggufs/smollm2-Q4_1-ctx32k.gguf [--tokens 4096,16384] \\
      [--placements mpi,netns] [--cp 1,2] [--json out.json]

The model must have a context of at least the longest --tokens
(`tests/cut_gguf.py --context-length 32768` raises SmolLM2's 8K). A
benchmark, not a test: it prints figures, and exits 1 when a run fails or
the runs' greedy continuations differ (which would make the figures
meaningless). The netns placement needs root, iproute2 and tc.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import re
import subprocess
import sys
import tempfile
import time
import types

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "tests"))
sys.path.insert(0, os.path.join(HERE, "..", "tests", "cluster"))
sys.path.insert(0, os.path.join(HERE, "..", "tests", "multinode"))
import check_cluster  # noqa: E402
import check_multinode  # noqa: E402
import netns  # noqa: E402

STATS = re.compile(r"prompt (\d+) tokens, first token after ([0-9.]+)s \| "
                   r"generated (\d+) tokens, decode ([0-9.]+) tok/s")
COMM = re.compile(r"worker rank (\d+): (\d+) steps, ([0-9.]+) s in steps, "
                  r"([0-9.]+) s")
CP_BYTES = re.compile(r"worker rank (\d+): CP sent (\d+) bytes in (\d+) "
                      r"sequence-parallel steps .*?, (\d+) bytes in (\d+) "
                      r"whole steps")
SIM_TTFT = re.compile(r"time to first token\s+([0-9.]+)")
SIM_TPOT = re.compile(r"time per out. token\s+([0-9.]+)")

# SmolLM2-135M: layers, heads, KV heads, head_dim, hidden.
SHAPE = dict(layers=30, heads=9, kv_heads=3, head_dim=64, hidden=576)
# f16 K and V of a block of 16 tokens over the 30 layers and 3 KV heads.
BLOCK_BYTES = 2 * 30 * 3 * 64 * 2 * 16

# 1.0606 SmolLM2 tokens per word (4,048 words: 4,293 tokens; 16,336:
# 17,326); the exact count is what the server reports back.
TOKENS_PER_WORD = 1.0606
WORDS = ("the river ran past the old mill where the miller kept his accounts "
         "in a ledger bound in green cloth and every evening he counted the "
         "sacks of flour twice before he slept").split()


def prompt_of(words: int) -> str:
    return " ".join(WORDS[i % len(WORDS)] for i in range(words))


def predicted_bytes(prompt: int, generated: int, chunk: int,
                    cp: int) -> dict:
    """Bytes one CP rank sends: over the prefill chunks, and per decode."""
    s = SHAPE
    if cp == 1:
        return {"prefill": 0, "chunks": 0, "decode_step": 0}
    total, chunks = 0, 0
    for begin in range(0, prompt, chunk):
        n = min(chunk, prompt - begin)
        chunks += 1
        if n < cp:  # Runs whole on every rank.
            per_layer = n * s["heads"] * (s["head_dim"] + 1) * 4
        else:
            per_layer = (math.ceil(n / cp) * (s["heads"] + 2 * s["kv_heads"])
                         * s["head_dim"] * 4
                         + n * s["heads"] * (s["head_dim"] + 1) * 4)
        total += (cp - 1) * s["layers"] * per_layer
    total += (cp - 1) * s["hidden"] * 4  # The sampled row's logit-row sum.
    decode = (cp - 1) * s["layers"] * s["heads"] * (s["head_dim"] + 1) * 4
    return {"prefill": total, "chunks": chunks, "decode_step": decode}


def simulate(a, prompt: int, cp: int) -> dict:
    with tempfile.NamedTemporaryFile("w", suffix=".csv", delete=False) as f:
        f.write(f"0,{prompt},{a.gen}\n")
    r = subprocess.run(
        [a.shardlm, "simulate", "--model-config", a.model, "--gpu",
         "cpu-this-machine", "--cp", str(cp), "--trace", f.name,
         "--max-batched-tokens", str(a.chunk), "--weight-dtype", "q4_1",
         "--kv-cache-dtype", "f16"], capture_output=True, text=True,
        timeout=300)
    os.unlink(f.name)
    t, p = SIM_TTFT.search(r.stdout), SIM_TPOT.search(r.stdout)
    if r.returncode != 0 or not t or not p:
        return {"error": (r.stderr or r.stdout)[-300:]}
    return {"ttft_s": float(t.group(1)) / 1000,
            "decode_tok_s": 1000 / float(p.group(1)),
            "cp_lines": [l for l in r.stdout.splitlines()
                         if "cp" in l.lower() and "bytes" in l.lower()]}


def prioritize(pids) -> None:
    """Gives the sessions of `pids` this process's nice value. With the
    kernel's autogroups (/proc/sys/kernel/sched_autogroup_enabled), nice
    orders processes only within a session, and each cluster is started in
    a session of its own: without this, `nice -n -15 cp_bench.py` would
    share the cores equally with every other session's work."""
    for pid in pids:
        try:
            with open(f"/proc/{pid}/autogroup", "w") as f:
                f.write(str(os.nice(0)))
        except OSError:
            pass


def netns_pids(h) -> list[int]:
    out = []
    for i in range(h.n):
        out += [int(p) for p in subprocess.run(
            ["ip", "netns", "pids", h.ns(i)], capture_output=True,
            text=True).stdout.split()]
    return out


def cluster_flags(a, tokens: int, cp: int) -> list[str]:
    blocks = math.ceil((tokens + 16) / 16) + 2  # CP 1's pool, in blocks.
    blocks += blocks % 2
    return ["--threads", "1", "--kv-cache-dtype", "f16", "--kv-cache-bytes",
            str(blocks // cp * BLOCK_BYTES), "--max-batched-tokens",
            str(a.chunk), "--prefix-caching=false", "--step-timeout-s", "900",
            "--startup-timeout-s", "300"]


def parse_reports(log: str) -> dict:
    comm = {int(m.group(1)): (int(m.group(2)), float(m.group(3)),
                              float(m.group(4))) for m in COMM.finditer(log)}
    cpb = {int(m.group(1)): tuple(int(m.group(i)) for i in range(2, 6))
           for m in CP_BYTES.finditer(log)}
    return {"comm": comm, "cp_bytes": cpb}


def http_client(url: str, prompt_file: str, gen: int) -> int:
    """The client for prompts too long for one argument (Linux takes at
    most 128 KiB): a streamed greedy completion over the OpenAI API,
    printing `generate --stats`'s line (first token: the first chunk with a
    choice; decode: the tokens after it over the time to the last)."""
    import urllib.request
    with open(prompt_file) as f:
        body = {"prompt": f.read(), "max_tokens": gen, "temperature": 0,
                "ignore_eos": True, "stream": True,
                "stream_options": {"include_usage": True}}
    req = urllib.request.Request(
        url + "/v1/completions", data=json.dumps(body).encode(),
        headers={"Content-Type": "application/json"})
    start = time.time()
    first = last = None
    text, usage = [], {}
    with urllib.request.urlopen(req, timeout=7200) as resp:
        for line in resp:
            line = line.decode().strip()
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            chunk = json.loads(line[6:])
            if chunk.get("choices"):
                last = time.time()
                first = first or last
                text.append(chunk["choices"][0].get("text", ""))
            if chunk.get("usage"):
                usage = chunk["usage"]
    n = usage.get("completion_tokens", 0)
    print("".join(text))
    print(f"[shardlm] http | prompt {usage.get('prompt_tokens', 0)} tokens, "
          f"first token after {first - start:.3f}s | generated {n} tokens, "
          f"decode {(n - 1) / (last - first) if n > 1 else 0:.1f} tok/s",
          file=sys.stderr)
    return 0


def request(run, server: str, http: str, a, text: str) -> dict:
    if len(text.encode()) < 120_000 and not a.http:
        argv = [a.shardlm, "generate", "--server", server, "--prompt", text,
                "--max-tokens", str(a.gen), "--ignore-eos", "--stats"]
    else:
        prompt_file = os.path.join(a.workdir, "prompt.txt")
        with open(prompt_file, "w") as f:
            f.write(text)
        argv = [sys.executable, os.path.abspath(__file__), "--client", http,
                prompt_file, str(a.gen)]
    r = run(argv)
    m = STATS.search(r.stderr)
    if r.returncode != 0 or m is None:
        raise RuntimeError(f"generate failed: {r.stderr[-600:]}")
    return {"prompt_tokens": int(m.group(1)), "ttft_s": float(m.group(2)),
            "generated": int(m.group(3)), "decode_tok_s": float(m.group(4)),
            "text": r.stdout}


def run_mpi(a, tokens: int, cp: int, text: str, workdir: str) -> dict:
    log = os.path.join(workdir, f"mpi_cp{cp}_{tokens}.log")
    http = check_cluster.free_port()
    c = check_cluster.Cluster(
        a.shardlm, a.model, 1, 1, log, cluster_flags(a, tokens, cp) +
        ["--http-listen", f"127.0.0.1:{http}"], cp=cp)
    prioritize([c.proc.pid])
    try:
        if not c.wait_serving(300):
            raise RuntimeError("cluster did not start:\n" + c.tail())
        out = request(lambda argv: subprocess.run(
            argv, capture_output=True, text=True, timeout=3600), c.address,
            f"http://127.0.0.1:{http}", a, text)
    finally:
        c.stop()
    with open(log) as f:
        out.update(parse_reports(f.read()))
    return out


def run_netns(a, h, tokens: int, cp: int, text: str, workdir: str) -> dict:
    log = os.path.join(workdir, f"netns_cp{cp}_{tokens}.log")
    hosts, slots = ([0, 1], [2, 1]) if cp == 2 else ([0, 1], [1, 1])
    extra = cluster_flags(a, tokens, cp) + (["--cp", str(cp)] if cp > 1
                                            else [])
    c = check_multinode.Cluster(h, types.SimpleNamespace(
        shardlm=a.shardlm, gguf=a.model), hosts, slots, 1, 1, log, extra)
    prioritize([c.proc.pid])
    try:
        if not c.wait_serving(300):
            raise RuntimeError("cluster did not start:\n" + c.tail())
        prioritize(netns_pids(h))
        out = request(lambda argv: h.run(0, argv, timeout=3600), c.server,
                      f"http://{h.address(0)}:{check_multinode.HTTP_PORT}", a,
                      text)
    finally:
        c.stop()
    out.update(parse_reports(c.text()))
    return out


def main() -> int:
    if len(sys.argv) == 5 and sys.argv[1] == "--client":
        return http_client(sys.argv[2], sys.argv[3], int(sys.argv[4]))
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--shardlm", required=True)
    ap.add_argument("--model", required=True)
    ap.add_argument("--tokens", default="4096,16384,32768")
    ap.add_argument("--cp", default="1,2")
    ap.add_argument("--placements", default="mpi,netns")
    ap.add_argument("--rate", default="1gbit")
    ap.add_argument("--chunk", type=int, default=512)
    ap.add_argument("--gen", type=int, default=32)
    ap.add_argument("--json")
    ap.add_argument("--http", action="store_true",
                    help="the HTTP client for every prompt (it is used "
                    "anyway for prompts over 120,000 bytes)")
    a = ap.parse_args()
    a.shardlm, a.model = os.path.abspath(a.shardlm), os.path.abspath(a.model)
    rate_bytes = {"k": 1e3, "m": 1e6, "g": 1e9}[
        re.fullmatch(r"\d+([kmg])bit", a.rate).group(1)] * int(
            re.match(r"\d+", a.rate).group(0)) / 8
    placements = a.placements.split(",")
    cps = [int(x) for x in a.cp.split(",")]
    prioritize([os.getpid()])
    workdir = a.workdir = tempfile.mkdtemp(prefix="cp_bench_")
    print(f"logs in {workdir}", flush=True)
    rows = []
    h = None
    if "netns" in placements:
        why = netns.unavailable()
        if why:
            print(f"netns: cannot run: {why}")
            return 1
        h = netns.Hosts(2).__enter__()
        for i in range(h.n):
            h.shape(i, a.rate)
    failed = False
    try:
        for tokens in (int(x) for x in a.tokens.split(",")):
            text = prompt_of(int((tokens - 48) / TOKENS_PER_WORD))
            for placement in placements:
                for cp in cps:
                    load0 = os.getloadavg()
                    t0 = time.time()
                    try:
                        r = (run_mpi(a, tokens, cp, text, workdir)
                             if placement == "mpi" else
                             run_netns(a, h, tokens, cp, text, workdir))
                    except RuntimeError as e:
                        print(f"{placement} cp {cp} {tokens}: {e}",
                              flush=True)
                        failed = True
                        continue
                    r.update(placement=placement, cp=cp, tokens=tokens,
                             load_before=load0[0],
                             load_after=os.getloadavg()[0],
                             wall_s=time.time() - t0,
                             predicted=predicted_bytes(
                                 r["prompt_tokens"], r["generated"], a.chunk,
                                 cp),
                             simulated=simulate(a, r["prompt_tokens"], cp))
                    rows.append(r)
                    print(json.dumps({k: v for k, v in r.items()
                                      if k != "text"}), flush=True)
    finally:
        if h is not None:
            h.__exit__(None, None, None)
    print()
    print(f"| tokens | placement | CP | TTFT s (sim) | decode tok/s (sim) | "
          f"CP bytes/rank per prefill chunk: measured (predicted) | "
          f"CP bytes/rank per decode step: measured (predicted) | "
          f"comm s/worker (predicted link s) | load before, after |")
    print("|---|---|---|---|---|---|---|---|---|")
    mpi_ttft = {}
    for r in rows:
        sim, pred = r["simulated"], r["predicted"]
        cpb = r["cp_bytes"]
        if cpb:
            split = max(v[0] / max(v[1], 1) for v in cpb.values())
            whole = max(v[2] / max(v[3], 1) for v in cpb.values())
            chunk_b = f"{split / 1e6:.2f} MB"
            dec_b = f"{whole / 1e3:.1f} KB"
        else:
            chunk_b = dec_b = "0"
        p_chunk = pred["prefill"] / max(pred["chunks"], 1)
        if r["placement"] == "mpi":
            mpi_ttft[(r["tokens"], r["cp"])] = r["ttft_s"]
            sim_ttft = sim.get("ttft_s")
            note = f"{sim_ttft:.2f}" if sim_ttft else "?"
        else:
            base = mpi_ttft.get((r["tokens"], r["cp"]))
            note = (f"mpi + link: {base + pred['prefill'] / rate_bytes:.2f}"
                    if base else "?")
        sim_dec = sim.get("decode_tok_s")
        sim_dec = f"{sim_dec:.1f}" if sim_dec else "?"
        comm = ", ".join(f"{v[2]:.1f}" for _, v in sorted(r["comm"].items()))
        if r["placement"] == "netns" and r["cp"] > 1:
            link = (pred["prefill"] + pred["decode_step"] *
                    (r["generated"] - 1)) / rate_bytes
            comm += f" ({link:.1f})"
        print(f"| {r['prompt_tokens']} | {r['placement']} | {r['cp']} | "
              f"{r['ttft_s']:.2f} ({note}) | {r['decode_tok_s']:.1f} "
              f"({sim_dec}) | {chunk_b} ({p_chunk / 1e6:.2f} MB) | "
              f"{dec_b} ({pred['decode_step'] / 1e3:.1f} KB) | {comm} | "
              f"{r['load_before']:.1f}, {r['load_after']:.1f} |", flush=True)
    # Exact byte check: each CP 2 worker's total against the formula.
    for r in rows:
        for rank, v in r["cp_bytes"].items():
            want = r["predicted"]
            print(f"{r['placement']} cp {r['cp']} {r['prompt_tokens']} rank "
                  f"{rank}: prefill {v[0]} bytes in {v[1]} steps (formula "
                  f"{want['prefill']} in {want['chunks']}), decode {v[2]} in "
                  f"{v[3]} steps (formula {want['decode_step'] * v[3]})")
    texts = {}
    for r in rows:
        texts.setdefault(r["tokens"], set()).add(r["text"])
    for tokens, t in texts.items():
        if len(t) != 1:
            print(f"the greedy continuations at {tokens} tokens differ: {t}",
                  file=sys.stderr)
            failed = True
    if a.json:
        with open(a.json, "w") as f:
            json.dump(rows, f, indent=1)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
