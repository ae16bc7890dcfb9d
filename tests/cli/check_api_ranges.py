#!/usr/bin/env python3
"""The same numeric ranges, with the same words, on both public APIs (issue
39): every out-of-range number sent to /v1/completions (or
/v1/chat/completions) and as the matching field of a gRPC GenerateRequest
is refused with HTTP 400 and INVALID_ARGUMENT, and the two messages are
identical. gRPC requests are hand-encoded, so that any value can be sent.

  check_api_ranges.py --shardlm BIN --gguf MODEL
"""

from __future__ import annotations

import argparse
import json
import os
import struct
import subprocess
import sys
import time

import grpc

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))
from testlib import FAILURES, check, free_port, http_post_json, stop  # noqa: E402
from testlib import pb_bytes as string  # noqa: E402
from testlib import pb_scalar as scalar  # noqa: E402
from testlib import pb_varint as varint  # noqa: E402








def f32(num: int, value: float) -> bytes:
    return varint(num << 3 | 5) + struct.pack("<f", value)


def http(port: int, path: str, body: dict) -> tuple[int | None, str]:
    status, raw = http_post_json(port, path, body)
    try:
        return status, json.loads(raw)["error"]["message"]
    except (ValueError, KeyError, TypeError):
        return status, ""


def generate(channel, body: bytes) -> tuple[str, str]:
    call = channel.unary_stream("/shardlm.v1.Inference/Generate",
                                request_serializer=lambda b: b,
                                response_deserializer=lambda b: b)
    try:
        for _ in call(body, timeout=60):
            pass
        return "OK", ""
    except grpc.RpcError as e:
        return e.code().name, e.details() or ""


PROMPT = string(1, b"Hello")


def bias_entry(token: int, bias: float) -> bytes:
    """One entry of SamplingParams.logit_bias (map field 8)."""
    return string(8, scalar(1, token) + f32(2, bias))


def sampling(*fields: bytes) -> bytes:
    return string(4, b"".join(fields))


# (name, HTTP path, HTTP body, gRPC request bytes).
CASES = [
    ("max_tokens -5", "/v1/completions",
     {"prompt": "Hello", "max_tokens": -5}, PROMPT + scalar(3, -5)),
    ("max_tokens past the context", "/v1/completions",
     {"prompt": "Hello", "max_tokens": 100000}, PROMPT + scalar(3, 100000)),
    ("temperature -1", "/v1/completions",
     {"prompt": "Hello", "max_tokens": 1, "temperature": -1},
     PROMPT + scalar(3, 1) + sampling(f32(1, -1.0))),
    ("top_p 2", "/v1/completions",
     {"prompt": "Hello", "max_tokens": 1, "top_p": 2},
     PROMPT + scalar(3, 1) + sampling(f32(3, 2.0))),
    ("top_k -3", "/v1/completions",
     {"prompt": "Hello", "max_tokens": 1, "top_k": -3},
     PROMPT + scalar(3, 1) + sampling(scalar(2, -3))),
    ("logprobs -1", "/v1/completions",
     {"prompt": "Hello", "max_tokens": 1, "logprobs": -1},
     PROMPT + scalar(3, 1) + scalar(9, -1)),
    ("logprobs 21", "/v1/completions",
     {"prompt": "Hello", "max_tokens": 1, "logprobs": 21},
     PROMPT + scalar(3, 1) + scalar(9, 21)),
    ("top_logprobs 21 (chat)", "/v1/chat/completions",
     {"messages": [{"role": "user", "content": "Hello"}], "max_tokens": 1,
      "logprobs": True, "top_logprobs": 21},
     PROMPT + scalar(3, 1) + scalar(9, 21)),
    ("prompt_logprobs -1", "/v1/completions",
     {"prompt": "Hello", "max_tokens": 1, "prompt_logprobs": -1},
     PROMPT + scalar(3, 1) + scalar(26, -1)),
    ("prompt_logprobs 21 (chat)", "/v1/chat/completions",
     {"messages": [{"role": "user", "content": "Hello"}], "max_tokens": 1,
      "prompt_logprobs": 21},
     PROMPT + scalar(3, 1) + scalar(26, 21)),
    ("presence_penalty 2.5", "/v1/completions",
     {"prompt": "Hello", "max_tokens": 1, "presence_penalty": 2.5},
     PROMPT + scalar(3, 1) + sampling(f32(5, 2.5))),
    ("frequency_penalty -3", "/v1/chat/completions",
     {"messages": [{"role": "user", "content": "Hello"}], "max_tokens": 1,
      "frequency_penalty": -3},
     PROMPT + scalar(3, 1) + sampling(f32(6, -3.0))),
    ("repetition_penalty -1", "/v1/completions",
     {"prompt": "Hello", "max_tokens": 1, "repetition_penalty": -1},
     PROMPT + scalar(3, 1) + sampling(f32(7, -1.0))),
    ("logit_bias 101", "/v1/completions",
     {"prompt": "Hello", "max_tokens": 1, "logit_bias": {"5": 101}},
     PROMPT + scalar(3, 1) + sampling(bias_entry(5, 101.0))),
    ("logit_bias id outside the vocabulary", "/v1/completions",
     {"prompt": "Hello", "max_tokens": 1, "logit_bias": {"49152": 1}},
     PROMPT + scalar(3, 1) + sampling(bias_entry(49152, 1.0))),
    ("min_tokens over max_tokens", "/v1/completions",
     {"prompt": "Hello", "max_tokens": 2, "min_tokens": 3},
     PROMPT + scalar(3, 2) + scalar(12, 3)),
    ("min_tokens -1", "/v1/completions",
     {"prompt": "Hello", "max_tokens": 2, "min_tokens": -1},
     PROMPT + scalar(3, 2) + scalar(12, -1)),
    ("truncate_prompt_tokens -1", "/v1/completions",
     {"prompt": "Hello", "max_tokens": 1, "truncate_prompt_tokens": -1},
     PROMPT + scalar(3, 1) + scalar(10, -1)),
    ("n 17", "/v1/completions",
     {"prompt": "Hello", "max_tokens": 1, "n": 17},
     PROMPT + scalar(3, 1) + scalar(25, 17)),
]


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--shardlm", required=True)
    ap.add_argument("--gguf", required=True)
    a = ap.parse_args()
    grpc_port, port = free_port(), free_port()
    env = dict(os.environ)
    env.pop("SHARDLM_API_KEY", None)
    server = subprocess.Popen(
        [a.shardlm, "serve", "--model", a.gguf, "--listen",
         f"127.0.0.1:{grpc_port}", "--http-listen", f"127.0.0.1:{port}"],
        stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE, text=True, env=env)
    try:
        deadline = time.monotonic() + 120
        up = False
        while time.monotonic() < deadline and server.poll() is None:
            try:
                up = http(port, "/v1/completions",
                          {"prompt": "Hi", "max_tokens": 1})[0] == 200
            except OSError:
                up = False
            if up:
                break
            time.sleep(0.2)
        check(up, "shardlm serve answers")
        if not up:
            return 1
        channel = grpc.insecure_channel(f"127.0.0.1:{grpc_port}")
        for name, path, body, proto in CASES:
            status, http_message = http(port, path, body)
            code, grpc_message = generate(channel, proto)
            check(status == 400 and code == "INVALID_ARGUMENT" and
                  http_message == grpc_message and http_message != "",
                  f"{name}: HTTP {status} {http_message!r}, gRPC {code} "
                  f"{grpc_message!r}")
    finally:
        stop(server)
    print(f"{len(FAILURES)} failed" if FAILURES else
          "the same ranges and words on both APIs")
    return 1 if FAILURES else 0


if __name__ == "__main__":
    sys.exit(main())
