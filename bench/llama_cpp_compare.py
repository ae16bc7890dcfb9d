#!/usr/bin/env python3
"""Decode and prefill speed of shardlm against llama.cpp on the same GGUF.

Benchmark only (never a build or test dependency): needs llama-cpp-python
in the Python that runs it (pip install llama-cpp-python; it compiles
llama.cpp). For each thread count, back to back in one run:

  shardlm generate --stats --ignore-eos --max-tokens N --threads T
  llama.cpp (llama-cpp-python): the same prompt, N greedy tokens, T threads

and prints tokens/s of each and their ratio. Both read the model's own
quantized weights. Greedy decode of shardlm is checked against llama.cpp's
first tokens (they agree while the top-2 margins exceed both sides'
rounding; the count of equal leading tokens is printed, not required).

  bench/llama_cpp_compare.py --shardlm build/launch/shardlm \\
      --model models/SmolLM2-135M-Instruct.Q4_1.gguf --threads 1,2
"""
import argparse
import re
import subprocess
import sys
import time


PROMPT = "Once upon a time"
# Prefill is timed on its own, on a prompt of a few hundred tokens.
LONG_PROMPT = " ".join(
    f"Paragraph {i}: the river ran past the old mill and the town slept."
    for i in range(24))


def run_shardlm(binary, model, threads, tokens, prompt=PROMPT):
    out = subprocess.run(
        [binary, "generate", "--model", model, "--prompt", prompt,
         "--max-tokens", str(tokens), "--ignore-eos", "--stats",
         "--threads", str(threads), "--device", "cpu"],
        capture_output=True, text=True, timeout=600, check=True)
    stats = out.stderr
    prefill = float(re.search(r"prefill [0-9.]+s \(([0-9.]+) tok/s\)", stats)[1])
    decode = float(re.search(r"decode ([0-9.]+) tok/s", stats)[1])
    return prefill, decode, out.stdout


# scripts/install-deps.sh --tests builds llama-cpp-python at -O1 for the
# tests (quicker to compile) and leaves this marker, holding the sha256 of
# the libggml-cpu.so it built, beside the package: a benchmark against
# that build would understate llama.cpp.
TEST_BUILD_MARKER = "shardlm-tests-O1-build"


def check_llama_cpp_build():
    """Exits with a message when llama_cpp is missing or the tests' -O1 build."""
    import hashlib  # noqa: PLC0415
    import os  # noqa: PLC0415
    try:
        import llama_cpp  # noqa: PLC0415
    except ImportError:
        sys.exit("llama_cpp_compare: pip install llama-cpp-python first")
    lib = os.path.join(os.path.dirname(llama_cpp.__file__), "lib")
    marker = os.path.join(lib, TEST_BUILD_MARKER)
    so = os.path.join(lib, "libggml-cpu.so")
    if os.path.exists(marker) and os.path.exists(so):
        with open(so, "rb") as f:
            digest = hashlib.sha256(f.read()).hexdigest()
        with open(marker) as f:
            if f.read().strip() == digest:
                sys.exit(
                    "llama_cpp_compare: this llama-cpp-python is the tests' "
                    "-O1 build (scripts/install-deps.sh --tests); for a fair "
                    "comparison use one built as pip does by default, e.g. in "
                    "another venv: pip install --no-cache-dir "
                    "llama-cpp-python==0.3.36")


def run_llama_cpp(model, threads, tokens, prompt=PROMPT, n_ctx=1024):
    from llama_cpp import Llama  # noqa: PLC0415 (benchmark-only import)
    llm = Llama(model_path=model, n_threads=threads, n_threads_batch=threads,
                n_ctx=n_ctx, n_batch=512, verbose=False)
    ids = llm.tokenize(prompt.encode(), add_bos=False)
    # Greedy, no penalties; generate() evaluates the prompt before its first
    # token and one token before each next one, and never stops by itself.
    gen = llm.generate(ids, top_k=1, top_p=1.0, temp=0.0, repeat_penalty=1.0)
    start = time.perf_counter()
    out = [next(gen)]
    first = time.perf_counter()
    for _ in range(tokens - 1):
        out.append(next(gen))
    end = time.perf_counter()
    prefill_s = first - start
    decode_s = (end - first) / max(tokens - 1, 1) * tokens
    text = llm.detokenize(out).decode("utf-8", errors="replace")
    return len(ids) / prefill_s, tokens / decode_s, text


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--shardlm", required=True)
    ap.add_argument("--model", required=True)
    ap.add_argument("--threads", default="1,2")
    ap.add_argument("--tokens", type=int, default=128)
    args = ap.parse_args()
    check_llama_cpp_build()
    print(f"model {args.model}, {args.tokens} greedy tokens after "
          f"{PROMPT!r}")
    print(f"{'threads':>7} {'shardlm dec':>12} {'llama.cpp dec':>14} "
          f"{'ratio':>6} {'shardlm pre':>12} {'llama.cpp pre':>14} {'same':>5}")
    for t in [int(x) for x in args.threads.split(",")]:
        _, s_dec, s_text = run_shardlm(args.shardlm, args.model, t,
                                       args.tokens)
        _, l_dec, l_text = run_llama_cpp(args.model, t, args.tokens)
        s_pre, _, _ = run_shardlm(args.shardlm, args.model, t, 1, LONG_PROMPT)
        l_pre, _, _ = run_llama_cpp(args.model, t, 1, LONG_PROMPT)
        same = 0
        for a, b in zip(s_text, l_text):
            if a != b:
                break
            same += 1
        print(f"{t:>7} {s_dec:>12.1f} {l_dec:>14.1f} {s_dec / l_dec:>6.2f} "
              f"{s_pre:>12.1f} {l_pre:>14.1f} {same:>5}")
    print("(dec: decode tokens/s after the short prompt; pre: prefill tokens/s "
          "of a ~400-token prompt; same: leading characters of the greedy "
          "texts that agree)")


if __name__ == "__main__":
    main()
