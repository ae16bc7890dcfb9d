#!/usr/bin/env python3
"""Checks our byte-level BPE tokenizer against Hugging Face `tokenizers`.

The reference is built independently from the GGUF's own vocabulary and
merges (hf_tokenizer.build): BPE(vocab, merges) with the pre-tokenizer of the
family (smollm: Sequence[Digits(individual), ByteLevel]; llama3 and qwen2:
Sequence[Split(Regex(pattern), isolated), ByteLevel(use_regex=False)], qwen2
after an NFC normalizer), a ByteLevel decoder, and the CONTROL tokens (type
3) as special added tokens. tokenize_dump (our C++) must give identical ids
for every test string, the ids of a prompt (EncodePrompt: BOS in front when
the tokenizer asks for it, never doubled), and decoding (plain and
streaming) must give the string back (its NFC form for qwen2).

Families and files:
  smollm  the real SmolLM2 GGUF; tokenizer.json files the reference writes
          (the smollm one, a legacy "a b" merges variant, and a GPT-2 style
          one with no digit split)
  llama3  SmolLM2's vocabulary and merges plus Llama 3's special tokens, as
          a tokenizer-only GGUF (tokenizer.ggml.pre llama-bpe, add_bos by
          default; and llama3 with add_bos_token false) and as the
          tokenizer.json the reference writes (Split + a BOS template)
  qwen2   the same vocabulary plus Qwen2.5's special tokens: GGUF (pre
          qwen2) and tokenizer.json (NFC normalizer)
  gpt-4o  the same vocabulary plus gpt-oss's harmony tokens: GGUF (pre
          gpt-4o, as gpt-oss GGUFs have it) and tokenizer.json (the o200k
          Split regex)
Real Llama 3 / Qwen2 / o200k vocabularies are not available offline; the regexes
are what differs, and random strings drawn from the characters that tell
them apart check the pieces. Our NFC is also compared with Python's
unicodedata on every code point.

  check_tokenizer.py --tool build/tests/reference/tokenize_dump \
      --gguf models/SmolLM2-135M-Instruct.Q4_1.gguf --workdir /tmp/tok
"""
import argparse
import json
import os
import random
import subprocess
import sys
import unicodedata

import gguf

import hf_tokenizer

CONTROL, USER_DEFINED = 3, 4

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
# What tells the Llama 3 / Qwen2 regexes from GPT-2's and from each other:
# contractions in any case, digit groups, whitespace runs with CR/LF,
# punctuation before newlines, and (qwen2) text that is not in NFC.
STRINGS += [
    "I'LL DON'T We'Re YOU'VE SHE'S IT'D I'M they'Ll",
    "'S 'T 'RE 'VE 'M 'LL 'D 'x 'ſt",
    # A contraction is a piece of its own only when letters follow it.
    "'status 'Status 'tis 'Tis 'dare 'Dare 'mine 'Mine 'really 'REALLY",
    "'very 'VERY 'llama 'LLama 'ſtatus x'sx X'SX",
    "'ſt", "x'ſt", "\nx", "a\nx\r\nw", "\tx\tw",
    "1", "12", "123", "1234", "12345", "123456", "1234567",
    "abc123def x1y22z333w4444v55555",
    "pi=3.14159265, e=2.71828; 1,000,000 and 2024-05-17T12:34:56",
    "\r\n\r\n", "a\r\n\tb", " \t\n", "  \n  ", "\n \n", " \n ",
    "foo  \n\n  bar", "tab\t\tx\t", "  leading", "trailing  ",
    "end!\n\nnext", "?!\r\n", ":)\n  ", "   !!!   ", "\u00a0x \u3000y",
    "\t\n\x0b\x0c\r\x85 controls",
    "e\u0301", "A\u030a and \u212b", "\u1100\u1161\u11a8 \uac00\u11a8",
    "a\u0302\u0323 \u1e0b\u0323 q\u0307\u0323", "\u0344 \u0b47\u0b3e",
    "re\u0301sume\u0301 nai\u0308ve",
    "<|begin_of_text|><|start_header_id|>user<|end_header_id|>\n\nHi there!"
    "<|eot_id|><|start_header_id|>assistant<|end_header_id|>\n\n",
    "<|begin_of_text|>", "text<|begin_of_text|>", "<|eot_id|>x",
    "<|im_start|>system\nYou are Qwen.<|im_end|>\n<tool_call>\n"
    "{\"name\": \"f\", \"arguments\": {\"x\": 1}}\n</tool_call>",
]
# What tells o200k (gpt-4o) apart: words split where lower case turns to
# upper, contractions kept on the word, title case, modifier letters and
# marks in both letter sets, '/' after punctuation.
STRINGS += [
    "HelloWorld XMLHttpRequest iPhone camelCaseName snake_case_name",
    "I'LL don't We'Re they'RE ABC'sx x'\u017ft",
    "\u01c5ungla \u02b0ab A\u02b0B \u00c9COLE \u00e9cole",
    "\u0301AB !\u0301ab  \u0301AB e\u0301E\u0301e",
    "a/b !/\n/x :// https://x.org/a/b?c=d",
    "<|start|>user<|message|>What is 2+2?<|end|><|start|>assistant"
    "<|channel|>analysis<|message|>Simple.<|end|><|start|>assistant"
    "<|channel|>final<|message|>4<|return|>",
    "<|start|>assistant to=functions.get_weather<|channel|>commentary "
    "<|constrain|>json<|message|>{\"city\": \"Paris\"}<|call|>",
]

# SmolLM2's vocabulary has no token for 21 bytes (e.g. 0x04, 0x13, 0xC0):
# HF (and llama.cpp) drop them, so these do not decode back to themselves.
LOSSY = ["ctrl\x04chars\x13\x14 here", "\x1d\x16"]
STRINGS += LOSSY

# Long pieces (issue 39): BpeTokenizer merges a piece in cuts of at most
# 16 KiB (kMaxMergedPieceBytes), so every piece up to 16,384 bytes must
# still give exactly the reference's tokens: a single word of 16,384 random
# ASCII letters, one of 8,192 two-byte letters, 16,384 bytes of
# punctuation, of spaces before a word, and a word just under the bound
# after text.
_long = random.Random(39)
STRINGS += [
    "".join(_long.choice("abcdefghijklmnopqrstuvwxyzABCDEFGHIJ")
            for _ in range(16384)),
    "".join(_long.choice("\u00e9\u00e8\u00fc\u0436\u03bb")
            for _ in range(8192)),
    "".join(_long.choice("!?.,;:-") for _ in range(16384)),
    " " * 16383 + "x",
    "Some text, then " + "".join(_long.choice("etaoinshrdlu")
                                 for _ in range(16000)) + " and more.",
]


# Pieces that tell the regexes apart, for random strings.
ATOMS = [
    "a", "Z", "word", "WORD", "'", "s", "S", "t", "T", "ll", "LL", "re", "Re",
    "ve", "m", "d", "D", "ſ", "0", "7", "42", "123", "98765", " ", "  ", "\t",
    "\r", "\n", "\r\n", "\u00a0", "\u3000", "!", "?", ".", ",", "-", "(",
    "\"", "中文", "😀", "²", "٣", "Ⅻ", "é", "e\u0301", "\u0301", "\u0323",
    "A\u030a", "\u212b", "\u1100\u1161", "\u11a8", "Ａ", "ß",
    "Hello", "XML", "iPhone", "\u01c5", "\u02b0", "/", "\u00c9", "'s",
]
RANDOM_STRINGS = 1000

# Special tokens appended to SmolLM2's 49152 for each synthetic family:
# (content, GGUF token type).
LLAMA3_SPECIALS = [(t, CONTROL) for t in (
    "<|begin_of_text|>", "<|end_of_text|>", "<|reserved_special_token_0|>",
    "<|start_header_id|>", "<|end_header_id|>", "<|eot_id|>",
    "<|python_tag|>")]
HARMONY_SPECIALS = [(t, CONTROL) for t in (
    "<|startoftext|>", "<|return|>", "<|constrain|>", "<|channel|>",
    "<|start|>", "<|end|>", "<|message|>", "<|call|>")]
QWEN2_SPECIALS = [("<|object_ref_start|>", CONTROL),
                  ("<|vision_start|>", CONTROL), ("<|fim_prefix|>", CONTROL),
                  ("<tool_call>", USER_DEFINED), ("</tool_call>", USER_DEFINED)]


# Merges SmolLM2's vocabulary lacks, added for the synthetic families so that
# piece boundaries the regexes disagree on change the ids: digit groups
# (SmolLM2 splits every digit, so it has no merges between digits),
# punctuation before a newline, a tab or a newline before a letter, and
# "ſ" (bytes C5 BF, "Å¿") before a letter, for the case-folded "'ſ".
EXTRA_MERGES = (
    [(a, b) for a in "0123456789" for b in "0123456789"] +
    [(a + b, c) for a in "0123456789" for b in "0123456789"
     for c in "0123456789"] +
    [(p, "Ċ") for p in "!.?:"] +
    [("ĉ", "x"), ("ĉ", "w"), ("Ċ", "x"), ("Ċ", "w"), ("Å", "¿"),
     ("Å¿", "t")])


def random_strings(n, seed=1):
    rng = random.Random(seed)
    return ["".join(rng.choice(ATOMS) for _ in range(rng.randint(1, 12)))
            for _ in range(n)]


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


def write_tokenizer_gguf(path, tokens, merges, types, pre, bos, eos,
                         add_bos=None):
    """A GGUF with tokenizer metadata only (no tensors)."""
    w = gguf.GGUFWriter(path, "llama")
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre(pre)
    w.add_token_list(tokens)
    w.add_token_types(types)
    w.add_token_merges(merges)
    w.add_bos_token_id(bos)
    w.add_eos_token_id(eos)
    if add_bos is not None:
        w.add_add_bos_token(add_bos)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


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
    # Not splitlines(): the JSON may hold U+0085 or U+2028 unescaped.
    lines = proc.stdout.split("\n")[:-1]
    if len(lines) != len(strings):
        sys.exit(f"{tool}: {len(lines)} output lines for {len(strings)} inputs")
    return [json.loads(line) for line in lines]


def compare(label, reference, results, strings, nfc=False, bos=None):
    """`bos`: the id EncodePrompt must put in front, or None."""
    failures = 0
    for s, got in zip(strings, results):
        want = reference.encode(s, add_special_tokens=False).ids
        want_prompt = list(want)
        if bos is not None and (not want or want[0] != bos):
            want_prompt.insert(0, bos)
        problems = []
        if got["ids"] != want:
            first = next((i for i, (a, b) in enumerate(zip(want, got["ids"]))
                          if a != b), min(len(want), len(got["ids"])))
            problems.append(
                f"ids differ from index {first}:\n"
                f"    expected {want}\n    got      {got['ids']}")
        if got["prompt_ids"] != want_prompt:
            problems.append(f"prompt ids {got['prompt_ids']}, expected "
                            f"{want_prompt}")
        # Bytes without a token are dropped; only LOSSY strings have them.
        text = reference.decode(want, skip_special_tokens=False)
        source = unicodedata.normalize("NFC", s) if nfc else s
        if (text == source) == (s in LOSSY):
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


def check_nfc(tool):
    """NormalizeNfc against unicodedata on every code point: alone, after
    marks of two classes (reordering, composition, blocking) and after 'a'
    (composition with a base)."""
    strings = [chr(cp) + "\u0323\u0301a" + chr(cp)
               for cp in range(0x110000) if not 0xD800 <= cp <= 0xDFFF]
    proc = subprocess.run(
        [tool, "--nfc"], input="".join(json.dumps(s) + "\n" for s in strings),
        capture_output=True, text=True, encoding="utf-8")
    if proc.returncode != 0:
        sys.exit(f"{tool} --nfc failed ({proc.returncode}):\n{proc.stderr}")
    # Not splitlines(): the JSON may hold U+0085 or U+2028 unescaped.
    lines = proc.stdout.split("\n")[:-1]
    if len(lines) != len(strings):
        sys.exit(f"{tool}: {len(lines)} output lines for {len(strings)} inputs")
    failures = 0
    for s, line in zip(strings, lines):
        got, want = json.loads(line)["nfc"], unicodedata.normalize("NFC", s)
        if got != want:
            failures += 1
            if failures <= 10:
                print(f"FAIL [nfc] {s!r}: got {got!r}, expected {want!r}")
    print(f"nfc (Unicode {unicodedata.unidata_version}): "
          f"{len(strings) - failures}/{len(strings)} strings match")
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
                    help="where the tokenizer files are written")
    args = ap.parse_args()
    os.makedirs(args.workdir, exist_ok=True)

    tokens, merges, types, pre = gguf_vocab(args.gguf)
    if pre != "smollm":
        sys.exit(f"expected pre-tokenizer smollm, the GGUF says {pre!r}")
    smollm = hf_tokenizer.build(tokens, merges, types, "smollm")
    gpt2 = hf_tokenizer.build(tokens, merges, types, "gpt2")

    # The strings must be able to catch a wrong pre-tokenizer: dropping the
    # digit split has to change the ids of some of them.
    sensitive = [s for s in STRINGS
                 if smollm.encode(s).ids != gpt2.encode(s).ids]
    if len(sensitive) < 3:
        sys.exit(f"only {len(sensitive)} strings tell smollm from gpt2")
    print(f"{len(STRINGS)} strings; {len(sensitive)} of them tokenize "
          "differently without the digit split")

    failures = check_nfc(args.tool)
    failures += compare("gguf", smollm,
                        run_tool(args.tool, args.gguf, STRINGS), STRINGS)
    for label, ref, legacy in [("tokenizer.json", smollm, False),
                               ("tokenizer.json legacy merges", smollm, True),
                               ("tokenizer.json gpt2", gpt2, False)]:
        directory = save_variant(
            ref, os.path.join(args.workdir, label.replace(" ", "_")), legacy)
        failures += compare(label, ref, run_tool(args.tool, directory, STRINGS),
                            STRINGS)

    # Llama 3 and Qwen2 on SmolLM2's vocabulary with their special tokens.
    strings = STRINGS + random_strings(RANDOM_STRINGS)
    refs = {}
    extra = [a + b for a, b in EXTRA_MERGES]
    fmerges = list(merges) + [f"{a} {b}" for a, b in EXTRA_MERGES]
    for fam, specials in [("llama3", LLAMA3_SPECIALS),
                          ("qwen2", QWEN2_SPECIALS),
                          ("gpt-4o", HARMONY_SPECIALS)]:
        ftokens = list(tokens) + extra + [t for t, _ in specials]
        ftypes = list(types) + [1] * len(extra) + [ty for _, ty in specials]
        if fam == "llama3":
            bos = ftokens.index("<|begin_of_text|>")
            eos = ftokens.index("<|eot_id|>")
            ggufs = [("llama-bpe", None, True), ("llama3", False, False)]
        elif fam == "gpt-4o":  # gpt-oss GGUFs: no add_bos_token key.
            bos = ftokens.index("<|startoftext|>")
            eos = ftokens.index("<|return|>")
            ggufs = [("gpt-4o", None, False)]
        else:  # Qwen2.5 GGUFs: BOS <|endoftext|>, not added.
            bos, eos = ftokens.index("<|endoftext|>"), ftokens.index("<|im_end|>")
            ggufs = [("qwen2", False, False)]
        for gpre, add_bos_kv, adds in ggufs:
            ref = hf_tokenizer.build(ftokens, fmerges, ftypes, gpre,
                                     add_bos=adds, bos_id=bos)
            refs.setdefault(fam, ref)
            path = write_tokenizer_gguf(
                os.path.join(args.workdir, f"{gpre}.gguf"), ftokens, fmerges,
                ftypes, gpre, bos, eos, add_bos_kv)
            failures += compare(f"gguf {gpre}", ref,
                                run_tool(args.tool, path, strings), strings,
                                nfc=fam == "qwen2", bos=bos if adds else None)
        ref = refs[fam]
        adds = fam == "llama3"
        if adds:  # The reference's own template must add exactly BOS.
            for s in strings[:20]:
                plain = ref.encode(s, add_special_tokens=False).ids
                if ref.encode(s).ids != [bos] + plain:
                    sys.exit(f"reference template does not add BOS to {s!r}")
        directory = save_variant(
            ref, os.path.join(args.workdir, f"tokenizer_json_{fam}"))
        failures += compare(f"tokenizer.json {fam}", ref,
                            run_tool(args.tool, directory, strings), strings,
                            nfc=fam == "qwen2", bos=bos if adds else None)

    # The strings must tell the families apart, on the same vocabulary.
    llama3, qwen2 = refs["llama3"], refs["qwen2"]
    ftokens = list(tokens) + extra + [t for t, _ in LLAMA3_SPECIALS]
    ftypes = list(types) + [1] * len(extra) + [ty for _, ty in LLAMA3_SPECIALS]
    llama3_gpt2 = hf_tokenizer.build(ftokens, fmerges, ftypes, "gpt2")
    llama3_qwen2 = hf_tokenizer.build(ftokens, fmerges, ftypes, "qwen2")
    llama3_gpt4o = hf_tokenizer.build(ftokens, fmerges, ftypes, "gpt-4o")
    for what, a, b in [("llama3 from gpt2", llama3, llama3_gpt2),
                       ("llama3 from qwen2", llama3, llama3_qwen2),
                       ("gpt-4o from llama3", llama3_gpt4o, llama3)]:
        n = sum(a.encode(s, add_special_tokens=False).ids !=
                b.encode(s, add_special_tokens=False).ids for s in strings)
        print(f"{n} of {len(strings)} strings tell {what}")
        if n < 10:
            sys.exit(f"too few strings tell {what}")
    if failures:
        print(f"FAILED: {failures} mismatches")
        return 1
    print("OK")
    return 0


if __name__ == "__main__":
    sys.exit(main())
