#!/usr/bin/env python3
"""Decode speed of a DeepSeek-shaped model (multi-head latent attention,
sigmoid-routed mixture with a shared expert) against llama.cpp on the same
GGUF.

1. Writes a random-weight deepseek2 GGUF (F32; default about 220M
   parameters: hidden 1024, 8 layers of 16 heads over a latent of 256 and a
   RoPE key of 32, heads of 64 + 32, values of 64, q LoRA 384; 8 routed
   experts of 512 columns, top 2 in 4 groups keeping 2, one shared expert,
   layer 0 dense; SmolLM2's vocabulary) with the tests' writer (tests/
   reference/make_family_models.py), and quantizes it with llama.cpp's own
   quantizer (tests/quantize_gguf.py) to each --types.
2. For each type: bench/llama_cpp_compare.py (shardlm generate against
   llama-cpp-python, decode and prefill, at each --threads).

Needs llama-cpp-python in the Python that runs it. Benchmark only, never a
test:

  bench/mla_bench.py --shardlm build/launch/shardlm --workdir /tmp/mla-bench
"""
import argparse
import os
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.join(HERE, "..")
sys.path.insert(0, os.path.join(ROOT, "tests", "reference"))
sys.path.insert(0, os.path.join(ROOT, "tests"))

import make_family_models  # noqa: E402
import quantize_gguf  # noqa: E402


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--shardlm", required=True)
    ap.add_argument("--workdir", required=True)
    ap.add_argument("--tokenizer-gguf",
                    default=os.path.join(ROOT, "models",
                                         "SmolLM2-135M-Instruct.Q4_1.gguf"))
    ap.add_argument("--types", default="Q8_0")
    ap.add_argument("--threads", default="1,2")
    ap.add_argument("--tokens", type=int, default=64)
    args = ap.parse_args()
    os.makedirs(args.workdir, exist_ok=True)
    f = make_family_models.family("deepseek3")
    f.update(hidden=1024, layers=8, heads=16, kv_heads=16, head_dim=64,
             qk_rope=32, kv_lora=256, q_lora=384, v_head=64, ffn=2048,
             experts=8, experts_used=2, expert_ffn=512)
    f32 = os.path.join(args.workdir, "mla-f32.gguf")
    if not os.path.exists(f32):
        make_family_models.write_gguf(f32, f, make_family_models.draw(f, 1),
                                      args.tokenizer_gguf)
    for t in args.types.split(","):
        path = os.path.join(args.workdir, f"mla-{t}.gguf")
        if not os.path.exists(path):
            quantize_gguf.quantize(f32, path, t)
        print(f"== {t}: {path}", flush=True)
        subprocess.run([sys.executable, os.path.join(HERE,
                                                     "llama_cpp_compare.py"),
                        "--shardlm", args.shardlm, "--model", path,
                        "--threads", args.threads,
                        "--tokens", str(args.tokens)], check=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
