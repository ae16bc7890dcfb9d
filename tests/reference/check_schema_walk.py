#!/usr/bin/env python3
"""Structured outputs' property test (issue 38): random schemas of the
supported subset, uniformly random tokens from each one's mask over the
model's real vocabulary, and `jsonschema` as the judge.

For --schemas random schemas (seeded; objects with properties, required
and additionalProperties false, arrays with items and min/maxItems,
strings with maxLength, enum, const and the formats date, date-time and
uuid, integers and numbers with bounds (inclusive and exclusive),
booleans, null, nullable types, anyOf, oneOf with branches of distinct
types (oneOf is generated as anyOf: docs/api.md), and $defs with a
recursive $ref), the C++ tool walks --walks times from the empty output,
each token drawn uniformly from the constraint's mask until EOS. A
uniform walk takes tokens no model would, which is the point: every
token the mask allows must keep the output a prefix of a valid document.
Fails when any complete output is not valid JSON valid against its schema,
when the constraint refuses a token its mask allowed or allows EOS early,
when its mask is empty, or when fewer than 90% of the walks end within
--max-tokens (an output that never closes would hide what it breaks).

  check_schema_walk.py --tool build/tests/reference/schema_walk \\
      --gguf models/SmolLM2-135M-Instruct.Q4_1.gguf
"""
from __future__ import annotations

import argparse
import json
import os
import random
import subprocess
import sys

import jsonschema

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))
from testlib import FAILURES, check, exit_code  # noqa: E402

FORMATS = jsonschema.Draft202012Validator.FORMAT_CHECKER
NAMES = ["id", "name", "count", "ok", "tags", "when", "price", "kind", "note",
         "items", "a", "b_c", "Ünïcode", "with space", "quote\"d"]


def scalar(rng: random.Random) -> dict:
    kind = rng.choice(["string", "string", "enum", "const", "format",
                       "integer", "number", "boolean", "null", "nullable"])
    if kind == "string":
        s = {"type": "string", "maxLength": rng.randint(0, 12)}
        if rng.random() < 0.3:
            s["minLength"] = rng.randint(0, s["maxLength"])
        return s
    if kind == "enum":
        pool = ["red", "green", "a \"b\"", "", "ü", 42, -1.5, True, None,
                "line\nbreak"]
        return {"enum": rng.sample(pool, rng.randint(1, 4))}
    if kind == "const":
        return {"const": rng.choice(["x", 7, False, None, "tab\t"])}
    if kind == "format":
        return {"type": "string",
                "format": rng.choice(["date", "date-time", "uuid"])}
    if kind in ("integer", "number"):
        s = {"type": kind}
        lo = rng.randint(-1000, 1000)
        if rng.random() < 0.7:
            s["exclusiveMinimum" if rng.random() < 0.3 else "minimum"] = (
                lo if kind == "integer" else lo + rng.choice([0, 0.25]))
        if rng.random() < 0.7:
            s["exclusiveMaximum" if rng.random() < 0.3 else "maximum"] = (
                lo + rng.randint(2, 5000))
        return s
    if kind == "nullable":
        return {"type": [rng.choice(["string", "integer", "boolean"]), "null"],
                **({"maxLength": 5} if rng.random() < 0.5 else {})}
    return {"type": kind}


def schema(rng: random.Random, depth: int) -> dict:
    roll = rng.random() if depth < 3 else 1.0
    if roll < 0.3:
        names = rng.sample(NAMES, rng.randint(1, 4))
        s = {"type": "object",
             "properties": {n: schema(rng, depth + 1) for n in names},
             "additionalProperties": False}
        s["required"] = [n for n in names if rng.random() < 0.6]
        return s
    if roll < 0.45:
        lo = rng.randint(0, 2)
        s = {"type": "array", "items": schema(rng, depth + 1), "minItems": lo}
        if rng.random() < 0.8:
            s["maxItems"] = lo + rng.randint(0, 3)
        return s
    if roll < 0.55:
        return {"anyOf": [schema(rng, depth + 1)
                          for _ in range(rng.randint(1, 3))]}
    if roll < 0.6:
        # Branches of distinct types: a value then matches exactly one.
        kinds = rng.sample(["string", "integer", "boolean", "null"], 2)
        return {"oneOf": [{"type": k, **({"maxLength": 4} if k == "string"
                                         else {})} for k in kinds]}
    return scalar(rng)


def recursive(rng: random.Random) -> dict:
    """A tree through $defs and $ref, as check_structured's "tree"."""
    return {"$defs": {"node": {
        "type": "object",
        "properties": {"label": {"type": "string",
                                 "maxLength": rng.randint(1, 6)},
                       "children": {"type": "array",
                                    "maxItems": rng.randint(1, 2),
                                    "items": {"$ref": "#/$defs/node"}}},
        "required": ["label"], "additionalProperties": False}},
        "$ref": "#/$defs/node"}


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--tool", required=True)
    ap.add_argument("--gguf", required=True)
    ap.add_argument("--schemas", type=int, default=60)
    ap.add_argument("--walks", type=int, default=20)
    ap.add_argument("--max-tokens", type=int, default=400)
    ap.add_argument("--seed", type=int, default=2026)
    a = ap.parse_args()
    if not os.path.exists(a.gguf):
        print(f"SKIP: {a.gguf} not found")
        return 77
    rng = random.Random(a.seed)
    schemas = [recursive(rng) if i % 10 == 9 else schema(rng, 0)
               for i in range(a.schemas)]
    lines = "".join(json.dumps({"schema": s, "walks": a.walks,
                                "seed": a.seed + i,
                                "max_tokens": a.max_tokens}) + "\n"
                    for i, s in enumerate(schemas))
    run = subprocess.run([a.tool, "--model", a.gguf], input=lines.encode(),
                         capture_output=True, timeout=540)
    check(run.returncode == 0,
          f"schema_walk ran ({run.returncode}: {run.stderr[-300:]!r})")
    results = [json.loads(x) for x in run.stdout.decode().splitlines()]
    refused = [r for r in results if "refused" in r]
    check(not refused, f"every random schema compiles ({refused[:3]})")
    walks = [r for r in results if "refused" not in r]
    check(len(walks) == a.schemas * a.walks,
          f"{a.schemas} schemas x {a.walks} walks ({len(walks)} came)")
    errors = [(r["schema"], r["error"]) for r in walks if r["error"]]
    check(not errors, f"no token the mask allowed was refused, no empty "
          f"mask, no early EOS ({len(errors)}: {errors[:3]})")
    invalid, complete = [], 0
    for r in walks:
        if not r["complete"]:
            continue
        complete += 1
        s = schemas[r["schema"]]
        raw = bytes.fromhex(r["text_hex"])
        try:
            value = json.loads(raw.decode("utf-8"))
            jsonschema.validate(value, s, format_checker=FORMATS)
        except (ValueError, jsonschema.ValidationError) as e:
            invalid.append((r["schema"], raw[:120], str(e)[:200]))
    check(not invalid, f"every complete output is valid against its schema "
          f"({complete} complete; {len(invalid)} invalid: {invalid[:2]}"
          f"{' ' + json.dumps(schemas[invalid[0][0]]) if invalid else ''})")
    check(complete >= 0.9 * len(walks),
          f"at least 90% of the walks end by themselves within "
          f"{a.max_tokens} tokens ({complete} of {len(walks)})")
    return exit_code()


if __name__ == "__main__":
    sys.exit(main())
