#!/usr/bin/env python3
"""Checks a GGUF model's logits three ways: llama.cpp (llama-cpp-python), the
numpy reference (llama_ref.py) and our C++ forward pass (forward_dump).

  check_llama_cpp.py --tool build/tests/reference/forward_dump \\
      --model /tmp/fam/qwen2.gguf [--tool-args "--tp 2 --pp 2"]

llama.cpp is an implementation independent of both of ours: agreeing with it
shows that the reference reads a family's GGUF metadata (RoPE style, biases,
rope_freqs, YaRN) as llama.cpp does, so the C++-vs-reference checks test the
right math. F32 weights and an F32 KV cache keep llama.cpp on f32 dot
products. For each of make_synthetic_model.SYNTHETIC_PROMPTS: every prompt
position's logits and the 32 greedy steps' logits, all three pairwise,
within --atol, and the same greedy ids.

llama.cpp ignores a sliding window on the llama architecture (Mistral v0.1;
measured: past the window its logits match the reference without one), so
for a llama model with one, llama.cpp is compared on the prompt positions
inside the window only and the rest is left to the reference (said in the
output). It applies gemma3's (compared everywhere).

--llama-cpp-atol bounds the pairs with llama.cpp (default: --atol). Gemma's
GeGLU needs ~1e-2: llama.cpp's CPU GELU reads an f16 lookup table (its
input and output rounded to f16), which moves logits of ~100 by up to
5e-3; with that table emulated in the reference, the gap falls to 1e-4.

Without --tool, the reference and llama.cpp only: for a family whose C++
forward pass is not built yet, so that the reference the C++ will be held
to is itself held to llama.cpp first.

Exit 0: all agree; 1: a mismatch; 2: a tool error; 77: llama-cpp-python is
not installed (ctest reports the test as skipped, not passed).
"""

from __future__ import annotations

import argparse
import os
import shlex
import sys

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import check_forward  # noqa: E402
import llama_ref  # noqa: E402
import make_synthetic_model  # noqa: E402

SKIP = 77


def llama_cpp_greedy(llm, ids, steps):
    """(logits of every prompt position, [steps] greedy ids, (steps, vocab)
    logits each id was chosen from)."""
    llm.reset()
    llm.eval(ids)
    n_vocab = llm.n_vocab()
    prompt_rows = np.array(llm.scores[:len(ids), :n_vocab], dtype=np.float64)
    rows, out = [prompt_rows[-1]], []
    for step in range(steps):
        nxt = int(np.argmax(rows[-1]))
        out.append(nxt)
        if step + 1 < steps:
            llm.eval([nxt])
            rows.append(np.array(llm.scores[llm.n_tokens - 1, :n_vocab],
                                 dtype=np.float64))
    return prompt_rows, out, np.array(rows)


def max_err(a, b) -> float:
    """NaN-proof: a NaN or a shape mismatch is an infinite error."""
    if a.shape != b.shape:
        return float("inf")
    e = np.abs(a - b)
    return float("inf") if not np.all(np.isfinite(e)) else float(e.max())


def report(name: str, errs: dict, same: dict, atol: float) -> int:
    """Prints each max error (against atol) and each greedy comparison of
    one prompt; returns how many failed."""
    failures = 0
    for what, e in errs.items():
        bad = not e <= atol
        failures += bad
        print(f"[{name}] {what}: max |dlogit| {e:.3e}"
              f"{'  FAIL > atol %g' % atol if bad else ''}")
    for what, ok in same.items():
        failures += not ok
        print(f"[{name}] {what}: {'identical' if ok else 'DIFFER'}")
    return failures


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--tool", help="forward_dump (none: the reference and "
                    "llama.cpp only)")
    ap.add_argument("--model", required=True, help="an F32 GGUF")
    ap.add_argument("--atol", type=float, default=1e-4)
    ap.add_argument("--llama-cpp-atol", type=float, default=None)
    ap.add_argument("--steps", type=int, default=32)
    ap.add_argument("--tool-args", default="")
    a = ap.parse_args(argv)
    try:
        from llama_cpp import Llama  # noqa: PLC0415
    except ImportError:
        print("SKIPPED: llama-cpp-python is not installed in this Python "
              "(scripts/install-deps.sh installs it when it can build it)")
        return SKIP

    # The reference's greedy runs come from check_forward.py's cache when
    # the layouts' checks have computed them (the same model, prompts,
    # steps and f32 KV); only the prompt pass is computed here.
    cached = check_forward.CachedReference(a.model, "f32")
    ref = cached.ref()
    import gguf
    arch = llama_ref._gguf_field(gguf.GGUFReader(a.model),
                                 "general.architecture")
    # The window llama.cpp ignores (its llama architecture's).
    window = ref.cfg.sliding_window if arch == "llama" else 0
    l_atol = a.llama_cpp_atol if a.llama_cpp_atol is not None else a.atol
    llm = Llama(model_path=a.model, n_ctx=256, n_batch=256, logits_all=True,
                type_k=0, type_v=0, n_threads=2, seed=0, verbose=False)
    failures = 0
    for ids in make_synthetic_model.SYNTHETIC_PROMPTS:
        name = f"ids{len(ids)}"
        ref_prompt = ref.logits_all(ids)
        ref_greedy, ref_rows = cached.greedy(ids, a.steps)
        errs, same = {}, {}
        if a.tool:
            try:
                cpp_logits, cpp_greedy, cpp_steps, _ = check_forward.run_tool(
                    a.tool, a.model, ids, a.steps, 600,
                    ["--kv-cache-dtype", "f32", *shlex.split(a.tool_args)])
            except check_forward.ToolError as e:
                print(f"[{name}] TOOL ERROR: {e}")
                return 2
            errs["cpp-ref last position"] = max_err(cpp_logits, ref_rows[0])
            same["cpp-ref greedy"] = cpp_greedy == ref_greedy
        # llama.cpp applies no window on the llama architecture: compare it
        # only where the window does not bite.
        if window > 0 and len(ids) + a.steps > window:
            l_prompt, _, _ = llama_cpp_greedy(llm, ids, 1)
            inside = min(window, len(ids))
            errs[f"llama.cpp-ref prompt positions 0-{inside - 1}"] = max_err(
                l_prompt[:inside], ref_prompt[:inside])
            print(f"[{name}] llama.cpp not compared past position "
                  f"{inside - 1}: it does not apply the sliding window of "
                  f"{window} to this architecture")
        else:
            l_prompt, l_greedy, l_rows = llama_cpp_greedy(llm, ids, a.steps)
            errs["llama.cpp-ref every prompt position"] = max_err(l_prompt,
                                                                  ref_prompt)
            if a.tool:
                errs["llama.cpp-cpp last position"] = max_err(l_prompt[-1],
                                                              cpp_logits)
            agree = 0
            while (agree < a.steps and l_greedy[agree] == ref_greedy[agree]):
                agree += 1
            errs[f"llama.cpp-ref {agree} decode steps"] = max_err(
                l_rows[:agree], ref_rows[:agree])
            same["llama.cpp-ref greedy"] = l_greedy == ref_greedy
        failures += report(name, {k: v for k, v in errs.items()
                                  if "llama.cpp" not in k}, same, a.atol)
        failures += report(name, {k: v for k, v in errs.items()
                                  if "llama.cpp" in k}, {}, l_atol)
    print(f"reference: {cached.hits} of "
          f"{len(make_synthetic_model.SYNTHETIC_PROMPTS)} greedy runs from the "
          f"cache")
    print("PASSED" if failures == 0 else f"FAILED: {failures} checks")
    return 0 if failures == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
