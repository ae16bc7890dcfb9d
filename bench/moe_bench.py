#!/usr/bin/env python3
"""A mixture of experts of realistic shape for a CPU: speed against
llama.cpp, and expert parallel (ep) against tensor parallel (tp) sharding.

1. Writes a random-weight Qwen3-MoE GGUF (F32; default about 300M
   parameters: hidden 1024, 10 layers, 8 experts of 1024 columns, top 2,
   SmolLM2's vocabulary) with the tests' writer (tests/reference/
   make_family_models.py) and quantizes it with llama.cpp's own quantizer
   (tests/quantize_gguf.py, needs llama-cpp-python) to each --types.
2. For each type: bench/llama_bench_compare.py (engine_bench against
   llama-bench, decode and prefill, 1 and 2 threads), when --llama-bench is
   given.
3. For the first type: a TP 2 cluster under mpirun, once with
   --moe-sharding ep and once with tp, `shardlm bench` at each
   --concurrency, output tokens/s of each and their ratio, and the expert
   load each saw (shardlm_rank_expert_tokens_total: the busiest expert's
   share against an even 1 / 8, and the two ranks' shares under ep). The
   greedy texts of the two runs must agree.

Benchmark only, never a test:

  bench/moe_bench.py --shardlm build/launch/shardlm \\
      --engine-bench build/bench/engine_bench \\
      --llama-bench ~/llama.cpp/build/bin/llama-bench --workdir /tmp/moe
"""
import argparse
import json
import os
import re
import subprocess
import sys
import time
import urllib.request

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.join(HERE, "..")
sys.path.insert(0, os.path.join(ROOT, "tests", "reference"))
sys.path.insert(0, os.path.join(ROOT, "tests"))

import make_family_models  # noqa: E402
import quantize_gguf  # noqa: E402
from testlib import free_port  # noqa: E402


def write_model(workdir, tokenizer_gguf, args):
    f = make_family_models.family("qwen3moe")
    f.update(hidden=args.hidden, layers=args.layers, heads=args.hidden // 64,
             kv_heads=max(1, args.hidden // 256), head_dim=64,
             experts=args.experts, experts_used=args.top_k,
             expert_ffn=args.expert_ffn, ffn=args.expert_ffn * 3)
    path = os.path.join(workdir, "moe-f32.gguf")
    if not os.path.exists(path):
        make_family_models.write_gguf(path, f,
                                      make_family_models.draw(f, seed=1),
                                      tokenizer_gguf)
    return path


def metrics(port):
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics",
                                timeout=10) as r:
        return r.read().decode()


def expert_load(text):
    load = {}
    for m in re.finditer(r'shardlm_rank_expert_tokens_total\{rank="(\d+)",'
                         r'expert="(\d+)"\} (\d+)', text):
        rank, expert, n = int(m[1]), int(m[2]), int(m[3])
        load.setdefault(expert, {})[rank] = n
    return load


def run_cluster(args, model, moe):
    port, http = free_port(), free_port()
    root = ["--allow-run-as-root"] if os.getuid() == 0 else []
    proc = subprocess.Popen(
        ["mpirun", *root, "--oversubscribe", "-np", "3", args.shardlm,
         "launch", "--model", model, "--tp", "2", "--moe-sharding", moe,
         "--threads", "1", "--listen", f"127.0.0.1:{port}",
         "--http-listen", f"127.0.0.1:{http}"],
        stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.time() + 300
        while time.time() < deadline:
            try:
                urllib.request.urlopen(f"http://127.0.0.1:{http}/ready",
                                       timeout=2)
                break
            except OSError:
                time.sleep(1)
        else:
            raise RuntimeError(f"{moe} cluster did not become ready")
        text = subprocess.run(
            [args.shardlm, "generate", "--server", f"127.0.0.1:{port}",
             "--prompt", "Once upon a time", "--max-tokens", "32"],
            capture_output=True, text=True, check=True).stdout
        results = {}
        for c in args.concurrency.split(","):
            out = os.path.join(args.workdir, f"bench-{moe}-{c}.json")
            subprocess.run(
                [args.shardlm, "bench", "--server", f"127.0.0.1:{port}",
                 "--concurrency", c, "--requests", str(args.requests),
                 "--max-tokens", str(args.max_tokens), "--json", out],
                capture_output=True, text=True, check=True)
            with open(out) as fh:
                row = json.load(fh)
            results[int(c)] = row
        return text, results, expert_load(metrics(http))
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()


def output_tokens_per_s(result):
    rows = result if isinstance(result, list) else result.get("levels", [])
    for r in rows:
        for key in ("output_tokens_per_s", "output_tokens_per_second"):
            if key in r:
                return r[key]
    raise KeyError(f"no output tokens/s in {result}")


def main():
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--shardlm", required=True)
    ap.add_argument("--engine-bench", required=True)
    ap.add_argument("--llama-bench", help="llama.cpp's llama-bench binary")
    ap.add_argument("--llama-isa", default="native")
    ap.add_argument("--workdir", required=True)
    ap.add_argument("--tokenizer-gguf",
                    default=os.path.join(ROOT, "models",
                                         "SmolLM2-135M-Instruct.Q4_1.gguf"))
    ap.add_argument("--types", default="Q8_0,Q4_K_M")
    ap.add_argument("--hidden", type=int, default=1024)
    ap.add_argument("--layers", type=int, default=10)
    ap.add_argument("--experts", type=int, default=8)
    ap.add_argument("--top-k", type=int, default=2)
    ap.add_argument("--expert-ffn", type=int, default=1024)
    ap.add_argument("--threads", default="1,2")
    ap.add_argument("--concurrency", default="1,8")
    ap.add_argument("--requests", type=int, default=16)
    ap.add_argument("--max-tokens", type=int, default=32)
    args = ap.parse_args()
    os.makedirs(args.workdir, exist_ok=True)
    f32 = write_model(args.workdir, args.tokenizer_gguf, args)
    models = []
    for t in args.types.split(","):
        path = os.path.join(args.workdir, f"moe-{t}.gguf")
        if not os.path.exists(path):
            quantize_gguf.quantize(f32, path, t)
        models.append(path)
    subprocess.run([args.shardlm, "inspect", models[0]], check=True,
                   stdout=subprocess.PIPE, text=True)
    info = subprocess.run([args.shardlm, "inspect", models[0]],
                          capture_output=True, text=True).stdout
    print(next(line for line in info.splitlines()
               if line.startswith("experts")))
    if args.llama_bench:
        cmd = [sys.executable, os.path.join(HERE, "llama_bench_compare.py"),
               "--engine-bench", args.engine_bench, "--llama-bench",
               args.llama_bench, "--llama-isa", args.llama_isa, "--threads",
               args.threads]
        for m in models:
            cmd += ["--model", m]
        subprocess.run(cmd, check=True)

    print(f"\nTP 2 under mpirun (1 thread per worker), {models[0]}:")
    runs = {moe: run_cluster(args, models[0], moe) for moe in ("ep", "tp")}
    if runs["ep"][0] != runs["tp"][0]:
        sys.exit("moe_bench: ep and tp gave different greedy texts")
    print(f"{'streams':>7} {'ep tok/s':>9} {'tp tok/s':>9} {'ep / tp':>8}")
    for c in sorted(runs["ep"][1]):
        ep = output_tokens_per_s(runs["ep"][1][c])
        tp = output_tokens_per_s(runs["tp"][1][c])
        print(f"{c:>7} {ep:>9.1f} {tp:>9.1f} {ep / tp:>8.2f}")
    for moe in ("ep", "tp"):
        load = runs[moe][2]
        per_expert = {e: sum(r.values()) for e, r in load.items()}
        if moe == "tp":  # Every rank counts every expert.
            per_expert = {e: n / 2 for e, n in per_expert.items()}
        total = sum(per_expert.values())
        busiest = max(per_expert.values()) / total if total else 0
        line = (f"{moe}: busiest expert {busiest:.1%} of routed tokens "
                f"(even: {1 / args.experts:.1%})")
        if moe == "ep":
            ranks = {}
            for r in load.values():
                for rank, n in r.items():
                    ranks[rank] = ranks.get(rank, 0) + n
            line += ", ranks " + ", ".join(
                f"{r}: {n / total:.1%}" for r, n in sorted(ranks.items()))
        print(line)


if __name__ == "__main__":
    main()
