#!/usr/bin/env python3
"""End-to-end checks of the `shardlm` binary.

1. `shardlm generate` streams exactly the text of the greedy tokens that
   forward_dump computes for the same prompt (itself checked against the
   numpy reference), with prompt ids and the decoded text both produced by
   the Hugging Face reference tokenizer: this covers the wiring of encode,
   engine, stop tokens and streaming decode.
2. The same seed gives the same sampled text; another seed, other text.
   The sampling fields' flags (--presence-penalty, --frequency-penalty,
   --repetition-penalty, --logit-bias ID=BIAS, --min-tokens) give the HTTP
   API's text for the same fields.
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
from testlib import (FAILURES, check, free_port,  # noqa: E402
                     http_post_json, run, start_serve, stop, wait_until)


def sampling_flag_checks(a, gen: list[str], tok) -> None:
    prompt = "The capital of France is"
    the = tok.encode(" the").ids
    fields = {"presence_penalty": 0.5, "frequency_penalty": 1.0,
              "repetition_penalty": 1.3, "logit_bias": {str(the[0]): -5}}
    flags = ["--presence-penalty", "0.5", "--frequency-penalty", "1.0",
             "--repetition-penalty", "1.3", "--logit-bias", f"{the[0]}=-5"]
    out = run(gen + ["--prompt", prompt, "--max-tokens", "24"] + flags)
    plain = run(gen + ["--prompt", prompt, "--max-tokens", "24"])
    port = free_port()
    server, _ = start_serve(a.shardlm, a.gguf,
                            ["--http-listen", f"127.0.0.1:{port}"])
    try:
        up = wait_until(lambda: _answers(port), timeout=120, every=0.3)
        status, raw = http_post_json(port, "/v1/completions", {
            "prompt": prompt, "max_tokens": 24, "temperature": 0, **fields})
        want = json.loads(raw)["choices"][0]["text"] if status == 200 else \
            raw[:200]
    finally:
        stop(server)
    check(up and out.returncode == 0 and out.stdout == want + "\n" and
          out.stdout != plain.stdout,
          f"generate --presence/--frequency/--repetition-penalty "
          f"--logit-bias: the API's text for the same fields, not the plain "
          f"greedy one (got {out.stdout!r}, want {want!r}, plain "
          f"{plain.stdout!r}; {out.stderr.strip()})")
    # +100 on one token: every greedy token is it (until --max-tokens, with
    # --min-tokens keeping end-of-text away).
    x = tok.encode(" x").ids[0]
    out = run(gen + ["--prompt", prompt, "--max-tokens", "6", "--min-tokens",
                     "6", "--logit-bias", f"{x}=100"])
    check(out.returncode == 0 and out.stdout == " x" * 6 + "\n",
          f"generate --logit-bias {x}=100: six ' x' ({out.stdout!r} "
          f"{out.stderr.strip()})")


def _answers(port: int) -> bool:
    try:
        return http_post_json(port, "/v1/completions",
                              {"prompt": "x", "max_tokens": 1})[0] == 200
    except OSError:
        return False


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
    # PP 2 with either stage balance (SmolLM2's stages: 19 + 11 layers,
    # or 15 + 15 with --pp-balance prefill) computes the same layers.
    for balance in ("decode", "prefill"):
        out = run(gen + ["--prompt", prompt, "--max-tokens", str(n), "--pp",
                         "2", "--pp-balance", balance, "--threads", "2"])
        check(out.returncode == 0 and out.stdout == want + "\n",
              f"generate --pp 2 --pp-balance {balance}: the reference text "
              f"({out.stdout!r} {out.stderr.strip()[-300:]})")
    out = run(gen + ["--prompt", prompt, "--pp-balance", "both"])
    check(out.returncode != 0 and "--pp-balance 'both'" in out.stderr,
          f"--pp-balance both is refused naming the flag ({out.stderr!r})")

    # 1b. --precision: fast runs and says so in the startup log (its
    # distance from exact is bench/precision_bench.py's); a bad value is
    # refused naming the flag; exact is the default and the reference text
    # above.
    out = run(gen + ["--prompt", prompt, "--max-tokens", str(n),
                     "--precision", "fast"])
    check(out.returncode == 0 and out.stdout.strip() != "" and
          "precision fast" in out.stderr,
          f"generate --precision fast answers and logs its precision "
          f"({out.stdout!r} {out.stderr.strip()[-300:]})")
    out = run(gen + ["--prompt", prompt, "--max-tokens", "2"])
    check("precision exact" in out.stderr and "CPU thread" in out.stderr,
          f"the startup log names the threads and precision exact "
          f"({out.stderr.strip()[-300:]})")
    out = run(gen + ["--prompt", prompt, "--precision", "int4"])
    check(out.returncode != 0 and "--precision" in out.stderr
          and "'int4'" in out.stderr,
          f"--precision int4 is refused naming the flag ({out.stderr!r})")

    # 2. Seeded sampling is reproducible.
    sample = gen + ["--prompt", "Once upon a time", "--max-tokens", "24",
                    "--temperature", "1.0", "--top-p", "0.95"]
    s1 = run(sample + ["--seed", "11"]).stdout
    s2 = run(sample + ["--seed", "11"]).stdout
    s3 = run(sample + ["--seed", "12"]).stdout
    check(s1 == s2 and s1.strip() != "", "same seed, same text")
    check(s1 != s3, "another seed, other text")

    # 2b. The sampling fields' flags (issue 38): the same text as the HTTP
    # API given the same fields (check_sampling checks the API against a
    # numpy reference of the penalties and logit_bias), and a +100 bias
    # makes every greedy token the biased one.
    sampling_flag_checks(a, gen, tok)

    # 3. Bad input: non-zero exit and a message naming the problem.
    truncated = os.path.join(a.workdir, "truncated.gguf")
    with open(a.gguf, "rb") as f, open(truncated, "wb") as g:
        g.write(f.read(4096))
    not_gguf = os.path.join(a.workdir, "not.gguf")
    with open(not_gguf, "wb") as g:
        g.write(b"this is not a model file at all")
    # inspect --plan's KV cache per token of context: SmolLM2-135M's 30
    # layers x 3 KV heads x head_dim 64, K and V, 2 bytes each (f16), or
    # int8's byte per value and f32 scale per head and token; TP 3 x PP 2
    # gives each rank one KV head of its stage's layers.
    for dtype, want in (("auto", 30 * 3 * 64 * 2 * 2),
                        ("int8", 30 * 3 * 2 * (64 + 4))):
        r = run([a.shardlm, "inspect", a.gguf, "--plan", "--tp", "3",
                 "--pp", "2", "--kv-cache-dtype", dtype])
        lines = r.stdout.splitlines()
        per_rank = [int(x.split()[1]) for x in lines if "x K, V)" in x]
        total = [int(x.split()[1]) for x in lines if x.startswith("all ")]
        check(r.returncode == 0 and len(per_rank) == 6 and
              total == [want] and sum(per_rank) == want,
              f"inspect --plan --tp 3 --pp 2 --kv-cache-dtype {dtype}: "
              f"{want} KV bytes per token in all, the ranks' sum "
              f"(got {per_rank} and {total})")
    bad = [
        (gen + ["--prompt", "x", "--bogus", "1"], 2, "--bogus"),
        ([a.shardlm, "inspect", a.gguf, "--plan", "--kv-cache-dtype", "f8"],
         2, "--kv-cache-dtype"),
        (gen + ["--prompt", "x", "--max-tokens", "ten"], 2, "--max-tokens"),
        (gen + ["--prompt", "x", "--temperature", "-1"], 2, "temperature"),
        (gen + ["--prompt", "x", "--top-p", "0"], 2, "top_p"),
        (gen + ["--prompt", "x", "--logit-bias", "42"], 2, "--logit-bias"),
        (gen + ["--prompt", "x", "--logit-bias", "42=-101"], 2,
         "logit_bias of token 42"),
        (gen + ["--prompt", "x", "--logit-bias", "99999999=1"], 1,
         "logit_bias token 99999999"),
        (gen + ["--prompt", "x", "--presence-penalty", "3"], 2,
         "presence_penalty"),
        (gen + ["--prompt", "x", "--repetition-penalty", "0"], 2,
         "repetition_penalty"),
        (gen + ["--prompt", "x", "--min-tokens", "200"], 2, "--min-tokens"),
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
