#!/usr/bin/env python3
"""One draw of the tiny qwen35 (or --family qwen3next) model written as both
files (make_family_models.py: llama.cpp's GGUF layout, and the Hugging Face
folder, whose value heads, fused projections, A_log, norms and names
differ), read back by the numpy reference: every prompt position's logits
equal within 1e-5 (qwen3next: 5e-5, measured 1.2e-5), so the two readings
are one model. With --tool (forward_dump), the C++ reads both to the same
last-position logits within the family tests' bound (3e-4, 1e-3; measured
2.4e-5 and 3.2e-4: the rounded norms and decays below, through the f32
recurrence; a misread head or expert moves logits by whole units). (Not closer: the folder stores the norms as
w - 1 and the decays as log(-a) in f32, which rounds them: measured 2.7e-6
at most; a value head, A_log or norm misread moves logits by whole units.) (check_qwen35_transformers.py holds the GGUF
reading to transformers, and family_qwen35_llama_cpp to llama.cpp.)

  check_qwen35_formats.py --workdir DIR [--family qwen35|qwen3next]
      [--tokenizer-gguf SMOLLM2.gguf] [--tool forward_dump]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
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
    ap.add_argument("--family", default="qwen35",
                    choices=("qwen35", "qwen35moe", "qwen3next"))
    ap.add_argument("--tool", help="forward_dump: the C++ reads both too")
    a = ap.parse_args()
    os.makedirs(a.workdir, exist_ok=True)
    f = mf.family(a.family)
    ref_atol = 1e-5 if a.family == "qwen35" else 5e-5
    cpp_atol = 3e-4 if a.family == "qwen35" else 1e-3
    t = mf.draw(f, 2)
    gguf_path = os.path.join(a.workdir, f"{a.family}-same.gguf")
    hf_path = os.path.join(a.workdir, f"{a.family}-same-hf")
    mf.write_gguf(gguf_path, f, t, a.tokenizer_gguf)
    mf.write_hf(hf_path, f, t)
    g = llama_ref.LlamaRef.load(gguf_path)
    h = llama_ref.LlamaRef.load(hf_path)
    failures = 0
    for ids in make_synthetic_model.SYNTHETIC_PROMPTS:
        e = float(np.abs(g.logits_all(ids) - h.logits_all(ids)).max())
        ok = e <= ref_atol
        failures += not ok
        print(f"[ids{len(ids)}] GGUF vs folder, every prompt position: "
              f"max |dlogit| {e:.3e}{'' if ok else f'  FAIL > {ref_atol}'}")
        if a.tool:
            logits = []
            for path in (gguf_path, hf_path):
                out = subprocess.run(
                    [a.tool, "--model", path, "--tokens",
                     ",".join(map(str, ids)), "--steps", "1",
                     "--kv-cache-dtype", "f32"],
                    capture_output=True, text=True, timeout=300)
                if out.returncode != 0:
                    print(f"forward_dump failed on {path}: {out.stderr}")
                    return 2
                logits.append(np.array(json.loads(out.stdout)["logits"]))
            e = float(np.abs(logits[0] - logits[1]).max())
            ok = e <= cpp_atol
            failures += not ok
            print(f"[ids{len(ids)}] C++: GGUF vs folder, last position: "
                  f"max |dlogit| {e:.3e}{'' if ok else f'  FAIL > {cpp_atol}'}")
    print("PASSED" if failures == 0 else f"FAILED: {failures} checks")
    return 0 if failures == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
