#!/usr/bin/env python3
"""Anthropic's Messages API (issue 61) through the unmodified `anthropic`
Python client: `shardlm serve` on SmolLM2 with Qwen2.5's chat template
(--chat-template: the Hermes <tool_call> format) and an API key, driven
only by `anthropic.Anthropic(base_url=..., api_key=...)`:
`client.messages.create` and `client.messages.stream`. Each check compares
what the client parsed with a reference that does not go through it:

- greedy text = /v1/completions over raw HTTP of jinja2's rendering of the
  same conversation (a system prompt and a user turn), the usage's token
  counts equal to the completion's; streamed = not streamed (the client's
  own accumulation of the events: text, stop_reason, usage);
- stop_sequences: a word of the greedy text ends the message before it,
  stop_reason "stop_sequence" and the sequence named; max_tokens: stop
  reason "max_tokens" after that many tokens;
- tools: tool_choice naming a tool gives one tool_use block whose input
  validates against the tool's input_schema (jsonschema), stop_reason
  "tool_use"; streamed, the client assembles the same name and input; a
  follow-up with its tool_result answers as completions of jinja2's
  rendering of the same history (the tool_use as an assistant call, the
  result as a tool message);
- errors in Anthropic's shape, raised as the client's own exceptions: a
  wrong key (AuthenticationError), no max_tokens and an image block
  (BadRequestError naming the field).

  check_anthropic_client.py --shardlm BIN --gguf MODEL --workdir DIR
"""

from __future__ import annotations

import argparse
import http.client
import json
import os
import sys

import anthropic
import jsonschema

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, ".."))
sys.path.insert(0, os.path.join(HERE, "..", "reference"))
from check_chat_template import QWEN3, QWEN25_TOOLS, jinja_render  # noqa: E402
from check_tools import TOOLS  # noqa: E402
from testlib import (check, exit_code, free_port,  # noqa: E402
                     http_post_json, start_serve, stop, wait_until)

KEY = "test-key-123"
KV = ["--kv-cache-dtype", "f32"]
SYSTEM = "You are a helpful assistant."
PLANET = [{"role": "user", "content": "Name a planet and say why."}]
ASK = [{"role": "user", "content": "What is the weather in Paris?"}]
# The tools in Anthropic's form.
A_TOOLS = [{"name": t["function"]["name"],
            "description": t["function"]["description"],
            "input_schema": t["function"]["parameters"]} for t in TOOLS]
SCHEMA = {t["name"]: t["input_schema"] for t in A_TOOLS}
TIMEOUT_S = 300
MODEL = [""]  # The served model's name (from /v1/models).
# The client (2.x) has no sampling parameters; the API takes them, as
# Anthropic's does.
GREEDY = {"temperature": 0}


def completion(port: int, prompt: str, max_tokens: int) -> dict:
    """The reference: greedy /v1/completions over raw HTTP."""
    status, raw = http_post_json(
        port, "/v1/completions",
        {"prompt": prompt, "max_tokens": max_tokens, "temperature": 0},
        timeout=TIMEOUT_S, headers={"Authorization": f"Bearer {KEY}"})
    return json.loads(raw) if status == 200 else {"status": status}


def blocks_of(message) -> list:
    """The content blocks as plain tuples (a stream's final message holds
    the client's Parsed* block classes, a created one its plain ones)."""
    return [(b.type, getattr(b, "text", None), getattr(b, "thinking", None),
             getattr(b, "name", None), getattr(b, "input", None))
            for b in message.content]


def text_of(message) -> str:
    return "".join(b.text for b in message.content if b.type == "text")


def greedy_checks(client, port: int) -> None:
    prompt = jinja_render(QWEN25_TOOLS, "<|im_start|>",
                          [{"role": "system", "content": SYSTEM}] + PLANET)
    ref = completion(port, prompt, 24)
    want = ref.get("choices", [{}])[0].get("text")
    got = client.messages.create(model=MODEL[0], max_tokens=24, extra_body=GREEDY,
                                 system=SYSTEM, messages=PLANET)
    usage = ref.get("usage", {})
    check(text_of(got) == want and got.role == "assistant" and
          got.usage.input_tokens == usage.get("prompt_tokens") and
          got.usage.output_tokens == usage.get("completion_tokens") and
          got.stop_reason in ("end_turn", "max_tokens"),
          f"greedy message = raw completions of jinja2's rendering "
          f"({text_of(got)!r} vs {want!r}; {got.usage}, {got.stop_reason})")
    with client.messages.stream(model=MODEL[0], max_tokens=24, extra_body=GREEDY,
                                system=SYSTEM, messages=PLANET) as s:
        streamed = "".join(s.text_stream)
        final = s.get_final_message()
    check(streamed == text_of(got) and blocks_of(final) == blocks_of(got) and
          final.stop_reason == got.stop_reason and
          final.usage.output_tokens == got.usage.output_tokens and
          final.usage.input_tokens == got.usage.input_tokens,
          f"streamed: the same text, blocks, stop_reason and usage "
          f"({streamed!r}, {final.stop_reason}, {final.usage})")

    # A stop sequence from inside the greedy text: the text before it.
    words = [w for w in want.split(" ") if len(w) > 2]
    if len(words) >= 2:
        cut = words[1]
        stopped = client.messages.create(
            model=MODEL[0], max_tokens=24, extra_body=GREEDY, system=SYSTEM,
            messages=PLANET, stop_sequences=["zzzq", cut])
        check(text_of(stopped) == want[:want.index(cut)] and
              stopped.stop_reason == "stop_sequence" and
              stopped.stop_sequence == cut,
              f"stop_sequences: cut before {cut!r}, named "
              f"({text_of(stopped)!r}, {stopped.stop_reason}, "
              f"{stopped.stop_sequence!r})")
    else:
        check(False, f"the greedy text {want!r} has two words to stop at")
    short = client.messages.create(model=MODEL[0], max_tokens=3, extra_body=GREEDY,
                                   system=SYSTEM, messages=PLANET)
    check(short.stop_reason == "max_tokens" and
          short.usage.output_tokens == 3 and want.startswith(text_of(short)),
          f"max_tokens 3: stop_reason max_tokens after 3 tokens "
          f"({text_of(short)!r}, {short.stop_reason}, {short.usage})")


def tool_checks(client, port: int) -> None:
    named = {"type": "tool", "name": "get_weather"}
    got = client.messages.create(model=MODEL[0], max_tokens=64, extra_body=GREEDY,
                                 messages=ASK, tools=A_TOOLS,
                                 tool_choice=named)
    uses = [b for b in got.content if b.type == "tool_use"]
    valid = False
    if len(uses) == 1 and uses[0].name == "get_weather":
        try:
            jsonschema.validate(uses[0].input, SCHEMA["get_weather"])
            valid = True
        except jsonschema.ValidationError as e:
            print(f"  invalid input: {e}")
    check(valid and got.stop_reason == "tool_use" and
          uses[0].id.startswith("toolu_"),
          f"tool_choice tool: one get_weather tool_use, its input valid "
          f"against the schema, stop_reason tool_use ({got.content}, "
          f"{got.stop_reason})")
    with client.messages.stream(model=MODEL[0], max_tokens=64, extra_body=GREEDY,
                                messages=ASK, tools=A_TOOLS,
                                tool_choice=named) as s:
        final = s.get_final_message()
    s_uses = [b for b in final.content if b.type == "tool_use"]
    check(len(s_uses) == len(uses) and final.stop_reason == "tool_use" and
          all(a.name == b.name and a.input == b.input
              for a, b in zip(s_uses, uses)),
          f"streamed tool_use: the client assembles the same call "
          f"({final.content})")
    if not valid:
        return
    # The call answered: the history renders as jinja2 renders it.
    call = uses[0]
    history = ASK + [
        {"role": "assistant", "content": [
            {"type": "tool_use", "id": call.id, "name": call.name,
             "input": call.input}]},
        {"role": "user", "content": [
            {"type": "tool_result", "tool_use_id": call.id,
             "content": "18 C, sunny"}]}]
    jinja_messages = ASK + [
        {"role": "assistant", "content": "", "tool_calls": [
            {"id": call.id, "type": "function",
             "function": {"name": call.name, "arguments": call.input}}]},
        {"role": "tool", "tool_call_id": call.id, "content": "18 C, sunny"}]
    prompt = jinja_render(QWEN25_TOOLS, "<|im_start|>", jinja_messages,
                          [{"type": "function", "function": {
                              "name": t["name"],
                              "description": t["description"],
                              "parameters": t["input_schema"]}}
                           for t in A_TOOLS])
    ref = completion(port, prompt, 24)
    want = ref.get("choices", [{}])[0].get("text")
    answer = client.messages.create(model=MODEL[0], max_tokens=24, extra_body=GREEDY,
                                    messages=history, tools=A_TOOLS,
                                    tool_choice={"type": "none"})
    check(text_of(answer) == want and
          answer.usage.input_tokens == ref.get("usage", {}).get(
              "prompt_tokens"),
          f"tool_result follow-up = raw completions of jinja2's rendering "
          f"({text_of(answer)!r} vs {want!r})")


def error_checks(port: int, client) -> None:
    wrong = anthropic.Anthropic(base_url=f"http://127.0.0.1:{port}",
                                api_key="wrong", max_retries=0,
                                timeout=TIMEOUT_S)
    try:
        wrong.messages.create(model=MODEL[0], max_tokens=4, messages=PLANET)
        check(False, "a wrong key is refused")
    except anthropic.AuthenticationError as e:
        check(e.status_code == 401 and
              e.body.get("error", {}).get("type") == "authentication_error",
              f"a wrong key: AuthenticationError ({e.body})")
    image = [{"role": "user", "content": [
        {"type": "image", "source": {"type": "base64",
                                     "media_type": "image/png",
                                     "data": "AAAA"}}]}]
    try:
        client.messages.create(model=MODEL[0], max_tokens=4, messages=image)
        check(False, "an image block is refused")
    except anthropic.BadRequestError as e:
        error = (e.body or {}).get("error", {})
        check(e.status_code == 400 and "'image'" in error.get("message", "")
              and error.get("type") == "invalid_request_error",
              f"an image block: BadRequestError naming it ({e.body})")
    # The client insists on max_tokens itself: over raw HTTP.
    status, raw = http_post_json(port, "/v1/messages",
                                 {"model": MODEL[0], "messages": PLANET},
                                 timeout=TIMEOUT_S,
                                 headers={"x-api-key": KEY})
    error = json.loads(raw).get("error", {}) if status == 400 else {}
    check("'max_tokens' is required" in error.get("message", "") and
          error.get("type") == "invalid_request_error",
          f"no max_tokens: 400 naming it ({status} {raw[:200]!r})")


def thinking_checks(shardlm: str, gguf: str, workdir: str) -> None:
    """Qwen3's template: a <think> block (written by the grammar extension)
    comes back as a thinking block before the text, streamed or not."""
    template = os.path.join(workdir, "qwen3.jinja")
    with open(template, "w", encoding="utf-8") as f:
        f.write(QWEN3)
    port = free_port()
    server, _ = start_serve(shardlm, gguf,
                            ["--http-listen", f"127.0.0.1:{port}",
                             "--chat-template", template, *KV],
                            env=dict(os.environ, SHARDLM_API_KEY=KEY))
    client = anthropic.Anthropic(base_url=f"http://127.0.0.1:{port}",
                                 api_key=KEY, max_retries=0,
                                 timeout=TIMEOUT_S)
    think = 'root ::= "<think>\\nhmm, 2+2\\n</think>\\n\\nFour."'
    body = dict(GREEDY, grammar=think)
    try:
        up = wait_until(lambda: served(port, client), timeout=120, every=0.3)
        check(up, "serve --chat-template (Qwen3's) answers")
        if not up:
            return
        got = client.messages.create(model=MODEL[0], max_tokens=48,
                                     messages=ASK, extra_body=body)
        with client.messages.stream(model=MODEL[0], max_tokens=48,
                                    messages=ASK, extra_body=body) as s:
            final = s.get_final_message()
        want = [("thinking", None, "hmm, 2+2", None, None),
                ("text", "Four.", None, None, None)]
        check(blocks_of(got) == want and blocks_of(final) == want and
              got.stop_reason == "end_turn",
              f"Qwen3's <think>: a thinking block, then the text, streamed "
              f"or not ({got.content}; {final.content})")
    finally:
        stop(server)


def served(port: int, client) -> bool:
    """Whether the server answers (and MODEL[0] is its model's name)."""
    try:
        conn = http.client.HTTPConnection("127.0.0.1", port, timeout=5)
        conn.request("GET", "/v1/models",
                     headers={"Authorization": f"Bearer {KEY}"})
        reply = conn.getresponse()
        if reply.status != 200:
            return False
        MODEL[0] = json.loads(reply.read())["data"][0]["id"]
        client.messages.create(model=MODEL[0], max_tokens=1, messages=PLANET)
        return True
    except (OSError, ValueError, anthropic.APIError):
        return False


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--shardlm", required=True)
    ap.add_argument("--gguf", required=True)
    ap.add_argument("--workdir", required=True)
    a = ap.parse_args()
    os.makedirs(a.workdir, exist_ok=True)
    template = os.path.join(a.workdir, "qwen2.5_tools.jinja")
    with open(template, "w", encoding="utf-8") as f:
        f.write(QWEN25_TOOLS)
    env = dict(os.environ, SHARDLM_API_KEY=KEY)
    port = free_port()
    server, _ = start_serve(
        a.shardlm, a.gguf, ["--http-listen", f"127.0.0.1:{port}",
                            "--chat-template", template, *KV], env=env)
    client = anthropic.Anthropic(base_url=f"http://127.0.0.1:{port}",
                                 api_key=KEY, max_retries=0,
                                 timeout=TIMEOUT_S)

    try:
        up = wait_until(lambda: served(port, client), timeout=120, every=0.3)
        check(up, "serve answers the anthropic client")
        if up:
            greedy_checks(client, port)
            tool_checks(client, port)
            error_checks(port, client)
    finally:
        stop(server)
    thinking_checks(a.shardlm, a.gguf, a.workdir)
    return exit_code("the anthropic client gets what the references say")


if __name__ == "__main__":
    sys.exit(main())
