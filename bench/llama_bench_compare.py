#!/usr/bin/env python3
"""shardlm against llama.cpp's own benchmark (llama-bench), GGUF by GGUF.

For each model and thread count, back to back in one run: engine_bench
(prefill of --prompt-tokens, then --decode-tokens greedy steps, medians
of --repeat runs after a warm-up) and llama-bench (-p PROMPT, and -n DECODE
-d PROMPT so that it decodes at the same context, -r REPEAT, its means),
and their ratios, with shardlm's decode against the
quantized-bytes bandwidth floor engine_bench measures. The machine (CPU
model, ISA flags) and the ISA of each side are printed with the table:
shardlm's is its decode kernel set (SHARDLM_CPU_ISA chooses another), the
llama.cpp one is the label you give (--llama-isa: how llama-bench was
built, e.g. "native" or "avx2: GGML_NATIVE=OFF GGML_AVX2=ON").

Benchmark only, never a test: llama-bench comes from a llama.cpp build of
your own (cmake -DLLAMA_CURL=OFF ...; cmake --build build --target
llama-bench); nothing here downloads it.

  bench/llama_bench_compare.py --engine-bench build/bench/engine_bench \\
      --llama-bench ~/llama.cpp/build/bin/llama-bench --llama-isa native \\
      --model Q4_K_M.gguf --model Q6_K.gguf --threads 1,2
"""
import argparse
import json
import os
import subprocess
import tempfile


def cpu_summary():
    model, flags = "unknown CPU", set()
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name") and model == "unknown CPU":
                    model = line.split(":", 1)[1].strip()
                elif line.startswith("flags") and not flags:
                    flags = set(line.split(":", 1)[1].split())
    except OSError:
        pass
    isa = [x for x in ("avx512f", "avx512_vnni", "avx512_bf16", "avx2", "fma",
                       "f16c") if x in flags]
    return f"{model} ({', '.join(isa) or 'no AVX2'}), {os.cpu_count()} CPUs"


def run_engine_bench(binary, model, threads, prompt, decode, repeat):
    with tempfile.NamedTemporaryFile(suffix=".json") as out:
        proc = subprocess.run(
            [binary, "--model", model, "--threads", str(threads),
             "--prompt-tokens", str(prompt), "--decode-tokens", str(decode),
             "--repeat", str(repeat), "--json", out.name],
            capture_output=True, text=True, timeout=1800, check=True)
        row = json.load(open(out.name))[0]
    kernel = "?"
    for line in proc.stdout.splitlines():
        if "CPU kernels" in line:
            kernel = line.split("CPU kernels", 1)[1].split(",")[0].strip()
    return row, kernel


def run_llama_bench(binary, model, threads, prompt, decode, repeat, depth):
    """llama-bench's prefill of `prompt` tokens (from an empty context) and
    decode of `decode` tokens after `depth` tokens of context (-d)."""
    def bench(args):
        proc = subprocess.run(
            [binary, "-m", model, "-t", str(threads), "-r", str(repeat),
             "-o", "json"] + args,
            capture_output=True, text=True, timeout=3600, check=True)
        return json.loads(proc.stdout)
    pre = dec = None
    for row in bench(["-p", str(prompt), "-n", "0"]):
        if row["n_prompt"] > 0 and row["n_gen"] == 0:
            pre = row["avg_ts"]
    for row in bench(["-p", "0", "-n", str(decode), "-d", str(depth)]):
        if row["n_gen"] > 0 and row["n_prompt"] == 0:
            dec = row["avg_ts"]
    return pre, dec


def main():
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--engine-bench", required=True)
    ap.add_argument("--llama-bench", required=True)
    ap.add_argument("--llama-isa", default="native",
                    help="how llama-bench was built (printed)")
    ap.add_argument("--model", action="append", required=True)
    ap.add_argument("--threads", default="1,2")
    ap.add_argument("--prompt-tokens", type=int, default=512)
    ap.add_argument("--decode-tokens", type=int, default=128)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--llama-decode-depth", type=int, default=None,
                    help="context llama-bench decodes after (-d); default "
                    "--prompt-tokens, where engine_bench decodes (0: "
                    "llama-bench's tg from an empty context, as tables "
                    "before 2026-12-05 were measured)")
    args = ap.parse_args()
    print(f"machine: {cpu_summary()}")
    depth = (args.prompt_tokens if args.llama_decode_depth is None
             else args.llama_decode_depth)
    print(f"llama.cpp: {args.llama_bench} ({args.llama_isa}); "
          f"prefill {args.prompt_tokens} tokens, decode {args.decode_tokens} "
          f"after {args.prompt_tokens} (llama-bench -d {depth}), "
          f"{args.repeat} runs each")
    print(f"{'model':<28} {'thr':>3} {'isa':>8} {'dec':>7} {'l.cpp':>7} "
          f"{'ratio':>6} {'floor':>6} {'pre':>7} {'l.cpp':>7} {'ratio':>6}")
    for model in args.model:
        for t in [int(x) for x in args.threads.split(",")]:
            row, kernel = run_engine_bench(args.engine_bench, model, t,
                                           args.prompt_tokens,
                                           args.decode_tokens, args.repeat)
            l_pre, l_dec = run_llama_bench(args.llama_bench, model, t,
                                           args.prompt_tokens,
                                           args.decode_tokens, args.repeat,
                                           depth)
            dec, pre = row["decode_tokens_per_s"], row["prefill_tokens_per_s"]
            print(f"{os.path.basename(model)[:28]:<28} {t:>3} {kernel:>8} "
                  f"{dec:>7.1f} {l_dec:>7.1f} {dec / l_dec:>6.2f} "
                  f"{row['decode_fraction_of_bandwidth_floor']:>6.0%} "
                  f"{pre:>7.1f} {l_pre:>7.1f} {pre / l_pre:>6.2f}", flush=True)
    print("(dec / pre: decode and prefill tokens/s, shardlm engine_bench "
          "medians and llama-bench means; floor: shardlm decode against the "
          "bytes a step must read at the read bandwidth measured)")


if __name__ == "__main__":
    main()
