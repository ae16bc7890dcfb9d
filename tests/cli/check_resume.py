#!/usr/bin/env python3
"""The resume API (issue 37): a stream cut after k tokens on one `shardlm
serve` and continued on a second one (GenerateRequest.resume_token_ids and
resume_position) gives the rest of the undisturbed text: what the first
server sent for its k tokens followed by what the second sends is the
undisturbed stream's text, token ids, finish_reason and usage, for k = 0,
1, in the middle of a stop string (text held back), and max_tokens - 1, on
greedy and seeded sampled requests. Bad resume inputs are refused with
INVALID_ARGUMENT and change nothing.

  check_resume.py --shardlm BIN --gguf MODEL
"""

from __future__ import annotations

import argparse
import os
import struct
import sys

import grpc

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))
from testlib import (check, exit_code, pb_bytes, pb_fields,  # noqa: E402
                     pb_ints, pb_scalar, pb_varint, start_serve, stop,
                     wait_ready)

PROMPT = "The capital of France is"
EOS_FREE = "Write a short poem about the sea."
CHAT = ("<|im_start|>user\nName three colors.<|im_end|>\n"
        "<|im_start|>assistant\n")
MAX_TOKENS = 40


class Response:
    """One GenerateResponse: text, token ids, finish_reason, usage."""

    def __init__(self, raw: bytes):
        self.text, self.ids, self.finish, self.usage = "", [], "", None
        for num, v in pb_fields(raw):
            if num == 1:
                self.text += v.decode()
            elif num == 2:
                self.ids += pb_ints(v)
            elif num == 3:
                self.finish = v.decode()
            elif num == 4:
                u = dict(pb_fields(v))
                self.usage = (u.get(1, 0), u.get(2, 0))


def request(prompt: str, seed: int | None, stop: str | None = None,
            resume: list[int] | None = None,
            position: int | None = None, max_tokens: int = MAX_TOKENS,
            ignore_eos: bool = True, json_object: bool = False) -> bytes:
    out = pb_bytes(1, prompt.encode()) + pb_scalar(3, max_tokens)
    if json_object:  # constraint { json_object: true }
        out += pb_bytes(13, pb_scalar(1, 1))
    if seed is not None:  # temperature 0.9, top_p 0.95, the seed
        out += pb_bytes(4, pb_varint(1 << 3 | 5) + struct.pack("<f", 0.9) +
                        pb_varint(3 << 3 | 5) + struct.pack("<f", 0.95) +
                        pb_scalar(4, seed))
    if ignore_eos:
        out += pb_scalar(6, 1)
    if stop is not None:
        out += pb_bytes(8, stop.encode())
    if resume:
        out += pb_bytes(20, b"".join(pb_varint(t) for t in resume))
    if position is not None:
        out += pb_scalar(21, position)
    return out


def generate(channel, body: bytes) -> list[Response] | grpc.RpcError:
    call = channel.unary_stream("/shardlm.v1.Inference/Generate",
                                request_serializer=lambda b: b,
                                response_deserializer=lambda b: b)
    try:
        return [Response(r) for r in call(body, timeout=300)]
    except grpc.RpcError as e:
        return e


def joined(responses: list[Response]) -> tuple[str, list[int], str, tuple]:
    return ("".join(r.text for r in responses),
            [t for r in responses for t in r.ids],
            responses[-1].finish, responses[-1].usage)


def sent_for(responses: list[Response], k: int) -> str:
    """The text the first server had sent once its k-th token's response
    was out (a response carries one token)."""
    text, n = "", 0
    for r in responses:
        if n >= k:
            break
        text += r.text
        n += len(r.ids)
    return text


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--shardlm", required=True)
    ap.add_argument("--gguf", required=True)
    a = ap.parse_args()
    first, first_addr = start_serve(a.shardlm, a.gguf, ["--threads", "1"])
    second, second_addr = start_serve(a.shardlm, a.gguf, ["--threads", "1"])
    try:
        up = (wait_ready(a.shardlm, first_addr, first) and
              wait_ready(a.shardlm, second_addr, second))
        check(up, "two serve processes answer")
        if not up:
            return exit_code()
        one = grpc.insecure_channel(first_addr)
        two = grpc.insecure_channel(second_addr)

        # A stop string of three tokens' text from the middle of the greedy
        # stream: cut after the second of them, the first server held their
        # text back.
        plain = generate(one, request(PROMPT, None))
        text, ids, _, _ = joined(plain)
        pieces = [r.text for r in plain]
        span = next(j for j in range(8, len(pieces) - 3)
                    if all(pieces[j:j + 3]) and
                    "".join(pieces[j:j + 3]) not in "".join(pieces[:j + 2]))
        stop_text = "".join(pieces[span:span + 3])

        cases = [("greedy", PROMPT, None, None),
                 ("seeded", EOS_FREE, 1234, None),
                 ("greedy with a stop string", PROMPT, None, stop_text),
                 ("seeded chat ending at its end-of-text token", CHAT, 99,
                  None)]
        for name, prompt, seed, stop_str in cases:
            eos = name.startswith("seeded chat")
            undisturbed = generate(one, request(prompt, seed, stop_str,
                                                ignore_eos=not eos))
            if isinstance(undisturbed, grpc.RpcError):
                check(False, f"[{name}] undisturbed: {undisturbed.details()}")
                continue
            want = joined(undisturbed)
            n = len(want[1])
            cuts = {0, 1, n - 1}
            if stop_str is not None:
                cuts.add(span + 1)  # Two of the stop string's three tokens.
            if not eos:
                cuts.add(MAX_TOKENS - 1)
            for k in sorted(c for c in cuts if 0 <= c < n):
                rest = generate(two, request(prompt, seed, stop_str,
                                             resume=want[1][:k], position=k,
                                             ignore_eos=not eos))
                if isinstance(rest, grpc.RpcError):
                    check(False, f"[{name}] resumed after {k}: "
                          f"{rest.code()} {rest.details()}")
                    continue
                got_text = sent_for(undisturbed, k) + joined(rest)[0]
                got_ids = want[1][:k] + joined(rest)[1]
                got = (got_text, got_ids, rest[-1].finish, rest[-1].usage)
                check(got == want,
                      f"[{name}] cut after {k} of {n} tokens and resumed on "
                      f"another server: the same text, ids, finish_reason "
                      f"({want[2]}) and usage ({want[3]})" +
                      ("" if got == want else f"\n  got  {got}\n  want {want}"))

        # A constrained (JSON) stream resumes with its grammar state
        # following the resumed tokens; tokens that break the grammar are
        # refused.
        body = dict(prompt=CHAT, seed=None, ignore_eos=False, json_object=True)
        undisturbed = generate(one, request(**body))
        if isinstance(undisturbed, grpc.RpcError):
            check(False, f"[json_object] undisturbed: {undisturbed.details()}")
        else:
            want = joined(undisturbed)
            k = len(want[1]) // 2
            rest = generate(two, request(**body, resume=want[1][:k],
                                         position=k))
            got = None if isinstance(rest, grpc.RpcError) else (
                sent_for(undisturbed, k) + joined(rest)[0],
                want[1][:k] + joined(rest)[1], rest[-1].finish,
                rest[-1].usage)
            check(got == want, f"[json_object] cut after {k} of "
                  f"{len(want[1])} tokens and resumed: the same JSON "
                  f"({want[0][:60]!r})" + ("" if got == want else
                                           f"\n  got {got}\n  want {want}"))
            r = generate(two, request(**body, resume=ids[:2], position=2))
            ok = (isinstance(r, grpc.RpcError) and
                  r.code() == grpc.StatusCode.INVALID_ARGUMENT and
                  "breaks the constraint" in r.details())
            check(ok, "resume of a JSON stream with tokens that are not "
                  f"JSON: INVALID_ARGUMENT "
                  f"({r.details() if isinstance(r, grpc.RpcError) else r})")

        # Bad resume inputs: INVALID_ARGUMENT, naming what is wrong.
        vocab_ids = ids[:3]
        bad = [("a token outside the vocabulary", [ids[0], 10**6], 2,
                "outside the vocabulary"),
               ("a position that disagrees with the ids", vocab_ids, 2,
                "resume_position"),
               ("as many tokens as max_tokens", ids[:MAX_TOKENS], MAX_TOKENS,
                "leave none of max_tokens"),
               ("a position without ids", [], 3, "resume_position")]
        for what, resume, position, words in bad:
            r = generate(two, request(PROMPT, None, resume=resume,
                                      position=position))
            ok = (isinstance(r, grpc.RpcError) and
                  r.code() == grpc.StatusCode.INVALID_ARGUMENT and
                  words in r.details())
            check(ok, f"resume with {what}: INVALID_ARGUMENT ({words!r}) "
                  f"({r.details() if isinstance(r, grpc.RpcError) else r})")
        # An end-of-text token among them: the stream had ended.
        r = generate(two, request(PROMPT, None, resume=[ids[0], 2], position=2,
                                  ignore_eos=False))
        ok = (isinstance(r, grpc.RpcError) and
              r.code() == grpc.StatusCode.INVALID_ARGUMENT and
              "stop token" in r.details())
        check(ok, "resume with the end-of-text token among the ids: "
              f"INVALID_ARGUMENT ({r.details() if not isinstance(r, list) else r})")
        # The server still serves.
        after = generate(two, request(PROMPT, None))
        check(not isinstance(after, grpc.RpcError) and
              joined(after)[1] == ids,
              "after the refusals the second server answers as the first")
    finally:
        stop(first)
        stop(second)
    return exit_code("all resume checks passed")


if __name__ == "__main__":
    sys.exit(main())
