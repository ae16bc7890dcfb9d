#!/usr/bin/env python3
"""End-to-end checks of the `shardlm` binary.

1. `shardlm generate` streams exactly the text of the greedy tokens that
   forward_dump computes for the same prompt (itself checked against the
   numpy reference), with prompt ids and the decoded text both produced by
   the Hugging Face reference tokenizer: this covers the wiring of encode,
   engine, stop tokens and streaming decode.
2. The same seed gives the same sampled text; another seed, other text.
3. Bad input (unknown flag, bad value, missing or corrupt model, over-long
   request) exits non-zero with a message that names the problem, and no
   crash.

  check_cli.py --shardlm BIN --forward-dump BIN --gguf MODEL --workdir DIR
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "reference"))
import hf_tokenizer  # noqa: E402

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))
from testlib import FAILURES, check, run  # noqa: E402


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--shardlm", required=True)
    ap.add_argument("--forward-dump", required=True)
    ap.add_argument("--gguf", required=True)
    ap.add_argument("--workdir", required=True)
    a = ap.parse_args()
    os.makedirs(a.workdir, exist_ok=True)
    tok = hf_tokenizer.build_from_gguf(a.gguf)
    gen = [a.shardlm, "generate", "--model", a.gguf]

    # 1. Greedy text == decode(forward_dump greedy tokens), cut at a stop.
    prompt = "The capital of France is"
    n = 24
    ids = tok.encode(prompt).ids
    dump = run([a.forward_dump, "--model", a.gguf, "--tokens",
                ",".join(map(str, ids)), "--steps", str(n)])
    check(dump.returncode == 0, f"forward_dump ran ({dump.stderr.strip()})")
    greedy = json.loads(dump.stdout)["greedy"]
    stops = {tok.token_to_id("<|endoftext|>"), tok.token_to_id("<|im_end|>")}
    cut = next((i for i, t in enumerate(greedy) if t in stops), len(greedy))
    want = tok.decode(greedy[:cut], skip_special_tokens=False)
    out = run(gen + ["--prompt", prompt, "--max-tokens", str(n)])
    check(out.returncode == 0, f"generate exits 0 ({out.stderr.strip()})")
    check(out.stdout == want + "\n",
          f"generate streams the reference text: got {out.stdout!r}, "
          f"want {want!r}")

    # 2. Seeded sampling is reproducible.
    sample = gen + ["--prompt", "Once upon a time", "--max-tokens", "24",
                    "--temperature", "1.0", "--top-p", "0.95"]
    s1 = run(sample + ["--seed", "11"]).stdout
    s2 = run(sample + ["--seed", "11"]).stdout
    s3 = run(sample + ["--seed", "12"]).stdout
    check(s1 == s2 and s1.strip() != "", "same seed, same text")
    check(s1 != s3, "another seed, other text")

    # 3. Bad input: non-zero exit and a message naming the problem.
    truncated = os.path.join(a.workdir, "truncated.gguf")
    with open(a.gguf, "rb") as f, open(truncated, "wb") as g:
        g.write(f.read(4096))
    not_gguf = os.path.join(a.workdir, "not.gguf")
    with open(not_gguf, "wb") as g:
        g.write(b"this is not a model file at all")
    bad = [
        (gen + ["--prompt", "x", "--bogus", "1"], 2, "--bogus"),
        (gen + ["--prompt", "x", "--max-tokens", "ten"], 2, "--max-tokens"),
        (gen + ["--prompt", "x", "--temperature", "-1"], 2, "temperature"),
        (gen + ["--prompt", "x", "--top-p", "0"], 2, "top_p"),
        ([a.shardlm, "generate", "--prompt", "x"], 2, "--model"),
        (gen, 2, "--prompt"),
        ([a.shardlm, "generate", "--model", "/nonexistent.gguf",
          "--prompt", "x"], 1, "/nonexistent.gguf"),
        ([a.shardlm, "generate", "--model", truncated, "--prompt", "x"], 1,
         "offset"),
        ([a.shardlm, "inspect", not_gguf], 1, "not a GGUF file"),
        (gen + ["--prompt", "x", "--max-tokens", "9000"], 1,
         "[1, 8192] (the context window)"),
        (gen + ["--prompt", "x", "--kv-cache-bytes", "100000"], 1,
         "KV cache"),
        ([a.shardlm, "frobnicate"], 2, "unknown command"),
        # The KV cache's and step limits' flags are one set (launch/
        # cache_flags.h) on every command that runs an engine or a cluster.
        (gen + ["--prompt", "x", "--max-seqs", "0"], 2, "--max-seqs"),
        ([a.shardlm, "serve", "--model", a.gguf, "--max-queued", "-1"], 2,
         "--max-queued"),
        ([a.shardlm, "launch", "--model", a.gguf, "--block-size", "0"], 2,
         "--block-size"),
        ([a.shardlm, "coordinator", "--model", a.gguf,
          "--gpu-memory-utilization", "2"], 2, "--gpu-memory-utilization"),
    ]
    for cmd, code, needle in bad:
        r = run(cmd)
        shown = " ".join(cmd[1:])
        check(r.returncode == code and needle in r.stderr,
              f"`{shown}` exits {code} naming {needle!r} "
              f"(got {r.returncode}: {r.stderr.strip().splitlines()[:1]})")

    print(f"{len(FAILURES)} failed" if FAILURES else "all CLI checks passed")
    return 1 if FAILURES else 0


if __name__ == "__main__":
    sys.exit(main())
