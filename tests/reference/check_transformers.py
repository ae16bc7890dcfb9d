#!/usr/bin/env python3
"""Checks a Hugging Face model folder's logits three ways: Hugging Face
`transformers` (PyTorch, float32), the numpy reference (llama_ref.py) and
our C++ forward pass (forward_dump).

  check_transformers.py --tool build/tests/reference/forward_dump \\
      --model build/tests/reference/families/qwen3moe-hf [--tool-args "--tp 2"]

transformers is the implementation the folders' config.json keys are defined
by: agreeing with it shows that the reference and the loader read a
family's keys (norm_topk_prob, head_dim, moe_intermediate_size,
num_local_experts, rope_scaling...) as the family's own code does, so the
C++-vs-reference checks (family_*) test the right math. For each of
make_synthetic_model.SYNTHETIC_PROMPTS: every prompt position's logits and
the greedy steps' logits, transformers against the reference, and the last
prompt position and the greedy ids against the C++ pass, within --atol.

Not a ctest: PyPI's torch wheels bring about 3 GB of CUDA libraries, too
much for CI's budget, so this runs by hand in a venv that has torch and
transformers (docs/testing.md says how), and its results are recorded.

Exit 0: all agree; 1: a mismatch; 2: a tool error; 77: torch or
transformers is not installed.
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
from check_llama_cpp import max_err, report  # noqa: E402

SKIP = 77


def transformers_greedy(model, torch, ids, steps):
    """(logits of every prompt position, [steps] greedy ids, (steps, vocab)
    logits each id was chosen from), without a KV cache: every step runs
    the whole sequence again, so the cache code is not what is compared."""
    seq = list(ids)
    with torch.no_grad():
        out = model(torch.tensor([seq])).logits[0].double().numpy()
    prompt_rows, rows, greedy = out, [out[-1]], []
    for step in range(steps):
        nxt = int(np.argmax(rows[-1]))
        greedy.append(nxt)
        if step + 1 < steps:
            seq.append(nxt)
            with torch.no_grad():
                rows.append(model(torch.tensor([seq])).logits[0, -1]
                            .double().numpy())
    return prompt_rows, greedy, np.array(rows)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--tool", required=True, help="forward_dump")
    ap.add_argument("--model", required=True,
                    help="a Hugging Face folder (config.json, safetensors)")
    ap.add_argument("--atol", type=float, default=1e-4)
    ap.add_argument("--steps", type=int, default=16)
    ap.add_argument("--tool-args", default="")
    a = ap.parse_args(argv)
    try:
        import torch  # noqa: PLC0415
        import transformers  # noqa: PLC0415
    except ImportError as e:
        print(f"SKIPPED: {e} (this check needs torch and transformers)")
        return SKIP
    torch.set_num_threads(2)
    model = transformers.AutoModelForCausalLM.from_pretrained(
        a.model, dtype=torch.float32, attn_implementation="eager")
    model.eval()
    print(f"transformers {transformers.__version__}, torch {torch.__version__}: "
          f"{type(model).__name__}")
    ref = llama_ref.LlamaRef.load(a.model)
    failures = 0
    for ids in make_synthetic_model.SYNTHETIC_PROMPTS:
        name = f"ids{len(ids)}"
        ref_prompt = ref.logits_all(ids)
        ref_greedy, ref_rows = ref.greedy(ids, a.steps, return_logits=True)
        try:
            cpp_logits, cpp_greedy, _, _ = check_forward.run_tool(
                a.tool, a.model, ids, a.steps, 600,
                ["--kv-cache-dtype", "f32", *shlex.split(a.tool_args)])
        except check_forward.ToolError as e:
            print(f"[{name}] TOOL ERROR: {e}")
            return 2
        t_prompt, t_greedy, t_rows = transformers_greedy(model, torch, ids,
                                                         a.steps)
        agree = 0
        while agree < a.steps and t_greedy[agree] == ref_greedy[agree]:
            agree += 1
        errs = {
            "transformers-ref every prompt position":
                max_err(t_prompt, ref_prompt),
            f"transformers-ref {agree} decode steps":
                max_err(t_rows[:agree], ref_rows[:agree]),
            "transformers-cpp last position": max_err(t_prompt[-1], cpp_logits),
        }
        same = {"transformers-ref greedy": t_greedy == ref_greedy,
                "transformers-cpp greedy": t_greedy == cpp_greedy}
        failures += report(name, errs, same, a.atol)
    print("PASSED" if failures == 0 else f"FAILED: {failures} checks")
    return 0 if failures == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
