#!/usr/bin/env python3
"""How far --precision fast moves the model from exact, beside llama.cpp.

For each GGUF: the next-token distribution after every prefix of a real
text (--positions tokens of docs/design-notes.md's prose, tokenized by the
model's own tokenizer through llama.cpp), from shardlm exact, shardlm fast
(bench/precision_dump, one precision each) and llama.cpp (llama-cpp-python,
logits_all: its CPU path quantizes activations to Q8_0 / Q8_K as fast
does). Against exact: KL(exact || other) per position (mean, p99, max) and
top-1 agreement. The bound the tests hold fast to comes from this table
(docs/precision.md).

  bench/precision_bench.py --dump build/bench/precision_dump \\
      --model SmolLM2-135M-Instruct.Q4_1.gguf [--requantize Q4_0,Q8_0,Q4_K_M]

--requantize makes those formats from the first --model with llama.cpp's
quantizer (from its weights, dequantized: a requantized file, not one made
from the original f16 weights, which is what the comparison needs: both
sides read the same file).

Benchmark only, never a test (minutes per model on two cores).
"""
import argparse
import os
import subprocess
import sys
import tempfile

import numpy as np


def text_tokens(llm, positions: int) -> list[int]:
    here = os.path.dirname(os.path.abspath(__file__))
    with open(os.path.join(here, "..", "docs", "design-notes.md")) as f:
        text = f.read()
    ids = llm.tokenize(text.encode(), add_bos=False, special=False)
    if len(ids) < positions + 1:
        sys.exit(f"the text has {len(ids)} tokens, fewer than {positions + 1}")
    return ids[: positions + 1]


def log_softmax(x: np.ndarray) -> np.ndarray:
    x = x.astype(np.float64)
    m = x.max(axis=-1, keepdims=True)
    return x - m - np.log(np.exp(x - m).sum(axis=-1, keepdims=True))


def compare(ref: np.ndarray, other: np.ndarray) -> dict:
    """KL(ref || other) per row (rows of log-probabilities) and top-1."""
    kl = []
    for a, b in zip(ref, other):
        a = a.astype(np.float64)
        b = b.astype(np.float64)
        kl.append(float(np.sum(np.exp(a) * (a - b))))
    kl = np.array(kl)
    top1 = float(np.mean(ref.argmax(axis=1) == other.argmax(axis=1)))
    return {"mean": float(kl.mean()), "p99": float(np.percentile(kl, 99)),
            "max": float(kl.max()), "top1": top1}


def dump(tool: str, model: str, ids_path: str, out: str, precision: str,
         threads: int, n: int, vocab: int) -> np.ndarray:
    subprocess.run([tool, "--model", model, "--tokens-file", ids_path,
                    "--out", out, "--precision", precision, "--threads",
                    str(threads)], check=True)
    return np.fromfile(out, dtype=np.float32).reshape(n, vocab)


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--dump", required=True, help="build/bench/precision_dump")
    ap.add_argument("--model", action="append", required=True)
    ap.add_argument("--requantize", default="",
                    help="comma-separated formats made from the first model")
    ap.add_argument("--positions", type=int, default=2000)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--workdir", default=None)
    a = ap.parse_args()
    import llama_cpp  # Benchmark-only dependency (scripts/install-deps.sh).

    work = a.workdir or tempfile.mkdtemp(prefix="precision_bench_")
    os.makedirs(work, exist_ok=True)
    models = list(a.model)
    for fmt in filter(None, a.requantize.split(",")):
        out = os.path.join(work, f"{fmt}.gguf")
        if not os.path.exists(out):
            params = llama_cpp.llama_model_quantize_default_params()
            params.ftype = getattr(llama_cpp, f"LLAMA_FTYPE_MOSTLY_{fmt}")
            params.allow_requantize = True
            params.nthread = a.threads
            rc = llama_cpp.llama_model_quantize(a.model[0].encode(),
                                                out.encode(), params)
            if rc != 0:
                sys.exit(f"llama.cpp could not quantize to {fmt} ({rc})")
        models.append(out)

    rows = []
    for model in models:
        llm = llama_cpp.Llama(model_path=model, n_ctx=a.positions + 8,
                              logits_all=True, n_threads=a.threads,
                              n_batch=512, verbose=False)
        ids = text_tokens(llm, a.positions)
        vocab = llm.n_vocab()
        llm.reset()
        llm.eval(ids[:-1])
        llama = log_softmax(np.array(llm.scores[: a.positions]))
        del llm
        ids_path = os.path.join(work, "ids.txt")
        with open(ids_path, "w") as f:
            f.write(" ".join(map(str, ids)))
        exact = dump(a.dump, model, ids_path, os.path.join(work, "exact.f32"),
                     "exact", a.threads, a.positions, vocab)
        fast = dump(a.dump, model, ids_path, os.path.join(work, "fast.f32"),
                    "fast", a.threads, a.positions, vocab)
        name = os.path.basename(model)
        rows.append((name, "shardlm fast", compare(exact, fast)))
        rows.append((name, "llama.cpp", compare(exact, llama)))
        for _, who, r in rows[-2:]:
            print(f"{name} {who}: mean KL {r['mean']:.3e}, p99 "
                  f"{r['p99']:.3e}, max {r['max']:.3e}, top-1 "
                  f"{100 * r['top1']:.1f}%", flush=True)

    print(f"\nKL(exact || other) over {a.positions} positions of "
          f"docs/design-notes.md, and top-1 agreement with exact:\n")
    print(f"| model | against exact | mean KL | p99 KL | max KL | top-1 |")
    print(f"|---|---|---|---|---|---|")
    for name, who, r in rows:
        print(f"| {name} | {who} | {r['mean']:.2e} | {r['p99']:.2e} | "
              f"{r['max']:.2e} | {100 * r['top1']:.1f}% |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
