#!/usr/bin/env python3
"""The logit processors end to end (issue 38): presence, frequency and
repetition penalties, logit_bias and min_tokens through the HTTP API of
`shardlm serve` on SmolLM2, their token ids over gRPC, and the same greedy
tokens from a TP=2 x PP=2 cluster under mpirun as from TP=PP=1.

Behaviour is checked against what the fields promise on the real model,
each beside the same request without the field:
- a -100 logit_bias on the greedy first token changes it (and it is out of
  that position's top logprobs: they are of the biased distribution), a
  +100 one forces its token;
- frequency, presence and repetition penalties each leave fewer repeated
  tokens than none on a repetitive prompt;
- min_tokens keeps a chat reply that ends after a few tokens going for at
  least that many;
- a seeded sampled request with penalties is reproducible.
The sampling math itself is checked against a reference in
kernels/sampling/sampling_test.cc.

  check_sampling.py --shardlm BIN --gguf MODEL --workdir DIR
"""

from __future__ import annotations

import argparse
import http.client as http_client
import json
import os
import shutil
import struct
import subprocess
import sys
import time

import grpc

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))
from testlib import (check, exit_code, free_port,  # noqa: E402
                     http_post_json, pb_bytes, pb_fields, pb_ints, pb_scalar,
                     mpirun_cluster, pb_read_varint, pb_varint,
                     prometheus_series, skip,
                     stop)

# f32 KV on the server and the cluster: with the default f16 KV, the same
# seeded request sent again gave other texts on a 2-core Zen 3 (4 of 8
# prompts; logprobs 2e-4 to 6e-4 apart before the first different token,
# sampled in the tail at temperature 1), with one thread and the portable
# kernels too; with f32 KV, 8 of 8 repeated exactly. The f16 path's
# run-to-run variation is a defect of its own (issue 55's closing note),
# not this script's subject: seeds, penalties and n.
KV = ["--kv-cache-dtype", "f32"]
REPETITIVE = "one two one two one two one two one two one two"
CHAT_SHORT = [{"role": "user", "content": "Reply with only the word: yes"}]


def http(port: int, path: str, body: dict) -> tuple[int, dict]:
    status, raw = http_post_json(port, path, body, timeout=300)
    try:
        return status, json.loads(raw)
    except ValueError:
        return status, {}


def f32(num: int, value: float) -> bytes:
    return pb_varint(num << 3 | 5) + struct.pack("<f", value)


def token_ids(response: bytes) -> list[int]:
    """GenerateResponse.token_ids (field 2, packed or not)."""
    return [t for num, v in pb_fields(response) if num == 2
            for t in pb_ints(v)]


def grpc_request(prompt: str, max_tokens: int, presence: float = 0,
                 frequency: float = 0, repetition: float = 0,
                 bias: dict[int, float] | None = None, min_tokens: int = 0,
                 ignore_eos: bool = True) -> bytes:
    """A GenerateRequest, greedy, with the logit processors given; a
    prompt "user: TEXT" is sent as a chat of one user message."""
    sampling = b""
    if presence:
        sampling += f32(5, presence)
    if frequency:
        sampling += f32(6, frequency)
    if repetition:
        sampling += f32(7, repetition)
    for token, b in (bias or {}).items():
        sampling += pb_bytes(8, pb_scalar(1, token) + f32(2, b))
    # A prompt of "user: TEXT" is a one-message chat (field 11).
    if prompt.startswith("user: "):
        out = pb_bytes(11, pb_bytes(1, b"user") +
                       pb_bytes(2, prompt[len("user: "):].encode()))
    else:
        out = pb_bytes(1, prompt.encode())
    out += pb_scalar(3, max_tokens)
    if sampling:
        out += pb_bytes(4, sampling)
    if ignore_eos:
        out += pb_scalar(6, 1)
    if min_tokens:
        out += pb_scalar(12, min_tokens)
    return out


def generate(channel, body: bytes) -> list[int] | str:
    """The token ids generated, or the error."""
    call = channel.unary_stream("/shardlm.v1.Inference/Generate",
                                request_serializer=lambda b: b,
                                response_deserializer=lambda b: b)
    ids = []
    try:
        for r in call(body, timeout=300):
            ids += token_ids(r)
        return ids
    except grpc.RpcError as e:
        return f"{e.code().name}: {e.details()}"


def repeats(tokens: list) -> int:
    return len(tokens) - len(set(tokens))


def completion(port: int, **fields) -> dict:
    body = {"prompt": REPETITIVE, "max_tokens": 32, "temperature": 0,
            "ignore_eos": True, "logprobs": 0}
    body.update(fields)
    status, got = http(port, "/v1/completions", body)
    check(status == 200,
          f"completions {fields}: 200 ({status}{'' if status == 200 else got})")
    return got if status == 200 else {
        "choices": [{"text": "", "logprobs": {"tokens": [],
                                              "top_logprobs": []}}]}


def model_info(channel) -> dict:
    """GetModelInfo's block_size (7) and prefix_caching (9)."""
    call = channel.unary_unary("/shardlm.v1.Inference/GetModelInfo",
                               request_serializer=lambda b: b,
                               response_deserializer=lambda b: b)
    return dict(pb_fields(call(b"", timeout=30)))


def cached_tokens_checks(port: int, channel) -> None:
    """usage.prompt_tokens_details.cached_tokens: none for a prompt never
    seen, then the full blocks of it that the prefix cache holds (all but
    the last prompt token are looked up, in whole blocks)."""
    info = model_info(channel)
    block, caching = info.get(7, 0), bool(info.get(9, 0))
    prompt = (f"A unique prompt {time.time_ns()} about the weather in a "
              "town by the sea, where the fishing boats come in at dawn "
              "and the market opens before the sun is up.")
    seen = []
    for stream in (False, False, True):
        body = {"prompt": prompt, "max_tokens": 2, "temperature": 0}
        if stream:
            body.update(stream=True, stream_options={"include_usage": True})
            status, raw = http_post_json(port, "/v1/completions", body,
                                         timeout=300)
            events = [json.loads(b[6:]) for b in raw.decode().split("\n\n")
                      if b.startswith("data: {")]
            # No event: say what came instead (the check below then fails).
            usage = events[-1].get("usage", {}) if events else {}
            if not events:
                print(f"streamed usage: status {status}, no event in "
                      f"{raw[:300]!r}")
        else:
            status, got = http(port, "/v1/completions", body)
            usage = got.get("usage", {})
        seen.append((status, usage.get("prompt_tokens", 0),
                     usage.get("prompt_tokens_details", {})
                     .get("cached_tokens")))
    prompt_tokens = seen[0][1]
    full = (prompt_tokens - 1) // block * block if caching and block else 0
    check(all(st == 200 for st, _, _ in seen) and prompt_tokens > 2 * block
          and [c for _, _, c in seen] == [0, full, full],
          f"cached_tokens: 0, then the {full} tokens of whole blocks "
          f"(prompt {prompt_tokens} tokens, block {block}, prefix caching "
          f"{caching}): {seen}")


def computed_tokens(port: int) -> float:
    """shardlm_computed_tokens_total: tokens run through the model."""
    conn = http_client.HTTPConnection("127.0.0.1", port, timeout=60)
    conn.request("GET", "/metrics")
    text = conn.getresponse().read().decode()
    conn.close()
    return prometheus_series(text).get("shardlm_computed_tokens_total", -1)


def sse_choices(port: int, path: str, body: dict) -> dict[int, str]:
    """Streamed text per choice index."""
    conn = http_client.HTTPConnection("127.0.0.1", port, timeout=300)
    conn.request("POST", path, body=json.dumps(dict(body, stream=True)),
                 headers={"Content-Type": "application/json"})
    raw = conn.getresponse().read()  # De-chunked.
    conn.close()
    out: dict[int, str] = {}
    for block in raw.decode().split("\n\n"):
        if not block.startswith("data: {"):
            continue
        for c in json.loads(block[6:]).get("choices", []):
            piece = c.get("text") or c.get("delta", {}).get("content") or ""
            out[c["index"]] = out.get(c["index"], "") + piece
    return out


def n_checks(port: int, channel) -> None:
    """n: sequence i samples with seed + i (seeded: n different,
    reproducible texts; greedy: n identical ones, n = 1's); one prefill
    (the others compute only the prompt's last partial block, counted in
    shardlm_computed_tokens_total); streamed chunks carry their index."""
    info = model_info(channel)
    block, caching = info.get(7, 0), bool(info.get(9, 0))
    prompt = (f"Story {time.time_ns()}: once upon a time, in a quiet village "
              "beside a wide river, there lived an old clockmaker who")
    seeded = {"prompt": prompt, "max_tokens": 12, "temperature": 1.0,
              "seed": 7, "n": 4, "ignore_eos": True}
    before = computed_tokens(port)
    status, got = http(port, "/v1/completions", seeded)
    after = computed_tokens(port)
    texts = [c["text"] for c in got.get("choices", [])]
    indices = [c["index"] for c in got.get("choices", [])]
    usage = got.get("usage", {})
    p, m = usage.get("prompt_tokens", 0), 12
    check(status == 200 and indices == [0, 1, 2, 3] and
          len(set(texts)) == 4 and usage.get("completion_tokens") == 4 * m,
          f"seeded n = 4: four different texts, usage counts all "
          f"({status} {texts} {usage})")
    # One prefill: a hidden one-token request computes the prompt, then the
    # four sequences, submitted together, each compute what is past its
    # whole cached blocks (all but the last prompt token are looked up)
    # and decode m - 1 tokens.
    shared = (p - 1) // block * block if caching else 0
    want = p + 4 * (p - shared) + 4 * (m - 1)
    check(after - before == want and shared > 0,
          f"n = 4: one prefill: {after - before:.0f} tokens computed = "
          f"{p} + 4 x {p - shared} + 4 x {m - 1} (the {shared} prompt "
          f"tokens of whole blocks shared; {4 * p + 4 * (m - 1)} without)")
    # Reproducible: the four enter the scheduler together and run in the
    # same steps each time, cold (the prompt computed by this request's
    # own prefill) or warm (found cached). (Under concurrent load other
    # requests' rows share the steps; a step of more than 16 rows takes the
    # prefill GEMM, whose last bits differ from the decode GEMV's, which
    # can turn into a different token sampled near a boundary: seeds
    # reproduce a schedule, as OpenAI's "best effort". See KV above.)
    warm = [c["text"] for c in
            http(port, "/v1/completions", seeded)[1].get("choices", [])]
    again = [c["text"] for c in
             http(port, "/v1/completions", seeded)[1].get("choices", [])]
    check(len(warm) == 4 and again == warm == texts,
          f"seeded n = 4 is reproducible ({texts}, {warm}, then {again})")
    streamed = sse_choices(port, "/v1/completions", seeded)
    check(streamed == dict(enumerate(warm)),
          f"streamed n = 4: chunks carry their index, same texts "
          f"({streamed})")
    greedy = {"messages": CHAT_SHORT, "max_tokens": 8, "temperature": 0}
    one = http(port, "/v1/chat/completions", greedy)[1]
    status, four = http(port, "/v1/chat/completions", dict(greedy, n=4))
    want_text = one.get("choices", [{}])[0].get("message", {}).get("content")
    got_texts = [c["message"]["content"] for c in four.get("choices", [])]
    check(status == 200 and want_text is not None and
          got_texts == [want_text] * 4,
          f"greedy n = 4: four identical texts, n = 1's ({got_texts} vs "
          f"{want_text!r})")
    # gRPC: n = 3 greedy, each response tagged with its index (field 7),
    # three identical token lists, n = 1's; n = 17 refused.
    call = channel.unary_stream("/shardlm.v1.Inference/Generate",
                                request_serializer=lambda b: b,
                                response_deserializer=lambda b: b)
    req = grpc_request("The capital of France is", 5)
    by_index: dict[int, list[int]] = {}
    try:
        for r in call(req + pb_scalar(25, 3), timeout=300):
            index = dict((n, v) for n, v in pb_fields(r)
                         if isinstance(v, int)).get(7, 0)
            by_index.setdefault(index, []).extend(token_ids(r))
    except grpc.RpcError as e:
        by_index = {-1: [f"{e.code().name}: {e.details()}"]}
    single = generate(channel, req)
    check(sorted(by_index) == [0, 1, 2] and
          all(v == single for v in by_index.values()),
          f"gRPC greedy n = 3: responses tagged 0..2, each n = 1's tokens "
          f"({by_index} vs {single})")
    refused = generate(channel, req + pb_scalar(25, 17))
    check(isinstance(refused, str) and "n must be 1 to 16" in refused,
          f"gRPC n = 17: INVALID_ARGUMENT naming n ({refused})")
    for bad in (0, 17, 10000):
        status, got = http(port, "/v1/completions",
                           {"prompt": "x", "max_tokens": 2, "n": bad})
        msg = got.get("error", {}).get("message", "")
        check(status == 400 and "n must be 1 to 16" in msg,
              f"n = {bad}: 400 naming n ({status} {msg!r})")


def http_checks(port: int, channel) -> None:
    cached_tokens_checks(port, channel)
    n_checks(port, channel)
    # logit_bias against the greedy first token, found over gRPC.
    prompt = "The capital of France is"
    base = generate(channel, grpc_request(prompt, 6))
    check(isinstance(base, list) and len(base) == 6,
          f"gRPC greedy baseline: 6 tokens ({base})")
    if not isinstance(base, list) or not base:
        return
    first = base[0]
    banned = generate(channel, grpc_request(prompt, 6, bias={first: -100}))
    check(isinstance(banned, list) and banned and banned[0] != first,
          f"gRPC: logit_bias -100 on {first} moves the first token "
          f"({banned})")
    forced = generate(channel, grpc_request(prompt, 3, bias={1000: 100}))
    check(forced == [1000, 1000, 1000],
          f"gRPC: logit_bias +100 on token 1000 forces it ({forced})")
    plain = completion(port, prompt=prompt, max_tokens=6, logprobs=5)
    biased = completion(port, prompt=prompt, max_tokens=6, logprobs=5,
                        logit_bias={str(first): -100})
    ptext, btext = plain["choices"][0]["text"], biased["choices"][0]["text"]
    check(ptext != btext, f"HTTP: the bias changes the text ({ptext!r} -> "
          f"{btext!r})")
    ptop = plain["choices"][0]["logprobs"]["top_logprobs"]
    btop = biased["choices"][0]["logprobs"]["top_logprobs"]
    blp = biased["choices"][0]["logprobs"]["token_logprobs"]
    first_text = plain["choices"][0]["logprobs"]["tokens"][:1]
    check(bool(ptop) and bool(btop) and first_text and
          first_text[0] in ptop[0] and first_text[0] not in btop[0] and
          abs(blp[0] - max(btop[0].values())) < 1e-6,
          f"HTTP logprobs are of the biased distribution: the banned "
          f"{first_text} is top-1 without the bias ({ptop[:1]}), out of the "
          f"top 5 with it ({btop[:1]}), and greedy is its top-1")

    # Penalties: fewer repeated tokens than none, on a repetitive prompt.
    none = completion(port)["choices"][0]["logprobs"]["tokens"]
    check(repeats(none) >= 16,
          f"without penalties the prompt repeats ({repeats(none)} repeats "
          f"in {len(none)}: {''.join(none)!r})")
    for field, value in [("frequency_penalty", 2.0),
                         ("presence_penalty", 2.0),
                         ("repetition_penalty", 1.5)]:
        got = completion(port, **{field: value})
        toks = got["choices"][0]["logprobs"]["tokens"]
        check(len(toks) == 32 and repeats(toks) < repeats(none),
              f"{field} {value}: {repeats(toks)} repeats < "
              f"{repeats(none)} ({''.join(toks)!r})")
    # Chat, too, takes them.
    status, got = http(port, "/v1/chat/completions",
                       {"messages": [{"role": "user", "content": REPETITIVE}],
                        "max_tokens": 8, "temperature": 0,
                        "frequency_penalty": 1.0, "presence_penalty": 0.5,
                        "logit_bias": {"28": 5}})
    check(status == 200, f"chat with penalties and a bias: 200 ({status})")

    # min_tokens: a short chat reply goes on for at least that many.
    body = {"messages": CHAT_SHORT, "max_tokens": 64, "temperature": 0}
    status, short = http(port, "/v1/chat/completions", body)
    n_short = short.get("usage", {}).get("completion_tokens", 0)
    finish = short.get("choices", [{}])[0].get("finish_reason")
    check(status == 200 and finish == "stop" and 0 < n_short <= 54,
          f"the chat reply ends by itself after {n_short} tokens ({finish}, "
          f"{short.get('choices', [{}])[0].get('message')})")
    want = n_short + 10
    status, longer = http(port, "/v1/chat/completions",
                          dict(body, min_tokens=want))
    n_long = longer.get("usage", {}).get("completion_tokens", 0)
    check(status == 200 and n_long >= want,
          f"min_tokens {want}: {n_long} tokens "
          f"({longer.get('choices', [{}])[0].get('finish_reason')})")
    chat_prompt = "user: " + CHAT_SHORT[0]["content"]
    free = generate(channel, grpc_request(chat_prompt, 64, ignore_eos=False))
    ids = generate(channel, grpc_request(chat_prompt, 64, min_tokens=want,
                                         ignore_eos=False))
    check(isinstance(free, list) and isinstance(ids, list) and
          len(free) < want <= len(ids),
          f"gRPC min_tokens {want}: {len(ids)} tokens, "
          f"{len(free) if isinstance(free, list) else free} without")

    # Seeded sampling with penalties is reproducible.
    seeded = dict(temperature=0.9, seed=7, frequency_penalty=0.7,
                  presence_penalty=0.3, repetition_penalty=1.2,
                  logit_bias={"28": -3})
    a = completion(port, **seeded)["choices"][0]["text"]
    b = completion(port, **seeded)["choices"][0]["text"]
    check(a == b and a != "", f"seeded sampling with penalties repeats "
          f"({a!r} == {b!r})")

    # Refusals naming the field.
    for name, fields, want_msg in [
        ("a key that is no id", {"logit_bias": {"abc": 1}},
         "'logit_bias' keys must be token ids (integers >= 0), got 'abc'"),
        ("a negative key", {"logit_bias": {"-5": 1}},
         "'logit_bias' keys must be token ids"),
        ("a string bias", {"logit_bias": {"5": "x"}},
         "'logit_bias' values must be numbers"),
        ("a list", {"logit_bias": [1, 2]}, "'logit_bias' must be an object"),
        ("301 entries", {"logit_bias": {str(i): 1 for i in range(301)}},
         "at most 300 logit_bias entries"),
        ("repetition_penalty 0", {"repetition_penalty": 0},
         "repetition_penalty must be > 0"),
        ("presence_penalty a string", {"presence_penalty": "1"},
         "'presence_penalty' has the wrong type"),
    ]:
        status, got = http(port, "/v1/completions",
                           dict({"prompt": "Hi", "max_tokens": 2}, **fields))
        msg = got.get("error", {}).get("message", "")
        check(status == 400 and want_msg in msg,
              f"{name}: 400 saying {want_msg!r} ({status} {msg!r})")


# Greedy requests with every field, compared across layouts.
LAYOUT_REQUESTS = [
    grpc_request(REPETITIVE, 24, frequency=1.5),
    grpc_request(REPETITIVE, 24, presence=1.0, repetition=1.3),
    grpc_request("The capital of France is", 12, bias={264: -100, 1000: 8}),
    grpc_request("user: " + CHAT_SHORT[0]["content"], 40, min_tokens=34,
                 ignore_eos=False),
    grpc_request("def fibonacci(n):\n    ", 16, frequency=0.5, presence=0.5,
                 repetition=1.1, bias={28: 2.5}),
]


def message_fields(buf: bytes) -> list[tuple[int, object]]:
    """(field, value) of a message, fixed32 fields as floats (pb_fields
    skips them)."""
    out, i = [], 0
    while i < len(buf):
        key, i = pb_read_varint(buf, i)
        num, wire = key >> 3, key & 7
        if wire == 0:
            v, i = pb_read_varint(buf, i)
        elif wire == 2:
            n, i = pb_read_varint(buf, i)
            v, i = buf[i:i + n], i + n
        elif wire == 5:
            v, i = struct.unpack("<f", buf[i:i + 4])[0], i + 4
        else:
            v, i = None, i + 8
        out.append((num, v))
    return out


LOGPROBS_PROMPT = ("The quick brown fox jumps over the lazy dog. "
                   "The capital of France is")


def prompt_logprobs(address: str, prompt: str = LOGPROBS_PROMPT) -> list | str:
    """gRPC prompt_logprobs (field 26) of a prompt: per prompt token, its
    id, its logprob and its top-2 ids, from the first response (field 8)."""
    body = grpc_request(prompt, 1) + pb_scalar(26, 2)
    with grpc.insecure_channel(address) as channel:
        call = channel.unary_stream("/shardlm.v1.Inference/Generate",
                                    request_serializer=lambda b: b,
                                    response_deserializer=lambda b: b)
        try:
            first = next(iter(call(body, timeout=300)))
        except grpc.RpcError as e:
            return f"{e.code().name}: {e.details()}"
    out = []
    for num, lp in message_fields(first):
        if num != 8:
            continue
        fields = message_fields(lp)
        tok = dict(message_fields(next(v for n, v in fields if n == 1)))
        top = [dict(message_fields(v)).get(1, 0) for n, v in fields if n == 2]
        out.append((tok.get(1, 0), tok.get(3, 0.0), top))
    return out


def same_prompt_logprobs(want, have) -> bool:
    return (isinstance(want, list) and isinstance(have, list) and want and
            len(want) == len(have) and all(
                a[0] == b[0] and abs(a[1] - b[1]) <= 2e-3 and a[2] == b[2]
                for a, b in zip(want, have)))


def layout_tokens(address: str) -> list:
    with grpc.insecure_channel(address) as channel:
        return [generate(channel, r) for r in LAYOUT_REQUESTS]


def wait_grpc(address: str, proc: subprocess.Popen, timeout: float) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline and proc.poll() is None:
        with grpc.insecure_channel(address) as channel:
            if isinstance(generate(channel, grpc_request("x", 1)), list):
                return True
        time.sleep(0.5)
    return False


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--shardlm", required=True)
    ap.add_argument("--gguf", required=True)
    ap.add_argument("--workdir", required=True)
    a = ap.parse_args()
    os.makedirs(a.workdir, exist_ok=True)
    env = dict(os.environ)
    env.pop("SHARDLM_API_KEY", None)

    grpc_port, port = free_port(), free_port()
    server = subprocess.Popen(
        [a.shardlm, "serve", "--model", a.gguf, "--listen",
         f"127.0.0.1:{grpc_port}", "--http-listen", f"127.0.0.1:{port}",
         *KV],
        stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL, env=env)
    address = f"127.0.0.1:{grpc_port}"
    try:
        up = wait_grpc(address, server, 120)
        check(up, "shardlm serve answers")
        if not up:
            return 1
        with grpc.insecure_channel(address) as channel:
            http_checks(port, channel)
        reference = layout_tokens(address)
        reference_lp = prompt_logprobs(address)
    finally:
        stop(server)
    check(all(isinstance(t, list) and t for t in reference),
          f"TP=PP=1: every layout request served ({reference})")
    check(isinstance(reference_lp, list) and len(reference_lp) > 10 and
          reference_lp[0][1] == 0 and not reference_lp[0][2] and
          all(x[1] < 0 and len(x[2]) == 2 for x in reference_lp[1:]),
          f"gRPC prompt_logprobs 2: one per prompt token on the first "
          f"response, the first with none ({reference_lp})")

    if shutil.which("mpirun") is None:
        skip("TP=2 x PP=2 under mpirun: no mpirun")
        return exit_code()
    log_path = os.path.join(a.workdir, "sampling_cluster.log")
    with mpirun_cluster(a.shardlm, a.gguf, log_path, wait_grpc,
                        env=env, extra=KV) as caddr:
        if caddr:
            got = layout_tokens(caddr)
            for i, (want, have) in enumerate(zip(reference, got)):
                check(want == have,
                      f"layout request {i}: TP=2 x PP=2 gives TP=PP=1's "
                      f"tokens ({have} vs {want})")
            have_lp = prompt_logprobs(caddr)
            check(same_prompt_logprobs(reference_lp, have_lp),
                  f"prompt logprobs: TP=2 x PP=2 gives TP=PP=1's (ids, "
                  f"logprobs within 2e-3, top 2) ({have_lp})")
    return exit_code("the logit processors behave, on every layout")


if __name__ == "__main__":
    sys.exit(main())
