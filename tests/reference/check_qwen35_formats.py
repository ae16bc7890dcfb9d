#!/usr/bin/env python3
"""One draw of the tiny qwen35 model written as both files
(make_family_models.py: llama.cpp's GGUF layout, and Qwen3.5's Hugging Face
folder, whose value heads, A_log, norms and names differ), read back by the
numpy reference: every prompt position's logits equal within 1e-5, so the
two readings are one model. (Not closer: the folder stores the norms as
w - 1 and the decays as log(-a) in f32, which rounds them: measured 2.7e-6
at most; a value head, A_log or norm misread moves logits by whole units.) (check_qwen35_transformers.py holds the GGUF
reading to transformers, and family_qwen35_llama_cpp to llama.cpp.)

  check_qwen35_formats.py --workdir DIR [--tokenizer-gguf SMOLLM2.gguf]
"""

from __future__ import annotations

import argparse
import os
import sys

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import llama_ref  # noqa: E402
import make_family_models as mf  # noqa: E402
import make_synthetic_model  # noqa: E402


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--workdir", required=True)
    ap.add_argument("--tokenizer-gguf", default=mf.TOKENIZER_GGUF_DEFAULT)
    a = ap.parse_args()
    os.makedirs(a.workdir, exist_ok=True)
    f = mf.family("qwen35")
    t = mf.draw(f, 2)
    gguf_path = os.path.join(a.workdir, "qwen35-same.gguf")
    hf_path = os.path.join(a.workdir, "qwen35-same-hf")
    mf.write_gguf(gguf_path, f, t, a.tokenizer_gguf)
    mf.write_hf(hf_path, f, t)
    g = llama_ref.LlamaRef.load(gguf_path)
    h = llama_ref.LlamaRef.load(hf_path)
    failures = 0
    for ids in make_synthetic_model.SYNTHETIC_PROMPTS:
        e = float(np.abs(g.logits_all(ids) - h.logits_all(ids)).max())
        ok = e <= 1e-5
        failures += not ok
        print(f"[ids{len(ids)}] GGUF vs folder, every prompt position: "
              f"max |dlogit| {e:.3e}{'' if ok else '  FAIL > 1e-5'}")
    print("PASSED" if failures == 0 else f"FAILED: {failures} checks")
    return 0 if failures == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
