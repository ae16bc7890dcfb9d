"""tests/gpu/session.sh end to end without a GPU: a dry run over stub
binaries (one passes, one fails, one hangs) and a step too long for what is
left of the budget. The budget holds, the hang is cut after a backtrace
attempt, OUT holds exactly summary.txt, summary.tsv and logs.tgz (with every
step's log), the summary is the last thing printed, and a session killed
from outside still leaves the logs of the steps it finished.

Usage: python3 tests/gpu/check_session.py"""

from __future__ import annotations

import csv
import os
import signal
import stat
import subprocess
import sys
import tarfile
import tempfile
import time

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))
from testlib import check, exit_code  # noqa: E402

SESSION = os.path.join(os.path.dirname(os.path.abspath(__file__)),
                       "session.sh")
STUBS = {
    "pass_test": "#!/bin/sh\necho '[       OK ] Stub.Passes'\nexit 0\n",
    "fail_test": "#!/bin/sh\necho '[  FAILED  ] Stub.Fails' >&2\nexit 1\n",
    "hang_test": "#!/bin/sh\necho 'waiting for a peer'\nexec sleep 1000\n",
}


def make_stubs(d: str) -> None:
    for name, text in STUBS.items():
        path = os.path.join(d, name)
        with open(path, "w") as f:
            f.write(text)
        os.chmod(path, os.stat(path).st_mode | stat.S_IXUSR)


def steps_file(d: str, rows: list[tuple[str, int, str]]) -> str:
    path = os.path.join(d, "steps.tsv")
    with open(path, "w") as f:
        f.write("# name\tcap\tcommand\n")
        for name, cap, cmd in rows:
            f.write(f"{name}\t{cap}\t{cmd}\n")
    return path


def summary(out: str) -> dict[str, list[str]]:
    with open(os.path.join(out, "summary.tsv")) as f:
        rows = list(csv.reader(f, delimiter="\t"))
    return {r[0]: r[1:] for r in rows[1:]}


def log_names(out: str) -> set[str]:
    with tarfile.open(os.path.join(out, "logs.tgz")) as t:
        return {os.path.basename(n) for n in t.getnames()}


def full_session(d: str) -> None:
    bins = os.path.join(d, "bin")
    os.mkdir(bins)
    make_stubs(bins)
    steps = steps_file(d, [
        ("passes", 20, f"{bins}/pass_test"),
        ("fails", 20, f"{bins}/fail_test"),
        ("hangs", 5, f"{bins}/hang_test"),
        ("too_long", 400, f"{bins}/pass_test"),
        ("after", 20, f"{bins}/pass_test"),
    ])
    out = os.path.join(d, "out")
    budget = 40
    start = time.monotonic()
    p = subprocess.run(["bash", SESSION, out, "--steps", steps],
                       env={**os.environ, "BUDGET": str(budget),
                            "PACK_EVERY": "1"},
                       capture_output=True, text=True, timeout=120)
    took = time.monotonic() - start
    print(p.stdout[-2000:], p.stderr[-1000:])
    check(p.returncode == 1, f"a failed and a hung step: exit 1 "
          f"(got {p.returncode})")
    check(took < budget + 15, f"the budget holds: {took:.1f} s for a "
          f"{budget} s budget")
    check(sorted(os.listdir(out)) == ["logs.tgz", "summary.tsv",
                                      "summary.txt"],
          f"OUT holds exactly three files: {sorted(os.listdir(out))}")
    s = summary(out)
    check(s.get("passes", [""])[0] == "PASS", f"passes: {s.get('passes')}")
    check(s.get("fails", [""])[0] == "FAIL" and "exit 1" in s["fails"][2],
          f"fails: FAIL with its exit code: {s.get('fails')}")
    check(s.get("hangs", [""])[0] == "TIMEOUT", f"hangs: {s.get('hangs')}")
    check(s.get("too_long", [""])[0] == "NOT-RUN" and
          "budget" in s["too_long"][2],
          f"a step longer than the budget left: NOT-RUN (budget): "
          f"{s.get('too_long')}")
    check(s.get("after", [""])[0] == "PASS",
          f"the steps after a hang still run: {s.get('after')}")
    logs = log_names(out)
    check({"passes.log", "fails.log", "hangs.log", "after.log"} <= logs,
          f"logs.tgz holds every step's log: {sorted(logs)}")
    check("hangs.backtrace" in logs, "the hang's backtrace attempt is kept")
    with tarfile.open(os.path.join(out, "logs.tgz")) as t:
        member = next(m for m in t.getmembers()
                      if m.name.endswith("hangs.backtrace"))
        text = t.extractfile(member).read().decode(errors="replace")
    check("backtrace of" in text and "sleep" in text,
          f"the backtrace names the hung process: {text[:200]!r}")
    with open(os.path.join(out, "summary.txt")) as f:
        text = f.read()
    check(p.stdout.rstrip().endswith(text.rstrip()),
          "summary.txt is the last thing printed")
    check("fail_test" in text or "Stub.Fails" in text,
          "the summary carries the failing step's last lines")
    # No process of the session is left behind.
    left = subprocess.run(["pgrep", "-f", f"{bins}/hang_test"],
                          capture_output=True, text=True).stdout.strip()
    check(left == "", f"the hung stub is gone (pids: {left or 'none'})")


def one_step(d: str) -> None:
    bins = os.path.join(d, "bin1")
    os.mkdir(bins)
    make_stubs(bins)
    steps = steps_file(d, [("fails", 20, f"{bins}/fail_test"),
                           ("passes", 20, f"{bins}/pass_test"),
                           ("again", 20, f"{bins}/pass_test")])
    out = os.path.join(d, "out1")
    p = subprocess.run(["bash", SESSION, out, "--steps", steps,
                        "--only", "passes"],
                       capture_output=True, text=True, timeout=60)
    s = summary(out)
    check(p.returncode == 0 and list(s) == ["passes"],
          f"--only runs the one step: rc {p.returncode}, {list(s)}")
    p = subprocess.run(["bash", SESSION, out, "--steps", steps,
                        "--only", "again,passes"],
                       capture_output=True, text=True, timeout=60)
    s = summary(out)
    check(p.returncode == 0 and list(s) == ["passes", "again"],
          f"--only a,b runs those steps in the list's order: "
          f"rc {p.returncode}, {list(s)}")
    p = subprocess.run(["bash", SESSION, out, "--steps", steps,
                        "--only", "passes,nonesuch"],
                       capture_output=True, text=True, timeout=60)
    check(p.returncode == 2 and "no step 'nonesuch'" in p.stderr,
          f"--only with an unknown step is refused: {p.stderr.strip()}")


def killed_session(d: str) -> None:
    bins = os.path.join(d, "bin2")
    os.mkdir(bins)
    make_stubs(bins)
    steps = steps_file(d, [("passes", 20, f"{bins}/pass_test"),
                           ("hangs", 300, f"{bins}/hang_test")])
    out = os.path.join(d, "out2")
    p = subprocess.Popen(["bash", SESSION, out, "--steps", steps],
                         env={**os.environ, "PACK_EVERY": "1"},
                         stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                         start_new_session=True)
    time.sleep(4)
    os.killpg(p.pid, signal.SIGKILL)  # As the device tool's timeout does.
    p.wait()
    check(os.path.exists(os.path.join(out, "logs.tgz")) and
          "passes.log" in log_names(out),
          "killed from outside: logs.tgz holds the finished step's log")
    check(summary(out).get("passes", [""])[0] == "PASS",
          "killed from outside: the summary of the finished steps is there")


TABLE = """[logprobs] token: text logprob (prob) | alternatives
   0: " ("               -0.9524 (0.386) | " (" -0.9524 "." -1.4970
   1: ","                -1.0851 (0.338) | "," -1.0851 " I" -1.1128
   2: " most"            -0.4424 (0.643) | " most" -0.4424 " I" -2.1472
   3: "\\"x"            -0.5423 (0.581) | "\\"x" -0.5423 " of" -0.9881
"""


def greedy_comparison(d: str) -> None:
    """compare_greedy.py, which the session's text checks use."""
    script = os.path.join(os.path.dirname(SESSION), "compare_greedy.py")

    def verdict(other: str) -> tuple[int, str]:
        a, b = os.path.join(d, "a.err"), os.path.join(d, "b.err")
        with open(a, "w") as f:
            f.write("shardlm: device: the CPU\n" + TABLE)
        with open(b, "w") as f:
            f.write(other)
        p = subprocess.run([sys.executable, script, a, b],
                           capture_output=True, text=True)
        return p.returncode, p.stdout.strip()

    rc, why = verdict(TABLE)
    check(rc == 0 and "all 4" in why, f"the same table agrees: {why}")
    drift = TABLE.replace("-0.4424 (0.643)", "-0.7424 (0.476)")
    rc, why = verdict(drift)
    check(rc == 1 and "token 2" in why, f"a logprob off by 0.3 differs: {why}")
    # Token 1 is a near tie on the reference (margin 0.028): the other pick
    # is allowed, and the rest is not compared.
    tie = TABLE.replace('1: ","                -1.0851', '1: " I"               -1.0900')
    tie = tie.replace('" most"', '" the"')
    rc, why = verdict(tie)
    check(rc == 0 and "near tie" in why, f"a flip at a near tie agrees: {why}")
    # Token 2 is not a near tie (margin 1.7).
    flip = TABLE.replace('2: " most"            -0.4424',
                         '2: " I"               -0.5000')
    rc, why = verdict(flip)
    check(rc == 1 and "margin" in why, f"a flip past the margin differs: {why}")
    rc, why = verdict("\n".join(TABLE.splitlines()[:3]))
    check(rc == 1 and "stops after 2" in why, f"a short answer differs: {why}")
    rc, why = verdict("no table at all")
    check(rc == 1, f"no table differs: {why}")


def main() -> int:
    with tempfile.TemporaryDirectory() as d:
        greedy_comparison(d)
        full_session(d)
        one_step(d)
        killed_session(d)
    return exit_code("session.sh keeps its budget, cuts hangs and returns "
                     "its three files")


if __name__ == "__main__":
    sys.exit(main())
