#!/usr/bin/env python3
"""Long-context prefill and decode of shardlm against llama.cpp.

Benchmark only (never a build or test dependency). For each context
length and thread count, back to back in one run:

  shardlm generate --stats --device cpu --kv-cache-dtype K (each K)
  llama.cpp (llama-cpp-python, when installed): the same prompt (its KV
  cache is f16, its default)

and prints prefill tokens/s (the whole prompt), decode tokens/s at that
context (--decode-tokens greedy tokens after it), their ratios to
llama.cpp, and the KV bytes per token of context shardlm reports.

  bench/long_context.py --shardlm build/launch/shardlm \\
      --model models/SmolLM2-135M-Instruct.Q4_1.gguf \\
      --lengths 512,2048,4096,7000 --threads 2
"""
import argparse
import re
import subprocess
import sys
import time

import llama_cpp_compare

PARAGRAPH = ("Paragraph {i}: the river ran past the old mill, the baker "
             "counted {i} loaves, and the town slept under a sky of {c} "
             "stars.\n")


def text_of(n_paragraphs):
    return "".join(PARAGRAPH.format(i=i, c=(i * 37) % 1000)
                   for i in range(n_paragraphs))


def run_shardlm(binary, model, prompt, threads, kv, tokens):
    out = subprocess.run(
        [binary, "generate", "--model", model, "--prompt", prompt,
         "--max-tokens", str(tokens), "--ignore-eos", "--stats",
         "--threads", str(threads), "--device", "cpu",
         "--kv-cache-dtype", kv],
        capture_output=True, text=True, timeout=3600)
    if out.returncode != 0:
        sys.exit(f"long_context: shardlm failed:\n{out.stderr[-2000:]}")
    s = out.stderr
    n = int(re.search(r"prompt (\d+) tokens", s)[1])
    prefill = float(re.search(r"prefill [0-9.]+s \(([0-9.]+) tok/s\)", s)[1])
    decode = float(re.search(r"decode ([0-9.]+) tok/s", s)[1])
    kib = float(re.search(r"([0-9.]+) KiB per token", s)[1])
    return n, prefill, decode, kib


def paragraphs_for(binary, model, length):
    """How many paragraphs make a prompt of about `length` tokens."""
    n, _, _, _ = run_shardlm(binary, model, text_of(20), 1, "f16", 1)
    return max(1, round(length * 20 / n))


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--shardlm", required=True)
    ap.add_argument("--model", required=True)
    ap.add_argument("--lengths", default="512,2048,4096,7000")
    ap.add_argument("--threads", default="2")
    ap.add_argument("--kv", default="f32,f16,bf16",
                    help="shardlm KV cache dtypes to run")
    ap.add_argument("--decode-tokens", type=int, default=32)
    ap.add_argument("--no-llama-cpp", action="store_true")
    a = ap.parse_args()
    have_llama = not a.no_llama_cpp
    if have_llama:
        try:
            import llama_cpp  # noqa: F401,PLC0415
        except ImportError:
            print("(llama-cpp-python not installed: shardlm only)")
            have_llama = False
    if have_llama:
        llama_cpp_compare.check_llama_cpp_build()

    per = paragraphs_for(a.shardlm, a.model, 1000) / 1000
    print(f"model {a.model}; decode: {a.decode_tokens} greedy tokens after "
          f"the prompt; ratio = shardlm / llama.cpp")
    print(f"{'ctx':>6} {'thr':>3} {'kv':>5} {'KiB/tok':>7} "
          f"{'prefill':>8} {'llama':>7} {'ratio':>5} "
          f"{'decode':>7} {'llama':>7} {'ratio':>5}")
    for length in [int(x) for x in a.lengths.split(",")]:
        prompt = text_of(max(1, round(length * per)))
        for t in [int(x) for x in a.threads.split(",")]:
            l_pre = l_dec = None
            if have_llama:
                l_pre, l_dec, _ = llama_cpp_compare.run_llama_cpp(
                    a.model, t, a.decode_tokens, prompt,
                    n_ctx=length + length // 8 + a.decode_tokens + 64)
            for kv in a.kv.split(","):
                n, pre, dec, kib = run_shardlm(a.shardlm, a.model, prompt, t,
                                               kv, a.decode_tokens)
                lp = f"{l_pre:>7.1f} {pre / l_pre:>5.2f}" if l_pre else \
                    f"{'-':>7} {'-':>5}"
                ld = f"{l_dec:>7.1f} {dec / l_dec:>5.2f}" if l_dec else \
                    f"{'-':>7} {'-':>5}"
                print(f"{n:>6} {t:>3} {kv:>5} {kib:>7.1f} {pre:>8.1f} {lp} "
                      f"{dec:>7.1f} {ld}", flush=True)
    print("(prefill, decode: tokens/s; llama.cpp's KV cache is f16)")


if __name__ == "__main__":
    start = time.time()
    main()
    print(f"({time.time() - start:.0f} s)")
