#!/usr/bin/env python3
"""How far to trust `shardlm simulate` on this machine (issue #17 part 3):
the simulator's predictions for the CPU engine against measured runs of
`shardlm bench` against `shardlm serve`, at several loads and layouts, with
the error per figure.

Calibration, in the same run: engine_bench's one-sequence decode and
prefill rates at the thread count each rank gets become the CPU profile's
achieved bandwidth and FLOP rate (the roofline's two rates; nothing is
fitted to the serving runs being predicted). Each serving run is then
simulated as a closed loop of the same clients sending the same prompts (by
token count, read back from the server) and output lengths. With --rounds
N all of it is done N times, and the median of each figure and error over
the rounds is reported too: this VM's speed drifts between runs minutes
apart by as much as the errors looked for.

  bench/simulator_validation.py --shardlm build/launch/shardlm \\
      --engine-bench build/bench/engine_bench --model M.gguf \\
      [--layouts 1x1,2x1] [--concurrency 1,4,16] [--requests 48] \\
      [--max-tokens 64] [--rounds 1] [--json OUT] \\
      [--cp-paragraphs 27,80 [--cp 1,2]]

Context parallel (issue #35), with --cp-paragraphs: one long prompt (that
many of bench/cp_prefill.py's paragraphs, about 37 SmolLM2 tokens each)
through `shardlm generate --cp C --threads 1` (the CP ranks are threads of
one process, one thread each), its prefill time and decode tokens/s against
`shardlm simulate --cp C` of the same prompt on the rates of one thread
(engine_bench at 1 thread, TP 1) and the in-process communicator's cost per
message (engine_bench --tp 2 at 1 thread per rank: the same communicator
carries CP's all-gathers). --layouts "" skips the serving runs.

A benchmark: it prints figures, and exits 1 only when a run fails.
"""

from __future__ import annotations

import argparse
import json
import statistics
import os
import resource
import subprocess
import sys
import tempfile
import urllib.request

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "tests"))
from testlib import free_port, run, start_serve, stop, wait_ready  # noqa: E402

# The most tokens a step's matrix-vector kernels take (kDecodeMaxRows in
# kernels/linear/linear.h); larger steps take the tiled path.
DECODE_MAX_ROWS = 16
# The small batch the CPU profile rates apart (kMatvecSmallBatchTokens in
# simulator/cost_model.h).
SMALL_BATCH = 4

WORDS = ("the quick brown fox jumps over a lazy dog while seven wizards "
         "quietly judge boxing matches near the old river bank").split()



def calibration_flags(cal: dict) -> list[str]:
    """`shardlm simulate` flags that replace the cpu-this-machine profile's
    rates with the ones calibrated here."""
    return ["--memory-bandwidth", str(cal["bandwidth"]),
            "--peak-flops", str(cal["peak_flops"]),
            "--matvec-flops", str(cal["matvec_flops"]),
            "--matvec-small-batch-flops",
            str(cal["matvec_small_batch_flops"]),
            "--matvec-batch-flops", str(cal["matvec_batch_flops"]),
            "--matvec-attention-flops", str(cal["matvec_attention_flops"]),
            "--matvec-batch-attention-flops",
            str(cal["matvec_batch_attention_flops"]),
            "--dequantize-rate", str(cal["dequantize_rate"])]

def prompts(n: int) -> list[str]:
    """n distinct prompts (no shared prefix block) from a few words to a
    few hundred."""
    out = []
    for i in range(n):
        length = 4 + (i * 53) % 260
        out.append(f"{i * 7919} " + " ".join(WORDS[(i + k) % len(WORDS)]
                                             for k in range(length)))
    return out


def model_shape(shardlm: str, model: str) -> dict:
    """The shape `shardlm inspect` reports."""
    r = run([shardlm, "inspect", model])
    shape = {}
    for line in r.stdout.splitlines():
        p = line.replace("(", " ").replace(")", " ").replace(",", " ").split()
        if len(p) < 2 or not p[1].isdigit():
            continue
        key = {"layers": "n_layers", "hidden": "hidden",
               "ffn_hidden": "ffn_hidden", "vocab": "vocab_size"}.get(p[0])
        if key:
            shape[key] = int(p[1])
        if p[0] == "heads" and len(p) >= 6:
            shape["n_heads"] = int(p[1])
            shape["n_kv_heads"] = int(p[3])
            shape["head_dim"] = int(p[5])
    return shape


def engine_bench(binary: str, model: str, threads: int, tp: int,
                 prompt: int, decode: int, batch: int = 1) -> dict:
    """Medians of five timed batches after a warm-up: single prefills on
    this VM vary by a third from one to the next."""
    with tempfile.NamedTemporaryFile(suffix=".json") as f:
        r = run([binary, "--model", model, "--threads", str(threads),
                 "--prompt-tokens", str(prompt), "--decode-tokens",
                 str(decode), "--tp", str(tp), "--batch", str(batch),
                 "--repeat", "5", "--json", f.name], timeout=900)
        if r.returncode != 0:
            raise RuntimeError(f"engine_bench failed: {r.stderr[-400:]}")
        return json.load(open(f.name))[0]


def calibrate(binary: str, model: str, threads: int, shape: dict,
              tp: int) -> dict:
    """The CPU profile's rates for one rank (1/tp of each layer), from
    engine_bench. One-sequence decode at a short (32-token) and a long
    (256-token) prompt: the short one gives the matrix-vector kernels' FLOP
    rate, the difference the rate of attention's FLOPs (4 x head_dim per
    query-key pair and query head). SMALL_BATCH sequences decoded side by
    side at 32 and 128 tokens of context: the difference gives the rate of the
    further sequences' attention (it splits over threads by sequence), and
    the short one against one sequence the rate of tokens 2 ..
    SMALL_BATCH of a step (the kernels read each weight row once for all
    of them); DECODE_MAX_ROWS sequences at the short context against
    SMALL_BATCH, the rate of each token after those; prefills of 32 and 256 tokens give the tiled path's per-step
    dequantization (the intercept) and its FLOP rate (the slope); the
    measured read bandwidth is the bandwidth. Each rate is what is left of
    a step once the others' shares and the communication are taken out."""
    s = shape
    kv_r = -(-s["n_kv_heads"] // tp)
    heads_r = kv_r * (s["n_heads"] // s["n_kv_heads"])
    layer = (s["hidden"] * s["head_dim"] * (2 * heads_r + 2 * kv_r) +
             3 * s["hidden"] * -(-s["ffn_hidden"] // tp))
    head = s["hidden"] * -(-s["vocab_size"] // tp)
    short = engine_bench(binary, model, threads, tp, 32, 32)
    small = engine_bench(binary, model, threads, tp, 32, 32,
                         batch=SMALL_BATCH)
    batched = engine_bench(binary, model, threads, tp, 32, 32,
                           batch=DECODE_MAX_ROWS)
    long = engine_bench(binary, model, threads, tp, 256, 64)
    # engine_bench prefills a batch in one step of at most 512 tokens.
    small_long = engine_bench(binary, model, threads, tp,
                              512 // SMALL_BATCH, 64, batch=SMALL_BATCH)
    weights = 2 * (s["n_layers"] * layer + head)  # FLOPs per token.

    def attention(run: dict) -> float:
        """Attention FLOPs of one decode token: its step's tokens sit at
        positions prompt .. prompt + decode - 1, each seeing position + 1
        keys."""
        keys = run["prompt_tokens"] + (run["decode_tokens"] + 1) / 2
        return s["n_layers"] * 4 * s["head_dim"] * heads_r * keys

    def compute(run: dict) -> float:
        """A decode step less its time in communicator calls."""
        step = run["decode_step_seconds"]
        return step * (1 - run.get("comm_share_of_step_time", 0)) \
            if tp > 1 else step

    # Attention's rate from the added context; none (folded into the
    # matrix-vector rates) if the VM's noise hides it.
    added = compute(long) - compute(short)
    per_attention_flop = max(0.0, added / (attention(long) - attention(short)))
    matvec = weights / (compute(short) - attention(short) * per_attention_flop)
    # The further sequences' attention: what the added context adds to a
    # small batch beyond its first sequence's share.
    further = SMALL_BATCH - 1
    added_attention = attention(small_long) - attention(small)
    added = (compute(small_long) - compute(small) -
             added_attention * per_attention_flop)
    per_batch_attention_flop = max(0.0, added / (further * added_attention))
    if per_batch_attention_flop == 0 or per_attention_flop == 0:
        # None measured, or attention folded into the weights' rates.
        per_batch_attention_flop = per_attention_flop

    def per_token(more: dict, less: dict, tokens: int) -> float:
        """A weights FLOP's seconds for each of `tokens` tokens a step of
        `more` has beyond one of `less`: the added time less their
        attention (the communication, a few messages of a few KB, grows
        little), or near nothing if the VM's noise hides it."""
        t = ((more["decode_step_seconds"] - less["decode_step_seconds"]) /
             tokens - attention(short) * per_batch_attention_flop)
        return t / weights if t > 0 else 0.01 / matvec

    per_small = per_token(small, short, further)
    per_batch = per_token(batched, small, DECODE_MAX_ROWS - SMALL_BATCH)
    # The TP link's alpha: the long run's communication over its step's 2
    # all-reduces per layer of 2 (tp - 1) ring hops each (and the logits'
    # gather).
    comm = long["decode_step_seconds"] - compute(long)
    alpha = comm / (2 * s["n_layers"] * 2 * (tp - 1) + 1) if tp > 1 else 0
    t_short = 32 / short["prefill_tokens_per_s"]
    t_long = 256 / long["prefill_tokens_per_s"]
    per_token = max(1e-9, (t_long - t_short) / (256 - 32))
    intercept = max(0.0, t_short - 32 * per_token)
    params = s["n_layers"] * layer + head
    return {"threads": threads, "tp": tp,
            "decode_tokens_per_s": long["decode_tokens_per_s"],
            "prefill32_tokens_per_s": short["prefill_tokens_per_s"],
            "prefill256_tokens_per_s": long["prefill_tokens_per_s"],
            "bandwidth": long["read_bandwidth_bytes_per_s"],
            "decode_step1_ms": 1e3 * short["decode_step_seconds"],
            "decode_step_long_ms": 1e3 * long["decode_step_seconds"],
            "decode_step_small_ms": 1e3 * small["decode_step_seconds"],
            "decode_step_small_long_ms":
                1e3 * small_long["decode_step_seconds"],
            "decode_step_batched_ms": 1e3 * batched["decode_step_seconds"],
            "matvec_flops": matvec,
            "matvec_small_batch_flops": 1 / per_small,
            "matvec_batch_flops": 1 / per_batch,
            "matvec_attention_flops": (1 / per_attention_flop
                                       if per_attention_flop > 0 else 0),
            "matvec_batch_attention_flops": (
                1 / per_batch_attention_flop
                if per_batch_attention_flop > 0 else 0),
            "peak_flops": 2 * s["n_layers"] * layer / per_token,
            "dequantize_rate": params / intercept if intercept > 0 else 0,
            "tp_link_alpha": alpha}


def cp_alpha(binary: str, model: str, shape: dict) -> float:
    """Seconds per message of the in-process communicator (what --cp's
    threads use too): engine_bench --tp 2 at one thread per rank, its
    decode step's communication over its 2 all-reduces per layer and the
    logits' gather."""
    run2 = engine_bench(binary, model, 1, 2, 256, 64)
    comm = (run2["decode_step_seconds"] *
            run2.get("comm_share_of_step_time", 0))
    return comm / (2 * shape["n_layers"] * 2 + 1)


def cp_rows(args, shape: dict, work: str) -> list:
    """Calibrates one thread, then for each prompt and CP degree runs
    `shardlm generate` and simulates the same request; a row per run."""
    sys.path.insert(0, os.path.dirname(__file__))
    from cp_prefill import BLOCK_BYTES, LINE, prompt  # noqa: E402
    cal = calibrate(args.engine_bench, args.model, 1, shape, 1)
    alpha = cp_alpha(args.engine_bench, args.model, shape)
    print(f"calibration for CP (1 thread per rank): decode steps at 32 / "
          f"256 tokens {cal['decode_step1_ms']:.2f} / "
          f"{cal['decode_step_long_ms']:.2f} ms -> matvec "
          f"{cal['matvec_flops'] / 1e9:.1f} GFLOP/s, attention "
          f"{cal['matvec_attention_flops'] / 1e9:.1f} GFLOP/s; prefill "
          f"{cal['prefill32_tokens_per_s']:.0f} / "
          f"{cal['prefill256_tokens_per_s']:.0f} tok/s -> "
          f"{cal['peak_flops'] / 1e9:.1f} GFLOP/s + dequantize "
          f"{cal['dequantize_rate'] / 1e9:.2f} G params/s; communicator "
          f"{alpha * 1e6:.1f} us per message", flush=True)
    rows = []
    cps = [int(c) for c in args.cp.split(",")]
    for paragraphs in (int(p) for p in args.cp_paragraphs.split(",")):
        text = prompt(paragraphs)
        # Blocks enough for the prompt and output at the largest CP;
        # every CP degree gets the same group total.
        group_blocks = max(cps) * (-(-(40 * paragraphs + args.cp_tokens) //
                                      16 // max(cps)) + 2)
        for cp in cps:
            pool = group_blocks // cp * BLOCK_BYTES

            def generate(text: str, tokens: int):
                """Runs generate; its stderr and CPU seconds (every
                rank's)."""
                before = resource.getrusage(resource.RUSAGE_CHILDREN)
                r = run([args.shardlm, "generate", "--model", args.model,
                         "--prompt", text, "--max-tokens", str(tokens),
                         "--ignore-eos", "--kv-cache-dtype", "f16",
                         "--device", "cpu", "--threads", "1", "--stats",
                         "--cp", str(cp), "--prefix-caching=false",
                         "--kv-cache-bytes", str(pool)], timeout=1800)
                after = resource.getrusage(resource.RUSAGE_CHILDREN)
                m = LINE.search(r.stderr)
                if r.returncode != 0 or m is None:
                    raise RuntimeError(f"generate --cp {cp} failed: "
                                       f"{r.stderr[-400:]}")
                return m, (after.ru_utime + after.ru_stime -
                           before.ru_utime - before.ru_stime)

            # What the work cost whatever the wait for cores shared with
            # other processes: the run's CPU seconds less those of a
            # one-token request (loading, start-up).
            _, idle = generate("Hi", 1)
            m, cpu = generate(text, args.cp_tokens)
            cpu -= idle
            tokens, generated = int(m[1]), int(m[3])
            load = os.getloadavg()[0]
            trace = os.path.join(work, "cp-trace.csv")
            with open(trace, "w") as f:
                f.write(f"0,{tokens},{generated}\n")
            sim_json = os.path.join(work, f"sim-cp{cp}-{tokens}.json")
            r = run([args.shardlm, "simulate", "--model-config", args.model,
                     "--gpu", "cpu-this-machine", "--cp", str(cp),
                     *calibration_flags(cal),
                     "--cp-link-alpha", str(alpha), "--step-overhead", "0",
                     "--weight-dtype", args.weight_dtype,
                     "--kv-cache-dtype", "f16", "--kv-cache-bytes",
                     str(pool), "--max-batched-tokens", "512",
                     "--concurrency", "1", "--client-gap", "0",
                     "--trace", trace, "--json", sim_json])
            if r.returncode != 0:
                raise RuntimeError(f"simulate failed: {r.stderr[-400:]}")
            sim = json.load(open(sim_json))
            measured = {"prefill_s": float(m[2]),
                        "decode_tokens_per_s": float(m[4]),
                        "cpu_s": cpu}
            # Every rank busy for the whole request (communication taken
            # as busy too: an upper bound).
            simulated = {"prefill_s": sim["ttft_s"]["p50"],
                         "decode_tokens_per_s": 1 / sim["tpot_s"]["p50"],
                         "cpu_s": cp * sim["e2e_s"]["p50"]}
            # Cores the run had on average: CPU seconds over the request's
            # wall time (CP C on C free cores would have close to C).
            wall = measured["prefill_s"] + (generated - 1) / max(
                measured["decode_tokens_per_s"], 1e-9)
            row = {"cp": cp, "prompt_tokens": tokens, "load": load,
                   "cores_used": cpu / wall,
                   "measured": measured, "simulated": simulated,
                   "cp_bytes_per_rank": sim["cp_bytes_per_rank"],
                   "calibration": cal, "cp_link_alpha": alpha,
                   "error": {k: simulated[k] / measured[k] - 1
                             for k in measured}}
            print(f"cp {cp}, {tokens} tokens (load {load:.1f}, "
                  f"{row['cores_used']:.2f} cores used): prefill "
                  f"{measured['prefill_s']:.2f} s measured, "
                  f"{simulated['prefill_s']:.2f} s simulated "
                  f"({100 * row['error']['prefill_s']:+.0f}%); decode "
                  f"{measured['decode_tokens_per_s']:.1f} / "
                  f"{simulated['decode_tokens_per_s']:.1f} tok/s "
                  f"({100 * row['error']['decode_tokens_per_s']:+.0f}%); "
                  f"CPU {measured['cpu_s']:.1f} / {simulated['cpu_s']:.1f} s "
                  f"({100 * row['error']['cpu_s']:+.0f}%)", flush=True)
            rows.append(row)
    return rows


def print_cp_table(rows: list, title: str) -> None:
    """The errors, and CP C's prefill speed-up over CP 1 of the same
    prompt, measured against simulated."""
    print(f"\n{title}context parallel, simulated / measured - 1")
    print(f"{'cp':>3} {'prompt':>7} {'prefill s (meas, sim)':>28} "
          f"{'decode tok/s (meas, sim)':>28} {'CPU s (meas, sim)':>28} "
          f"{'prefill speed-up':>17}")
    for row in rows:
        m, s, e = row["measured"], row["simulated"], row["error"]
        base = [r for r in rows
                if r["cp"] == 1 and r["prompt_tokens"] == row["prompt_tokens"]]
        gain = ""
        if base and row["cp"] > 1:
            b = base[0]
            gain = (f"{b['measured']['prefill_s'] / m['prefill_s']:.2f}x, "
                    f"{b['simulated']['prefill_s'] / s['prefill_s']:.2f}x")
        print(f"{row['cp']:>3} {row['prompt_tokens']:>7} "
              f"{m['prefill_s']:>9.2f} {s['prefill_s']:>8.2f} "
              f"{100 * e['prefill_s']:+7.0f}% "
              f"{m['decode_tokens_per_s']:>9.1f} "
              f"{s['decode_tokens_per_s']:>8.1f} "
              f"{100 * e['decode_tokens_per_s']:+7.0f}% "
              f"{m['cpu_s']:>9.1f} {s['cpu_s']:>8.1f} "
              f"{100 * e['cpu_s']:+7.0f}% {gain:>17}")


def median_cp_rows(rows: list) -> list:
    """Per CP degree and prompt, the median over rounds of each figure and
    error."""
    out = []
    keys = []
    for r in rows:
        if (r["cp"], r["prompt_tokens"]) not in keys:
            keys.append((r["cp"], r["prompt_tokens"]))
    for cp, tokens in keys:
        group = [r for r in rows
                 if r["cp"] == cp and r["prompt_tokens"] == tokens]
        row = {"cp": cp, "prompt_tokens": tokens}
        for part in ("measured", "simulated", "error"):
            row[part] = {k: statistics.median(g[part][k] for g in group)
                         for k in group[0][part]}
        row["range"] = {k: (min(g["error"][k] for g in group),
                            max(g["error"][k] for g in group))
                        for k in group[0]["error"]}
        out.append(row)
    return out


def prompt_tokens(http_port: int, texts: list[str]) -> list[int]:
    base = f"http://127.0.0.1:{http_port}/v1"
    with urllib.request.urlopen(f"{base}/models", timeout=60) as resp:
        model = json.load(resp)["data"][0]["id"]
    out = []
    for t in texts:
        body = json.dumps({"model": model, "prompt": t, "max_tokens": 1})
        req = urllib.request.Request(
            f"{base}/completions",
            data=body.encode(), headers={"Content-Type": "application/json"})
        with urllib.request.urlopen(req, timeout=60) as resp:
            out.append(json.load(resp)["usage"]["prompt_tokens"])
    return out


def print_table(rows: list, title: str) -> None:
    print(f"\n{title}simulated / measured - 1 (the goal: within 15% on "
          "throughput and medians)")
    print(f"{'layout':>7} {'conc':>5} {'out tok/s':>22} {'TTFT p50 ms':>22} "
          f"{'ITL p50 ms':>22} {'TTFT p99':>9} {'ITL p99':>8}")
    for row in rows:
        m, s, e = row["measured"], row["simulated"], row["error"]

        def cell(k):
            return (f"{m[k]:7.1f} {s[k]:7.1f} {100 * e.get(k, 0):+5.0f}%")

        print(f"{row['layout']:>7} {row['concurrency']:>5} "
              f"{cell('output_tokens_per_s'):>22} {cell('ttft_p50_ms'):>22} "
              f"{cell('itl_p50_ms'):>22} "
              f"{100 * e.get('ttft_p99_ms', 0):+8.0f}% "
              f"{100 * e.get('itl_p99_ms', 0):+7.0f}%")


def median_rows(rows: list) -> list:
    """Per layout and load, the median over rounds of each measured and
    simulated figure and of each error (not the error of the medians)."""
    out = []
    keys = []
    for r in rows:
        if (r["layout"], r["concurrency"]) not in keys:
            keys.append((r["layout"], r["concurrency"]))
    for layout, c in keys:
        group = [r for r in rows
                 if r["layout"] == layout and r["concurrency"] == c]
        row = {"layout": layout, "concurrency": c}
        for part in ("measured", "simulated", "error"):
            row[part] = {k: statistics.median(g[part][k] for g in group
                                              if k in g[part])
                         for k in group[0][part]}
        out.append(row)
    return out


def validate_layout(args, shape: dict, layout: str, texts: list[str],
                    prompts_file: str, work: str, rows: list,
                    calibrations: list) -> int:
    """Calibrates one TPxPP layout, measures it serving, simulates the same
    closed loops and appends the comparison to `rows`; 1 on a failure."""
    tp, pp = (int(x) for x in layout.split("x"))
    ranks = tp * pp
    threads = max(1, args.threads // ranks)
    cal = calibrate(args.engine_bench, args.model, threads, shape, tp)
    calibrations.append(cal)
    print(f"calibration tp {tp} x pp {pp} ({threads} thread(s) per rank): "
          f"decode steps at 32 / 256 tokens of context "
          f"{cal['decode_step1_ms']:.2f} / "
          f"{cal['decode_step_long_ms']:.2f} ms -> matvec "
          f"{cal['matvec_flops'] / 1e9:.1f} GFLOP/s, attention "
          f"{cal['matvec_attention_flops'] / 1e9:.1f} GFLOP/s; "
          f"{SMALL_BATCH} sequences at 32 / {512 // SMALL_BATCH} "
          f"{cal['decode_step_small_ms']:.2f} / "
          f"{cal['decode_step_small_long_ms']:.2f} ms -> further "
          f"sequences' attention "
          f"{cal['matvec_batch_attention_flops'] / 1e9:.1f} GFLOP/s; steps "
          f"of 1 / {SMALL_BATCH} / {DECODE_MAX_ROWS} tokens "
          f"{cal['decode_step1_ms']:.2f} / "
          f"{cal['decode_step_small_ms']:.2f} / "
          f"{cal['decode_step_batched_ms']:.2f} ms -> "
          f"{cal['matvec_small_batch_flops'] / 1e9:.1f} / "
          f"{cal['matvec_batch_flops'] / 1e9:.1f} GFLOP/s each further "
          f"token; prefill "
          f"{cal['prefill32_tokens_per_s']:.0f} / "
          f"{cal['prefill256_tokens_per_s']:.0f} tok/s (32 / 256) -> "
          f"{cal['peak_flops'] / 1e9:.1f} GFLOP/s + dequantize "
          f"{cal['dequantize_rate'] / 1e9:.2f} G params/s; read "
          f"bandwidth {cal['bandwidth'] / 1e9:.1f} GB/s; TP message "
          f"{cal['tp_link_alpha'] * 1e6:.1f} us", flush=True)

    http = free_port()
    server, addr = start_serve(
        args.shardlm, args.model,
        ["--tp", str(tp), "--pp", str(pp), "--threads", str(args.threads),
         "--prefix-caching=false",
         "--http-listen", f"127.0.0.1:{http}"])
    try:
        if not wait_ready(args.shardlm, addr, server):
            print("the server did not come up")
            return 1
        lengths = prompt_tokens(http, texts)
        out = os.path.join(work, f"bench-{layout}.json")
        r = run([args.shardlm, "bench", "--server", addr, "--concurrency",
                 args.concurrency, "--requests", str(args.requests),
                 "--max-tokens", str(args.max_tokens), "--prompts",
                 prompts_file, "--json", out], timeout=3600)
        if r.returncode != 0:
            print(f"bench failed: {r.stderr[-400:]}")
            return 1
        measured = json.load(open(out))["levels"]
    finally:
        stop(server)

    trace = os.path.join(work, "trace.csv")
    with open(trace, "w") as f:
        for i in range(args.requests):
            f.write(f"0,{lengths[i % len(lengths)]},{args.max_tokens}\n")
    # serve's defaults: KV for one full context (f16), 512 tokens a
    # step, 64 sequences.
    kv_bytes = (8192 * shape["n_layers"] * 2 *
                -(-shape["n_kv_heads"] // tp) * shape["head_dim"] * 2)
    for m in measured:
        c = m["concurrency"]
        sim_json = os.path.join(work, f"sim-{layout}-{c}.json")
        r = run([args.shardlm, "simulate", "--model-config", args.model,
                 "--gpu", "cpu-this-machine", "--tp", str(tp), "--pp",
                 str(pp), *calibration_flags(cal),
                 "--tp-link-alpha", str(cal["tp_link_alpha"]),
                 "--step-overhead", "0", "--weight-dtype",
                 args.weight_dtype, "--kv-cache-dtype", "f16",
                 "--kv-cache-bytes", str(kv_bytes),
                 "--max-batched-tokens", "512", "--max-seqs", "64",
                 "--concurrency", str(c), "--trace", trace,
                 "--json", sim_json])
        if r.returncode != 0:
            print(f"simulate failed: {r.stderr[-400:]}")
            return 1
        s = json.load(open(sim_json))
        row = {
            "layout": layout, "concurrency": c,
            "measured": {"output_tokens_per_s": m["output_tokens_per_s"],
                         "ttft_p50_ms": m["ttft_ms"]["p50"],
                         "ttft_p99_ms": m["ttft_ms"]["p99"],
                         "itl_p50_ms": m["itl_ms"]["p50"],
                         "itl_p99_ms": m["itl_ms"]["p99"]},
            "simulated": {"output_tokens_per_s": s["output_tokens_per_s"],
                          "ttft_p50_ms": 1e3 * s["ttft_s"]["p50"],
                          "ttft_p99_ms": 1e3 * s["ttft_s"]["p99"],
                          "itl_p50_ms": 1e3 * s["itl_s"]["p50"],
                          "itl_p99_ms": 1e3 * s["itl_s"]["p99"]},
        }
        row["error"] = {k: row["simulated"][k] / row["measured"][k] - 1
                        for k in row["measured"] if row["measured"][k] > 0}
        rows.append(row)
    return 0


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--shardlm", required=True)
    ap.add_argument("--engine-bench", required=True)
    ap.add_argument("--model", required=True)
    ap.add_argument("--layouts", default="1x1,2x1", help="TPxPP list")
    ap.add_argument("--concurrency", default="1,4,16")
    ap.add_argument("--requests", type=int, default=48)
    ap.add_argument("--max-tokens", type=int, default=64)
    ap.add_argument("--threads", type=int, default=os.cpu_count() or 2)
    ap.add_argument("--weight-dtype", default="q4_1")
    ap.add_argument("--rounds", type=int, default=1,
                    help="calibrate, measure and simulate this many times "
                    "(this VM drifts between runs: the median is reported)")
    ap.add_argument("--cp-paragraphs", default="",
                    help="context parallel: prompts of these many "
                    "paragraphs (27: ~1K tokens, 80: ~3K) through "
                    "generate --cp (empty: none)")
    ap.add_argument("--cp", default="1,2", help="CP degrees to run")
    ap.add_argument("--cp-tokens", type=int, default=32,
                    help="tokens generated after each CP prompt")
    ap.add_argument("--json")
    args = ap.parse_args()
    shape = model_shape(args.shardlm, args.model)
    if len(shape) != 7:
        print(f"could not read the model's shape from inspect: {shape}")
        return 1
    # One prompt per request, and the server's prefix cache off: the
    # simulated prompts share nothing either.
    texts = prompts(args.requests)
    work = tempfile.mkdtemp(prefix="simval-")
    prompts_file = os.path.join(work, "prompts.txt")
    with open(prompts_file, "w") as f:
        f.write("\n".join(texts) + "\n")

    rows = []
    calibrations = []
    cp_runs = []
    for rnd in range(args.rounds):
        if args.cp_paragraphs:
            try:
                more = cp_rows(args, shape, work)
            except RuntimeError as e:
                print(e)
                return 1
            for row in more:
                row["round"] = rnd
                cp_runs.append(row)
        for layout in filter(None, args.layouts.split(",")):
            first = len(rows)
            if validate_layout(args, shape, layout, texts, prompts_file, work,
                               rows, calibrations):
                return 1
            for row in rows[first:]:
                row["round"] = rnd
            calibrations[-1]["round"] = rnd

    for rnd in range(args.rounds if rows else 0):
        print_table([r for r in rows if r["round"] == rnd],
                    f"round {rnd + 1} of {args.rounds}: ")
    if rows and args.rounds > 1:
        print_table(median_rows(rows), f"median over {args.rounds} rounds: ")
    for rnd in range(args.rounds if cp_runs else 0):
        print_cp_table([r for r in cp_runs if r["round"] == rnd],
                       f"round {rnd + 1} of {args.rounds}: ")
    if cp_runs and args.rounds > 1:
        print_cp_table(median_cp_rows(cp_runs),
                       f"median over {args.rounds} rounds: ")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"calibration": calibrations, "runs": rows,
                       "median": median_rows(rows) if rows else [],
                       "cp_runs": cp_runs,
                       "cp_median": median_cp_rows(cp_runs)}, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
