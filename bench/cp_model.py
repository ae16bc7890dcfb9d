#!/usr/bin/env python3
"""What context parallelism would buy a lone long prompt, by the cost model
(issue #35, part 2): `shardlm simulate --cp N` for Llama 3.1 8B (TP 1)
and 70B (TP 8) on H200s, time to first token of one prompt of 32K, 128K
and 512K tokens at CP = 1, 2, 4, 8 (chunks of --chunk tokens). 512K is
past Llama 3.1's 128K context: it is simulated with the same shapes and a
512K window, as a context-extended variant would have.

The model is the scheme the CPU path runs (docs/design-notes.md, section
3): the KV of every sequence split by block over the CP ranks (block j on
rank j mod C); each chunk cut into C contiguous slices, each rank running
its slice through the projections and MLP; the slices' Q, K and V
all-gathered, every rank attending all the chunk's queries over its own
blocks, and the partial outputs with their log-sum-exps all-gathered (f32,
as the CPU path sends them) and merged. CP on GPUs is not built: these are
the cost model's figures for that scheme on H200s, not measurements.

With --compare, the same table again for an exchange that is not built:
bf16 Q/K/V and outputs, each rank sending each peer only that peer's
slice of its partial outputs (--cp-exchange-dtype bf16
--cp-scatter-outputs).

  bench/cp_model.py --shardlm build/launch/shardlm [--chunk 8192] [--compare]
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile

SHAPES = {  # Llama 3 / 3.1 config.json fields.
    "8b": dict(hidden_size=4096, intermediate_size=14336,
               num_hidden_layers=32, num_attention_heads=32),
    "70b": dict(hidden_size=8192, intermediate_size=28672,
                num_hidden_layers=80, num_attention_heads=64),
}


def config_dir(root: str, size: str, context: int) -> str:
    d = os.path.join(root, f"llama3.1-{size}-{context}")
    os.makedirs(d, exist_ok=True)
    with open(os.path.join(d, "config.json"), "w") as f:
        json.dump(dict(architectures=["LlamaForCausalLM"], model_type="llama",
                       num_key_value_heads=8, vocab_size=128256,
                       max_position_embeddings=context, rope_theta=500000.0,
                       rms_norm_eps=1e-5, tie_word_embeddings=False,
                       **SHAPES[size]), f)
    return d


def ttft(shardlm: str, config: str, tp: int, cp: int, tokens: int,
         chunk: int, out: dict, extra: list) -> float | str:
    """The simulated TTFT in seconds (or why there is none); out gets the
    bytes each CP rank sends."""
    path = os.path.join(os.path.dirname(config), f"report-{cp}.json")
    r = subprocess.run(
        [shardlm, "simulate", "--model-config", config, "--gpu", "h200",
         "--tp", str(tp), "--cp", str(cp), "--concurrency", "1",
         "--requests", "1", "--prompt-len", f"fixed:{tokens}",
         "--output-len", "fixed:1", "--max-batched-tokens", str(chunk),
         "--json", path] + extra,
        capture_output=True, text=True, timeout=600)
    if r.returncode != 0:
        return r.stderr.strip().splitlines()[0] if r.stderr else "failed"
    refused = re.search(r"(\d+) refused \(([^)]*)\)", r.stdout)
    if refused and refused.group(1) != "0":
        return f"refused ({refused.group(2)})"
    with open(path) as f:
        b = json.load(f)["cp_bytes_per_rank"]
    out[cp] = b["all_gather"] + b["all_reduce"]
    m = re.search(r"time to first token\s+([\d.]+)", r.stdout)
    return float(m.group(1)) / 1000 if m else "no TTFT"


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--shardlm", required=True)
    ap.add_argument("--chunk", type=int, default=8192)
    ap.add_argument("--compare", action="store_true",
                    help="also an exchange that is not built (bf16, "
                    "outputs scattered)")
    a = ap.parse_args()
    cps = [1, 2, 4, 8]
    variants = [("as built: f32, outputs all-gathered", [])]
    if a.compare:
        variants.append(("not built: bf16, outputs scattered",
                         ["--cp-exchange-dtype", "bf16",
                          "--cp-scatter-outputs"]))
    with tempfile.TemporaryDirectory() as root:
        for name, extra in variants:
            print(f"TTFT (s) of one prompt, H200s, chunks of {a.chunk} "
                  f"tokens, bf16 weights and KV (shardlm simulate --cp); CP "
                  f"exchange {name}")
            print(f"{'model':<14} {'tokens':>8} " +
                  " ".join(f"{'cp ' + str(c):>9}" for c in cps) +
                  "   speed-up at cp 8")
            for size, tp in (("8b", 1), ("70b", 8)):
                for tokens in (32_000, 128_000, 512_000):
                    cfg = config_dir(root, size, 524288 if tokens > 131072
                                     else 131072)
                    sent = {}
                    row = [ttft(a.shardlm, cfg, tp, c, tokens, a.chunk, sent,
                                extra) for c in cps]
                    cells = " ".join(f"{v:>9.2f}" if isinstance(v, float)
                                     else f"{v[:9]:>9}" for v in row)
                    gain = (f"{row[0] / row[-1]:.2f}x"
                            if all(isinstance(v, float) for v in row)
                            else "")
                    print(f"{size + ' tp ' + str(tp):<14} {tokens:>8} "
                          f"{cells}   {gain:>8}   GB sent per CP rank: " +
                          ", ".join(f"cp {c} {sent[c] / 1e9:.1f}"
                                    for c in cps[1:] if c in sent))
    return 0


if __name__ == "__main__":
    sys.exit(main())
