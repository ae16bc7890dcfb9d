#!/usr/bin/env python3
"""Checks our SentencePiece BPE tokenizer (GGUF tokenizer model "llama", as
Llama 2, Mistral v0.1-v0.3 and Gemma 2 and 3 ship) against Google's
`sentencepiece` and against llama.cpp.

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

Then the same for Gemma's setup (Gemma 2 and 3: GGUF model "llama" with
add_space_prefix false): a second BPE model trained with no dummy prefix,
split digits, pad/eos/bos/unk at 0 to 3 and user-defined pieces as
Gemma's (<start_of_turn>, <end_of_turn>, <unusedN>, runs of newlines and
of spaces, HTML tags), written as convert_hf_to_gguf.py writes Gemma 3's
GGUF (its user-defined pieces CONTROL when tokenizer_config.json calls
them special or they look special, else USER_DEFINED with "▁" written as
spaces; add_bos true, add_eos false), as a folder with tokenizer.model,
and as tokenizer.json folders of GemmaConverter's two forms (the
normalizer Replace(" ", "▁"), with Gemma 3's no-op pre-tokenizer
Split(" ") and without): ids identical to sentencepiece's (strings
without its control pieces or a "▁" of their own), to llama.cpp's with
special=True (all strings) and special=False (strings with no CONTROL
token), and to Hugging Face's; every string decodes to itself and every
prompt is <bos> and the ids.

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


def train(workdir: str, model_type: str = "bpe", name: str = "spm",
          **options):
    """`options` override the trainer's settings (Gemma's, see
    GEMMA_TRAINER)."""
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
    settings = dict(
        input=corpus, model_prefix=prefix, vocab_size=VOCAB,
        model_type=model_type,
        byte_fallback=True, add_dummy_prefix=True,
        remove_extra_whitespaces=False, normalization_rule_name="identity",
        character_coverage=0.9995, num_threads=1, minloglevel=2,
        max_sentence_length=1 << 16)
    settings.update(options)
    spm.SentencePieceTrainer.train(**settings)
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


# Gemma (2 and 3; Gemma 3's 262K vocabulary) as its tokenizer.model is set
# up: BPE with byte fallback, no dummy prefix, digits split, pad/eos/bos/unk
# at ids 0 to 3, and user-defined pieces (matched whole in the text by
# sentencepiece, never merged into): <mask>, [multimodal], <unusedN>,
# <start_of_turn>, <end_of_turn>, runs of 1 to 31 newlines and of 2 to 31
# spaces ("▁▁"...), HTML tags (among them "<s>").
GEMMA_USER_DEFINED = (
    ["<mask>", "[multimodal]"] + [f"<unused{i}>" for i in range(3)] +
    ["<start_of_turn>", "<end_of_turn>"] +
    ["\n" * k for k in range(1, 32)] + ["\u2581" * k for k in range(2, 32)] +
    ["<table>", "<tr>", "<td>", "</td>", "</tr>", "</table>", "<b>", "</b>",
     "<s>", "<h1>"])
GEMMA_TRAINER = dict(
    add_dummy_prefix=False, split_digits=True,
    allow_whitespace_only_pieces=True, pad_id=0, eos_id=1, bos_id=2,
    unk_id=3, pad_piece="<pad>", eos_piece="<eos>", bos_piece="<bos>",
    unk_piece="<unk>", user_defined_symbols=GEMMA_USER_DEFINED)
# Gemma's tokenizer_config.json marks these added tokens special besides
# the control pieces (transformers' GemmaConverter.special_tokens).
GEMMA_SPECIAL = ("<start_of_turn>", "<end_of_turn>")
GEMMA_STRINGS = [
    "<start_of_turn>user\nWhat is 2+2?<end_of_turn>\n<start_of_turn>model\n",
    "<bos><start_of_turn>user\nhi<end_of_turn>\n<start_of_turn>model\n"
    "Hello!<end_of_turn>\n",
    "<start_of_turn><end_of_turn>", "x<start_of_turn>y", " <end_of_turn> a",
    "<start_of_turn", "<end_of_turn>>", "<<start_of_turn>>",
    "<bos>", "<eos>", "<pad>", "<unk>", "text<eos>more", "a<bos><bos>b",
    "<mask> [multimodal] <unused0><unused2>x", "<unused7>",
    "<table><tr><td>cell</td></tr></table>", "<b>bold</b> and <s>struck",
    "<s></s><s>", " " * 31, " " * 32, " " * 70 + "x", "a" + " " * 33 + "b",
    "\n" * 31, "\n" * 33 + "y", "a \n  \n   b\n\n\n c", "\t\t  \n\n",
    # U+2581 written in the text: sentencepiece escapes spaces to it and
    # then matches its "▁▁" pieces; in the GGUF those are "  " (real
    # spaces), so llama.cpp never does. Compared with llama.cpp only.
    "x\u2581\u2581y", "\u2581leading \u2581\u2581\u2581 and  \u2581",
]


def gemma_added_tokens(sp) -> dict:
    """tokenizer_config.json's added_tokens_decoder as Gemma 3 ships it:
    every control, unknown and user-defined piece; special for the
    control and unknown ones and GEMMA_SPECIAL."""
    added = {}
    user_defined = set(GEMMA_USER_DEFINED)  # (No is_user_defined in Python.)
    for i in range(sp.get_piece_size()):
        piece = sp.id_to_piece(i)
        control = sp.is_control(i) or sp.is_unknown(i)
        if control or piece in user_defined:
            added[str(i)] = {"content": piece, "lstrip": False,
                             "normalized": False, "rstrip": False,
                             "single_word": False,
                             "special": control or piece in GEMMA_SPECIAL}
    return added


def looks_special(token: str) -> bool:
    """convert_hf_to_gguf.py's does_token_look_special."""
    return (token in ("<pad>", "<mask>", "<2mass>", "[@BOS@]") or
            (token.startswith("<|") and token.endswith("|>")) or
            (token.startswith("<\uff5c") and token.endswith("\uff5c>")) or
            (token.startswith("<unused") and token.endswith(">")))


def write_gemma_gguf(path: str, sp) -> None:
    """The vocabulary as convert_hf_to_gguf.py writes Gemma 3's
    (_create_vocab_sentencepiece, then add_space_prefix false): piece
    types from the model, where user-defined pieces count as normal; then
    every added token of tokenizer_config.json becomes CONTROL when it is
    special or looks special (<mask>, <unusedN>: so <unk> too, and
    <start_of_turn> and <end_of_turn>), else USER_DEFINED with its "▁"
    written as spaces, all scored -1000; add_bos true, add_eos false."""
    import gguf
    n = sp.get_piece_size()
    pieces = [sp.id_to_piece(i) for i in range(n)]
    scores = [float(sp.get_score(i)) for i in range(n)]
    types = [2 if sp.is_unknown(i) else 3 if sp.is_control(i) else
             5 if sp.is_unused(i) else 6 if sp.is_byte(i) else 1
             for i in range(n)]
    for key, token in gemma_added_tokens(sp).items():
        i, text = int(key), token["content"]
        if token["special"] or looks_special(text):
            types[i] = 3
        else:
            types[i] = 4
            text = text.replace("\u2581", " ")
        pieces[i], scores[i] = text, -1000.0
    w = gguf.GGUFWriter(path, "gemma3")
    # Enough of a Gemma 3 for llama.cpp's vocab-only load.
    w.add_block_count(1)
    w.add_context_length(256)
    w.add_embedding_length(16)
    w.add_feed_forward_length(32)
    w.add_head_count(2)
    w.add_head_count_kv(2)
    w.add_key_length(8)
    w.add_value_length(8)
    w.add_sliding_window(128)
    w.add_layer_norm_rms_eps(1e-6)
    w.add_tokenizer_model("llama")
    w.add_tokenizer_pre("default")
    w.add_token_list(pieces)
    w.add_token_scores(scores)
    w.add_token_types(types)
    w.add_bos_token_id(sp.bos_id())
    w.add_eos_token_id(sp.eos_id())
    w.add_unk_token_id(sp.unk_id())
    w.add_pad_token_id(sp.pad_id())
    w.add_add_bos_token(True)
    w.add_add_eos_token(False)
    w.add_add_space_prefix(False)
    w.add_tensor("token_embd.weight", np.zeros((n, 16), dtype=np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


def check_gemma(a, Llama) -> int:
    """The Gemma variant: a model trained as GEMMA_TRAINER, as a GGUF
    (write_gemma_gguf), as a folder with tokenizer.model and as
    tokenizer.json folders, against sentencepiece, Hugging Face and
    (Llama not None) llama.cpp. Returns the failures."""
    sp = train(a.workdir, name="gemma", **GEMMA_TRAINER)
    model = os.path.join(a.workdir, "gemma.gguf")
    write_gemma_gguf(model, sp)
    folder = os.path.join(a.workdir, "hf-gemma-tokenizer-model")
    write_model_folder(folder, os.path.join(a.workdir, "gemma.model"))
    with open(os.path.join(folder, "tokenizer_config.json"), "w") as f:
        json.dump({"tokenizer_class": "GemmaTokenizer", "bos_token": "<bos>",
                   "eos_token": "<eos>", "unk_token": "<unk>",
                   "pad_token": "<pad>", "add_bos_token": True,
                   "add_eos_token": False,
                   "added_tokens_decoder": gemma_added_tokens(sp)}, f)

    strings = list(check_tokenizer.STRINGS)
    strings += check_tokenizer.random_strings(1000) + GEMMA_STRINGS
    # sentencepiece matches its user-defined pieces in the text, not its
    # control ones, and "▁" written in the text as a space.
    control = [sp.id_to_piece(i) for i in range(sp.get_piece_size())
               if sp.is_control(i) or sp.is_unknown(i)]
    plain = [s for s in strings
             if "\u2581" not in s and not any(c in s for c in control)]
    failures = 0
    llm = Llama and Llama(model_path=model, vocab_only=True, verbose=False)
    for label, path in (("gemma gguf", model),
                        ("gemma tokenizer.model", folder)):
        ours = check_tokenizer.run_tool(a.tool, path, strings)
        by_string = dict(zip(strings, ours))

        def report(what, want_of, subset):
            nonlocal failures
            same = 0
            for s in subset:
                got, want = by_string[s]["ids"], want_of(s)
                same += got == want
                if got != want:
                    failures += 1
                    if failures <= 10:
                        print(f"  [{label}] {what} DIFFERS on {s!r}:\n"
                              f"    ours {got}\n    want {want}")
            print(f"[{label}] {what}: {same} of {len(subset)} strings "
                  f"identical")

        report("sentencepiece", lambda s: sp.encode(s), plain)
        # No dummy prefix: every string decodes to itself ("▁" to a space).
        decoded = sum(r["decoded"] == s.replace("\u2581", " ")
                      for s, r in zip(strings, ours))
        failures += len(strings) - decoded
        # <bos> in front unless there already; never <eos> at the end.
        bos = [sp.bos_id()]
        prompts = sum(r["prompt_ids"] == ([] if r["ids"][:1] == bos else bos)
                      + r["ids"] for r in ours)
        failures += len(strings) - prompts
        print(f"[{label}] {decoded} of {len(strings)} decode to themselves; "
              f"{prompts} of {len(strings)} prompts are <bos> and the ids")
        if llm is None:
            continue
        # The folder is sentencepiece's model: "▁" in the text differs.
        subset = [s for s in strings
                  if label == "gemma gguf" or "\u2581" not in s]
        # special=True: control tokens written in the text are matched
        # (as our Encode does); user-defined ones are either way, so on
        # strings with no control token special=False must agree too.
        report("llama.cpp", lambda s: llm.tokenize(
            s.encode("utf-8"), add_bos=False, special=True), subset)
        gguf_control = control + [t for t in GEMMA_USER_DEFINED
                                  if t in GEMMA_SPECIAL or looks_special(t)]
        report("llama.cpp special=False", lambda s: llm.tokenize(
            s.encode("utf-8"), add_bos=False, special=False),
            [s for s in subset if not any(c in s for c in gguf_control)])
    from tokenizers import Tokenizer  # noqa: PLC0415
    for form in ("gemma3", "gemma"):
        d = os.path.join(a.workdir, f"hf-{form}")
        os.makedirs(d, exist_ok=True)
        text = json.dumps(hf_tokenizer_json(sp, form), ensure_ascii=False)
        with open(os.path.join(d, "tokenizer.json"), "w",
                  encoding="utf-8") as f:
            f.write(text)
        with open(os.path.join(d, "tokenizer_config.json"), "w") as f:
            json.dump({"bos_token": "<bos>", "eos_token": "<eos>"}, f)
        hf = Tokenizer.from_str(text)
        want = [hf.encode(s, add_special_tokens=False).ids for s in strings]
        faithful = sum(w == sp.encode(s) for w, s in zip(want, strings)
                       if s in plain)
        print(f"[hf {form}] the written tokenizer.json: Hugging Face agrees "
              f"with sentencepiece on {faithful} of {len(plain)} strings")
        ours = check_tokenizer.run_tool(a.tool, d, strings)
        same = 0
        for s, r, w in zip(strings, ours, want):
            same += r["ids"] == w
            if r["ids"] != w:
                failures += 1
                if failures <= 10:
                    print(f"  hf {form} DIFFERS on {s!r}:\n    ours "
                          f"{r['ids']}\n    want {w}")
        bos_ok = all(r["prompt_ids"][:1] == [sp.bos_id()] for r in ours)
        failures += not bos_ok
        print(f"[hf {form}] {same} of {len(strings)} strings identical to "
              f"Hugging Face; prompts start with <bos>: {bos_ok}")
    return failures


def hf_tokenizer_json(sp, form: str) -> dict:
    """A tokenizer.json for the model `sp`, as transformers' LlamaConverter
    (GemmaConverter: form "gemma", "gemma3") writes one: merges are every
    split of a piece into two pieces, best merged-piece score first."""
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
    if form.startswith("gemma"):  # Every control and user-defined piece.
        added = [{"id": int(i), **t}
                 for i, t in gemma_added_tokens(sp).items()]
    bos = sp.id_to_piece(sp.bos_id())
    tj = {
        "version": "1.0", "truncation": None, "padding": None,
        "added_tokens": added,
        "post_processor": {
            "type": "TemplateProcessing",
            "single": [{"SpecialToken": {"id": bos, "type_id": 0}},
                       {"Sequence": {"id": "A", "type_id": 0}}],
            "pair": [{"SpecialToken": {"id": bos, "type_id": 0}},
                     {"Sequence": {"id": "A", "type_id": 0}},
                     {"SpecialToken": {"id": bos, "type_id": 1}},
                     {"Sequence": {"id": "B", "type_id": 1}}],
            "special_tokens": {bos: {"id": bos, "ids": [sp.bos_id()],
                                     "tokens": [bos]}}},
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
    elif form.startswith("gemma"):  # No dummy prefix.
        tj["normalizer"] = {"type": "Replace", "pattern": {"String": " "},
                            "content": space}
        # Gemma 3's files: a Split at " " that finds none left.
        tj["pre_tokenizer"] = None if form == "gemma" else {
            "type": "Split", "pattern": {"String": " "},
            "behavior": "MergedWithPrevious", "invert": False}
        tj["decoder"] = {"type": "Sequence", "decoders": [
            {"type": "Replace", "pattern": {"String": space}, "content": " "},
            {"type": "ByteFallback"}, {"type": "Fuse"}]}
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
        skipped.append(f"llama.cpp comparisons (spm.gguf, gemma.gguf and "
                       f"the tokenizer.model folders): llama-cpp-python is "
                       f"not installed for {sys.executable} ({e})")
        print(f"SKIP: {skipped[-1]}")
    else:
        llm = Llama(model_path=model, vocab_only=True, verbose=False)

        def llama_cpp(s):
            return llm.tokenize(s.encode("utf-8"), add_bos=False,
                                special=True)
        report("llama.cpp", llama_cpp, strings)
        report_folder("tokenizer.model: llama.cpp", llama_cpp, strings)
    failures += check_gemma(a, None if skipped else Llama)
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
