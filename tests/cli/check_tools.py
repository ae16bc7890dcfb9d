#!/usr/bin/env python3
"""Tool calls (issue 38) end to end through `shardlm serve`, raw HTTP and
gRPC: SmolLM2 served with Qwen2.5's chat template (--chat-template, the
Hermes <tool_call> format), since SmolLM2's own renders no tools.

- A chat with tools, an assistant's tool calls and tool results gives the
  same greedy text as /v1/completions given jinja2's rendering of the same
  conversation (the template renders as transformers does, end to end).
- tool_choice naming a function, and "required" (seeded, temperature 1):
  message.tool_calls with an offered name and arguments valid against its
  parameters (jsonschema), finish_reason "tool_calls"; streamed, the same
  call from OpenAI's tool-call deltas (id, type, name and empty arguments
  first, then the arguments), reassembled; no markup in the content.
- auto: a call the model writes is parsed; a malformed one (forced here
  with the grammar extension) comes back as content, finish_reason stop.
- gRPC: tools and tool_choice_function; the last response's tool_calls.
- Qwen3's template: the history as jinja2's, a named function's call;
  a <think> block as reasoning_content, served and through a router.
- gpt-oss's template (harmony): the history as jinja2's; tool_choice
  required refused.
- Llama 3.1's template (JSON calls): the history as jinja2's; a named
  function's call, streamed too; auto's parse of a written call and of a
  malformed one; the same through a router, which learns the format from
  the replica's ModelInfo.
- Bad input: 400 naming the field (an unknown function, a keyword outside
  the schema subset, too many tools, tools on completions), and SmolLM2's
  own template refuses tools unless tool_choice is none.

  check_tools.py --shardlm build/launch/shardlm --gguf MODEL --workdir DIR
"""

from __future__ import annotations

import argparse
import datetime
import http.client
import json
import os
import subprocess
import sys

import grpc
import jsonschema

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, ".."))
sys.path.insert(0, os.path.join(HERE, "..", "reference"))
import check_chat_template  # noqa: E402
from check_chat_template import (DEEPSEEK_R1, GLM45,  # noqa: E402
                                 HARMONY_TOOLS, LLAMA31_TOOLS, QWEN3,
                                 QWEN25_TOOLS, jinja_render)
from testlib import (check, exit_code, free_port,  # noqa: E402
                     http_post_json, pb_bytes, pb_fields, pb_scalar, stop,
                     start_serve, wait_until)

WEATHER = {"type": "function", "function": {
    "name": "get_weather", "description": "The weather in a city today.",
    "parameters": {"type": "object", "properties": {
        "city": {"type": "string", "maxLength": 20},
        "unit": {"enum": ["celsius", "fahrenheit"]}},
        "required": ["city", "unit"], "additionalProperties": False}}}
ADD = {"type": "function", "function": {
    "name": "add", "description": "Adds two integers.",
    "parameters": {"type": "object", "properties": {
        "a": {"type": "integer", "minimum": -1000, "maximum": 1000},
        "b": {"type": "integer", "minimum": -1000, "maximum": 1000}},
        "required": ["a", "b"], "additionalProperties": False}}}
TOOLS = [WEATHER, ADD]
SCHEMA = {t["function"]["name"]: t["function"]["parameters"] for t in TOOLS}
ASK = [{"role": "user", "content": "What is the weather in Paris?"}]


def post(port: int, path: str, body: dict) -> tuple[int, dict]:
    status, raw = http_post_json(port, path, body, timeout=300)
    try:
        return status, json.loads(raw)
    except ValueError:
        return status, {"raw": raw[:200]}


def chat(port: int, **fields) -> tuple[int, dict]:
    return post(port, "/v1/chat/completions",
                {"messages": ASK, "tools": TOOLS, "max_tokens": 48,
                 "temperature": 0, **fields})


def sse(port: int, body: dict) -> list[dict]:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=300)
    conn.request("POST", "/v1/chat/completions",
                 body=json.dumps(dict(body, stream=True)),
                 headers={"Content-Type": "application/json"})
    out = conn.getresponse().read().decode()
    conn.close()
    return [json.loads(b[len("data: "):]) for b in out.split("\n\n")
            if b.startswith("data: ") and b != "data: [DONE]"]


def reassemble(chunks: list[dict]) -> tuple[list[dict], str | None]:
    """The calls of a stream's tool-call deltas put together as the openai
    client's stream helper does (by index: id, type and name from the
    first delta, arguments concatenated), and None when every call's first
    delta has index, id, type, name and empty arguments as OpenAI's, else
    why not."""
    calls: dict[int, dict] = {}
    why = None
    for c in chunks:
        if not c.get("choices"):
            continue
        for d in c["choices"][0]["delta"].get("tool_calls") or []:
            i = d.get("index")
            f = d.get("function", {})
            if i not in calls:
                if not (d.get("id", "").startswith("call_") and
                        d.get("type") == "function" and "name" in f and
                        f.get("arguments") == ""):
                    why = why or f"first delta of call {i}: {d}"
                calls[i] = {"id": d.get("id"), "type": d.get("type"),
                            "function": {"name": f.get("name"),
                                         "arguments": ""}}
            elif "id" in d or "name" in f:
                why = why or f"a later delta of call {i} renames it: {d}"
            calls[i]["function"]["arguments"] += f.get("arguments", "")
    if sorted(calls) != list(range(len(calls))):
        why = why or f"indices {sorted(calls)}"
    return [calls[i] for i in sorted(calls)], why


def valid_calls(calls, names) -> str | None:
    """None when every call is well formed, offered and valid, else why."""
    if not calls:
        return "no tool_calls"
    for c in calls:
        f = c.get("function", {})
        if c.get("type") != "function" or not c.get("id", "").startswith(
                "call_"):
            return f"malformed call {c}"
        if f.get("name") not in names:
            return f"name {f.get('name')!r} not offered"
        try:
            jsonschema.validate(json.loads(f["arguments"]),
                                SCHEMA[f["name"]])
        except (ValueError, jsonschema.ValidationError) as e:
            return f"arguments {f.get('arguments')!r}: {e}"
    return None


def history_checks(port: int, template: str = QWEN25_TOOLS,
                   name: str = "qwen2.5", content: str | None = None) -> None:
    """Tools, an assistant's calls and tool results render as jinja2 does:
    the same greedy text as completions of jinja2's rendering. `content`:
    the calling message's (gpt-oss's template fails on None)."""
    history = ASK + [
        {"role": "assistant", "content": content, "tool_calls": [
            {"id": "call_1", "type": "function", "function": {
                "name": "get_weather",
                "arguments": json.dumps({"city": "Paris",
                                         "unit": "celsius"})}}]},
        {"role": "tool", "tool_call_id": "call_1", "content": "18 C, sunny"},
    ]
    jinja_messages = ASK + [
        {"role": "assistant", "content": content, "tool_calls": [
            {"id": "call_1", "type": "function", "function": {
                "name": "get_weather",
                "arguments": {"city": "Paris", "unit": "celsius"}}}]},
        history[2]]
    prompt = jinja_render(template, "<|im_start|>", jinja_messages, TOOLS)
    # The generated text: the logprobs' tokens, since a harmony answer's
    # content is parsed out of its markup (which SmolLM2 imitates).
    s1, got = chat(port, messages=history, max_tokens=12, tool_choice="none",
                   logprobs=True)
    s2, want = post(port, "/v1/completions",
                    {"prompt": prompt, "max_tokens": 12, "temperature": 0})
    ok = s1 == 200 and s2 == 200
    check(ok and got["usage"]["prompt_tokens"] ==
          want["usage"]["prompt_tokens"] and
          "".join(t["token"] for t in got["choices"][0]["logprobs"]["content"])
          == want["choices"][0]["text"],
          f"{name}: a history with tool calls and results renders as "
          f"jinja2's ({s1} {s2}: {got.get('usage')} {want.get('usage')})")


def named_and_required_checks(port: int) -> None:
    forced = {"type": "function", "function": {"name": "get_weather"}}
    status, got = chat(port, tool_choice=forced)
    choice = got.get("choices", [{}])[0]
    msg = choice.get("message", {})
    calls = msg.get("tool_calls")
    why = valid_calls(calls, {"get_weather"}) if status == 200 else got
    check(why is None and len(calls) == 1 and
          choice.get("finish_reason") == "tool_calls" and
          msg.get("content") is None,
          f"tool_choice get_weather: one valid call, finish tool_calls "
          f"({why}; {choice})")
    # Streamed: the same call (greedy) in OpenAI's tool-call deltas (the
    # first with id, type, name and empty arguments, then the arguments),
    # no markup in the content.
    chunks = sse(port, {"messages": ASK, "tools": TOOLS, "max_tokens": 48,
                        "temperature": 0, "tool_choice": forced})
    content = "".join(c["choices"][0]["delta"].get("content") or ""
                      for c in chunks if c.get("choices"))
    got_calls, why = reassemble(chunks)
    finish = [c["choices"][0]["finish_reason"] for c in chunks
              if c.get("choices") and c["choices"][0]["finish_reason"]]
    check(why is None and calls and
          [c["function"] for c in got_calls] ==
          [c["function"] for c in calls] and content == "" and
          finish == ["tool_calls"],
          f"streamed: the same call from OpenAI-shaped deltas ({why}; "
          f"{got_calls}, content {content!r}, finish {finish})")
    # required, sampled: every answer calls an offered function validly.
    for seed in (1, 2, 3):
        status, got = chat(port, tool_choice="required", temperature=1.0,
                           seed=seed, max_tokens=64)
        choice = got.get("choices", [{}])[0]
        calls = choice.get("message", {}).get("tool_calls")
        why = valid_calls(calls, set(SCHEMA)) if status == 200 else got
        # The grammar allows more calls after each one: at temperature 1
        # SmolLM2 may go on until max_tokens ("length"), with the calls it
        # completed returned.
        check(why is None and choice.get("finish_reason") in
              ("tool_calls", "length"),
              f"required, seed {seed}: {len(calls or [])} valid call(s) "
              f"({why}; {choice.get('finish_reason')})")


def auto_checks(port: int) -> None:
    """auto parses what the model writes; the grammar extension decides
    what that is here, so that both outcomes are tested."""
    good = ('root ::= "<tool_call>\\n{\\"name\\": \\"add\\", '
            '\\"arguments\\": {\\"a\\": 2, \\"b\\": 3}}\\n</tool_call>"')
    status, got = chat(port, grammar=good)
    choice = got.get("choices", [{}])[0]
    calls = choice.get("message", {}).get("tool_calls") or []
    check(status == 200 and choice.get("finish_reason") == "tool_calls" and
          [c["function"] for c in calls] ==
          [{"name": "add", "arguments": '{"a": 2, "b": 3}'}],
          f"auto: a written call is parsed ({status} {choice})")
    # Two calls, streamed: indices 0 and 1, each reassembled as the
    # non-streamed call.
    two = ('root ::= "<tool_call>\\n{\\"name\\": \\"add\\", '
           '\\"arguments\\": {\\"a\\": 2, \\"b\\": 3}}\\n</tool_call>\\n'
           '<tool_call>\\n{\\"name\\": \\"get_weather\\", \\"arguments\\": '
           '{\\"city\\": \\"Oslo\\", \\"unit\\": \\"celsius\\"}}\\n'
           '</tool_call>"')
    status, got = chat(port, grammar=two, max_tokens=160)
    want = [c["function"] for c in
            got.get("choices", [{}])[0].get("message", {}).get("tool_calls")
            or []]
    chunks = sse(port, {"messages": ASK, "tools": TOOLS, "max_tokens": 160,
                        "temperature": 0, "grammar": two})
    got_calls, why = reassemble(chunks)
    finish = [c["choices"][0]["finish_reason"] for c in chunks
              if c.get("choices") and c["choices"][0]["finish_reason"]]
    check(status == 200 and why is None and len(want) == 2 and
          finish == ["tool_calls"] and
          [c["function"] for c in got_calls] == want and
          len({c["id"] for c in got_calls}) == 2,
          f"two calls streamed: indices 0 and 1, the same as not streamed "
          f"({why}; {got_calls} vs {want})")
    bad = 'root ::= "Sure. <tool_call>\\n{\\"name\\": \\"rm\\", \\"arguments\\": {}}"'
    text = 'Sure. <tool_call>\n{"name": "rm", "arguments": {}}'
    for streamed in (False, True):
        if streamed:
            chunks = sse(port, {"messages": ASK, "tools": TOOLS,
                                "max_tokens": 48, "temperature": 0,
                                "grammar": bad})
            content = "".join(c["choices"][0]["delta"].get("content") or ""
                              for c in chunks if c.get("choices"))
            finish = [c["choices"][0]["finish_reason"] for c in chunks
                      if c.get("choices") and c["choices"][0]["finish_reason"]]
            has_calls = any(c["choices"][0]["delta"].get("tool_calls")
                            for c in chunks if c.get("choices"))
            ok = content == text and finish == ["stop"] and not has_calls
            seen = (content, finish)
        else:
            status, got = chat(port, grammar=bad)
            choice = got.get("choices", [{}])[0]
            msg = choice.get("message", {})
            ok = (status == 200 and msg.get("content") == text and
                  "tool_calls" not in msg and
                  choice.get("finish_reason") == "stop")
            seen = (status, choice)
        check(ok, f"auto{' streamed' if streamed else ''}: a malformed call "
                  f"(unknown function, left open) is content, finish stop "
                  f"({seen})")


def grpc_checks(address: str) -> None:
    tool = (pb_bytes(1, b"get_weather") +
            pb_bytes(3, json.dumps(SCHEMA["get_weather"]).encode()))
    req = (pb_bytes(11, pb_bytes(1, b"user") + pb_bytes(2, ASK[0]["content"]
                                                         .encode())) +
           pb_scalar(3, 48) + pb_bytes(22, tool) +
           pb_bytes(24, b"get_weather"))
    with grpc.insecure_channel(address) as channel:
        call = channel.unary_stream("/shardlm.v1.Inference/Generate",
                                    request_serializer=lambda b: b,
                                    response_deserializer=lambda b: b)
        try:
            last = list(call(req, timeout=300))[-1]
        except grpc.RpcError as e:
            check(False, f"gRPC tools: {e.code().name} {e.details()}")
            return
    fields = pb_fields(last)
    finish = [v for n, v in fields if n == 3]
    calls = [dict(pb_fields(v)) for n, v in fields if n == 6]
    ok = finish == [b"tool_calls"] and len(calls) == 1 and \
        calls[0].get(2) == b"get_weather"
    if ok:
        try:
            jsonschema.validate(json.loads(calls[0][3]),
                                SCHEMA["get_weather"])
        except (ValueError, jsonschema.ValidationError, KeyError):
            ok = False
    check(ok, f"gRPC tool_choice_function: the last response's tool_calls "
              f"({finish} {calls})")


def bad_input_checks(port: int) -> None:
    def refused(what: str, words: str, path="/v1/chat/completions", **body):
        status, got = post(port, path, dict(
            {"messages": ASK, "tools": TOOLS, "max_tokens": 4}, **body))
        msg = got.get("error", {}).get("message", "")
        check(status == 400 and words in msg,
              f"{what}: 400 naming {words!r} ({status} {msg!r})")

    refused("tool_choice naming an unknown function", "'delete_all'",
            tool_choice={"type": "function",
                         "function": {"name": "delete_all"}})
    pattern = {"type": "function", "function": {
        "name": "f", "parameters": {"type": "object", "properties": {
            "s": {"type": "string", "pattern": "^a+$"}}}}}
    refused("an unsupported keyword in a constrained function's parameters",
            "tools[1].function.parameters", tools=[WEATHER, pattern],
            tool_choice="required")
    many = [{"type": "function", "function": {"name": f"f{i}"}}
            for i in range(129)]
    refused("129 tools", "at most 128 tools", tools=many)
    refused("a tool that is not a function", "tools[0].type",
            tools=[{"type": "retrieval"}])
    refused("tool_choice 'sometimes'", "tool_choice 'sometimes'",
            tool_choice="sometimes")
    refused("tools on /v1/completions", "'tools'", path="/v1/completions",
            prompt="x", messages=None)
    refused("required with response_format", "cannot be combined",
            tool_choice="required",
            response_format={"type": "json_object"})


def own_template_checks(shardlm: str, gguf: str) -> None:
    """SmolLM2's own template renders no tools: refused, naming them,
    unless tool_choice is none."""
    port = free_port()
    server, addr = start_serve(shardlm, gguf,
                               ["--http-listen", f"127.0.0.1:{port}"])
    try:
        up = wait_until(lambda: _answers(port), timeout=120, every=0.3)
        check(up, "serve with the model's own template answers")
        if not up:
            return
        status, got = chat(port, max_tokens=4)
        msg = got.get("error", {}).get("message", "")
        check(status == 400 and "tools needs a chat template" in msg,
              f"own template: tools refused ({status} {msg!r})")
        status, got = chat(port, max_tokens=4, tool_choice="none")
        check(status == 200, f"own template: tool_choice none is served "
                             f"without the tools ({status})")
    finally:
        stop(server)


def start_router(shardlm: str, gguf: str, replica: str,
                 label: str) -> tuple[subprocess.Popen, int | None]:
    """`shardlm router` in front of `replica`: the process and its HTTP
    port, None when it does not answer within a minute."""
    port = free_port()
    router = subprocess.Popen(
        [shardlm, "router", "--replica", replica, "--model", gguf,
         "--listen", f"127.0.0.1:{free_port()}",
         "--http-listen", f"127.0.0.1:{port}"],
        stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL)
    up = wait_until(lambda: _answers(port), timeout=60, every=0.3)
    check(up, f"a router in front of {label} answers")
    return router, port if up else None


def serve_template(shardlm: str, gguf: str, workdir: str, name: str,
                   source: str):
    """`shardlm serve --chat-template` with `source`: the process, its
    gRPC address and HTTP port (None when it does not answer)."""
    template = os.path.join(workdir, name.replace(" ", "_") + ".jinja")
    with open(template, "w", encoding="utf-8") as f:
        f.write(source)
    port = free_port()
    server, addr = start_serve(shardlm, gguf,
                               ["--http-listen", f"127.0.0.1:{port}",
                                "--chat-template", template])
    up = wait_until(lambda: _answers(port), timeout=120, every=0.3)
    check(up, f"serve --chat-template ({name}'s) answers")
    return server, addr, port if up else None


def router_checks(shardlm: str, gguf: str, replica: str) -> None:
    """The same calls through `shardlm router` in front of the replica:
    its OpenAI layer takes the calls from the replica's last response and
    keeps their markup out of the content without a template of its own;
    n choices come back whole."""
    router, port = start_router(shardlm, gguf, replica, "the replica")
    try:
        if port is None:
            return
        named_and_required_checks(port)
        auto_checks(port)
        status, got = chat(port, n=2)
        texts = [c.get("message", {}).get("content")
                 for c in got.get("choices", [])]
        check(status == 200 and len(texts) == 2 and texts[0] == texts[1],
              f"router: greedy n = 2 gives two equal choices ({status} "
              f"{texts})")
    finally:
        stop(router)


def llama_checks(shardlm: str, gguf: str, workdir: str) -> None:
    """Llama 3.1's JSON tool calls (its template given to SmolLM2): the
    history renders as jinja2's; a named function gives one valid call of
    {"name", "parameters"} as the whole turn, streamed as OpenAI's deltas;
    auto parses a written call and gives a malformed one back as content;
    a router learns the format from the replica (ModelInfo) and parses the
    same calls."""
    server, addr, port = serve_template(shardlm, gguf, workdir, "Llama 3.1",
                                        LLAMA31_TOOLS)
    try:
        if port is None:
            return
        history_checks(port, LLAMA31_TOOLS, "llama3.1")
        llama_call_checks(port, "llama3.1")
        router, rport = start_router(shardlm, gguf, addr,
                                     "the Llama 3.1 replica")
        try:
            if rport is not None:
                llama_call_checks(rport, "llama3.1 through a router")
        finally:
            stop(router)
    finally:
        stop(server)


def llama_call_checks(port: int, name: str) -> None:
    forced = {"type": "function", "function": {"name": "get_weather"}}
    status, got = chat(port, tool_choice=forced, max_tokens=64)
    choice = got.get("choices", [{}])[0]
    calls = choice.get("message", {}).get("tool_calls")
    why = valid_calls(calls, {"get_weather"}) if status == 200 else got
    check(why is None and len(calls) == 1 and
          choice.get("finish_reason") == "tool_calls" and
          choice["message"].get("content") is None,
          f"{name}: tool_choice get_weather gives one valid call ({why}; "
          f"{choice})")
    chunks = sse(port, {"messages": ASK, "tools": TOOLS, "max_tokens": 64,
                        "temperature": 0, "tool_choice": forced})
    got_calls, why = reassemble(chunks)
    content = "".join(c["choices"][0]["delta"].get("content") or ""
                      for c in chunks if c.get("choices"))
    check(why is None and calls and content == "" and
          [c["function"] for c in got_calls] ==
          [c["function"] for c in calls],
          f"{name}: streamed, the same call from OpenAI's deltas ({why}; "
          f"{got_calls}, content {content!r})")
    good = ('root ::= "{\\"name\\": \\"add\\", \\"parameters\\": '
            '{\\"a\\": 2, \\"b\\": 3}}"')
    status, got = chat(port, grammar=good, max_tokens=64)
    choice = got.get("choices", [{}])[0]
    calls = choice.get("message", {}).get("tool_calls") or []
    check(status == 200 and choice.get("finish_reason") == "tool_calls" and
          [c["function"] for c in calls] ==
          [{"name": "add", "arguments": '{"a": 2, "b": 3}'}],
          f"{name}: auto parses a written call ({status} {choice})")
    bad = 'root ::= "{\\"name\\": \\"rm\\", \\"parameters\\": {}}"'
    status, got = chat(port, grammar=bad, max_tokens=64)
    choice = got.get("choices", [{}])[0]
    msg = choice.get("message", {})
    check(status == 200 and msg.get("content") ==
          '{"name": "rm", "parameters": {}}' and "tool_calls" not in msg and
          choice.get("finish_reason") == "stop",
          f"{name}: a call of a function not offered is content "
          f"({status} {choice})")


def think_checks(port: int, where: str,
                 think: str = 'root ::= "<think>\\nhmm, 2+2\\n</think>'
                              '\\n\\nFour."') -> None:
    """Qwen3's <think> block (written by the grammar extension here) comes
    back as reasoning_content, apart from the answer, streamed or not."""
    status, got = chat(port, grammar=think, tool_choice="none")
    message = got.get("choices", [{}])[0].get("message", {})
    chunks = sse(port, {"messages": ASK, "max_tokens": 48, "temperature": 0,
                        "grammar": think})
    streamed = ["".join(c["choices"][0]["delta"].get(k) or ""
                        for c in chunks if c.get("choices"))
                for k in ("reasoning_content", "content")]
    check(status == 200 and message.get("reasoning_content") == "hmm, 2+2" and
          message.get("content") == "Four." and
          streamed == ["hmm, 2+2", "Four."],
          f"{where}: <think> is reasoning_content, streamed or not "
          f"({status} {message}; {streamed})")


def qwen3_checks(shardlm: str, gguf: str, workdir: str) -> None:
    """Qwen3's template: the history renders as jinja2's, a named function
    gives one valid Hermes call, and the <think> block is reasoning, also
    through a router (which learns that from the replica's ModelInfo)."""
    server, addr, port = serve_template(shardlm, gguf, workdir, "Qwen3",
                                        QWEN3)
    try:
        if port is None:
            return
        history_checks(port, QWEN3, "qwen3")
        think_checks(port, "qwen3")
        # enable_thinking false: the prompt jinja2 renders with it.
        prompt = jinja_render(QWEN3, "<|im_start|>", ASK,
                              enable_thinking=False)
        s1, got = post(port, "/v1/chat/completions", {
            "messages": ASK, "max_tokens": 8, "temperature": 0,
            "chat_template_kwargs": {"enable_thinking": False}})
        s2, want = post(port, "/v1/completions",
                        {"prompt": prompt, "max_tokens": 8, "temperature": 0})
        check(s1 == 200 and s2 == 200 and
              got["usage"]["prompt_tokens"] ==
              want["usage"]["prompt_tokens"] and
              got["choices"][0]["message"]["content"] ==
              want["choices"][0]["text"],
              f"qwen3: enable_thinking false renders as jinja2's ({s1} {s2})")
        router, rport = start_router(shardlm, gguf, addr, "the Qwen3 replica")
        try:
            if rport is not None:
                think_checks(rport, "qwen3 through a router")
        finally:
            stop(router)
        forced = {"type": "function", "function": {"name": "add"}}
        status, got = chat(port, tool_choice=forced)
        choice = got.get("choices", [{}])[0]
        calls = choice.get("message", {}).get("tool_calls")
        why = valid_calls(calls, {"add"}) if status == 200 else got
        check(why is None and len(calls) == 1 and
              choice.get("finish_reason") == "tool_calls",
              f"qwen3: tool_choice add gives one valid call ({why}; {choice})")
    finally:
        stop(server)


def deepseek_checks(shardlm: str, gguf: str, workdir: str) -> None:
    """DeepSeek R1's template: a conversation renders as jinja2's; its
    prompt opened <think>, so the answer's text up to </think> is
    reasoning, also through a router; its tools are refused."""
    server, addr, port = serve_template(shardlm, gguf, workdir, "DeepSeek R1",
                                        DEEPSEEK_R1)
    try:
        if port is None:
            return
        history = [{"role": "system", "content": "Be brief."},
                   {"role": "user", "content": "2+2?"},
                   {"role": "assistant", "content": "<think>\nx\n</think>4"},
                   {"role": "user", "content": "3+3?"}]
        prompt = jinja_render(DEEPSEEK_R1, "<|im_start|>", history)
        s1, got = post(port, "/v1/chat/completions", {
            "messages": history, "max_tokens": 8, "temperature": 0,
            "logprobs": True})
        s2, want = post(port, "/v1/completions",
                        {"prompt": prompt, "max_tokens": 8, "temperature": 0})
        check(s1 == 200 and s2 == 200 and
              got["usage"]["prompt_tokens"] ==
              want["usage"]["prompt_tokens"] and
              "".join(t["token"] for t in
                      got["choices"][0]["logprobs"]["content"]) ==
              want["choices"][0]["text"],
              f"deepseek r1: a conversation renders as jinja2's ({s1} {s2})")
        opened = 'root ::= "hmm, 2+2\\n</think>\\n\\nFour."'

        def split(p: int, where: str) -> None:
            status, got = chat(p, grammar=opened, tool_choice="none")
            message = got.get("choices", [{}])[0].get("message", {})
            chunks = sse(p, {"messages": ASK, "max_tokens": 48,
                             "temperature": 0, "grammar": opened})
            streamed = ["".join(c["choices"][0]["delta"].get(k) or ""
                                for c in chunks if c.get("choices"))
                        for k in ("reasoning_content", "content")]
            check(status == 200 and
                  message.get("reasoning_content") == "hmm, 2+2" and
                  message.get("content") == "Four." and
                  streamed == ["hmm, 2+2", "Four."],
                  f"{where}: the text before </think> is reasoning_content, "
                  f"streamed or not ({status} {message}; {streamed})")

        split(port, "deepseek r1")
        router, rport = start_router(shardlm, gguf, addr, "the R1 replica")
        try:
            if rport is not None:
                split(rport, "deepseek r1 through a router")
        finally:
            stop(router)
        status, got = chat(port)
        check(status == 400 and "tools" in json.dumps(got),
              f"deepseek r1: tools are refused, naming them ({status} {got})")
    finally:
        stop(server)


def glm_checks(shardlm: str, gguf: str, workdir: str) -> None:
    """GLM-4.5's template: its answer opens with a newline before <think>,
    and the block is reasoning all the same."""
    server, _, port = serve_template(shardlm, gguf, workdir, "GLM-4.5", GLM45)
    try:
        if port is not None:
            think_checks(port, "glm-4.5", 'root ::= "\\n<think>hmm, 2+2'
                                          '</think>\\nFour."')
    finally:
        stop(server)


def harmony_checks(shardlm: str, gguf: str, workdir: str) -> None:
    """gpt-oss's template (harmony): the history renders as jinja2's (dated
    today, as the server dates it); tool_choice required is refused, since
    no grammar constrains harmony's channels yet."""
    server, _, port = serve_template(shardlm, gguf, workdir, "gpt-oss",
                                     HARMONY_TOOLS)
    try:
        if port is None:
            return
        check_chat_template.NOW = datetime.datetime.now(datetime.timezone.utc)
        history_checks(port, HARMONY_TOOLS, "harmony", content="")
        status, got = chat(port, tool_choice="required")
        check(status == 400 and "harmony" in json.dumps(got),
              f"harmony: tool_choice required refused, naming the format "
              f"({status} {got})")
    finally:
        stop(server)


def _answers(port: int) -> bool:
    try:
        return post(port, "/v1/completions",
                    {"prompt": "x", "max_tokens": 1})[0] == 200
    except OSError:
        return False


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--shardlm", required=True)
    ap.add_argument("--gguf", required=True)
    ap.add_argument("--workdir", required=True)
    a = ap.parse_args()
    os.makedirs(a.workdir, exist_ok=True)
    os.environ.pop("SHARDLM_API_KEY", None)
    template = os.path.join(a.workdir, "qwen2.5_tools.jinja")
    with open(template, "w", encoding="utf-8") as f:
        f.write(QWEN25_TOOLS)
    port = free_port()
    server, addr = start_serve(a.shardlm, a.gguf,
                               ["--http-listen", f"127.0.0.1:{port}",
                                "--chat-template", template])
    try:
        up = wait_until(lambda: _answers(port), timeout=120, every=0.3)
        check(up, "serve --chat-template (Qwen2.5's) answers")
        if not up:
            return exit_code()
        history_checks(port)
        named_and_required_checks(port)
        auto_checks(port)
        grpc_checks(addr)
        bad_input_checks(port)
        router_checks(a.shardlm, a.gguf, addr)
    finally:
        stop(server)
    own_template_checks(a.shardlm, a.gguf)
    qwen3_checks(a.shardlm, a.gguf, a.workdir)
    harmony_checks(a.shardlm, a.gguf, a.workdir)
    deepseek_checks(a.shardlm, a.gguf, a.workdir)
    glm_checks(a.shardlm, a.gguf, a.workdir)
    llama_checks(a.shardlm, a.gguf, a.workdir)
    return exit_code("tool calls render, parse, constrain and refuse")


if __name__ == "__main__":
    sys.exit(main())
