#!/usr/bin/env python3
"""The cluster under mpirun (DESIGN.md sections 1 and 3), end to end.

1. Equivalence: for each TP x PP layout, a real cluster (`mpirun ... shardlm
   launch`: a coordinator process and TP*PP worker processes exchanging
   activations over MPI, controlled over gRPC) answers prompts through the
   public API with exactly the text of TP = PP = 1 in one process (32
   greedy tokens, end-of-text ignored), and at every one of those steps
   the log-probabilities of the chosen token and of the 5 most likely
   ones within 2e-3 of the single process's (both with f32 KV caches, so
   that the check measures the sharding, not the cache's rounding).
   SmolLM2 (9 query / 3 KV heads: uneven TP splits) and a synthetic model
   with 8 / 4 heads (TP = 4); with --hybrid, the tiny Qwen3.5 (its state
   slots across processes) at TP 2 x PP 2, and in the overlap check below.
2. Failure: killing a worker mid-generation fails the stream with
   UNAVAILABLE within 10 s, naming that worker's rank and pid; the
   coordinator stays up and fails later requests at once.
   Steps in flight: 16 concurrent streams at PP = 2 and 3 get the same
   text as one process, with more than one step in flight at once.
3. Drain: SIGTERM to every process with a stream in flight lets it finish
   with all its tokens, then every rank exits.
4. Bad launches end every rank with one clear message, never a hang: wrong
   world size, TP above the KV head count, the model missing on one node,
   model files differing between nodes (nodes are simulated with mpirun's
   per-rank working directories).

  check_cluster.py --shardlm BIN --gguf MODEL --workdir DIR
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import signal
import subprocess
import sys
import time
import urllib.request

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "reference"))

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))
from testlib import FAILURES, check, free_port, prometheus_series  # noqa: E402

MPIRUN = ["mpirun", "--oversubscribe", "--enable-recovery"]
if os.geteuid() == 0:
    MPIRUN.insert(1, "--allow-run-as-root")

PROMPTS = ["The capital of France is",
           "def fibonacci(n):\n    ",
           "<|im_start|>user\nName three colors.<|im_end|>\n<|im_start|>assistant\n"]


class Cluster:
    """mpirun -np 1+tp*pp*cp shardlm launch, serving on a free local port."""

    def __init__(self, shardlm: str, model: str, tp: int, pp: int, log: str,
                 extra: list[str] | tuple = (), cp: int = 1):
        self.port = free_port()
        self.log_path = log
        self.log = open(log, "w")
        self.proc = subprocess.Popen(
            MPIRUN + ["-np", str(1 + tp * pp * cp), shardlm, "launch",
                      "--model", model, "--tp", str(tp), "--pp", str(pp),
                      *(["--cp", str(cp)] if cp > 1 else []),
                      "--listen", f"127.0.0.1:{self.port}",
                      "--worker-timeout-ms", "3000", *extra],
            stdout=self.log, stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL, start_new_session=True)
        self.address = f"127.0.0.1:{self.port}"

    def wait_serving(self, timeout: float = 180) -> bool:
        deadline = time.time() + timeout
        while time.time() < deadline:
            if self.proc.poll() is not None:
                return False
            with open(self.log_path) as f:
                if "[shardlm] serving" in f.read():
                    return True
            time.sleep(0.3)
        return False

    def worker_pids(self) -> dict[int, int]:
        """MPI rank -> pid of each shardlm process of this job."""
        out = subprocess.run(["pgrep", "-s", str(self.proc.pid), "-f",
                              "shardlm launch"], capture_output=True,
                             text=True).stdout.split()
        ranks = {}
        for pid in map(int, out):
            try:
                env = open(f"/proc/{pid}/environ", "rb").read().split(b"\0")
            except OSError:
                continue
            for kv in env:
                if kv.startswith(b"OMPI_COMM_WORLD_RANK="):
                    ranks[int(kv.split(b"=")[1])] = pid
        return ranks

    def stop(self) -> None:
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait()
        self.log.close()

    def tail(self) -> str:
        with open(self.log_path) as f:
            return "".join(f.readlines()[-15:])


def generate(shardlm: str, where: list[str], prompt: str, n: int = 32,
             timeout: float = 300,
             extra: list[str] | tuple = ()) -> subprocess.CompletedProcess:
    return subprocess.run([shardlm, "generate", *where, "--prompt", prompt,
                           "--max-tokens", str(n), "--ignore-eos", *extra],
                          capture_output=True, text=True, timeout=timeout,
                          stdin=subprocess.DEVNULL)


QUOTED = r'"((?:[^"\\]|\\.)*)"'
STEP = re.compile(r"^\s*(\d+): " + QUOTED + r"\s+(-?\d+\.\d+) \([0-9.]+\) \|(.*)$")
ALTERNATIVE = re.compile(QUOTED + r" (-?\d+\.\d+)")
LOGPROB_TOL = 2e-3  # Printed to 4 decimals; f32 sharding noise is ~1e-4.


def step_logprobs(stderr: str) -> list[dict[str, float]]:
    """Per step of `generate --logprobs` output: {token text: logprob} of
    the chosen token and the printed alternatives."""
    steps = []
    for line in stderr.splitlines():
        m = STEP.match(line)
        if m:
            step = {m[2]: float(m[3])}
            step.update((t, float(lp)) for t, lp in ALTERNATIVE.findall(m[4]))
            steps.append(step)
    return steps


def logprob_error(got: list[dict[str, float]],
                  want: list[dict[str, float]]) -> float:
    """The largest difference over tokens printed at the same step by both
    (a near-tie can swap which ids make the top 5); inf when the step
    counts differ or nothing was compared."""
    if len(got) != len(want) or not want:
        return float("inf")
    worst, compared = 0.0, 0
    for g, w in zip(got, want):
        for text in g.keys() & w.keys():
            worst = max(worst, abs(g[text] - w[text]))
            compared += 1
    return worst if compared >= len(want) else float("inf")


KV = ["--kv-cache-dtype", "f32"]


def local_references(a, model: str, tag: str) -> dict:
    """prompt -> (text, per-step log-probabilities) of TP = PP = 1 in one
    process, with f32 KV."""
    local = {}
    for p in PROMPTS:
        r = generate(a.shardlm, ["--model", model, "--threads", "1"], p,
                     extra=[*KV, "--logprobs", "5"])
        check(r.returncode == 0, f"[{tag}] local generate ({r.stderr.strip()})")
        local[p] = (r.stdout, step_logprobs(r.stderr))
        check(len(local[p][1]) == 32,
              f"[{tag}] local generate printed 32 steps of log-probabilities "
              f"({len(local[p][1])})")
    return local


def check_like_local(name: str, prompt: str, r, want, seconds: float):
    """`r` (generate --logprobs 5 through a cluster) has the text of `want`
    and every step's log-probabilities within LOGPROB_TOL."""
    want_text, want_lp = want
    same = r.returncode == 0 and r.stdout == want_text
    check(same, f"[{name}] {prompt[:24]!r}: same 32 tokens as tp1 pp1 "
          f"in one process ({seconds:.1f}s)"
          + ("" if same else f"\n  got  {r.stdout!r}\n  want "
             f"{want_text!r}\n  {r.stderr.strip()[-500:]}"))
    err = logprob_error(step_logprobs(r.stderr), want_lp)
    check(err <= LOGPROB_TOL,
          f"[{name}] {prompt[:24]!r}: every step's log-probabilities "
          f"within {LOGPROB_TOL:g} of tp1 pp1 (max {err:.2g})")


def equivalence(a, model: str, layouts: list[tuple[int, int]], tag: str):
    local = local_references(a, model, tag)
    for tp, pp in layouts:
        name = f"{tag} tp{tp} pp{pp}"
        c = Cluster(a.shardlm, model, tp, pp,
                    os.path.join(a.workdir, f"{tag}_tp{tp}_pp{pp}.log"), KV)
        try:
            up = c.wait_serving()
            check(up, f"[{name}] cluster serves" + ("" if up else "\n" + c.tail()))
            if not up:
                continue
            for p in PROMPTS:
                t0 = time.time()
                r = generate(a.shardlm, ["--server", c.address], p,
                             extra=["--logprobs", "5"])
                check_like_local(name, p, r, local[p], time.time() - t0)
        finally:
            c.stop()


def overlap(a, model: str):
    """Steps in flight (issue #12): 16 concurrent streams at PP=2 and PP=3
    each get the text of TP = PP = 1 in one process, while /metrics shows
    that more than one step was in flight at once."""
    prompts = [f"Write one sentence about the number {i}." for i in range(16)]
    n = 24
    want = {}
    for p in prompts:
        r = generate(a.shardlm, ["--model", model, "--threads", "1"], p, n,
                     extra=KV)
        check(r.returncode == 0, f"[overlap] local generate ({r.stderr[-200:]})")
        want[p] = r.stdout
    for pp in (2, 3):
        http = free_port()
        name = f"overlap pp{pp}"
        c = Cluster(a.shardlm, model, 1, pp,
                    os.path.join(a.workdir, f"overlap_pp{pp}.log"),
                    [*KV, "--http-listen", f"127.0.0.1:{http}"])
        try:
            if not c.wait_serving():
                check(False, f"[{name}] cluster serves\n" + c.tail())
                continue
            t0 = time.time()
            clients = [subprocess.Popen(
                [a.shardlm, "generate", "--server", c.address, "--prompt", p,
                 "--max-tokens", str(n), "--ignore-eos"],
                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
                for p in prompts]
            got = [cl.communicate(timeout=300)[0] for cl in clients]
            same = [g == want[p] for g, p in zip(got, prompts)]
            check(all(same), f"[{name}] 16 concurrent streams: each the text "
                  f"of tp1 pp1 in one process ({sum(same)}/16 equal, "
                  f"{time.time() - t0:.1f}s)")
            with urllib.request.urlopen(
                    f"http://127.0.0.1:{http}/metrics", timeout=10) as m:
                series = prometheus_series(m.read().decode())
            most = series.get('shardlm_steps_in_flight{which="max"}', 0)
            check(most >= 2, f"[{name}] steps in flight at once: up to "
                  f"{most:g} (>= 2)")
        finally:
            c.stop()


def kill_worker(a, model: str):
    c = Cluster(a.shardlm, model, 2, 2, os.path.join(a.workdir, "kill.log"))
    try:
        if not c.wait_serving():
            check(False, "[kill] cluster serves\n" + c.tail())
            return
        ranks = c.worker_pids()
        check(sorted(ranks) == [0, 1, 2, 3, 4], f"[kill] found ranks {ranks}")
        victim = 3
        client = subprocess.Popen(
            [a.shardlm, "generate", "--server", c.address, "--prompt",
             "Tell me a long story about a dragon.", "--max-tokens", "3000",
             "--ignore-eos"], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
            text=True)
        first = client.stdout.read(1)  # Generating: a token arrived.
        os.kill(ranks[victim], signal.SIGKILL)
        killed = time.time()
        try:
            out, err = client.communicate(timeout=30)
        except subprocess.TimeoutExpired:
            client.kill()
            out, err = client.communicate()
        took = time.time() - killed
        check(client.returncode != 0 and "UNAVAILABLE" in err,
              f"[kill] stream fails with UNAVAILABLE ({err.strip()})")
        check(took <= 10, f"[kill] within 10 s of the kill ({took:.1f}s)")
        check(f"rank {victim}" in err and str(ranks[victim]) in err,
              f"[kill] the error names rank {victim} (pid {ranks[victim]})")
        check(len(first + out) > 0, "[kill] tokens streamed before the kill")
        check(c.proc.poll() is None and os.path.exists(f"/proc/{ranks[0]}"),
              "[kill] the coordinator stays up")
        t0 = time.time()
        r = generate(a.shardlm, ["--server", c.address], "hi", 4, timeout=30)
        check(r.returncode != 0 and "UNAVAILABLE" in r.stderr
              and f"rank {victim}" in r.stderr and time.time() - t0 < 5,
              f"[kill] a later request fails at once naming the rank "
              f"({r.stderr.strip()})")
    finally:
        c.stop()


def drain(a, model: str):
    """SIGTERM to every shardlm process of the job (as pods get it; mpirun
    itself is not signalled: it kills its job a few seconds after a
    SIGTERM) with a stream in flight: the stream completes with every
    token, then the whole job exits."""
    c = Cluster(a.shardlm, model, 1, 2, os.path.join(a.workdir, "drain.log"),
                ["--drain-timeout-s", "120"])
    try:
        if not c.wait_serving():
            check(False, "[drain] cluster serves\n" + c.tail())
            return
        n = 150
        stream = subprocess.Popen(
            [a.shardlm, "generate", "--server", c.address, "--prompt",
             "Tell me a story.", "--max-tokens", str(n), "--ignore-eos",
             "--stats"], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
            text=True)
        stream.stdout.read(1)  # Streaming.
        for pid in c.worker_pids().values():  # Rank 0 included.
            os.kill(pid, signal.SIGTERM)
        _, err = stream.communicate(timeout=120)
        m = re.search(r"generated (\d+) tokens", err)
        check(stream.returncode == 0 and m and int(m.group(1)) == n,
              f"[drain] the stream in flight completes with all {n} tokens "
              f"({err.strip()[-200:]})")
        try:
            c.proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            pass
        check(c.proc.poll() is not None and "drained" in open(c.log_path).read(),
              "[drain] then every rank exits\n" + c.tail())
    finally:
        c.stop()


def bad_launches(a, model: str):
    def launch(args: list[str], want: str, what: str):
        t0 = time.time()
        try:
            r = subprocess.run(MPIRUN + args, capture_output=True, text=True,
                               timeout=90, stdin=subprocess.DEVNULL, start_new_session=True)
            err = r.stdout + r.stderr
        except subprocess.TimeoutExpired:
            err = "(hung: killed after 90 s)"
        messages = [l for l in err.splitlines() if "shardlm launch" in l]
        check(want in err and len(messages) == 1,
              f"[bad launch] {what}: one message naming the problem in "
              f"{time.time() - t0:.1f}s ({' / '.join(err.strip().splitlines()[:4])})")

    b = a.shardlm
    launch(["-np", "4", b, "launch", "--model", model, "--tp", "2", "--pp",
            "2"], "needs 1 + 4 = 5", "world size other than 1 + TP*PP")
    launch(["-np", "5", b, "launch", "--model", model, "--tp", "4"],
           "exceeds the model's 3 KV heads", "TP above the KV heads")
    # Nodes: directories with the model, without it, with a different file.
    good, missing, other = (os.path.join(a.workdir, d)
                            for d in ("node_good", "node_missing", "node_other"))
    for d in (good, missing, other):
        os.makedirs(d, exist_ok=True)
    dst = os.path.join(good, "m.gguf")
    if not os.path.exists(dst):
        os.symlink(os.path.abspath(model), dst)
    changed = os.path.join(other, "m.gguf")
    if not os.path.exists(changed):
        shutil.copy(model, changed)
        with open(changed, "r+b") as f:  # Same size, other bytes at the end.
            f.seek(-100, os.SEEK_END)
            f.write(b"\x01" * 100)
    common = [b, "launch", "--model", "m.gguf", "--tp", "1", "--pp", "2"]
    launch(["-np", "2", "-wdir", good, *common, ":", "-np", "1", "-wdir",
            missing, *common], "rank 2: ", "model missing on one node")
    launch(["-np", "2", "-wdir", good, *common, ":", "-np", "1", "-wdir",
            other, *common], "differ", "model files differ between nodes")


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--shardlm", required=True)
    ap.add_argument("--gguf", required=True)
    ap.add_argument("--workdir", required=True)
    ap.add_argument("--layouts", default="2x1,3x1,1x2,1x3,2x2")
    ap.add_argument("--hybrid", help="a hybrid model (the tiny qwen35 GGUF): "
                    "its state slots across processes, TP 2 x PP 2 and 16 "
                    "streams with steps in flight")
    a = ap.parse_args()
    # mpirun -wdir resolves a relative program path in that directory.
    a.shardlm = os.path.abspath(a.shardlm)
    os.makedirs(a.workdir, exist_ok=True)
    layouts = [tuple(map(int, l.split("x"))) for l in a.layouts.split(",")]
    equivalence(a, a.gguf, [(1, 1)] + layouts, "smollm2")

    # The synthetic model (8 query / 4 KV heads, 4 layers) for TP = 4, with
    # SmolLM2's tokenizer saved as its tokenizer.json.
    import hf_tokenizer
    import make_synthetic_model
    syn = os.path.join(a.workdir, "synthetic")
    tok = os.path.join(a.workdir, "tokenizer.json")
    hf_tokenizer.build_from_gguf(a.gguf).save(tok)
    subprocess.run([sys.executable, make_synthetic_model.__file__, syn,
                    "--tokenizer-json", tok, "--no-check"], check=True,
                   capture_output=True)
    equivalence(a, syn, [(4, 1), (2, 2)], "synthetic")

    overlap(a, a.gguf)
    if a.hybrid:
        # Each sequence's recurrent state in its slot on every worker,
        # named in the step plans (StepInput::state_slots) over the wire.
        equivalence(a, a.hybrid, [(2, 2)], "qwen35")
        overlap(a, a.hybrid)
    kill_worker(a, a.gguf)
    drain(a, a.gguf)
    bad_launches(a, a.gguf)
    print(f"{len(FAILURES)} failed" if FAILURES else "all cluster checks passed")
    return 1 if FAILURES else 0


if __name__ == "__main__":
    sys.exit(main())
