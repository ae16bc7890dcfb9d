#!/usr/bin/env python3
"""Writes a small synthetic Hugging Face-style Llama model with seeded random
weights, for testing the C++ safetensors loader and forward pass against the
numpy reference (llama_ref.py).

  make_synthetic_model.py OUTDIR [--seed S] [--tokenizer-json PATH]
                                 [--min-margin M] [--no-check]

OUTDIR gets config.json and model.safetensors (and tokenizer.json when
--tokenizer-json is given). Dtypes are mixed so the loader is exercised:
embedding BF16, lm_head F16, attention/FFN projections F32 or F16 (varying by
layer and matrix), norms F32 around 1.

Weights are drawn in float64, then rounded to their storage dtype; the
reference reads them back from the written file, so it computes (in float64)
on exactly the values the C++ loader sees.

Unless --no-check, the script then runs the reference greedily for 32 steps on
each prompt in SYNTHETIC_PROMPTS and fails if at any step the top-1 logit does
not beat the top-2 by more than --min-margin, so the greedy comparison in
check_forward.py is never decided by a near-tie. The default seed is chosen so
that this holds.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import struct
import sys
import time

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import llama_ref  # noqa: E402
import llama_ref_hf  # noqa: E402

DEFAULT_SEED = 30
DEFAULT_MIN_MARGIN = 1e-2
STEPS = 32

CONFIG = {
    "architectures": ["LlamaForCausalLM"],
    "model_type": "llama",
    "hidden_size": 128,
    "intermediate_size": 320,
    "num_hidden_layers": 4,
    "num_attention_heads": 8,
    "num_key_value_heads": 4,
    "head_dim": 16,
    "vocab_size": 49152,
    "max_position_embeddings": 2048,
    "rope_theta": 10000.0,
    "rope_scaling": None,
    "rms_norm_eps": 1e-5,
    "hidden_act": "silu",
    "attention_bias": False,
    "mlp_bias": False,
    "tie_word_embeddings": False,
    "bos_token_id": 1,
    "eos_token_id": 2,
    "torch_dtype": "float32",
}

# Prompts (token ids) used by the margin check here and by check_forward.py.
# Lengths 1, 7 and 41: the last spans three KV blocks of 16 before any
# generation; with 32 generated tokens every prompt crosses block boundaries.
SYNTHETIC_PROMPTS = [
    [1],
    [1, 504, 3575, 282, 4649, 314, 49151],
    [1] + [(7919 * i + 13) % 49152 for i in range(1, 41)],
]

# Std of the LM head relative to 1/sqrt(fan_in): widens the logit spread so
# the top-1/top-2 gaps are comfortably above float32 rounding noise.
LM_HEAD_GAIN = 3.0


# ---------------------------------------------------------------------------
# dtype rounding and safetensors writing
# ---------------------------------------------------------------------------

def to_bf16_bits(a: np.ndarray) -> np.ndarray:
    """float -> bf16 bit patterns (uint16), round to nearest even."""
    u = np.ascontiguousarray(a, dtype=np.float32).view(np.uint32).astype(np.uint64)
    u = (u + 0x7FFF + ((u >> 16) & 1)) >> 16
    return u.astype(np.uint16)


def encode(a: np.ndarray, dtype: str) -> bytes:
    if dtype == "BF16":
        return to_bf16_bits(a).astype("<u2").tobytes()
    if dtype == "F16":
        return np.ascontiguousarray(a, dtype="<f2").tobytes()
    if dtype == "F32":
        return np.ascontiguousarray(a, dtype="<f4").tobytes()
    raise ValueError(dtype)


def write_safetensors(path: str, tensors: dict) -> None:
    """tensors: name -> (float ndarray, dtype string)."""
    header = {"__metadata__": {"format": "pt"}}
    blobs = []
    off = 0
    for name in sorted(tensors):
        arr, dt = tensors[name]
        b = encode(arr, dt)
        header[name] = {"dtype": dt, "shape": list(arr.shape),
                        "data_offsets": [off, off + len(b)]}
        blobs.append(b)
        off += len(b)
    h = json.dumps(header, separators=(",", ":")).encode()
    h += b" " * ((-len(h)) % 8)  # data starts 8-byte aligned, as upstream does
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(h)))
        f.write(h)
        for b in blobs:
            f.write(b)


# ---------------------------------------------------------------------------
# the model
# ---------------------------------------------------------------------------

def make_tensors(seed: int) -> dict:
    c = CONFIG
    rng = np.random.default_rng(seed)
    D, F, V = c["hidden_size"], c["intermediate_size"], c["vocab_size"]
    hd = c["head_dim"]
    Q, KV = c["num_attention_heads"] * hd, c["num_key_value_heads"] * hd

    def lin(out_f, in_f, gain=1.0):
        return rng.normal(0.0, gain / np.sqrt(in_f), size=(out_f, in_f))

    def norm():
        return 1.0 + 0.1 * rng.normal(size=(D,))

    t = {"model.embed_tokens.weight": (rng.normal(size=(V, D)), "BF16")}
    for i in range(c["num_hidden_layers"]):
        p = f"model.layers.{i}."
        # Alternate F32/F16 across matrices and layers.
        a, b = ("F32", "F16") if i % 2 == 0 else ("F16", "F32")
        t[p + "input_layernorm.weight"] = (norm(), "F32")
        t[p + "self_attn.q_proj.weight"] = (lin(Q, D), a)
        t[p + "self_attn.k_proj.weight"] = (lin(KV, D), b)
        t[p + "self_attn.v_proj.weight"] = (lin(KV, D), a)
        t[p + "self_attn.o_proj.weight"] = (lin(D, Q), b)
        t[p + "post_attention_layernorm.weight"] = (norm(), "F32")
        t[p + "mlp.gate_proj.weight"] = (lin(F, D), b)
        t[p + "mlp.up_proj.weight"] = (lin(F, D), a)
        t[p + "mlp.down_proj.weight"] = (lin(D, F), b)
    t["model.norm.weight"] = (norm(), "F32")
    t["lm_head.weight"] = (lin(V, D, LM_HEAD_GAIN), "F16")
    return t


def verify_file(outdir: str, tensors: dict) -> None:
    """Cross-checks the written file with the `safetensors` package (for the
    dtypes numpy has) and with llama_ref's own parser (all dtypes)."""
    from safetensors import safe_open
    path = os.path.join(outdir, "model.safetensors")
    mine = llama_ref_hf.read_safetensors(path)
    with safe_open(path, framework="numpy") as f:
        assert set(f.keys()) == set(tensors), "tensor names differ"
        for name, (arr, dt) in tensors.items():
            if dt == "BF16":
                # numpy has no bf16: compare with an independent widening.
                want = (to_bf16_bits(arr).astype(np.uint32) << 16).view(np.float32)
                assert np.allclose(arr, want, rtol=2 ** -7, atol=0)
            else:
                want = f.get_tensor(name)
            assert want.shape == mine[name].shape, name
            assert np.array_equal(want.astype(np.float64), mine[name]), name


def margin_report(model, prompts, steps):
    """Per prompt: (greedy ids, list of top1-top2 margins per step)."""
    out = []
    for p in prompts:
        ids, rows = model.greedy(p, steps, return_logits=True)
        out.append((ids, [llama_ref.top2_margin(r) for r in rows]))
    return out


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("outdir")
    ap.add_argument("--seed", type=int, default=DEFAULT_SEED)
    ap.add_argument("--tokenizer-json", help="copy this tokenizer.json into OUTDIR")
    ap.add_argument("--min-margin", type=float, default=DEFAULT_MIN_MARGIN)
    ap.add_argument("--no-check", action="store_true",
                    help="skip the greedy near-tie check")
    a = ap.parse_args(argv)

    t0 = time.time()
    os.makedirs(a.outdir, exist_ok=True)
    tensors = make_tensors(a.seed)
    cfg = dict(CONFIG)
    with open(os.path.join(a.outdir, "config.json"), "w") as f:
        json.dump(cfg, f, indent=2)
        f.write("\n")
    write_safetensors(os.path.join(a.outdir, "model.safetensors"), tensors)
    if a.tokenizer_json:
        shutil.copyfile(a.tokenizer_json, os.path.join(a.outdir, "tokenizer.json"))
    verify_file(a.outdir, tensors)
    print(f"wrote {a.outdir} (seed {a.seed}) in {time.time() - t0:.1f}s")

    if a.no_check:
        return 0
    model = llama_ref.LlamaRef.load(a.outdir)
    ok = True
    for p, (ids, margins) in zip(SYNTHETIC_PROMPTS,
                                 margin_report(model, SYNTHETIC_PROMPTS, STEPS)):
        worst = int(np.argmin(margins))
        print(f"  prompt len {len(p):3d}: min margin {margins[worst]:.4f} "
              f"(step {worst}), median {np.median(margins):.3f}, "
              f"distinct ids {len(set(ids))}")
        if margins[worst] <= a.min_margin:
            print(f"  NEAR TIE: step {worst} margin {margins[worst]:.2e} <= "
                  f"{a.min_margin}; pick another --seed", file=sys.stderr)
            ok = False
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
