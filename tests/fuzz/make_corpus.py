#!/usr/bin/env python3
"""Writes the fuzzers' seed corpora into tests/fuzz/corpus/<target>/: small,
valid inputs of each surface, built with independent writers (the `gguf`
package, numpy, protobuf) so that the fuzzers start from inputs that pass
the parsers and mutate from there. Deterministic: rerunning rewrites the
same bytes.

  .venv/bin/python tests/fuzz/make_corpus.py
"""

from __future__ import annotations

import json
import os
import struct
import subprocess
import sys
import tempfile

import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))
from testlib import pb_bytes, pb_scalar, pb_varint  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
CORPUS = os.path.join(HERE, "corpus")


def put(target: str, name: str, data: bytes | str) -> None:
    d = os.path.join(CORPUS, target)
    os.makedirs(d, exist_ok=True)
    with open(os.path.join(d, name), "wb") as f:
        f.write(data.encode() if isinstance(data, str) else data)


# A byte-level BPE vocabulary: the 256 byte symbols (GPT-2 mapping), a few
# merges, and two special tokens.
def byte_symbols() -> list[str]:
    bs = (list(range(ord("!"), ord("~") + 1)) + list(range(0xA1, 0xAD))
          + list(range(0xAE, 0x100)))
    cs = bs[:]
    n = 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return [chr(c) for c in cs]


MERGES = ["Ġ t", "h e", "Ġt he", "i n", "e r", "a n", "Ġ a", "o n"]
SPECIAL = ["<|endoftext|>", "<|im_end|>"]


def vocab() -> list[str]:
    v = byte_symbols()
    for m in MERGES:
        v.append(m.replace(" ", ""))
    return v + SPECIAL


def gguf_seed() -> bytes:
    import gguf
    path = tempfile.mktemp(suffix=".gguf")
    w = gguf.GGUFWriter(path, "llama")
    w.add_block_count(1)
    w.add_context_length(64)
    w.add_embedding_length(32)
    w.add_feed_forward_length(64)
    w.add_head_count(2)
    w.add_head_count_kv(1)
    w.add_layer_norm_rms_eps(1e-5)
    w.add_rope_freq_base(10000.0)
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre("smollm")
    toks = vocab()
    w.add_token_list(toks)
    w.add_token_types([1] * (len(toks) - len(SPECIAL)) + [3] * len(SPECIAL))
    w.add_token_merges(MERGES)
    w.add_eos_token_id(len(toks) - 1)
    rng = np.random.default_rng(0)
    n_vocab = len(toks)

    def t(name, *shape):
        w.add_tensor(name, rng.standard_normal(shape).astype(np.float16))

    t("token_embd.weight", n_vocab, 32)
    w.add_tensor("output_norm.weight", np.ones(32, np.float32))
    w.add_tensor("blk.0.attn_norm.weight", np.ones(32, np.float32))
    w.add_tensor("blk.0.ffn_norm.weight", np.ones(32, np.float32))
    t("blk.0.attn_q.weight", 32, 32)
    t("blk.0.attn_k.weight", 16, 32)
    t("blk.0.attn_v.weight", 16, 32)
    t("blk.0.attn_output.weight", 32, 32)
    t("blk.0.ffn_gate.weight", 64, 32)
    t("blk.0.ffn_up.weight", 64, 32)
    t("blk.0.ffn_down.weight", 32, 64)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    with open(path, "rb") as f:
        data = f.read()
    os.unlink(path)
    return data


def safetensors_seed(dtype: str, np_dtype) -> bytes:
    # The fuzzer's config.json: hidden 32, ffn 64, 2 layers, 2 heads of 16
    # (1 KV head), vocabulary 67, tied embeddings.
    rng = np.random.default_rng(1)
    shapes = {"model.embed_tokens.weight": (67, 32), "model.norm.weight": (32,)}
    for l in range(2):
        p = f"model.layers.{l}."
        shapes.update({
            p + "input_layernorm.weight": (32,),
            p + "post_attention_layernorm.weight": (32,),
            p + "self_attn.q_proj.weight": (32, 32),
            p + "self_attn.k_proj.weight": (16, 32),
            p + "self_attn.v_proj.weight": (16, 32),
            p + "self_attn.o_proj.weight": (32, 32),
            p + "mlp.gate_proj.weight": (64, 32),
            p + "mlp.up_proj.weight": (64, 32),
            p + "mlp.down_proj.weight": (32, 64),
        })
    header, blobs, offset = {}, [], 0
    for name, shape in shapes.items():
        b = rng.standard_normal(shape).astype(np_dtype).tobytes()
        header[name] = {"dtype": dtype, "shape": list(shape),
                        "data_offsets": [offset, offset + len(b)]}
        blobs.append(b)
        offset += len(b)
    header["__metadata__"] = {"format": "pt"}
    h = json.dumps(header).encode()
    h += b" " * (-len(h) % 8)
    return struct.pack("<Q", len(h)) + h + b"".join(blobs)


QWEN2_REGEX = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}|"
               r" ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")


def tokenizer_json_seed(family: str = "gpt2") -> str:
    """gpt2: ByteLevel; qwen2: NFC, Split(Qwen2's regex), ByteLevel and a
    BOS template (as Llama 3 has)."""
    toks = vocab()
    pre = {"type": "ByteLevel", "add_prefix_space": False, "use_regex": True}
    extra = {}
    if family == "qwen2":
        pre = {"type": "Sequence", "pretokenizers": [
            {"type": "Split", "pattern": {"Regex": QWEN2_REGEX},
             "behavior": "Isolated", "invert": False},
            {"type": "ByteLevel", "add_prefix_space": False,
             "use_regex": False}]}
        bos = SPECIAL[0]
        extra = {"normalizer": {"type": "NFC"}, "post_processor": {
            "type": "TemplateProcessing",
            "single": [{"SpecialToken": {"id": bos, "type_id": 0}},
                       {"Sequence": {"id": "A", "type_id": 0}}],
            "special_tokens": {bos: {"id": bos, "ids": [len(toks) - len(SPECIAL)],
                                     "tokens": [bos]}}}}
    return json.dumps({
        "version": "1.0",
        "added_tokens": [{"id": len(toks) - len(SPECIAL) + i, "content": s,
                          "special": True} for i, s in enumerate(SPECIAL)],
        "normalizer": None,
        "pre_tokenizer": pre,
        "decoder": {"type": "ByteLevel"},
        "model": {"type": "BPE", "vocab": {t: i for i, t in enumerate(toks[:-2])},
                  "merges": MERGES},
        **extra,
    })


def step_plan_seeds() -> list[bytes]:
    out = tempfile.mkdtemp()
    subprocess.run([sys.executable, "-m", "grpc_tools.protoc",
                    f"-I{ROOT}/proto", f"--python_out={out}",
                    f"{ROOT}/proto/shardlm/v1/inference.proto",
                    f"{ROOT}/proto/shardlm/v1/control.proto"], check=True)
    sys.path.insert(0, out)
    from shardlm.v1 import control_pb2  # noqa: E402

    seeds = []
    # Prefill of 5 tokens of sequence 7 in blocks 0 and 1 (block size 4),
    # sampling the last; then a decode step; then a copy to the host tier.
    p = control_pb2.StepPlan(step_id=1, tokens=[3, 14, 15, 9, 26],
                             positions=[0, 1, 2, 3, 4], token_seq=[0] * 5,
                             seq_ids=[7], logit_rows=[4], sample_index=[0],
                             logprobs=[2])
    p.deltas.add(seq_id=7, new_blocks=[0, 1])
    p.sampling.add()
    seeds.append(p.SerializeToString())
    d = control_pb2.StepPlan(step_id=2, tokens=[5], positions=[5],
                             token_seq=[0], seq_ids=[7], logit_rows=[0],
                             sample_index=[1])
    d.deltas.add(seq_id=7, new_blocks=[0, 1])
    d.sampling.add(temperature=0.8, top_p=0.9, seed=3)
    seeds.append(d.SerializeToString())
    c = control_pb2.StepPlan(step_id=3, released=[7])
    c.copies.add(src=0, dst=16)
    seeds.append(c.SerializeToString())
    return seeds


HTTP = [
    "GET /health HTTP/1.1\r\nHost: x\r\n\r\n",
    "GET /ready HTTP/1.1\r\n\r\n",
    "GET /metrics HTTP/1.1\r\n\r\n",
    "GET /v1/models HTTP/1.1\r\nAuthorization: Bearer k\r\n\r\n",
    'POST /v1/completions HTTP/1.1\r\nContent-Type: application/json\r\n'
    'Content-Length: 60\r\n\r\n{"prompt": "The capital of France is", "max_tokens": 4}',
    'POST /v1/completions HTTP/1.1\r\n\r\n{"prompt": ["a", "b"], '
    '"max_tokens": 3, "temperature": 0.7, "top_p": 0.9, "seed": 1, '
    '"stop": ["\\n", "é"], "logprobs": 2, "stream": true}',
    'POST /v1/chat/completions HTTP/1.1\r\n\r\n{"model": "tiny", "messages": '
    '[{"role": "system", "content": "Be brief."}, {"role": "user", '
    '"content": "Hi \\u00e9"}], "max_tokens": 3, "stream": true}',
    'POST /v1/chat/completions HTTP/1.1\r\n\r\n{"messages": [{"role": "user", '
    '"content": [{"type": "text", "text": "x"}]}], "max_completion_tokens": 2,'
    ' "stop_token_ids": [1, 2]}',
    'POST /tokenize HTTP/1.1\r\n\r\n{"prompt": "hello <|im_end|>"}',
    'POST /v1/messages HTTP/1.1\r\nx-api-key: k\r\n\r\n{"model": "tiny", '
    '"max_tokens": 3, "system": [{"type": "text", "text": "Be brief."}], '
    '"messages": [{"role": "user", "content": "Hi"}], "stream": true, '
    '"stop_sequences": ["\\n"]}',
    'POST /v1/messages HTTP/1.1\r\n\r\n{"max_tokens": 2, "tools": [{"name": '
    '"f", "input_schema": {"type": "object"}}], "tool_choice": {"type": '
    '"auto"}, "messages": [{"role": "assistant", "content": [{"type": '
    '"tool_use", "id": "t", "name": "f", "input": {}}]}, {"role": "user", '
    '"content": [{"type": "tool_result", "tool_use_id": "t", "content": '
    '"ok"}]}]}',
    'POST /v1/responses HTTP/1.1\r\n\r\n{"model": "tiny", "instructions": '
    '"Be brief.", "input": [{"role": "user", "content": [{"type": '
    '"input_text", "text": "Hi"}]}, {"type": "function_call", "call_id": '
    '"c", "name": "f", "arguments": "{}"}, {"type": "function_call_output",'
    ' "call_id": "c", "output": "ok"}], "max_output_tokens": 3, "stream": '
    'true, "store": true, "text": {"format": {"type": "json_object"}}}',
]

TEXT = ["Hello, world!", "don't stop 1234 56", "  two  spaces\n\ttab",
        "日本語のテキスト", "emoji 🙂👍🏽", "<|im_start|>user\nhi<|im_end|>",
        "\xc3\xa9t\xc3\xa9", "a" * 200,
        # Llama 3 / Qwen2 regexes and NFC.
        "I'LL We'Re x'\u017ft 1234567\r\n\r\n  x!!\n\n\tword",
        "e\u0301 A\u030a \u212b \u1100\u1161\u11a8 a\u0302\u0323",
        "<|begin_of_text|><|start_header_id|>user<|end_header_id|>\n\nhi"
        "<|eot_id|>"]


def grpc_seeds() -> list[bytes]:
    """fuzz_grpc_api inputs: a selector byte (even: Generate, odd:
    Tokenize), then a request's wire bytes, hand-encoded (proto3 field
    numbers of proto/shardlm/v1/inference.proto)."""
    varint, string, scalar = pb_varint, pb_bytes, pb_scalar

    msg = lambda role, content: string(11, string(1, role) +  # noqa: E731
                                       string(2, content))
    return [
        b"\x00" + string(1, b"Once upon a time") + scalar(3, 4),
        b"\x00" + string(2, bytes([1, 2, 3])) + scalar(3, 2) + scalar(9, 2) +
        string(8, b"."),
        b"\x00" + msg(b"system", b"Be brief.") + msg(b"user", b"Hi!") +
        scalar(3, 3) + string(4, scalar(2, 5) + scalar(4, 7)),
        b"\x01" + string(1, "h\u00e9llo w\u00f6rld 123".encode()),
    ]


def main() -> int:
    put("fuzz_gguf", "tiny.gguf", gguf_seed())
    put("fuzz_safetensors", "f32.safetensors",
        safetensors_seed("F32", np.float32))
    put("fuzz_safetensors", "f16.safetensors",
        safetensors_seed("F16", np.float16))
    put("fuzz_tokenizer_json", "bpe.json", tokenizer_json_seed())
    put("fuzz_tokenizer_json", "qwen2.json", tokenizer_json_seed("qwen2"))
    for i, t in enumerate(TEXT):
        put("fuzz_tokenizer_roundtrip", f"text{i}", t)
    put("fuzz_tokenizer_roundtrip", "invalid", b"\xff\xfe\xc3(\xe2\x82")
    put("fuzz_stop_strings", "one", b"\x00\x02\nxline one\nline two")
    put("fuzz_stop_strings", "three",
        b"\x02\x03end\x01.\x02\xc3\xa9Once upon a time. The end.")
    for i, r in enumerate(HTTP):
        put("fuzz_http_api", f"req{i}", r)
    for i, r in enumerate(grpc_seeds()):
        put("fuzz_grpc_api", f"req{i}", r)
    for i, s in enumerate(step_plan_seeds()):
        put("fuzz_step_plan", f"plan{i}", s)
    print(f"seeds written to {CORPUS}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
