"""The test machinery tested: a skipped case never hides a failed one.

On a probe binary built on the shared test main (test_main_probe.cc: cases
Probe.Passes, Probe.Fails, Probe.Skips):
  1. the main's exit status: 0 all passed, 77 some skipped and none failed,
     1 when any failed (whatever skipped) or when no case ran;
  2. ctest, with the properties every shardlm_test gets
     (cmake/gtest_properties.cmake, included into a scratch project):
     a failed-and-skipped binary fails ctest, prints its failure, and is
     "fail" in the JUnit results; a skipped one is "notrun";
  3. CI's gate (scripts/ctest_gate.py) fails on a skip outside its
     allow-list, lets a gpu-labelled one pass where no GPU is, and prints
     the skip's reason.

  check_skip_semantics.py --probe BIN --properties CMAKE --gate PY --workdir DIR
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import shutil
import subprocess
import sys
import xml.etree.ElementTree as ET

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))
from testlib import FAILURES, check  # noqa: E402

CASES = {  # ctest name -> (gtest filter, labels)
    "passes": ("Probe.Passes", "unit"),
    "skips": ("Probe.Skips", "unit"),
    "skips_gpu": ("Probe.Skips", "gpu"),
    "fails_and_skips": ("Probe.Fails:Probe.Skips", "unit"),
}


def run(cmd, cwd=None):
    return subprocess.run(cmd, cwd=cwd, capture_output=True, text=True,
                          timeout=60, stdin=subprocess.DEVNULL)


def statuses(junit):
    return {c.get("name"): c.get("status")
            for c in ET.parse(junit).getroot().iter("testcase")}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--probe", required=True)
    ap.add_argument("--properties", required=True)
    ap.add_argument("--gate", required=True)
    ap.add_argument("--workdir", required=True)
    a = ap.parse_args()

    print("== 1. the test main's exit status")
    for flt, want in [("Probe.Passes", 0), ("Probe.Skips", 77),
                      ("Probe.Passes:Probe.Skips", 77), ("Probe.Fails", 1),
                      ("Probe.Fails:Probe.Skips", 1), ("NoSuchCase.*", 1)]:
        r = run([a.probe, f"--gtest_filter={flt}"])
        check(r.returncode == want, f"{flt}: exit {r.returncode}, want {want}")

    print("== 2. ctest with shardlm_test's properties")
    shutil.rmtree(a.workdir, ignore_errors=True)
    src, build = os.path.join(a.workdir, "src"), os.path.join(a.workdir, "b")
    os.makedirs(src)
    lines = ["cmake_minimum_required(VERSION 3.22)", "project(probe NONE)",
             "enable_testing()", f'include("{a.properties}")']
    for name, (flt, labels) in CASES.items():
        lines.append(f'add_test(NAME {name} COMMAND "{a.probe}" '
                     f'--gtest_filter={flt})')
        lines.append(f'shardlm_gtest_properties({name} "{labels}")')
    with open(os.path.join(src, "CMakeLists.txt"), "w") as f:
        f.write("\n".join(lines) + "\n")
    r = run(["cmake", "-S", src, "-B", build])
    check(r.returncode == 0, "the scratch project configures"
          + ("" if r.returncode == 0 else f": {r.stderr[-400:]}"))
    if r.returncode != 0:
        return 1

    def ctest(regex, tag):
        junit = os.path.join(a.workdir, f"{tag}.xml")
        r = run(["ctest", "-R", regex, "--output-on-failure",
                 "--output-junit", junit], cwd=build)
        return r, junit

    r, junit = ctest("^fails_and_skips$", "fails_and_skips")
    check(r.returncode != 0,
          f"a binary with a failed and a skipped case fails ctest "
          f"(exit {r.returncode})")
    check(statuses(junit).get("fails_and_skips") == "fail",
          f"...and is 'fail' in the JUnit results ({statuses(junit)})")
    check("the probe's deliberate failure" in r.stdout,
          "...and --output-on-failure prints its failure")
    r, skip_junit = ctest("^skips$", "skips")
    check(r.returncode == 0, f"a skipped binary does not fail ctest itself "
          f"(exit {r.returncode}): the gate must")
    check(statuses(skip_junit).get("skips") == "notrun",
          f"...and is 'notrun' in the JUnit results ({statuses(skip_junit)})")
    r, pass_junit = ctest("^passes$|^skips_gpu$", "passes")
    check(r.returncode == 0, f"passed + gpu-skipped: ctest exit {r.returncode}")

    print("== 3. CI's skip gate")
    spec = importlib.util.spec_from_file_location("ctest_gate", a.gate)
    gate_mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(gate_mod)

    def gate(junit):
        return run([sys.executable, a.gate, "--build-dir", build,
                    "--junit", junit, "--phase", "probe"])

    g = gate(skip_junit)
    print(g.stdout, end="")
    check(g.returncode == 1, f"a unit-labelled skip fails the gate "
          f"(exit {g.returncode})")
    check("NOT RUN  skips: notrun: the probe's deliberate skip" in g.stdout,
          "...naming the test and its reason")
    g = gate(pass_junit)
    print(g.stdout, end="")
    if gate_mod.gpu_visible():
        check(g.returncode == 1,
              "with a GPU visible, a gpu-labelled skip fails the gate too")
    else:
        check(g.returncode == 0, f"without a GPU, a gpu-labelled skip is "
              f"allowed (exit {g.returncode})")
        check("skipped  skips_gpu: the probe's deliberate skip" in g.stdout,
              "...and listed with its reason")
    g = gate(junit)
    check(g.returncode == 0 and "1 failed" in g.stdout,
          "a failure is counted, not mistaken for a skip "
          f"(exit {g.returncode}: {g.stdout.splitlines()[:1]})")

    if FAILURES:
        print(f"FAILED: {len(FAILURES)} check(s)")
        return 1
    print("all skip-semantics checks passed")
    return 0


if __name__ == "__main__":
    sys.exit(main())
