#!/usr/bin/env python3
"""Builds a Hugging Face `tokenizers.Tokenizer` from a GGUF's byte-level BPE
metadata, as an independent reference for the C++ tokenizer and for turning
test prompts into ids.

Matches llama.cpp's `smollm` pre-tokenizer: every Unicode number code point
is split off alone (Digits(individual_digits=True)), then the GPT-2 regex runs
(ByteLevel(add_prefix_space=False), which also maps bytes to GPT-2's printable
code points). Control tokens (token_type 3, e.g. <|im_start|>=1,
<|im_end|>=2) and user-defined tokens (type 4) are added as special tokens so
they are matched whole in the input text.

  python hf_tokenizer.py MODEL.gguf "text to encode"
"""

from __future__ import annotations

import sys

CONTROL, USER_DEFINED = 3, 4


def build_from_gguf(path: str):
    import gguf
    from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers

    reader = gguf.GGUFReader(path)

    def field(key):
        f = reader.fields.get(key)
        if f is None:
            raise ValueError(f"{path}: missing {key}")
        return f.contents()

    model = field("tokenizer.ggml.model")
    if model != "gpt2":
        raise ValueError(f"{path}: tokenizer model {model!r}; only 'gpt2' "
                         "(byte-level BPE) is supported here")
    tokens = field("tokenizer.ggml.tokens")
    types = field("tokenizer.ggml.token_type")
    merges = [tuple(m.split(" ", 1)) for m in field("tokenizer.ggml.merges")]
    vocab = {t: i for i, t in enumerate(tokens)}

    tk = Tokenizer(models.BPE(vocab=vocab, merges=merges))
    tk.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Digits(individual_digits=True),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True),
    ])
    tk.decoder = decoders.ByteLevel()
    special = [AddedToken(tokens[i], special=True, normalized=False)
               for i in range(len(tokens)) if types[i] in (CONTROL, USER_DEFINED)]
    tk.add_special_tokens(special)
    # Adding must not have renumbered anything.
    for t in special:
        assert tk.token_to_id(t.content) == vocab[t.content], t.content
    return tk


if __name__ == "__main__":
    if len(sys.argv) != 3:
        print(__doc__)
        sys.exit(2)
    tk = build_from_gguf(sys.argv[1])
    enc = tk.encode(sys.argv[2])
    print(enc.ids)
    print(enc.tokens)
    print(repr(tk.decode(enc.ids, skip_special_tokens=False)))
