#!/usr/bin/env python3
"""Builds a Hugging Face `tokenizers.Tokenizer` from a GGUF's byte-level BPE
metadata, as an independent reference for the C++ tokenizer and for turning
test prompts into ids.

The pre-tokenizer follows `tokenizer.ggml.pre` as the models' own
tokenizer.json files have it:
  smollm     Digits(individual_digits=True), then ByteLevel(use_regex=True)
             (the GPT-2 regex, which also maps bytes to GPT-2's printable
             code points)
  gpt2       ByteLevel(use_regex=True)
  llama-bpe  Split(Regex(LLAMA3_PATTERN), "isolated"), then
  (llama3,   ByteLevel(use_regex=False); BPE ignore_merges=True as in
  llama-v3)  llama.cpp
  qwen2      Split(Regex(QWEN2_PATTERN), "isolated"), then
             ByteLevel(use_regex=False), after an NFC normalizer
  gpt-4o     Split(Regex(GPT4O_PATTERN), "isolated"), then
  (llama4)   ByteLevel(use_regex=False); merges as they are (llama.cpp)
Control tokens (token_type 3, e.g. <|im_start|>) and user-defined tokens
(type 4) are added as special tokens so they are matched whole in the input
text. When the GGUF asks for BOS (`tokenizer.ggml.add_bos_token`, default
true for the llama3 names as in llama.cpp), a TemplateProcessing
post-processor puts it in front of `encode(text)` (add_special_tokens=True).

  python hf_tokenizer.py MODEL.gguf "text to encode"
"""

from __future__ import annotations

import sys

CONTROL, USER_DEFINED = 3, 4

# The Split regexes of Meta-Llama-3's and Qwen2.5's tokenizer.json (llama.cpp
# src/llama-vocab.cpp quotes the same as the "original regex").
LLAMA3_PATTERN = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}|"
    r" ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")
QWEN2_PATTERN = LLAMA3_PATTERN.replace(r"\p{N}{1,3}", r"\p{N}")
# tiktoken's o200k_base / o200k_harmony (GPT-4o, gpt-oss), as gpt-oss's
# tokenizer.json writes it.
GPT4O_PATTERN = (
    r"[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]*"
    r"[\p{Ll}\p{Lm}\p{Lo}\p{M}]+(?i:'s|'t|'re|'ve|'m|'ll|'d)?|"
    r"[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]+"
    r"[\p{Ll}\p{Lm}\p{Lo}\p{M}]*(?i:'s|'t|'re|'ve|'m|'ll|'d)?|"
    r"\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+")

LLAMA3_NAMES = ("llama-bpe", "llama3", "llama-v3")
GPT4O_NAMES = ("gpt-4o", "llama4")
PRE_NAMES = ("smollm", "gpt2", "qwen2") + LLAMA3_NAMES + GPT4O_NAMES
PATTERNS = {"llama3": LLAMA3_PATTERN, "qwen2": QWEN2_PATTERN,
            "gpt-4o": GPT4O_PATTERN}


def family(pre: str) -> str:
    """The pre-tokenizer family of a tokenizer.ggml.pre value."""
    if pre not in PRE_NAMES:
        raise ValueError(f"tokenizer.ggml.pre {pre!r} is not one of {PRE_NAMES}")
    if pre in LLAMA3_NAMES:
        return "llama3"
    return "gpt-4o" if pre in GPT4O_NAMES else pre


def default_add_bos(pre: str) -> bool:
    return family(pre) == "llama3"


def build(tokens, merges, types, pre, add_bos=False, bos_id=None):
    """A Tokenizer for vocabulary `tokens` (byte-level strings), merges
    ("a b" strings), GGUF token types and a tokenizer.ggml.pre value."""
    from tokenizers import (AddedToken, Regex, Tokenizer, decoders, models,
                            normalizers, pre_tokenizers, processors)

    fam = family(pre)
    vocab = {t: i for i, t in enumerate(tokens)}
    pairs = [tuple(m.split(" ", 1)) for m in merges]
    tk = Tokenizer(models.BPE(vocab=vocab, merges=pairs,
                              ignore_merges=fam == "llama3"))
    if fam in ("smollm", "gpt2"):
        steps = [pre_tokenizers.ByteLevel(add_prefix_space=False,
                                          use_regex=True)]
        if fam == "smollm":
            steps.insert(0, pre_tokenizers.Digits(individual_digits=True))
    else:
        steps = [pre_tokenizers.Split(Regex(PATTERNS[fam]), "isolated"),
                 pre_tokenizers.ByteLevel(add_prefix_space=False,
                                          use_regex=False)]
    tk.pre_tokenizer = pre_tokenizers.Sequence(steps)
    if fam == "qwen2":
        tk.normalizer = normalizers.NFC()
    tk.decoder = decoders.ByteLevel()
    special = [AddedToken(tokens[i], special=True, normalized=False)
               for i in range(len(tokens)) if types[i] in (CONTROL, USER_DEFINED)]
    tk.add_special_tokens(special)
    # Adding must not have renumbered anything.
    for t in special:
        assert tk.token_to_id(t.content) == vocab[t.content], t.content
    if add_bos and bos_id is not None:
        bos = tokens[bos_id]
        tk.post_processor = processors.TemplateProcessing(
            single=f"{bos} $A", pair=f"{bos} $A {bos} $B",
            special_tokens=[(bos, bos_id)])
    return tk


def build_from_gguf(path: str):
    import gguf

    reader = gguf.GGUFReader(path)

    def field(key, default=None):
        f = reader.fields.get(key)
        if f is None:
            if default is not None:
                return default
            raise ValueError(f"{path}: missing {key}")
        return f.contents()

    model = field("tokenizer.ggml.model")
    if model != "gpt2":
        raise ValueError(f"{path}: tokenizer model {model!r}; only 'gpt2' "
                         "(byte-level BPE) is supported here")
    pre = field("tokenizer.ggml.pre", "gpt2")
    add_bos = field("tokenizer.ggml.add_bos_token", default_add_bos(pre))
    bos_field = reader.fields.get("tokenizer.ggml.bos_token_id")
    return build(field("tokenizer.ggml.tokens"), field("tokenizer.ggml.merges"),
                 field("tokenizer.ggml.token_type"), pre, add_bos=add_bos,
                 bos_id=int(bos_field.contents()) if bos_field else None)


if __name__ == "__main__":
    if len(sys.argv) != 3:
        print(__doc__)
        sys.exit(2)
    tk = build_from_gguf(sys.argv[1])
    enc = tk.encode(sys.argv[2])
    print(enc.ids)
    print(enc.tokens)
    print(repr(tk.decode(enc.ids, skip_special_tokens=False)))
