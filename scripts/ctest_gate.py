#!/usr/bin/env python3
"""CI's gate on skips: after a ctest phase, fails when a test outside the
allow-list below did not run or skipped, and prints what skipped and why.

ctest's exit code alone lets a test vanish with CI green: a binary whose
cases all skip (exit 77), a script that skips when a package is missing,
a llama.cpp install that only warned. Every such test must be in the
allow-list, with the reason it may skip on this machine.

  ctest_gate.py --build-dir DIR --junit FILE [--phase NAME]

FILE is ctest's --output-junit of the phase, DIR its build tree (for the
tests' labels, from ctest --show-only=json-v1). Exit 0 when everything
that did not run is allowed, 1 otherwise (and when the files are unreadable).

It also prints the phase's slowest tests (where CI's minutes go) and every
line a test printed starting with NOTE_MARK: what a test left out on
purpose, said once, without skipping (e.g. the AVX-512 kernels on a CPU
without them: kernels/cpu_isa_testing.h).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import xml.etree.ElementTree as ET


NOTE_MARK = "[gate note] "
SLOWEST = 15


def gpu_visible() -> bool:
    """True when nvidia-smi lists at least one GPU."""
    if shutil.which("nvidia-smi") is None:
        return False
    r = subprocess.run(["nvidia-smi", "-L"], capture_output=True, text=True)
    return r.returncode == 0 and "GPU" in r.stdout


def cuda_setting(build_dir: str) -> str:
    """SHARDLM_CUDA as the build tree was configured (AUTO, ON, OFF)."""
    try:
        with open(os.path.join(build_dir, "CMakeCache.txt")) as f:
            for line in f:
                if line.startswith("SHARDLM_CUDA:"):
                    return line.split("=", 1)[1].strip().upper()
    except OSError:
        pass
    return "AUTO"


def allow_list(has_gpu: bool, cuda: str, ci: bool) -> dict[str, str]:
    """Label -> why tests with it may skip here. Nothing else may skip on a
    root CI machine with scripts/install-deps.sh's packages: not the
    llama.cpp family checks, multinode, k8s_manifests, nor a SmolLM2 test."""
    allowed = {}
    if not has_gpu:
        # GPU-only binaries (every case needs a CUDA device) and the GPU
        # benchmark: they run on a GPU machine (tests/gpu/session.sh).
        allowed["gpu"] = "no GPU on this machine"
    # CPU tests that need the CUDA toolkit to build (shardlm_cuda_unit_test
    # in CMakeLists.txt): in a tree built without CUDA on purpose (the
    # sanitizer tree), or on a user's machine without nvcc; CI machines
    # have the toolkit, so there a tree that looked for it must have it.
    if cuda == "OFF":
        allowed["cuda_build"] = "this tree is built with SHARDLM_CUDA=OFF"
    elif not ci:
        allowed["cuda_build"] = "no CUDA toolkit found (CI requires one)"
    return allowed


def labels_by_test(build_dir: str) -> dict[str, list[str]]:
    out = subprocess.run(["ctest", "--show-only=json-v1"], cwd=build_dir,
                         capture_output=True, text=True, check=True).stdout
    labels = {}
    for t in json.loads(out).get("tests", []):
        names = [p["value"] for p in t.get("properties", [])
                 if p.get("name") == "LABELS"]
        labels[t["name"]] = names[0] if names else []
    return labels


def skip_reason(output: str, fallback: str) -> str:
    """The line a test gave for skipping: gtest's message after
    "file:line: Skipped", else the last line that mentions a skip, else the
    last line of output, else ctest's own message."""
    lines = [l.strip() for l in output.splitlines() if l.strip()]
    for i, line in enumerate(lines):
        if line.endswith(": Skipped") and i + 1 < len(lines):
            return lines[i + 1]
    for line in reversed(lines):
        if "skip" in line.lower() and not line.startswith("[  SKIPPED ]"):
            return line
    return lines[-1] if lines else fallback


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--build-dir", required=True)
    ap.add_argument("--junit", required=True)
    ap.add_argument("--phase", default="ctest")
    a = ap.parse_args(argv)
    try:
        cases = ET.parse(a.junit).getroot().iter("testcase")
        labels = labels_by_test(a.build_dir)
    except (OSError, ET.ParseError, subprocess.CalledProcessError,
            json.JSONDecodeError) as e:
        print(f"ctest_gate [{a.phase}]: cannot read the results: {e}")
        return 1
    allowed = allow_list(gpu_visible(), cuda_setting(a.build_dir),
                         bool(os.environ.get("CI")))
    ran = failed = 0
    ok_skips, bad_skips = [], []
    notes, times = {}, []
    for case in cases:
        name, status = case.get("name"), case.get("status")
        output = case.findtext("system-out") or ""
        for line in output.splitlines():
            if line.startswith(NOTE_MARK):
                notes.setdefault(line[len(NOTE_MARK):].strip(), []).append(name)
        try:
            times.append((float(case.get("time", "0")), name))
        except ValueError:
            pass
        if status == "run":
            ran += 1
            continue
        if status == "fail":
            failed += 1
            continue
        skipped = case.find("skipped")
        why = skip_reason(output,
                          skipped.get("message", status) if skipped is not None
                          else status)
        allowing = [l for l in labels.get(name, []) if l in allowed]
        if allowing:
            ok_skips.append(f"{name}: {why} (allowed: label {allowing[0]}, "
                            f"{allowed[allowing[0]]})")
        else:
            bad_skips.append(f"{name}: {status}: {why}")
    print(f"ctest_gate [{a.phase}]: {ran} ran, {failed} failed, "
          f"{len(ok_skips)} skipped as allowed, {len(bad_skips)} did not run "
          "or skipped outside the allow-list")
    for line in ok_skips:
        print(f"  skipped  {line}")
    for line in bad_skips:
        print(f"  NOT RUN  {line}")
    for note, names in notes.items():
        print(f"  note     {note} ({', '.join(sorted(set(names)))})")
    times.sort(reverse=True)
    if times:
        print(f"ctest_gate [{a.phase}]: the {min(SLOWEST, len(times))} "
              "slowest tests (s): " + ", ".join(
                  f"{name} {t:.0f}" for t, name in times[:SLOWEST]))
    if ran == 0 and failed == 0:
        print(f"ctest_gate [{a.phase}]: no test ran")
        return 1
    return 1 if bad_skips else 0


if __name__ == "__main__":
    sys.exit(main())
