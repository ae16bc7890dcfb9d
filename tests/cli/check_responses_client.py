#!/usr/bin/env python3
"""OpenAI's Responses API (issue 61) through the unmodified `openai` Python
client: `shardlm serve` on SmolLM2 with Qwen2.5's chat template (the
Hermes <tool_call> format), driven only by `client.responses.create` and
`client.responses.stream`. Each check compares what the client parsed with
a reference that does not go through it:

- greedy output_text = /v1/completions over raw HTTP of jinja2's rendering
  of the same conversation (instructions as the system message), usage
  equal to the completion's; input as a plain string too; a response that
  ends by itself (the grammar extension writes "Mars.") is "completed",
  and streamed the client's own accumulation gives the same output;
- max_output_tokens: status "incomplete" (reason max_output_tokens) after
  that many tokens, streamed as a last response.incomplete event;
- tools: a named function gives one function_call item whose arguments
  validate against its parameters (jsonschema); streamed, the same call;
  stored ("store": true), its function_call_output answered through
  previous_response_id gives the text of jinja2's rendering of the whole
  history; an id never stored (store false) is 404;
- text.format json_schema: the output validates against the schema;
- a built-in tool (web_search) and an image part are 400 naming them.

  check_responses_client.py --shardlm BIN --gguf MODEL --workdir DIR
"""

from __future__ import annotations

import argparse
import json
import os
import sys

import jsonschema
import openai

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, ".."))
sys.path.insert(0, os.path.join(HERE, "..", "reference"))
from check_chat_template import QWEN25_TOOLS, jinja_render  # noqa: E402
from check_tools import SCHEMA, TOOLS  # noqa: E402
from testlib import (check, exit_code, free_port,  # noqa: E402
                     http_post_json, start_serve, stop, wait_until)

KV = ["--kv-cache-dtype", "f32"]
SYSTEM = "You are a helpful assistant."
PLANET = [{"role": "user", "content": "Name a planet and say why."}]
ASK = [{"role": "user", "content": "What is the weather in Paris?"}]
# The tools in the Responses API's (flat) form.
R_TOOLS = [{"type": "function", "name": t["function"]["name"],
            "description": t["function"]["description"],
            "parameters": t["function"]["parameters"]} for t in TOOLS]
PERSON = {"type": "object", "properties": {
    "name": {"type": "string", "maxLength": 20},
    "age": {"type": "integer", "minimum": 0, "maximum": 120}},
    "required": ["name", "age"], "additionalProperties": False}
TIMEOUT_S = 300
MODEL = [""]


def completion(port: int, prompt: str, max_tokens: int) -> dict:
    status, raw = http_post_json(
        port, "/v1/completions",
        {"prompt": prompt, "max_tokens": max_tokens, "temperature": 0},
        timeout=TIMEOUT_S)
    return json.loads(raw) if status == 200 else {"status": status}


def items_of(response) -> list:
    """The output items as plain tuples (types, texts, calls; not ids)."""
    out = []
    for item in response.output:
        if item.type == "message":
            out.append(("message", "".join(c.text for c in item.content)))
        elif item.type == "function_call":
            out.append(("function_call", item.name,
                        json.loads(item.arguments)))
        else:
            out.append((item.type,))
    return out


def greedy_checks(client, port: int) -> None:
    prompt = jinja_render(QWEN25_TOOLS, "<|im_start|>",
                          [{"role": "system", "content": SYSTEM}] + PLANET)
    ref = completion(port, prompt, 24)
    want = ref.get("choices", [{}])[0].get("text")
    got = client.responses.create(model=MODEL[0], instructions=SYSTEM,
                                  input=PLANET, max_output_tokens=24,
                                  temperature=0)
    usage = ref.get("usage", {})
    check(got.output_text == want and got.object == "response" and
          got.usage.input_tokens == usage.get("prompt_tokens") and
          got.usage.output_tokens == usage.get("completion_tokens") and
          got.usage.total_tokens == usage.get("prompt_tokens", 0) +
          usage.get("completion_tokens", 0),
          f"greedy output_text = raw completions of jinja2's rendering "
          f"({got.output_text!r} vs {want!r}; {got.usage})")
    check(got.status == "incomplete" and
          got.incomplete_details.reason == "max_output_tokens",
          f"24 tokens of a longer answer: incomplete, max_output_tokens "
          f"({got.status}, {got.incomplete_details})")
    as_string = client.responses.create(model=MODEL[0], instructions=SYSTEM,
                                        input=PLANET[0]["content"],
                                        max_output_tokens=24, temperature=0)
    check(as_string.output_text == want,
          f"input as a string: the same text ({as_string.output_text!r})")

    events = list(client.responses.create(
        model=MODEL[0], instructions=SYSTEM, input=PLANET,
        max_output_tokens=3, temperature=0, stream=True))
    deltas = "".join(e.delta for e in events
                     if e.type == "response.output_text.delta")
    last = events[-1] if events else None
    check(events and events[0].type == "response.created" and
          last.type == "response.incomplete" and
          last.response.status == "incomplete" and
          last.response.usage.output_tokens == 3 and
          deltas == last.response.output_text and want.startswith(deltas) and
          [e.sequence_number for e in events] == list(range(len(events))),
          f"max_output_tokens 3 streamed: created ... incomplete, the "
          f"deltas its text, numbered in order ({deltas!r}, "
          f"{last.type if last else None})")

    mars = {"grammar": 'root ::= "Mars."'}
    done = client.responses.create(model=MODEL[0], input=PLANET,
                                   max_output_tokens=24, temperature=0,
                                   extra_body=mars)
    with client.responses.stream(model=MODEL[0], input=PLANET,
                                 max_output_tokens=24, temperature=0,
                                 extra_body=mars) as s:
        text = "".join(e.delta for e in s
                       if e.type == "response.output_text.delta")
        final = s.get_final_response()
    check(done.status == "completed" and done.output_text == "Mars." and
          text == "Mars." and items_of(final) == items_of(done) and
          final.status == "completed" and
          final.usage.output_tokens == done.usage.output_tokens,
          f"an answer that ends: completed, streamed the same "
          f"({done.status} {done.output_text!r}; {text!r} "
          f"{items_of(final)})")


def tool_checks(client, port: int) -> None:
    named = {"type": "function", "name": "get_weather"}
    got = client.responses.create(model=MODEL[0], input=ASK, tools=R_TOOLS,
                                  tool_choice=named, max_output_tokens=64,
                                  temperature=0, store=True)
    calls = [i for i in got.output if i.type == "function_call"]
    valid = False
    if len(calls) == 1 and calls[0].name == "get_weather":
        try:
            jsonschema.validate(json.loads(calls[0].arguments),
                                SCHEMA["get_weather"])
            valid = True
        except (ValueError, jsonschema.ValidationError) as e:
            print(f"  invalid arguments: {e}")
    check(valid and calls[0].call_id and got.status == "completed",
          f"a named function: one function_call item, its arguments valid "
          f"({got.output})")
    with client.responses.stream(model=MODEL[0], input=ASK, tools=R_TOOLS,
                                 tool_choice=named, max_output_tokens=64,
                                 temperature=0) as s:
        final = s.get_final_response()
    check(items_of(final) == items_of(got),
          f"streamed: the client assembles the same call "
          f"({items_of(final)})")
    if not valid:
        return
    call = calls[0]
    jinja_messages = ASK + [
        {"role": "assistant", "content": "", "tool_calls": [
            {"id": call.call_id, "type": "function",
             "function": {"name": call.name,
                          "arguments": json.loads(call.arguments)}}]},
        {"role": "tool", "tool_call_id": call.call_id,
         "content": "18 C, sunny"}]
    prompt = jinja_render(QWEN25_TOOLS, "<|im_start|>", jinja_messages,
                          TOOLS)
    ref = completion(port, prompt, 24)
    want = ref.get("choices", [{}])[0].get("text")
    answer = client.responses.create(
        model=MODEL[0], previous_response_id=got.id, tools=R_TOOLS,
        tool_choice="none", max_output_tokens=24, temperature=0,
        input=[{"type": "function_call_output", "call_id": call.call_id,
                "output": "18 C, sunny"}])
    check(answer.output_text == want and
          answer.previous_response_id == got.id and
          answer.usage.input_tokens == ref.get("usage", {}).get(
              "prompt_tokens"),
          f"previous_response_id and a function_call_output = raw "
          f"completions of jinja2's rendering of the history "
          f"({answer.output_text!r} vs {want!r})")
    unstored = client.responses.create(model=MODEL[0], input=ASK,
                                       max_output_tokens=2, temperature=0)
    try:
        client.responses.create(model=MODEL[0], input=ASK,
                                previous_response_id=unstored.id,
                                max_output_tokens=2)
        check(False, "a response not stored cannot be continued")
    except openai.NotFoundError as e:
        check("not stored" in str(e),
              f"previous_response_id of a response not stored: 404 ({e})")


def format_and_error_checks(client) -> None:
    got = client.responses.create(
        model=MODEL[0], input=[{"role": "user", "content": "A person?"}],
        max_output_tokens=64, temperature=0,
        text={"format": {"type": "json_schema", "name": "person",
                         "schema": PERSON, "strict": True}})
    try:
        jsonschema.validate(json.loads(got.output_text), PERSON)
        valid = True
    except (ValueError, jsonschema.ValidationError):
        valid = False
    check(valid, f"text.format json_schema: the output validates "
          f"({got.output_text!r})")
    for name, fields, needle in [
            ("a built-in tool", {"input": ASK, "tools": [
                {"type": "web_search"}]}, "function tools"),
            ("an image part", {"input": [{"role": "user", "content": [
                {"type": "input_image", "image_url": "http://x/y.png"}]}]},
             "input_image")]:
        try:
            client.responses.create(model=MODEL[0], max_output_tokens=2,
                                    **fields)
            check(False, f"{name} is refused")
        except openai.BadRequestError as e:
            check(needle in str(e), f"{name}: 400 naming it ({e})")


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
    env = dict(os.environ)
    env.pop("SHARDLM_API_KEY", None)
    port = free_port()
    server, _ = start_serve(
        a.shardlm, a.gguf, ["--http-listen", f"127.0.0.1:{port}",
                            "--chat-template", template, *KV], env=env)
    client = openai.OpenAI(base_url=f"http://127.0.0.1:{port}/v1",
                           api_key="not-checked", max_retries=0,
                           timeout=TIMEOUT_S)

    def answers() -> bool:
        try:
            MODEL[0] = client.models.list().data[0].id
            client.responses.create(model=MODEL[0], input="x",
                                    max_output_tokens=1)
            return True
        except openai.OpenAIError:
            return False

    try:
        up = wait_until(answers, timeout=120, every=0.3)
        check(up, "serve answers the openai client's responses")
        if up:
            greedy_checks(client, port)
            tool_checks(client, port)
            format_and_error_checks(client)
    finally:
        stop(server)
    return exit_code("the Responses API gives what the references say")


if __name__ == "__main__":
    sys.exit(main())
