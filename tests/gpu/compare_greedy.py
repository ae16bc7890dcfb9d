"""Compares two greedy generations by their `--logprobs` tables (what
`shardlm generate --logprobs N` prints to stderr), with margins instead of
exact text: a GPU in bf16 may pick the other of two tokens whose
log-probabilities on the CPU (f32) are within --flip-margin, and the texts
then rightly part there. So:
- up to the first token where they differ, each token's log-probability
  must agree within --tolerance;
- where they differ, the reference's margin between its token and the
  other's must be under --flip-margin (a near tie); later tokens are not
  compared;
- the other generation must have as many tokens (or part at a near tie).
Exit 0 when they agree, 1 with the reason otherwise.

Usage: python3 compare_greedy.py REFERENCE.err OTHER.err
           [--tolerance 0.15] [--flip-margin 0.15]"""

from __future__ import annotations

import argparse
import re
import sys

ROW = re.compile(r'^\s*(\d+): "((?:[^"\\]|\\.)*)"\s+(-?[\d.]+|-inf)'
                 r'\s+\(([\d.]+)\) \|(.*)$')
ALT = re.compile(r'"((?:[^"\\]|\\.)*)" (-?[\d.]+|-inf)')


def parse(text: str) -> list[tuple[str, float, dict[str, float]]]:
    """The rows of a logprobs table: (token, logprob, {alternative: lp})."""
    rows = []
    for line in text.splitlines():
        m = ROW.match(line)
        if m:
            alts = {a: float(lp) for a, lp in ALT.findall(m.group(5))}
            rows.append((m.group(2), float(m.group(3)), alts))
    return rows


def compare(ref: str, other: str, tolerance: float,
            flip_margin: float) -> tuple[bool, str]:
    a, b = parse(ref), parse(other)
    if not a:
        return False, "the reference has no logprobs table"
    for i, (tok, lp, alts) in enumerate(a):
        if i >= len(b):
            return False, f"the other stops after {len(b)} of {len(a)} tokens"
        otok, olp, _ = b[i]
        if otok == tok:
            if abs(olp - lp) > tolerance:
                return False, (f"token {i} {tok!r}: logprob {olp:.4f} against "
                               f"{lp:.4f} (tolerance {tolerance})")
            continue
        if otok not in alts:
            return False, (f"token {i}: {otok!r} where the reference has "
                           f"{tok!r}, not among its alternatives")
        margin = lp - alts[otok]
        if margin >= flip_margin:
            return False, (f"token {i}: {otok!r} where the reference has "
                           f"{tok!r} by a margin of {margin:.4f} "
                           f"(flip margin {flip_margin})")
        return True, (f"agree on {i} tokens, then part at a near tie "
                      f"(margin {margin:.4f})")
    if len(b) > len(a):
        return False, f"the other has {len(b)} tokens, the reference {len(a)}"
    return True, f"agree on all {len(a)} tokens"


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("reference")
    p.add_argument("other")
    p.add_argument("--tolerance", type=float, default=0.15)
    p.add_argument("--flip-margin", type=float, default=0.15)
    args = p.parse_args()
    with open(args.reference, errors="replace") as f:
        ref = f.read()
    with open(args.other, errors="replace") as f:
        other = f.read()
    ok, why = compare(ref, other, args.tolerance, args.flip_margin)
    print(("agree: " if ok else "DIFFER: ") + why)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
