#!/usr/bin/env python3
"""What quantizing the activations (the inputs of every matrix product) does
to a model's logits, measured on the float64 numpy reference
(tests/reference/llama_ref.py), before anyone writes an integer kernel.

  .venv/bin/python bench/activation_precision.py \\
      --model models/SmolLM2-135M-Instruct.Q4_1.gguf [--steps 32]

Schemes, each applied per block of 32 values along a row (the weights stay
exactly as the file holds them):
  f32   the input rounded to float32 (what shardlm's kernels read);
  i16   int16 codes with one scale per block: max |x| maps to 127 * 256,
        i.e. two int8 planes (hi * 256 + lo), which VNNI's u8 x s8 dot
        products (vpdpbusd) or AVX2's maddubs take as two passes;
  q8    int8 codes, max |x| to 127: llama.cpp's Q8_0 activations;
  i24   three int8 planes (max |x| to 127 * 65536);
  KIND/B  the same per block of B values instead of 32 (e.g. i16/8).
For each of check_forward.py's prompts it prints the largest logit
difference from the unquantized reference over the prompt's last position
and the greedy steps, and the step where greedy ids first differ (none:
identical). shardlm's reference tests hold the C++ f32 path to 1e-3 of the
reference (forward_reference_*, measured 4.7e-5) with identical greedy ids.
"""

from __future__ import annotations

import argparse
import os
import sys

import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "tests", "reference"))
import check_forward  # noqa: E402
import llama_ref  # noqa: E402

BLOCK = 32


def quantize(x: np.ndarray, scheme: str) -> np.ndarray:
    """x (..., n) with its last axis quantized per block of 32."""
    if scheme == "none":
        return x
    x32 = x.astype(np.float32)
    if scheme == "f32":
        return x32.astype(np.float64)
    kind, _, block = scheme.partition("/")
    block = int(block or BLOCK)
    levels = {"i24": 127 * 65536, "i16": 127 * 256, "q8": 127}[kind]
    shape = x32.shape
    n = shape[-1]
    pad = (-n) % block
    b = np.pad(x32.reshape(-1, n), ((0, 0), (0, pad))).reshape(-1, block)
    amax = np.max(np.abs(b), axis=1, keepdims=True)
    d = (amax / np.float32(levels)).astype(np.float32)
    inv = np.where(d > 0, 1.0 / np.where(d > 0, d, 1), 0.0).astype(np.float32)
    q = np.clip(np.rint(b * inv), -levels, levels)
    out = (q * d).reshape(-1, n + pad)[:, :n]
    return out.reshape(shape).astype(np.float64)


class QuantizedInput:
    """A weight whose `.T`, multiplied from the left (h @ W.T), multiplies
    the quantized h. __array_ufunc__ = None makes numpy hand `@` to
    __rmatmul__."""
    __array_ufunc__ = None

    def __init__(self, w: np.ndarray, scheme: str):
        self.w, self.scheme = w, scheme

    @property
    def T(self):
        return _Transposed(self)

    def __getitem__(self, i):  # Mixtures index their experts: e_gate[e].
        return QuantizedInput(self.w[i], self.scheme)

    def __matmul__(self, h):  # ...and multiply them from the right: W @ h.
        return self.w @ quantize(h, self.scheme)


class _Transposed:
    __array_ufunc__ = None

    def __init__(self, q: QuantizedInput):
        self.q = q

    def __rmatmul__(self, h):
        return quantize(h, self.q.scheme) @ self.q.w.T


MATRICES = ("wq", "wk", "wv", "wo", "w_gate", "w_up", "w_down", "router",
            "e_gate", "e_up", "e_down")


def wrap(ref: llama_ref.LlamaRef, scheme: str) -> None:
    for layer in ref.w.layers:
        for name in MATRICES:
            w = getattr(layer, name, None)
            if isinstance(w, np.ndarray):
                setattr(layer, name, QuantizedInput(w, scheme))
    ref.w.lm_head = QuantizedInput(ref.w.lm_head, scheme)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", required=True)
    ap.add_argument("--steps", type=int, default=32)
    ap.add_argument("--schemes", default="f32,i16,q8")
    a = ap.parse_args(argv)
    import hf_tokenizer  # noqa: PLC0415
    tk = hf_tokenizer.build_from_gguf(a.model)
    prompts = [(n, tk.encode(t).ids) for n, t in check_forward.GGUF_PROMPTS]
    base = llama_ref.LlamaRef.load(a.model)
    want = {n: base.greedy(ids, a.steps, return_logits=True)
            for n, ids in prompts}
    print(f"{os.path.basename(a.model)}, {a.steps} greedy steps per prompt")
    print("| scheme | prompt | max abs dlogit | first greedy difference |")
    print("|---|---|---|---|")
    for scheme in a.schemes.split(","):
        ref = llama_ref.LlamaRef.load(a.model)
        wrap(ref, scheme)
        for name, ids in prompts:
            got_ids, got_rows = ref.greedy(ids, a.steps, return_logits=True)
            want_ids, want_rows = want[name]
            first = next((i for i, (g, w) in enumerate(zip(got_ids, want_ids))
                          if g != w), None)
            # Rows after a divergence follow other tokens: compare up to it.
            upto = a.steps if first is None else first + 1
            err = float(np.max(np.abs(got_rows[:upto] - want_rows[:upto])))
            print(f"| {scheme} | {name} | {err:.2e} | "
                  f"{'none' if first is None else f'step {first}'} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
