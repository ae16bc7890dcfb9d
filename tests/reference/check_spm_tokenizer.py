#!/usr/bin/env python3
"""Checks our SentencePiece BPE tokenizer (GGUF tokenizer model "llama", as
Llama 2 and Mistral v0.1-v0.3 ship) against Google's `sentencepiece` and
against llama.cpp.

  check_spm_tokenizer.py --tool build/tests/reference/tokenize_dump \\
      --workdir /tmp/spm

No real Llama 2 or Mistral vocabulary is available offline, so it trains
one: a BPE model of 2000 pieces with sentencepiece itself (byte fallback,
dummy prefix, no normalization and no whitespace folding, as those models'
tokenizers are set up; one thread, so the same model every run) on this
repository's documentation plus the test strings, then writes it as a GGUF
tokenizer (its pieces, scores and piece types, which use GGUF's numbering).
For the test strings of check_tokenizer.py and 1000 seeded random ones:
  - ids identical to sentencepiece's encode (strings without <s>/</s>,
    which sentencepiece never matches in text);
  - ids identical to llama.cpp's tokenize(special=True) (llama-cpp-python,
    vocab only), for all strings including ones with control tokens
    written literally, after which llama.cpp starts a new dummy prefix;
  - decoding gives the string back after the dummy prefix's space;
  - the same vocabulary as Hugging Face tokenizer.json folders (BPE with
    byte_fallback and merges made as transformers' converter makes them
    from the pieces' scores), in both forms those files take: Llama 2's
    Prepend/Replace normalizer and the newer Metaspace pre-tokenizer with
    prepend_scheme "first": ids identical to Hugging Face `tokenizers`
    reading the same file, for every string;
  - the trained model file itself as a Hugging Face folder with only
    tokenizer.model (and tokenizer_config.json): ids identical to
    sentencepiece's encode (strings without control tokens), to
    sentencepiece run on each text between literal control tokens as
    transformers' legacy LlamaTokenizer runs it (every string), and to
    llama.cpp (every string); prompts start with <s>;
    and a Unigram model trained the same way is refused by name.

Exit 0: all agree; 1: a mismatch or a tool error; 2: a usage error; 77
(ctest's skip): no mismatch, but the llama.cpp comparisons could not run,
llama-cpp-python not being installed for this Python (a "SKIP:" line
names it, after every other comparison has run).
"""

from __future__ import annotations

import argparse
import glob
import json
import os
import subprocess
import sys

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import check_tokenizer  # noqa: E402

VOCAB = 2000
SPECIAL_STRINGS = ["<s>", "</s>", "Hello</s>world", "<s>[INST] hi [/INST]",
                   "a <s>b</s> c", "<unk>", "x<s><s>y"]


def train(workdir: str, model_type: str = "bpe", name: str = "spm"):
    import sentencepiece as spm
    corpus = os.path.join(workdir, "corpus.txt")
    root = os.path.join(HERE, "..", "..")
    with open(corpus, "w", encoding="utf-8") as out:
        for path in sorted(glob.glob(os.path.join(root, "*.md")) +
                           glob.glob(os.path.join(root, "docs", "*.md"))):
            with open(path, encoding="utf-8") as f:
                out.write(f.read())
        for s in check_tokenizer.STRINGS:
            out.write(s.replace("\n", " ") + "\n")
    prefix = os.path.join(workdir, name)
    spm.SentencePieceTrainer.train(
        input=corpus, model_prefix=prefix, vocab_size=VOCAB,
        model_type=model_type,
        byte_fallback=True, add_dummy_prefix=True,
        remove_extra_whitespaces=False, normalization_rule_name="identity",
        character_coverage=0.9995, num_threads=1, minloglevel=2,
        max_sentence_length=1 << 16)
    return spm.SentencePieceProcessor(model_file=prefix + ".model")


def write_gguf(path: str, sp) -> None:
    import gguf
    n = sp.get_piece_size()
    pieces = [sp.id_to_piece(i) for i in range(n)]
    scores = [float(sp.get_score(i)) for i in range(n)]
    # sentencepiece's piece types are GGUF's token types (1 normal,
    # 2 unknown, 3 control, 4 user-defined, 5 unused, 6 byte).
    types = []
    for i in range(n):
        if sp.is_unknown(i):
            types.append(2)
        elif sp.is_control(i):
            types.append(3)
        elif sp.is_byte(i):
            types.append(6)
        elif sp.is_unused(i):
            types.append(5)
        else:
            types.append(1)
    w = gguf.GGUFWriter(path, "llama")
    # A token-embedding-only llama, enough for llama.cpp's vocab-only load.
    w.add_block_count(1)
    w.add_context_length(256)
    w.add_embedding_length(16)
    w.add_feed_forward_length(32)
    w.add_head_count(2)
    w.add_head_count_kv(2)
    w.add_layer_norm_rms_eps(1e-5)
    w.add_tokenizer_model("llama")
    w.add_token_list(pieces)
    w.add_token_scores(scores)
    w.add_token_types(types)
    w.add_bos_token_id(sp.bos_id())
    w.add_eos_token_id(sp.eos_id())
    w.add_unk_token_id(sp.unk_id())
    w.add_add_bos_token(True)
    w.add_add_space_prefix(True)
    w.add_tensor("token_embd.weight", np.zeros((n, 16), dtype=np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


def hf_tokenizer_json(sp, form: str) -> dict:
    """A tokenizer.json for the model `sp`, as transformers' LlamaConverter
    writes one: merges are every split of a piece into two pieces, best
    merged-piece score first."""
    n = sp.get_piece_size()
    vocab = {sp.id_to_piece(i): i for i in range(n)}
    merges = []
    for piece, i in vocab.items():
        if sp.is_control(i) or sp.is_unknown(i) or sp.is_byte(i):
            continue
        for k in range(1, len(piece)):
            left, right = piece[:k], piece[k:]
            if left in vocab and right in vocab:
                merges.append((sp.get_score(i), vocab[left], vocab[right],
                               left, right))
    merges.sort(key=lambda m: (-m[0], m[1], m[2]))
    space = "\u2581"
    added = [{"id": i, "content": sp.id_to_piece(i), "single_word": False,
              "lstrip": False, "rstrip": False, "normalized": False,
              "special": True} for i in (sp.unk_id(), sp.bos_id(), sp.eos_id())]
    tj = {
        "version": "1.0", "truncation": None, "padding": None,
        "added_tokens": added,
        "post_processor": {
            "type": "TemplateProcessing",
            "single": [{"SpecialToken": {"id": "<s>", "type_id": 0}},
                       {"Sequence": {"id": "A", "type_id": 0}}],
            "pair": [{"SpecialToken": {"id": "<s>", "type_id": 0}},
                     {"Sequence": {"id": "A", "type_id": 0}},
                     {"SpecialToken": {"id": "<s>", "type_id": 1}},
                     {"Sequence": {"id": "B", "type_id": 1}}],
            "special_tokens": {"<s>": {"id": "<s>", "ids": [sp.bos_id()],
                                       "tokens": ["<s>"]}}},
        "model": {"type": "BPE", "dropout": None, "unk_token": "<unk>",
                  "continuing_subword_prefix": None,
                  "end_of_word_suffix": None, "fuse_unk": True,
                  "byte_fallback": True, "ignore_merges": False,
                  "vocab": vocab,
                  "merges": [[m[3], m[4]] for m in merges]},
    }
    if form == "prepend":  # Llama 2, Mistral v0.1
        tj["normalizer"] = {"type": "Sequence", "normalizers": [
            {"type": "Prepend", "prepend": space},
            {"type": "Replace", "pattern": {"String": " "}, "content": space}]}
        tj["pre_tokenizer"] = None
        tj["decoder"] = {"type": "Sequence", "decoders": [
            {"type": "Replace", "pattern": {"String": space}, "content": " "},
            {"type": "ByteFallback"}, {"type": "Fuse"},
            {"type": "Strip", "content": " ", "start": 1, "stop": 0}]}
    else:  # Metaspace, prepend_scheme "first"
        meta = {"type": "Metaspace", "replacement": space,
                "prepend_scheme": "first", "split": False}
        tj["normalizer"] = None
        tj["pre_tokenizer"] = meta
        tj["decoder"] = dict(meta)
    return tj


def legacy_llama_encode(sp, text: str) -> list:
    """transformers' LlamaTokenizer (legacy, the slow one, sentencepiece
    underneath): the text is split at literal special tokens (here the
    model's control and unknown pieces; leftmost, longest first) and each
    text between them is encoded by sentencepiece on its own, dummy prefix
    included."""
    specials = sorted((sp.id_to_piece(i) for i in range(sp.get_piece_size())
                       if sp.is_control(i) or sp.is_unknown(i)),
                      key=len, reverse=True)
    ids, start, i = [], 0, 0
    while i < len(text):
        match = next((p for p in specials if text.startswith(p, i)), None)
        if match is None:
            i += 1
            continue
        if i > start:
            ids += sp.encode(text[start:i])
        ids.append(sp.piece_to_id(match))
        i += len(match)
        start = i
    if start < len(text):
        ids += sp.encode(text[start:])
    return ids


def write_model_folder(d: str, model_file: str) -> None:
    """A Hugging Face folder with tokenizer.model and no tokenizer.json,
    and the tokenizer_config.json of Llama 2's LlamaTokenizer."""
    import shutil
    os.makedirs(d, exist_ok=True)
    shutil.copyfile(model_file, os.path.join(d, "tokenizer.model"))
    with open(os.path.join(d, "tokenizer_config.json"), "w") as f:
        json.dump({"tokenizer_class": "LlamaTokenizer", "bos_token": "<s>",
                   "eos_token": "</s>", "unk_token": "<unk>",
                   "add_bos_token": True, "add_eos_token": False}, f)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--tool", required=True, help="tokenize_dump")
    ap.add_argument("--workdir", required=True)
    a = ap.parse_args(argv)
    os.makedirs(a.workdir, exist_ok=True)
    sp = train(a.workdir)
    model = os.path.join(a.workdir, "spm.gguf")
    write_gguf(model, sp)

    plain = [s for s in check_tokenizer.STRINGS
             if "<s>" not in s and "</s>" not in s and "<unk>" not in s]
    plain += check_tokenizer.random_strings(1000)
    strings = plain + SPECIAL_STRINGS
    ours = check_tokenizer.run_tool(a.tool, model, strings)
    failures = 0

    def report(label, want_of, subset):
        nonlocal failures
        same = 0
        for s in subset:
            got = ours[strings.index(s)]["ids"]
            want = want_of(s)
            if got == want:
                same += 1
            elif failures < 10:
                print(f"  {label} DIFFERS on {s!r}:\n    ours {got}\n"
                      f"    want {want}")
                failures += 1
            else:
                failures += 1
        print(f"[{label}] {same} of {len(subset)} strings identical")

    report("sentencepiece", lambda s: sp.encode(s), plain)
    bad_decode = [s for s, r in zip(strings, ours)
                  if s in plain and s and r["decoded"] != " " + s]
    print(f"[decode] {len(plain) - len(bad_decode)} of {len(plain)} strings "
          f"decode to the dummy prefix's space and themselves")
    failures += len(bad_decode)
    for s in bad_decode[:5]:
        print(f"  decode DIFFERS on {s!r}")
    from tokenizers import Tokenizer  # noqa: PLC0415
    for form in ("prepend", "metaspace"):
        d = os.path.join(a.workdir, f"hf-{form}")
        os.makedirs(d, exist_ok=True)
        text = json.dumps(hf_tokenizer_json(sp, form), ensure_ascii=False)
        with open(os.path.join(d, "tokenizer.json"), "w",
                  encoding="utf-8") as f:
            f.write(text)
        with open(os.path.join(d, "tokenizer_config.json"), "w") as f:
            json.dump({"bos_token": "<s>", "eos_token": "</s>"}, f)
        hf = Tokenizer.from_str(text)
        hf_plain = [hf.encode(s, add_special_tokens=False).ids for s in plain]
        faithful = sum(h == sp.encode(s) for h, s in zip(hf_plain, plain))
        # The Prepend form is the model itself: Hugging Face must agree
        # with sentencepiece everywhere. Metaspace adds no dummy prefix in
        # front of a leading space, by design.
        print(f"[hf {form}] the written tokenizer.json: Hugging Face agrees "
              f"with sentencepiece on {faithful} of {len(plain)} strings"
              f"{'' if form == 'prepend' else ' (not before a leading space)'}")
        if form == "prepend" and faithful != len(plain):
            failures += 1
        ours_hf = check_tokenizer.run_tool(a.tool, d, strings)
        same = 0
        for s, r in zip(strings, ours_hf):
            want = hf.encode(s, add_special_tokens=False).ids
            if r["ids"] == want:
                same += 1
            else:
                failures += 1
                if failures <= 10:
                    print(f"  hf {form} DIFFERS on {s!r}:\n    ours "
                          f"{r['ids']}\n    want {want}")
        bos = [r["prompt_ids"][:1] for r in ours_hf if r["ids"]]
        bos_ok = all(b == [sp.bos_id()] for b in bos)
        failures += not bos_ok
        print(f"[hf {form}] {same} of {len(strings)} strings identical to "
              f"Hugging Face; prompts start with <s>: {bos_ok}")
    # The model file itself, in a folder with no tokenizer.json.
    folder = os.path.join(a.workdir, "hf-tokenizer-model")
    write_model_folder(folder, os.path.join(a.workdir, "spm.model"))
    ours_model = check_tokenizer.run_tool(a.tool, folder, strings)

    def report_folder(label, want_of, subset):
        nonlocal failures
        same = 0
        for s in subset:
            got = ours_model[strings.index(s)]["ids"]
            want = want_of(s)
            same += got == want
            if got != want:
                failures += 1
                if failures <= 10:
                    print(f"  {label} DIFFERS on {s!r}:\n    ours {got}\n"
                          f"    want {want}")
        print(f"[{label}] {same} of {len(subset)} strings identical")

    report_folder("tokenizer.model: sentencepiece", lambda s: sp.encode(s),
                  plain)
    report_folder("tokenizer.model: legacy LlamaTokenizer",
                  lambda s: legacy_llama_encode(sp, s), strings)
    bos_ok = all(r["prompt_ids"][:1] == [sp.bos_id()] for r in ours_model)
    failures += not bos_ok
    print(f"[tokenizer.model] prompts start with <s>: {bos_ok}")
    train(a.workdir, model_type="unigram", name="unigram")
    bad = os.path.join(a.workdir, "hf-tokenizer-model-unigram")
    write_model_folder(bad, os.path.join(a.workdir, "unigram.model"))
    proc = subprocess.run([a.tool, "--model", bad], input="", text=True,
                          capture_output=True)
    refused = proc.returncode != 0 and "UNIGRAM" in proc.stderr
    failures += not refused
    print(f"[tokenizer.model] a Unigram model is refused by name: {refused}"
          f" ({proc.stderr.strip()})")
    skipped = []
    try:
        from llama_cpp import Llama  # noqa: PLC0415
    except ImportError as e:
        skipped.append(f"llama.cpp comparisons (spm.gguf and the "
                       f"tokenizer.model folder): llama-cpp-python is not "
                       f"installed for {sys.executable} ({e})")
        print(f"SKIP: {skipped[-1]}")
    else:
        llm = Llama(model_path=model, vocab_only=True, verbose=False)

        def llama_cpp(s):
            return llm.tokenize(s.encode("utf-8"), add_bos=False,
                                special=True)
        report("llama.cpp", llama_cpp, strings)
        report_folder("tokenizer.model: llama.cpp", llama_cpp, strings)
    if failures:
        print(f"FAILED: {failures}")
        return 1
    if skipped:
        print("SKIP: no mismatch, but not compared: " + "; ".join(skipped))
        return 77
    print("PASSED")
    return 0


if __name__ == "__main__":
    sys.exit(main())
