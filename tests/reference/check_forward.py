#!/usr/bin/env python3
"""Checks the C++ forward pass (forward_dump) against the numpy reference.

  check_forward.py --tool build/tests/reference/forward_dump \\
      --model models/SmolLM2-135M-Instruct.Q4_1.gguf
  check_forward.py --tool build/tests/reference/forward_dump \\
      --synthetic --workdir /tmp/synthetic            # generates the model
  check_forward.py --tool ... --model DIR             # an existing HF dir

For every prompt it runs

  TOOL --model MODEL --tokens 12,34,56 --steps N

which must print one JSON object on stdout:
  {"logits": [vocab floats, last prompt position], "greedy": [N ids]}
(greedy = argmax continuation, no EOS stopping), and requires
  max |logits_cpp - logits_ref| <= --atol   and   greedy ids identical.

GGUF: three text prompts (plain sentence, ChatML chat, code; ~5 to ~60
tokens) tokenized with hf_tokenizer.build_from_gguf (from --gguf-tokenizer,
default the model itself). HF/synthetic: the fixed token-id prompts of
make_synthetic_model.SYNTHETIC_PROMPTS (lengths 1, 7, 41). For the synthetic
model the reference's top-1/top-2 margin must exceed --min-margin at every
greedy step (otherwise the comparison would hinge on rounding).

Exits 0 when everything matches, 1 on any mismatch, 2 on a usage or tool error.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import shlex
import subprocess
import sys
import tempfile
import time

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import llama_ref  # noqa: E402
import llama_ref_hf  # noqa: E402
import make_synthetic_model  # noqa: E402

GGUF_PROMPTS = [
    # (name, text)
    ("plain", "The capital of France is"),
    ("chatml",
     "<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n"
     "<|im_start|>user\nWrite a haiku about the sea.<|im_end|>\n"
     "<|im_start|>assistant\n"),
    ("code",
     "def fibonacci(n):\n"
     "    \"\"\"Return the n-th Fibonacci number.\"\"\"\n"
     "    a, b = 0, 1\n"
     "    for _ in range(n):\n"
     "        a, b = b, a + b\n"
     "    return a\n\n\n"
     "def is_prime(n):\n"),
]


class ToolError(Exception):
    pass


def run_tool(tool, model, ids, steps, timeout, extra=()):
    cmd = [tool, "--model", model, "--tokens", ",".join(map(str, ids)),
           "--steps", str(steps), *extra]
    t0 = time.time()
    try:
        p = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        raise ToolError(f"timed out after {timeout}s: {' '.join(cmd[:5])} ...")
    dt = time.time() - t0
    if p.returncode != 0:
        raise ToolError(f"exit status {p.returncode}\ncommand: {' '.join(cmd)}\n"
                        f"stderr (tail):\n{p.stderr[-3000:]}")
    out = p.stdout.strip()
    try:
        obj = json.loads(out)
    except json.JSONDecodeError:
        # Be lenient about stray lines: take the last line that parses.
        obj = None
        for line in reversed(out.splitlines()):
            line = line.strip()
            if line.startswith("{"):
                try:
                    obj = json.loads(line)
                    break
                except json.JSONDecodeError:
                    pass
        if obj is None:
            raise ToolError(f"stdout is not a JSON object; first 500 chars:\n"
                            f"{out[:500]}")
    if not isinstance(obj, dict) or "logits" not in obj or "greedy" not in obj:
        raise ToolError(f"JSON lacks 'logits'/'greedy': keys "
                        f"{list(obj) if isinstance(obj, dict) else type(obj)}")
    run_tool.last = obj  # The whole output, for the checks beyond these.
    return (np.asarray(obj["logits"], dtype=np.float64),
            [int(i) for i in obj["greedy"]], obj.get("step_logprobs"), dt)


class CachedReference:
    """The numpy reference's greedy runs, kept on disk across tests: the same
    model and prompts are checked under several layouts and KV placements,
    and the float64 reference (not the C++ under test) is most of each
    test's time. A run is keyed by the model's bytes, the KV dtype the
    reference rounds to, the prompt, the steps, and llama_ref.py's source
    with the numpy and gguf versions; the model is loaded only on a miss.
    SHARDLM_REFERENCE_CACHE names the folder (tests/reference/CMakeLists.txt
    sets it); unset, nothing is kept."""

    def __init__(self, model: str, kv_dtype: str):
        self.model, self.kv_dtype = model, kv_dtype
        self.dir = os.environ.get("SHARDLM_REFERENCE_CACHE") or None
        self._ref = None
        self._key = None
        self.hits = 0

    def ref(self):
        if self._ref is None:
            t0 = time.time()
            self._ref = llama_ref.LlamaRef.load(self.model,
                                                kv_dtype=self.kv_dtype)
            r = self._ref
            print(f"reference loaded {self.model} in {time.time() - t0:.1f}s "
                  f"({r.cfg.n_layers} layers, dim {r.cfg.dim}, rope "
                  f"{r.cfg.rope_style})")
        return self._ref

    def _model_key(self) -> str:
        if self._key is None:
            from importlib.metadata import version
            h = hashlib.sha256()
            files = ([self.model] if os.path.isfile(self.model) else sorted(
                os.path.join(d, f) for d, _, fs in os.walk(self.model)
                for f in fs))
            for path in files:
                h.update(os.path.relpath(path, self.model).encode() + b"\0")
                with open(path, "rb") as f:
                    for chunk in iter(lambda: f.read(1 << 22), b""):
                        h.update(chunk)
            for module in (llama_ref, llama_ref_hf):
                with open(module.__file__, "rb") as f:
                    h.update(f.read())
            h.update(f"numpy {np.__version__} gguf {version('gguf')} "
                     f"kv {self.kv_dtype} rows f32".encode())
            self._key = h.hexdigest()[:32]
        return self._key

    def _run(self, ids, steps):
        ref = self.ref()
        if ref.cfg.vocab_size <= max(ids):
            raise ToolError("prompt ids exceed the model's vocabulary")
        return ref.greedy(ids, steps, return_logits=True)

    def greedy(self, ids, steps):
        """(greedy ids, their logits rows), as LlamaRef.greedy; ToolError
        when an id is outside the vocabulary (a cached run passed that).
        The rows are kept, and returned whether cached or not, rounded to
        float32 (an error under 1e-6 of a logit, 100 times below the
        tightest atol here): a run's rows are steps x vocab, and float64
        made the folder CI's largest (1.6 GB)."""
        if self.dir is None:
            greedy, rows = self._run(ids, steps)
            return greedy, rows.astype(np.float32).astype(np.float64)
        try:
            with np.load(self._path(ids, steps)) as z:
                self.hits += 1
                return ([int(i) for i in z["greedy"]],
                        z["rows"].astype(np.float64))
        except (OSError, KeyError, ValueError):
            pass
        greedy, rows = self._run(ids, steps)
        self.store(ids, steps, greedy, rows)
        return greedy, rows.astype(np.float32).astype(np.float64)

    def store(self, ids, steps, greedy, rows):
        """Keeps a greedy run computed elsewhere (make_family_models.py's
        margin check runs the same prompts on the model it writes)."""
        if self.dir is None:
            return
        path = self._path(ids, steps)
        os.makedirs(self.dir, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=self.dir, suffix=".npz")
        with os.fdopen(fd, "wb") as f:
            np.savez(f, greedy=np.asarray(greedy, dtype=np.int64),
                     rows=np.asarray(rows).astype(np.float32))
        os.replace(tmp, path)  # Whole or absent for a test beside this one.

    def _path(self, ids, steps) -> str:
        run = hashlib.sha256(json.dumps([list(ids), steps]).encode())
        return os.path.join(self.dir, f"{self._model_key()}-"
                            f"{run.hexdigest()[:24]}.npz")


def check_prompt(name, ids, ref, tool, model, steps, atol, min_margin,
                 timeout, decode, extra=(), anchor=None, kv_bytes=None):
    """Returns (ok, message lines). `anchor`: text the reference's greedy
    continuation must contain (a sanity check of the reference itself).
    `kv_bytes`: the KV bytes per token each rank's pool must hold, as the
    tool measured them (kv_bytes_per_token_per_rank)."""
    msgs = []
    t0 = time.time()
    ref_greedy, ref_rows = ref.greedy(ids, steps)
    t_ref = time.time() - t0
    margins = [llama_ref.top2_margin(r) for r in ref_rows]
    ref_logits = ref_rows[0]

    cpp_logits, cpp_greedy, cpp_steps, t_cpp = run_tool(tool, model, ids, steps,
                                                        timeout, extra)
    ok = True
    head = f"[{name}] {len(ids)} prompt tokens"
    if cpp_logits.shape != ref_logits.shape:
        return False, [f"{head}: FAIL logits length {cpp_logits.shape[0]}, "
                       f"want vocab {ref_logits.shape[0]}"]
    if not np.all(np.isfinite(cpp_logits)):
        bad = int(np.flatnonzero(~np.isfinite(cpp_logits))[0])
        return False, [f"{head}: FAIL non-finite logit at index {bad}: "
                       f"{cpp_logits[bad]}"]
    err = np.abs(cpp_logits - ref_logits)
    worst = int(np.argmax(err))
    a_ref, a_cpp = int(np.argmax(ref_logits)), int(np.argmax(cpp_logits))
    msgs.append(f"{head}: max|dlogit| {err.max():.3e} (at id {worst}: cpp "
                f"{cpp_logits[worst]:.6f} ref {ref_logits[worst]:.6f}), "
                f"argmax cpp {a_cpp} ref {a_ref}, "
                f"ref min margin {min(margins):.3g}, "
                f"time ref {t_ref:.1f}s cpp {t_cpp:.1f}s")
    if not err.max() <= atol:
        ok = False
        msgs.append(f"  FAIL: max abs logit error {err.max():.3e} > atol {atol:g}"
                    f" ({int(np.sum(err > atol))} of {err.size} logits over)")
    # Every decode step, not only the last prompt position: the chosen id's
    # log-probability and the top-20 ids' (log_softmax of that step's
    # logits) against the reference's at the same step, while the two
    # greedy sequences agree (after a divergence the contexts differ).
    if cpp_steps is None or len(cpp_steps) != len(cpp_greedy):
        ok = False
        msgs.append(f"  FAIL: the tool gave {0 if cpp_steps is None else len(cpp_steps)}"
                    f" steps of log-probabilities for {len(cpp_greedy)} ids")
    else:
        step_err, worst_step = 0.0, 0
        for s_i, (row, got) in enumerate(zip(ref_rows, cpp_steps)):
            if s_i >= len(ref_greedy) or cpp_greedy[s_i] != ref_greedy[s_i]:
                break
            lse = row.max() + np.log(np.exp(row - row.max()).sum())
            pairs = [(ref_greedy[s_i], got["sampled"])] + \
                    [(int(t), lp) for t, lp in got["top"]]
            for tok, lp in pairs:
                e = abs(float(lp) - (row[tok] - lse))
                if not e <= step_err:  # NaN-proof: a NaN fails below.
                    step_err, worst_step = e, s_i
                    if not np.isfinite(e):
                        step_err = float("inf")
        msgs.append(f"  every step: max |dlogprob| {step_err:.3e} over "
                    f"{len(cpp_steps)} steps x 21 ids (worst at step {worst_step})")
        if not step_err <= atol:
            ok = False
            msgs.append(f"  FAIL: a decode step's log-probabilities differ by "
                        f"{step_err:.3e} > atol {atol:g}")
    if cpp_greedy != ref_greedy:
        ok = False
        if len(cpp_greedy) != len(ref_greedy):
            msgs.append(f"  FAIL: greedy has {len(cpp_greedy)} ids, want {steps}")
        n = min(len(cpp_greedy), len(ref_greedy))
        first = next((i for i in range(n) if cpp_greedy[i] != ref_greedy[i]), n)
        if first < n:
            r = ref_rows[first]
            note = (" (reference near-tie there)" if margins[first] < 2 * atol
                    else "")
            msgs.append(
                f"  FAIL: greedy differs first at step {first} (position "
                f"{len(ids) + first}): cpp {cpp_greedy[first]} ref "
                f"{ref_greedy[first]}; ref logits there: ref-id "
                f"{r[ref_greedy[first]]:.5f}, cpp-id {r[cpp_greedy[first]]:.5f}, "
                f"margin {margins[first]:.3g}{note}")
        msgs.append(f"  ref greedy: {ref_greedy}")
        msgs.append(f"  cpp greedy: {cpp_greedy}")
    if min_margin is not None and min(margins) <= min_margin:
        ok = False
        s = int(np.argmin(margins))
        msgs.append(f"  FAIL: reference top-1/top-2 margin {margins[s]:.3g} at "
                    f"step {s} <= {min_margin:g}: test model/prompt is "
                    f"ill-conditioned (choose another seed)")
    if decode is not None:
        msgs.append(f"  ref text: {decode(ref_greedy)!r}")
    if anchor is not None:
        # The C++ and the reference could share a misreading of the file
        # (both plausible, both wrong): the reference must still say what
        # the model is known to say.
        text = decode(ref_greedy) if decode is not None else ""
        if anchor not in text:
            ok = False
            msgs.append(f"  FAIL: the reference's text does not contain the "
                        f"anchor {anchor!r}: the reference itself is wrong")
        else:
            msgs.append(f"  ok: the reference's text contains {anchor!r}")
    if kv_bytes is not None:
        got = run_tool.last.get("kv_bytes_per_token_per_rank")
        if got != kv_bytes:
            ok = False
            msgs.append(f"  FAIL: the ranks' KV pools hold {got} bytes per "
                        f"token, want {kv_bytes}")
        else:
            msgs.append(f"  ok: the ranks' KV pools hold {got} bytes per token")
    if ok:
        msgs.append(f"  ok: greedy {steps} ids identical")
    return ok, msgs


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--tool", required=True, help="path to forward_dump")
    src = ap.add_mutually_exclusive_group(required=True)
    src.add_argument("--model", help=".gguf file or Hugging Face model dir")
    src.add_argument("--synthetic", action="store_true",
                     help="generate the synthetic model into --workdir first")
    ap.add_argument("--workdir", help="where --synthetic writes the model")
    ap.add_argument("--seed", type=int, default=make_synthetic_model.DEFAULT_SEED)
    ap.add_argument("--gguf-tokenizer", help="GGUF whose tokenizer encodes the "
                    "text prompts (default: --model when it is a GGUF)")
    ap.add_argument("--id-prompts", action="store_true",
                    help="use the synthetic token-id prompts for a GGUF too "
                    "(a test model whose vocabulary is not its own)")
    ap.add_argument("--atol", type=float, default=1e-3)
    ap.add_argument("--steps", type=int, default=32)
    ap.add_argument("--min-margin", type=float, default=None,
                    help="fail if a reference greedy step's top1-top2 margin "
                    "is not above this (default: "
                    f"{make_synthetic_model.DEFAULT_MIN_MARGIN} for "
                    "synthetic models, off for a GGUF)")
    ap.add_argument("--kv-cache-dtype", default="f32",
                    choices=["f32", "f16", "bf16", "int8"],
                    help="KV cache element type of both the tool and the "
                         "reference (which rounds K and V to it)")
    ap.add_argument("--reference-kv-dtype", default=None,
                    choices=["f32", "f16", "bf16", "int8"],
                    help="what the reference rounds K and V to, when not "
                         "--kv-cache-dtype (f32: measure the accuracy cost "
                         "of a compact cache)")
    ap.add_argument("--anchor", action="append", default=[],
                    metavar="PROMPT=TEXT",
                    help="the reference's greedy text for the named GGUF "
                         "prompt must contain TEXT (repeatable), e.g. "
                         "plain=Paris for SmolLM2")
    ap.add_argument("--long-prompt", type=int, default=0,
                    help="one prompt of this many ids instead of the usual "
                         "ones (ids (7919 i + 17) mod 40000 + 1)")
    ap.add_argument("--expect-kv-bytes-per-rank", default=None,
                    help="comma-separated KV bytes per token each rank's "
                         "pool must hold, as forward_dump measures them")
    ap.add_argument("--tool-args", default="",
                    help="extra arguments for the tool, e.g. '--chunk 5'")
    ap.add_argument("--timeout", type=float, default=600,
                    help="seconds per tool run")
    a = ap.parse_args(argv)

    t_start = time.time()
    if not (os.path.isfile(a.tool) and os.access(a.tool, os.X_OK)):
        print(f"error: tool {a.tool} is not an executable file", file=sys.stderr)
        return 2

    if a.synthetic:
        if not a.workdir:
            ap.error("--synthetic needs --workdir")
        model = os.path.join(a.workdir, f"synthetic_seed{a.seed}")
        rc = make_synthetic_model.main([model, "--seed", str(a.seed), "--no-check"])
        if rc != 0:
            return 2
    else:
        model = a.model
        if not os.path.exists(model):
            print(f"error: model {model} does not exist", file=sys.stderr)
            return 2

    is_gguf = not os.path.isdir(model)
    min_margin = a.min_margin
    if min_margin is None and not is_gguf:
        min_margin = make_synthetic_model.DEFAULT_MIN_MARGIN

    decode = None
    if is_gguf and not a.id_prompts:
        import hf_tokenizer
        tk = hf_tokenizer.build_from_gguf(a.gguf_tokenizer or model)
        prompts = [(n, tk.encode(t).ids) for n, t in GGUF_PROMPTS]
        decode = lambda ids: tk.decode(ids, skip_special_tokens=False)  # noqa
    else:
        prompts = [(f"ids{len(p)}", p) for p in make_synthetic_model.SYNTHETIC_PROMPTS]
    if a.long_prompt:
        prompts = [(f"ids{a.long_prompt}",
                    [(7919 * i + 17) % 40000 + 1 for i in range(a.long_prompt)])]
        decode = None
    kv_bytes = None
    if a.expect_kv_bytes_per_rank:
        kv_bytes = [int(x) for x in a.expect_kv_bytes_per_rank.split(",")]

    ref = CachedReference(model, a.reference_kv_dtype or a.kv_cache_dtype)
    print(f"{a.kv_cache_dtype} KV (reference {ref.kv_dtype}); atol {a.atol:g}, "
          f"{a.steps} greedy steps; reference runs cached in "
          f"{ref.dir or '(nothing: SHARDLM_REFERENCE_CACHE unset)'}")

    anchors = dict(x.split("=", 1) for x in a.anchor)
    unknown = set(anchors) - {n for n, _ in prompts}
    if unknown or (anchors and decode is None):
        what = sorted(unknown) if unknown else "a model without a tokenizer"
        print(f"error: --anchor for {what}", file=sys.stderr)
        return 2
    failures = 0
    for name, ids in prompts:
        try:
            ok, msgs = check_prompt(name, ids, ref, a.tool, model, a.steps,
                                    a.atol, min_margin, a.timeout, decode,
                                    ["--kv-cache-dtype", a.kv_cache_dtype,
                                     *shlex.split(a.tool_args)],
                                    anchors.get(name), kv_bytes)
        except ToolError as e:
            print(f"[{name}] TOOL ERROR: {e}")
            return 2
        for m in msgs:
            print(m)
        failures += not ok
        sys.stdout.flush()

    total = time.time() - t_start
    print(f"reference: {ref.hits} of {len(prompts)} runs from the cache")
    if failures:
        print(f"FAILED: {failures} of {len(prompts)} prompts ({total:.1f}s)")
        return 1
    print(f"PASSED: {len(prompts)} prompts ({total:.1f}s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
