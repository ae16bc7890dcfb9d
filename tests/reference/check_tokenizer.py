#!/usr/bin/env python3
"""Checks our byte-level BPE tokenizer against Hugging Face `tokenizers`.

The reference is built independently from the GGUF's own vocabulary and
merges: BPE(vocab, merges) with pre-tokenizer Sequence[Digits(individual),
ByteLevel(add_prefix_space=False)], a ByteLevel decoder, and the CONTROL
tokens (type 3) as special added tokens. tokenize_dump (our C++) must give
identical ids for every test string, and decoding (plain and streaming) must
give the string back. The same is checked for tokenizer.json files the
reference writes: the smollm one, a legacy "a b" merges variant, and a GPT-2
style (no digit split) one against its own HF reference.

  check_tokenizer.py --tool build/tests/reference/tokenize_dump \
      --gguf models/SmolLM2-135M-Instruct.Q4_1.gguf --workdir /tmp/tok
"""
import argparse
import json
import os
import subprocess
import sys

import gguf
from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers

CONTROL = 3

LONG_PARAGRAPH = (
    "The quick brown fox jumps over the lazy dog. In 1969, Apollo 11 landed "
    "on the Moon; Neil Armstrong said: \"That's one small step for [a] man, "
    "one giant leap for mankind.\" Meanwhile, researchers at CERN (founded "
    "1954) measured 13.6 TeV collisions... Prices rose 4.5% year-over-year, "
    "from $1,234.56 to $1,290.12 — a jump that economists didn't expect! "
    "Ünïcödé, naïve café, résumé; Σ=∑ αβγ; 東京は日本の首都です。\n\n"
    "    def f(x):\n        return x ** 2  # square\n\t\tTabs\tand  spaces  "
)

STRINGS = [
    "",
    "Hello world",
    "Hello, world!",
    " leading space",
    "trailing space ",
    "trailing spaces   ",
    "  two leading spaces",
    "multiple    spaces    between",
    "tab\tseparated\tvalues",
    "line one\nline two\n",
    "\n\n\n",
    "windows\r\nline\r\nendings",
    " \t \n mixed whitespace \n\t ",
    "12345",
    "3.14159",
    "Version 2.0.1-rc3 released on 2024-05-17",
    "x=42; y=-7; z=x*y",
    "phone: +1 (555) 123-4567",
    "don't I'll WE'VE they're she's it'd you'll we've I'm",
    "'s 't 're 've 'm 'll 'd",
    "rock'n'roll ''quoted'' '",
    "O'Neil's dog's bone",
    "def fib(n):\n    if n < 2:\n        return n\n    return fib(n-1) + fib(n-2)\n",
    "for (int i = 0; i < 10; ++i) { sum += a[i]; }",
    "#include <stdio.h>\nint main() { printf(\"%d\\n\", 7); }",
    "SELECT * FROM users WHERE id = 10 AND name LIKE '%bob%';",
    "https://example.com/path?query=1&lang=en#frag",
    "email me at someone@example.org!!!",
    "你好，世界！这是一个测试。",
    "日本語のテキストと漢字とカタカナ",
    "한국어 문장입니다",
    "Привет, мир! Как дела?",
    "مرحبا بالعالم",
    "שלום עולם",
    "नमस्ते दुनिया",
    "Ελληνικά γράμματα",
    "café naïve résumé coöperate Ångström",
    "e\u0301 combining acute, n\u0303",
    "emoji 😀 🚀 🎉",
    "family 👨‍👩‍👧‍👦 and flag 🇫🇷 and skin 👍🏽",
    "heart ❤️ with variation selector",
    "full-width ＡＢＣ１２３ digits",
    "Arabic-Indic ٠١٢٣ digits and ½ ¾ Ⅻ superscript²",
    # A space before a non-ASCII number: the vocabulary has no merges
    # between ASCII digits, so these are what tell smollm from gpt2.
    "squared ² cubed ³ and ¼ cup",
    "Roman Ⅰ Ⅱ Ⅲ Ⅳ numerals",
    "Arabic ٣ and Devanagari १ २ digits",
    "non\u00a0breaking\u00a0space and\u2003em space",
    "zero\u200bwidth\u200bspace",
    "<|im_start|>user\nhi<|im_end|>",
    "<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained "
    "by Hugging Face<|im_end|>\n<|im_start|>user\nWhat is 2+2?<|im_end|>\n"
    "<|im_start|>assistant\n",
    "<|endoftext|><|endoftext|>text<|im_end|>",
    "<|im_start <|im_end| |im_end|> <|unknown|>",
    "x<|im_start|>y<file_sep>z<filename>",
    "<jupyter_start><jupyter_code>print(1)<jupyter_output>1<empty_output>",
    "!!!???...,,,;;;",
    "----------========__________",
    "ALL CAPS SENTENCE WITH NUMBERS 123 AND SYMBOLS @#$",
    "mIxEd CaSe WoRdS",
    "a" * 300,
    " " * 50 + "x",
    "1234567890" * 5,
    LONG_PARAGRAPH,
    LONG_PARAGRAPH * 3,
]
# SmolLM2's vocabulary has no token for 21 bytes (e.g. 0x04, 0x13, 0xC0):
# HF (and llama.cpp) drop them, so these do not decode back to themselves.
LOSSY = ["ctrl\x04chars\x13\x14 here", "\x1d\x16"]
STRINGS += LOSSY


def gguf_vocab(path):
    reader = gguf.GGUFReader(path)

    def field(key):
        f = reader.fields.get(key)
        if f is None:
            sys.exit(f"{path}: missing {key}")
        return f.contents()

    if field("tokenizer.ggml.model") != "gpt2":
        sys.exit(f"{path}: not a byte-level BPE (gpt2) tokenizer")
    return (field("tokenizer.ggml.tokens"), field("tokenizer.ggml.merges"),
            field("tokenizer.ggml.token_type"), field("tokenizer.ggml.pre"))


def build_reference(tokens, merges, types, digits):
    vocab = {tok: i for i, tok in enumerate(tokens)}
    pairs = [tuple(m.split(" ", 1)) for m in merges]
    tok = Tokenizer(models.BPE(vocab, pairs))
    steps = [pre_tokenizers.ByteLevel(add_prefix_space=False)]
    if digits:
        steps.insert(0, pre_tokenizers.Digits(individual_digits=True))
    tok.pre_tokenizer = pre_tokenizers.Sequence(steps)
    tok.decoder = decoders.ByteLevel()
    tok.add_special_tokens([
        AddedToken(t, special=True, normalized=False)
        for t, ty in zip(tokens, types) if ty == CONTROL
    ])
    return tok


def run_tool(tool, model, strings):
    proc = subprocess.run(
        [tool, "--model", model],
        input="".join(json.dumps(s) + "\n" for s in strings),
        capture_output=True, text=True, encoding="utf-8")
    if proc.returncode != 0:
        sys.exit(f"{tool} --model {model} failed ({proc.returncode}):\n"
                 f"{proc.stderr}")
    for line in proc.stderr.strip().splitlines():
        print(f"  [{os.path.basename(model)}] {line}")
    lines = proc.stdout.splitlines()
    if len(lines) != len(strings):
        sys.exit(f"{tool}: {len(lines)} output lines for {len(strings)} inputs")
    return [json.loads(line) for line in lines]


def compare(label, reference, results, strings):
    failures = 0
    for s, got in zip(strings, results):
        want = reference.encode(s, add_special_tokens=False).ids
        problems = []
        if got["ids"] != want:
            first = next((i for i, (a, b) in enumerate(zip(want, got["ids"]))
                          if a != b), min(len(want), len(got["ids"])))
            problems.append(
                f"ids differ from index {first}:\n"
                f"    expected {want}\n    got      {got['ids']}")
        # Bytes without a token are dropped; only LOSSY strings have them.
        text = reference.decode(want, skip_special_tokens=False)
        if (text == s) == (s in LOSSY):
            problems.append(f"HF decodes to {text!r}; LOSSY is out of date")
        if got["decoded"] != text:
            problems.append(f"Decode gave {got['decoded']!r}")
        if got["streamed"] != text:
            problems.append(f"StreamingDetokenizer gave {got['streamed']!r}")
        if problems:
            failures += 1
            print(f"FAIL [{label}] {s[:200]!r}")
            for p in problems:
                print("  " + p)
    print(f"{label}: {len(strings) - failures}/{len(strings)} strings match")
    return failures


def save_variant(tok, directory, legacy_merges=False):
    os.makedirs(directory, exist_ok=True)
    path = os.path.join(directory, "tokenizer.json")
    tok.save(path)
    if legacy_merges:  # Rewrite merges in the old "a b" string form.
        with open(path, encoding="utf-8") as f:
            data = json.load(f)
        data["model"]["merges"] = [
            m if isinstance(m, str) else " ".join(m)
            for m in data["model"]["merges"]
        ]
        with open(path, "w", encoding="utf-8") as f:
            json.dump(data, f, ensure_ascii=False)
    return directory


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tool", required=True, help="tokenize_dump binary")
    ap.add_argument("--gguf", required=True, help="SmolLM2 GGUF")
    ap.add_argument("--workdir", required=True,
                    help="where the tokenizer.json variants are written")
    args = ap.parse_args()

    tokens, merges, types, pre = gguf_vocab(args.gguf)
    if pre != "smollm":
        sys.exit(f"expected pre-tokenizer smollm, the GGUF says {pre!r}")
    smollm = build_reference(tokens, merges, types, digits=True)
    gpt2 = build_reference(tokens, merges, types, digits=False)

    # The strings must be able to catch a wrong pre-tokenizer: dropping the
    # digit split has to change the ids of some of them.
    sensitive = [s for s in STRINGS
                 if smollm.encode(s).ids != gpt2.encode(s).ids]
    if len(sensitive) < 3:
        sys.exit(f"only {len(sensitive)} strings tell smollm from gpt2")
    print(f"{len(STRINGS)} strings; {len(sensitive)} of them tokenize "
          "differently without the digit split")

    failures = 0
    failures += compare("gguf", smollm,
                        run_tool(args.tool, args.gguf, STRINGS), STRINGS)
    for label, ref, legacy in [("tokenizer.json", smollm, False),
                               ("tokenizer.json legacy merges", smollm, True),
                               ("tokenizer.json gpt2", gpt2, False)]:
        directory = save_variant(
            ref, os.path.join(args.workdir, label.replace(" ", "_")), legacy)
        failures += compare(label, ref, run_tool(args.tool, directory, STRINGS),
                            STRINGS)
    if failures:
        print(f"FAILED: {failures} mismatches")
        return 1
    print("OK")
    return 0


if __name__ == "__main__":
    sys.exit(main())
