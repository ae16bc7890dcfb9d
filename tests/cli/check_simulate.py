#!/usr/bin/env python3
"""`shardlm simulate` end to end (issue #17): bad flags and traces are usage
errors that say what is wrong; a trace's requests all end (finished or
refused with a reason) with no leaked KV block and the token counts the trace
asks for; the SmolLM2 preset and the real GGUF give the same report (the
preset is the file's config); more replicas under an overload cut queueing;
--sweep ranks layouts by devices; and --cp reports the bytes each CP rank
sends, as docs/design-notes.md's formula gives them.

  check_simulate.py --shardlm BIN --gguf MODEL --workdir DIR
"""

from __future__ import annotations

import argparse
import json
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))
from testlib import FAILURES, check, run  # noqa: E402


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--shardlm", required=True)
    ap.add_argument("--gguf", required=True)
    ap.add_argument("--workdir", required=True)
    args = ap.parse_args()
    os.makedirs(args.workdir, exist_ok=True)
    sim = [args.shardlm, "simulate"]

    def usage_error(extra: list[str], needle: str) -> None:
        r = run(sim + extra)
        check(r.returncode == 2 and needle in r.stderr,
              f"simulate {' '.join(extra)} -> exit 2 naming '{needle}' "
              f"(got {r.returncode}: {r.stderr.strip()[:160]})")

    usage_error(["--poisson", "1"], "--model-config is required")
    usage_error(["--model-config", "llama3-8b"], "give one of --trace")
    usage_error(["--model-config", "llama3-8b", "--poisson", "1",
                 "--gpu", "tpu9"], "known: h100")
    usage_error(["--model-config", "llama9", "--poisson", "1"],
                "no model preset 'llama9'")
    usage_error(["--model-config", "llama3-8b", "--poisson", "1",
                 "--tp", "16"], "tp exceeds the 8 KV heads")
    usage_error(["--model-config", "llama3-70b", "--poisson", "1"],
                "do not fit")
    usage_error(["--model-config", "llama3-8b", "--poisson", "1",
                 "--prompt-len", "uniform:9:3"], "B is less than A")
    bad_trace = os.path.join(args.workdir, "bad.csv")
    with open(bad_trace, "w") as f:
        f.write("0.0,10,10\n1.0,ten,10\n")
    usage_error(["--model-config", "llama3-8b", "--trace", bad_trace],
                "bad.csv:2:")

    # A trace: every request ends, with the tokens it asked for.
    trace = os.path.join(args.workdir, "trace.csv")
    rows = [(0.01 * i, 20 + (i * 37) % 300, 1 + (i * 13) % 60)
            for i in range(200)]
    rows.append((2.5, 9000, 10))  # Beyond SmolLM2's 8,192 context.
    with open(trace, "w") as f:
        f.write("arrival,prompt,output\n")
        for a, p, o in rows:
            f.write(f"{a:.3f},{p},{o}\n")
    out = os.path.join(args.workdir, "report.json")
    r = run(sim + ["--model-config", "smollm2-135m", "--gpu", "a100",
                   "--trace", trace, "--json", out])
    check(r.returncode == 0, f"simulate a trace (exit {r.returncode}: "
          f"{r.stderr.strip()[:200]})")
    if r.returncode == 0:
        rep = json.load(open(out))
        check(rep["requests"] == 201 and rep["finished"] == 200 and
              rep["refused"] == {"context_length": 1},
              f"200 finished, 1 refused for its length ({rep['finished']}, "
              f"{rep['refused']})")
        check(rep["output_tokens"] == sum(o for _, _, o in rows[:200]),
              f"output tokens are the trace's ({rep['output_tokens']})")
        check(rep["prompt_tokens"] == sum(p for _, p, _ in rows[:200]),
              "prompt tokens are the trace's")
        check(rep["leaked_blocks"] == 0, "no KV block leaked")
        check(0 < rep["ttft_s"]["p50"] <= rep["e2e_s"]["p50"],
              "0 < TTFT <= end to end")
        check("time to first token" in r.stdout, "a readable report")

    # The preset is the GGUF's config: the same report.
    reports = []
    for cfg in ("smollm2-135m", args.gguf):
        path = os.path.join(args.workdir, "same.json")
        r = run(sim + ["--model-config", cfg, "--gpu", "h100", "--poisson",
                       "50", "--duration", "20", "--seed", "5",
                       "--json", path])
        check(r.returncode == 0, f"simulate --model-config {cfg}")
        if r.returncode == 0:
            rep = json.load(open(path))
            for k in ("wall_s", "planner_wall_s"):
                rep.pop(k)
            reports.append(rep)
    check(len(reports) == 2 and reports[0] == reports[1],
          "the smollm2-135m preset and the GGUF give the same report")

    # Overload one replica; four cut the queueing.
    p90 = []
    for replicas in ("1", "4"):
        path = os.path.join(args.workdir, f"r{replicas}.json")
        r = run(sim + ["--model-config", "llama3-8b", "--gpu", "h100",
                       "--poisson", "60", "--duration", "30",
                       "--replicas", replicas, "--json", path])
        if r.returncode == 0:
            p90.append(json.load(open(path))["queueing_s"]["p90"])
    check(len(p90) == 2 and p90[1] < p90[0] / 2,
          f"4 replicas queue less than half as long at p90 ({p90})")

    # A sweep: layouts meeting the SLOs, fewest devices first.
    path = os.path.join(args.workdir, "sweep.json")
    r = run(sim + ["--model-config", "llama3-70b", "--gpu", "h100",
                   "--poisson", "20", "--duration", "20", "--slo-ttft", "1",
                   "--slo-tpot", "0.1", "--sweep", "tp=1,2,4,8", "pp=1,2",
                   "--max-gpus", "64", "--json", path])
    check(r.returncode == 0, f"simulate --sweep (exit {r.returncode}: "
          f"{r.stderr.strip()[:200]})")
    if r.returncode == 0:
        rows = json.load(open(path))
        devices = [x["tp"] * x["pp"] * x["replicas"] for x in rows]
        check(len(rows) >= 2 and devices == sorted(devices),
              f"layouts ranked by devices ({devices})")
        check(all(x["report"]["slo_attainment"] >= 0.9 for x in rows),
              "every listed layout meets the SLOs")
        check("tp 1 x pp 1" in r.stdout and "do not fit" in r.stdout,
              "a layout whose weights do not fit says so")

    # Context parallel: one 3,000-token prompt in chunks of 512 and 31
    # decode steps. Per layer a CP 2 rank sends its slice's Q, K and V
    # (ceil(n / 2) rows of (9 + 2 x 3) x 64 f32) when n >= 2, and the output
    # and lse of all n queries (9 x 65 f32 each); the last chunk's logit row
    # (576 f32) is summed. SmolLM2: 30 layers.
    cp_reports = {}
    for cp in ("1", "2"):
        path = os.path.join(args.workdir, f"cp{cp}.json")
        r = run(sim + ["--model-config", "smollm2-135m", "--gpu",
                       "cpu-this-machine", "--cp", cp, "--concurrency", "1",
                       "--requests", "1", "--prompt-len", "3000",
                       "--output-len", "32", "--max-batched-tokens", "512",
                       "--kv-cache-dtype", "f16", "--json", path])
        check(r.returncode == 0, f"simulate --cp {cp} (exit {r.returncode}: "
              f"{r.stderr.strip()[:200]})")
        if r.returncode == 0:
            cp_reports[cp] = json.load(open(path))
    if len(cp_reports) == 2:
        chunks = [512] * 5 + [440]
        gather = sum(30 * (-(-n // 2) * 15 * 64 * 4 + n * 9 * 65 * 4)
                     for n in chunks) + 31 * 30 * 9 * 65 * 4
        got = cp_reports["2"]["cp_bytes_per_rank"]
        check(got == {"all_gather": gather, "all_reduce": 576 * 4},
              f"CP 2's bytes per rank: {got}, want all_gather {gather}, "
              f"all_reduce {576 * 4}")
        check(cp_reports["1"]["cp_bytes_per_rank"] ==
              {"all_gather": 0, "all_reduce": 0}, "CP 1 sends nothing")
        t1 = cp_reports["1"]["ttft_s"]["p50"]
        t2 = cp_reports["2"]["ttft_s"]["p50"]
        check(t2 < 0.7 * t1, f"CP 2 prefills faster ({t2:.2f} s against "
              f"{t1:.2f} s)")

    if FAILURES:
        print(f"{len(FAILURES)} check(s) failed")
        return 1
    print("all simulate checks passed")
    return 0


if __name__ == "__main__":
    sys.exit(main())
