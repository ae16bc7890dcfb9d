#!/usr/bin/env python3
"""The OpenAI API through the unmodified `openai` Python client (issue 38):
`shardlm serve` on SmolLM2, with Qwen2.5's chat template (--chat-template:
the Hermes <tool_call> format; SmolLM2's own renders no tools), driven only
by `openai.OpenAI(base_url=..., api_key=...)` on /v1/completions and
/v1/chat/completions, streamed and not. Each check compares what the
client parsed with a reference that does not go through it:

- greedy completion = `shardlm generate --model` (no server); greedy chat
  = /v1/completions over raw HTTP of jinja2's rendering of the same
  messages; streamed = not streamed; include_usage's chunk = the
  non-streamed usage;
- n: seeded choices differ, repeat, and choice i is the n = 1 request
  with seed + i; greedy n = 2 gives n = 1's text twice;
- penalties (presence and frequency, and repetition_penalty through
  extra_body) leave fewer repeats than none on a repetitive prompt;
  min_tokens (extra_body) keeps a reply that ends by itself going;
- logit_bias: -100 on the greedy first token (its id from gRPC) moves
  it, +100 on a token makes greedy output it (its text from
  prompt_logprobs' decoded_token);
- echo with logprobs = prompt_logprobs (vLLM's extension, extra_body) =
  gRPC's prompt_logprobs, for the same prompt;
- response_format json_object and json_schema strict: every completion
  validates with jsonschema;
- tools: tool_choice named, required and auto (the call written through
  the grammar extension): message.tool_calls as the client parsed them,
  arguments valid against the parameters, and the same call as raw HTTP
  gives; streamed, the client's own stream helper assembles the deltas
  into the same call;
- usage.prompt_tokens_details.cached_tokens on a repeated prompt: the
  whole blocks of it the prefix cache holds;
- and a TP=2 x PP=2 cluster under mpirun (`shardlm launch`) answers the
  same client with TP=PP=1's greedy completion, chat, json_schema and
  tool call, seeded n = 2, frequency, presence and repetition penalties,
  logit_bias, echo with logprobs, a stream with include_usage and
  min_tokens (exit 77 without mpirun).

  check_openai_client.py --shardlm BIN --gguf MODEL --workdir DIR
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import time

import grpc
import jsonschema
import openai

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, ".."))
sys.path.insert(0, os.path.join(HERE, "..", "reference"))
from check_chat_template import QWEN25_TOOLS, jinja_render  # noqa: E402
from check_sampling import (LOGPROBS_PROMPT, REPETITIVE,  # noqa: E402
                            generate, grpc_request, prompt_logprobs, repeats)
from check_tools import SCHEMA, TOOLS  # noqa: E402
from testlib import (check, exit_code, free_port,  # noqa: E402
                     http_post_json, mpirun_cluster, run, skip, start_serve,
                     stop, wait_until)

BLOCK = 16  # --block-size given to every server here.
# Every run here (serve, the cluster, generate) keeps f32 KV: the checks
# compare greedy and seeded texts across runs whose steps batch
# differently (TP 2 x PP 2 against TP 1, n = 3 against three singles), and
# with f16 KV those move log-probabilities by up to ~7e-3, enough to part
# at a near tie (docs/design-notes.md, section 4). f16 is the default
# elsewhere.
KV = ["--kv-cache-dtype", "f32"]
FRANCE = "The capital of France is"
PLANET = [{"role": "user", "content": "Name a planet."}]
ASK = [{"role": "user", "content": "What is the weather in Paris?"}]
NAMED = {"type": "function", "function": {"name": "get_weather"}}
PERSON = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "maxLength": 20},
        "age": {"type": "integer", "minimum": 0, "maximum": 120},
        "pets": {"type": "array", "maxItems": 3,
                 "items": {"enum": ["cat", "dog", "fish"]}},
    },
    "required": ["name", "age", "pets"],
    "additionalProperties": False,
}
JSON_SCHEMA = {"type": "json_schema", "json_schema": {
    "name": "person", "schema": PERSON, "strict": True}}
DESCRIBE = [{"role": "user", "content": "Describe a person as JSON."}]
SEEDED = {"prompt": "Once upon a time, in a quiet village, there lived",
          "max_tokens": 10, "temperature": 1.0, "seed": 11,
          "extra_body": {"ignore_eos": True}}


# One call's limit: the longest takes seconds on 2 cores; a hung one fails
# here, well inside ctest's 600 s, with the cluster's log to read.
CALL_TIMEOUT_S = 60


def raw(port: int, path: str, body: dict) -> dict:
    """The same API without the client: one raw HTTP request."""
    status, got = http_post_json(port, path, body, timeout=CALL_TIMEOUT_S)
    try:
        return json.loads(got) if status == 200 else {"status": status}
    except ValueError:
        return {"status": status}


def client_for(port: int) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"http://127.0.0.1:{port}/v1",
                         api_key="not-checked", max_retries=0,
                         timeout=CALL_TIMEOUT_S)


def answers(client: openai.OpenAI) -> bool:
    try:
        client.completions.create(model=model_of(client), prompt="x",
                                  max_tokens=1)
        return True
    except openai.OpenAIError:
        return False


_MODEL: dict[str, str] = {}


def model_of(client: openai.OpenAI) -> str:
    """The served model's id, from /v1/models through the client."""
    key = str(client.base_url)
    if key not in _MODEL:
        _MODEL[key] = client.models.list().data[0].id
    return _MODEL[key]


def complete(client, **kw):
    return client.completions.create(model=model_of(client), **kw)


def chat(client, **kw):
    return client.chat.completions.create(model=model_of(client), **kw)


def extra(obj, name: str):
    """A field the OpenAI types do not declare (vLLM's prompt_logprobs)."""
    return (obj.model_extra or {}).get(name)


def greedy_checks(client, port: int, shardlm: str, gguf: str) -> None:
    """Greedy completion and chat, streamed and not, against references
    outside the client."""
    local = run([shardlm, "generate", "--model", gguf, *KV, "--prompt", FRANCE,
                 "--max-tokens", "24"])
    want = local.stdout[:-1]  # generate ends its output with a newline.
    got = complete(client, prompt=FRANCE, max_tokens=24, temperature=0)
    text = got.choices[0].text
    check(local.returncode == 0 and text == want,
          f"greedy completion = shardlm generate ({text!r} vs {want!r})")
    chunks = list(complete(client, prompt=FRANCE, max_tokens=24,
                           temperature=0, stream=True,
                           stream_options={"include_usage": True}))
    streamed = "".join(c.choices[0].text for c in chunks if c.choices)
    check(streamed == text and not chunks[-1].choices and
          chunks[-1].usage == got.usage,
          f"streamed completion: the same text, then include_usage's chunk "
          f"with the same usage ({streamed!r}, {chunks[-1].usage})")

    prompt = jinja_render(QWEN25_TOOLS, "<|im_start|>", PLANET)
    ref = raw(port, "/v1/completions", {"prompt": prompt, "max_tokens": 16,
                                        "temperature": 0})
    ref_text = ref.get("choices", [{}])[0].get("text")
    reply = chat(client, messages=PLANET, max_tokens=16, temperature=0)
    content = reply.choices[0].message.content
    check(content == ref_text and reply.usage.prompt_tokens ==
          ref.get("usage", {}).get("prompt_tokens"),
          f"greedy chat = raw completions of jinja2's rendering ({content!r} "
          f"vs {ref_text!r})")
    deltas = list(chat(client, messages=PLANET, max_tokens=16, temperature=0,
                       stream=True, stream_options={"include_usage": True}))
    joined = "".join(c.choices[0].delta.content or "" for c in deltas
                     if c.choices)
    check(joined == content and deltas[-1].usage == reply.usage and
          deltas[0].choices[0].delta.role == "assistant",
          f"streamed chat: the same text and usage ({joined!r})")


def n_checks(client) -> None:
    """Seeded n = 3: three texts, the same again, choice i = n = 1 with
    seed + i; streamed, the same per index. Greedy n = 2 = n = 1."""
    got = complete(client, n=3, **SEEDED)
    texts = [c.text for c in sorted(got.choices, key=lambda c: c.index)]
    again = [c.text for c in complete(client, n=3, **SEEDED).choices]
    singles = [complete(client, **dict(SEEDED, seed=SEEDED["seed"] + i))
               .choices[0].text for i in range(3)]
    check(len(set(texts)) == 3 and again == texts and singles == texts and
          got.usage.completion_tokens == 30,
          f"seeded n = 3: three texts, reproducible, choice i = seed + i "
          f"({texts}, {again}, {singles})")
    per_index: dict[int, str] = {}
    for c in complete(client, n=3, stream=True, **SEEDED):
        for ch in c.choices:
            per_index[ch.index] = per_index.get(ch.index, "") + ch.text
    check(per_index == dict(enumerate(texts)),
          f"seeded n = 3 streamed: the same text per index ({per_index})")
    one = chat(client, messages=PLANET, max_tokens=8, temperature=0)
    two = chat(client, messages=PLANET, max_tokens=8, temperature=0, n=2)
    check([c.message.content for c in two.choices] ==
          [one.choices[0].message.content] * 2,
          f"greedy chat n = 2: n = 1's text twice "
          f"({[c.message.content for c in two.choices]})")


def penalty_checks(client) -> None:
    def tokens(**kw) -> list[str]:
        eb = dict(kw.pop("extra_body", {}), ignore_eos=True)
        got = complete(client, prompt=REPETITIVE, max_tokens=32,
                       temperature=0, logprobs=0, extra_body=eb, **kw)
        return got.choices[0].logprobs.tokens

    none = tokens()
    check(repeats(none) >= 16, f"without penalties the prompt repeats "
                               f"({repeats(none)} in {len(none)})")
    for name, kw in [("frequency_penalty 2", {"frequency_penalty": 2.0}),
                     ("presence_penalty 2", {"presence_penalty": 2.0}),
                     ("repetition_penalty 1.5 (extra_body)",
                      {"extra_body": {"repetition_penalty": 1.5}})]:
        toks = tokens(**kw)
        check(len(toks) == 32 and repeats(toks) < repeats(none),
              f"{name}: {repeats(toks)} repeats < {repeats(none)} "
              f"({''.join(toks)!r})")
    # min_tokens: a short reply that ends by itself goes on.
    short = [{"role": "user", "content": "Reply with only the word: yes"}]
    free = chat(client, messages=short, max_tokens=64, temperature=0)
    n_free = free.usage.completion_tokens
    held = chat(client, messages=short, max_tokens=64, temperature=0,
                extra_body={"min_tokens": n_free + 10})
    check(free.choices[0].finish_reason == "stop" and
          held.usage.completion_tokens >= n_free + 10,
          f"min_tokens {n_free + 10} (extra_body): "
          f"{held.usage.completion_tokens} tokens, {n_free} without")


def logit_bias_checks(client, channel) -> None:
    base = generate(channel, grpc_request(FRANCE, 1))
    check(isinstance(base, list) and len(base) == 1,
          f"gRPC: the greedy first token's id ({base})")
    if not isinstance(base, list) or not base:
        return
    plain = complete(client, prompt=FRANCE, max_tokens=4, temperature=0,
                     logprobs=3)
    banned = complete(client, prompt=FRANCE, max_tokens=4, temperature=0,
                      logprobs=3, logit_bias={str(base[0]): -100})
    first = plain.choices[0].logprobs.tokens[0]
    check(banned.choices[0].logprobs.tokens[0] != first and
          first not in banned.choices[0].logprobs.top_logprobs[0],
          f"logit_bias -100 on the greedy token {base[0]} ({first!r}) "
          f"removes it ({banned.choices[0].logprobs.tokens[:1]})")
    # +100: greedy outputs that token; its text from prompt_logprobs.
    decoded = extra(complete(client, prompt=[1000, 1000], max_tokens=1,
                             extra_body={"prompt_logprobs": 0}).choices[0],
                    "prompt_logprobs")
    want = decoded[1]["1000"]["decoded_token"] if decoded else None
    forced = complete(client, prompt=FRANCE, max_tokens=3, temperature=0,
                      logprobs=1, logit_bias={"1000": 100})
    check(want is not None and
          forced.choices[0].logprobs.tokens == [want] * 3,
          f"logit_bias +100 on token 1000 ({want!r}): greedy outputs it "
          f"({forced.choices[0].logprobs.tokens})")


def prompt_logprobs_checks(client, address: str) -> None:
    """echo + logprobs 3, prompt_logprobs 3 and gRPC's prompt_logprobs 2
    of the same prompt: one computation, three formats."""
    echo = complete(client, prompt=LOGPROBS_PROMPT, max_tokens=1,
                    temperature=0, echo=True, logprobs=3)
    ids_only = complete(client, prompt=LOGPROBS_PROMPT, max_tokens=1,
                        temperature=0, extra_body={"prompt_logprobs": 0})
    top3 = complete(client, prompt=LOGPROBS_PROMPT, max_tokens=1,
                    temperature=0, extra_body={"prompt_logprobs": 3})
    n_prompt = top3.usage.prompt_tokens
    lp = echo.choices[0].logprobs
    ids = [None] + [int(next(iter(d))) for d in
                    (extra(ids_only.choices[0], "prompt_logprobs") or
                     [None])[1:]]
    vllm = extra(top3.choices[0], "prompt_logprobs") or []
    check(len(vllm) == n_prompt == len(ids) and vllm[0] is None and
          all(len(d) == 1 for d in
              extra(ids_only.choices[0], "prompt_logprobs")[1:]),
          f"prompt_logprobs: one per prompt token, the first null; 0 gives "
          f"the prompt token alone ({len(vllm)} for {n_prompt} tokens)")
    worst, why = 0.0, None
    for i in range(1, min(len(vllm), len(ids))):
        entry, own = vllm[i], vllm[i].get(str(ids[i]))
        # The 3 most likely (the prompt token among them when it is).
        top = sorted((v for v in entry.values()
                      if v["rank"] is not None and v["rank"] <= 3),
                     key=lambda v: v["rank"])
        echo_top = lp.top_logprobs[i]
        if own is None or own["decoded_token"] != lp.tokens[i]:
            why = why or f"token {i}: {entry} vs {lp.tokens[i]!r}"
            continue
        worst = max(worst, abs(own["logprob"] - lp.token_logprobs[i]))
        in_top = own["decoded_token"] in echo_top
        if {v["decoded_token"]: v["logprob"] for v in top} != echo_top:
            why = why or f"top 3 at {i}: {top} vs {echo_top}"
        elif [v["rank"] for v in top] != [1, 2, 3]:
            why = why or f"ranks at {i}: {entry}"
        elif in_top != (own["rank"] is not None and own["rank"] <= 3):
            why = why or f"the prompt token's rank at {i}: {entry}"
    check(why is None and worst <= 1e-6 and lp.token_logprobs[0] is None,
          f"prompt_logprobs 3 = echo's logprobs 3 (tokens, top 3, ranks; "
          f"worst |diff| {worst:.2g}) ({why})")
    grpc_lp = prompt_logprobs(address)
    two = extra(complete(client, prompt=LOGPROBS_PROMPT, max_tokens=1,
                         extra_body={"prompt_logprobs": 2}).choices[0],
                "prompt_logprobs") or []
    # As check_sampling.prompt_logprobs gives them: (id, logprob, top-2
    # ids) per token after the first.
    http_lp = [(ids[i], d[str(ids[i])]["logprob"] if str(ids[i]) in d else
                None, [int(k) for k, v in sorted(
                    d.items(), key=lambda kv: kv[1]["rank"] or 99)
                       if v["rank"] is not None and v["rank"] <= 2])
               for i, d in enumerate(two) if i > 0 and i < len(ids)]
    grpc_lp = grpc_lp[1:] if isinstance(grpc_lp, list) else grpc_lp
    check(isinstance(grpc_lp, list) and len(grpc_lp) == len(http_lp) > 10
          and all(g[0] == h[0] and h[1] is not None and
                  abs(g[1] - h[1]) <= 1e-6 and g[2] == h[2]
                  for g, h in zip(grpc_lp, http_lp)),
          f"prompt_logprobs 2 = gRPC's prompt_logprobs 2 (ids, logprobs, "
          f"top 2) ({http_lp[:2]} vs {grpc_lp[:2]})")
    # Chat: beside the choices, one per token of the rendered prompt.
    reply = chat(client, messages=PLANET, max_tokens=1, temperature=0,
                 extra_body={"prompt_logprobs": 1})
    listed = extra(reply, "prompt_logprobs") or []
    check(len(listed) == reply.usage.prompt_tokens and listed[0] is None and
          all(1 <= len(d) <= 2 for d in listed[1:]) and
          extra(reply.choices[0], "prompt_logprobs") is None,
          f"chat prompt_logprobs 1: beside the choices, one per prompt token "
          f"({len(listed)} for {reply.usage.prompt_tokens})")
    for bad in (21, -1):
        try:
            complete(client, prompt="x", max_tokens=1,
                     extra_body={"prompt_logprobs": bad})
            msg = "accepted"
        except openai.BadRequestError as e:
            msg = str(e)
        check("prompt_logprobs must be in [0, 20]" in msg,
              f"prompt_logprobs {bad}: 400 naming the range ({msg[:120]})")


def structured_checks(client) -> None:
    """json_object and json_schema strict: every completion is JSON and
    validates; greedy streamed = not streamed."""
    outs = chat(client, messages=DESCRIBE, max_tokens=96, temperature=1.0,
                seed=3, n=3, response_format={"type": "json_object"})
    bad = []
    for c in outs.choices:
        try:
            ok = c.finish_reason == "length" or isinstance(
                json.loads(c.message.content), dict)
        except ValueError:
            ok = False
        if not ok:
            bad.append((c.finish_reason, c.message.content))
    check(not bad and any(c.finish_reason == "stop" for c in outs.choices),
          f"json_object, 3 sampled: each a JSON object (or cut: length) "
          f"({bad})")
    outs = chat(client, messages=DESCRIBE, max_tokens=96, temperature=1.0,
                seed=5, n=4, response_format=JSON_SCHEMA)
    bad = []
    for c in outs.choices:
        try:
            if c.finish_reason != "length":
                jsonschema.validate(json.loads(c.message.content), PERSON)
        except (ValueError, jsonschema.ValidationError) as e:
            bad.append((c.message.content, str(e)[:80]))
    check(not bad and any(c.finish_reason == "stop" for c in outs.choices),
          f"json_schema strict, 4 sampled: each validates ({bad})")
    greedy = chat(client, messages=DESCRIBE, max_tokens=96, temperature=0,
                  response_format=JSON_SCHEMA).choices[0].message.content
    streamed = "".join(c.choices[0].delta.content or "" for c in
                       chat(client, messages=DESCRIBE, max_tokens=96,
                            temperature=0, response_format=JSON_SCHEMA,
                            stream=True) if c.choices)
    try:
        jsonschema.validate(json.loads(greedy), PERSON)
        valid = True
    except (ValueError, jsonschema.ValidationError):
        valid = False
    check(valid and streamed == greedy,
          f"json_schema greedy: valid, streamed the same ({greedy!r})")


def call_problem(calls, names) -> str | None:
    """None when the client parsed offered calls whose arguments validate
    against their parameters, else why not."""
    if not calls:
        return "no tool_calls"
    for c in calls:
        if not c.id.startswith("call_") or c.type != "function":
            return f"malformed {c}"
        if c.function.name not in names:
            return f"{c.function.name!r} not offered"
        try:
            jsonschema.validate(json.loads(c.function.arguments),
                                SCHEMA[c.function.name])
        except (ValueError, jsonschema.ValidationError) as e:
            return f"arguments {c.function.arguments!r}: {str(e)[:80]}"
    return None


def tool_checks(client, port: int) -> None:
    got = chat(client, messages=ASK, tools=TOOLS, tool_choice=NAMED,
               max_tokens=48, temperature=0)
    choice = got.choices[0]
    calls = choice.message.tool_calls
    ref = raw(port, "/v1/chat/completions",
              {"messages": ASK, "tools": TOOLS, "tool_choice": NAMED,
               "max_tokens": 48, "temperature": 0})
    ref_calls = [c["function"] for c in ref.get("choices", [{}])[0]
                 .get("message", {}).get("tool_calls") or []]
    named = [{"name": c.function.name, "arguments": c.function.arguments}
             for c in calls or []]
    why = call_problem(calls, {"get_weather"})
    check(why is None and len(calls) == 1 and
          choice.finish_reason == "tool_calls" and
          choice.message.content is None and named == ref_calls,
          f"tool_choice get_weather: one valid call, as raw HTTP's ({why}; "
          f"{named} vs {ref_calls})")
    # Streamed: the client's own stream helper assembles the deltas.
    with client.chat.completions.stream(
            model=model_of(client), messages=ASK, tools=TOOLS,
            tool_choice=NAMED, max_tokens=48, temperature=0) as s:
        final = s.get_final_completion()
    sc = final.choices[0]
    assembled = [{"name": c.function.name, "arguments": c.function.arguments}
                 for c in sc.message.tool_calls or []]
    check(assembled == named and sc.finish_reason == "tool_calls" and
          call_problem(sc.message.tool_calls, {"get_weather"}) is None and
          not sc.message.content,
          f"streamed: the client's stream helper assembles the same call "
          f"({assembled}, content {sc.message.content!r})")
    got = chat(client, messages=ASK, tools=TOOLS, tool_choice="required",
               max_tokens=64, temperature=1.0, seed=1)
    c = got.choices[0]
    why = call_problem(c.message.tool_calls, set(SCHEMA))
    # The grammar allows more calls after each one: at temperature 1 the
    # model may go on to max_tokens ("length"), its whole calls returned.
    check(why is None and c.finish_reason in ("tool_calls", "length"),
          f"tool_choice required, sampled: valid call(s) ({why}; "
          f"{c.finish_reason})")
    # auto: what the model writes is parsed; the grammar extension writes
    # a call of add here.
    grammar = ('root ::= "<tool_call>\\n{\\"name\\": \\"add\\", '
               '\\"arguments\\": {\\"a\\": 2, \\"b\\": 3}}\\n</tool_call>"')
    got = chat(client, messages=ASK, tools=TOOLS, tool_choice="auto",
               max_tokens=48, temperature=0, extra_body={"grammar": grammar})
    c = got.choices[0]
    check(c.finish_reason == "tool_calls" and
          call_problem(c.message.tool_calls, {"add"}) is None and
          [(t.function.name, json.loads(t.function.arguments))
           for t in c.message.tool_calls] == [("add", {"a": 2, "b": 3})],
          f"tool_choice auto: the call written is parsed "
          f"({c.message.tool_calls})")
    # auto, left to the model: a call it writes validates, else content.
    got = chat(client, messages=ASK, tools=TOOLS, max_tokens=48,
               temperature=0)
    c = got.choices[0]
    check((c.message.tool_calls and call_problem(
        c.message.tool_calls, set(SCHEMA)) is None) or
        (not c.message.tool_calls and isinstance(c.message.content, str)),
        f"tool_choice auto (the model's choice): valid calls or content "
        f"({c.finish_reason})")


def cached_tokens_checks(client) -> None:
    prompt = (f"A unique prompt {time.time_ns()} about the weather in a "
              "town by the sea, where the fishing boats come in at dawn "
              "and the market opens before the sun is up.")
    seen = []
    for _ in range(2):
        u = complete(client, prompt=prompt, max_tokens=2,
                     temperature=0).usage
        seen.append((u.prompt_tokens, u.prompt_tokens_details.cached_tokens))
    last = [c for c in complete(client, prompt=prompt, max_tokens=2,
                                temperature=0, stream=True,
                                stream_options={"include_usage": True})][-1]
    seen.append((last.usage.prompt_tokens,
                 last.usage.prompt_tokens_details.cached_tokens))
    p = seen[0][0]
    full = (p - 1) // BLOCK * BLOCK
    check(p > 2 * BLOCK and [c for _, c in seen] == [0, full, full],
          f"cached_tokens: 0, then the {full} tokens of whole blocks of the "
          f"{p}-token prompt, streamed too ({seen})")


def layout_results(client) -> dict:
    """What the TP=2 x PP=2 cluster must give as TP=PP=1 did."""
    text = complete(client, prompt=FRANCE, max_tokens=24,
                    temperature=0).choices[0].text
    reply = chat(client, messages=PLANET, max_tokens=16,
                 temperature=0).choices[0].message.content
    structured = chat(client, messages=DESCRIBE, max_tokens=96,
                      temperature=0, response_format=JSON_SCHEMA
                      ).choices[0].message.content
    call = chat(client, messages=ASK, tools=TOOLS, tool_choice=NAMED,
                max_tokens=48, temperature=0).choices[0].message.tool_calls
    seeded = [c.text for c in complete(client, n=2, **SEEDED).choices]

    def repetitive(**kw) -> str:
        eb = dict(kw.pop("extra_body", {}), ignore_eos=True)
        return complete(client, prompt=REPETITIVE, max_tokens=16,
                        temperature=0, extra_body=eb, **kw).choices[0].text

    echoed = complete(client, prompt=FRANCE, max_tokens=4, temperature=0,
                      echo=True, logprobs=1).choices[0]
    chunks = list(complete(client, prompt=FRANCE, max_tokens=8,
                           temperature=0, stream=True,
                           stream_options={"include_usage": True}))
    short = [{"role": "user", "content": "Reply with only the word: yes"}]
    held = chat(client, messages=short, max_tokens=32, temperature=0,
                extra_body={"min_tokens": 12})
    # The sampling fields, each where the sampling rank (the last stage's
    # TP rank 0 in a cluster) applies it; tokens, not logprobs (those agree
    # within rounding, checked by tests/cluster/).
    return {"completion": text, "chat": reply, "json_schema": structured,
            "tool_call": [(c.function.name, c.function.arguments)
                          for c in call or []],
            "seeded n = 2": seeded,
            "frequency_penalty": repetitive(frequency_penalty=2.0),
            "presence_penalty": repetitive(presence_penalty=2.0),
            "repetition_penalty": repetitive(
                extra_body={"repetition_penalty": 1.5}),
            "logit_bias": complete(client, prompt=FRANCE, max_tokens=3,
                                   temperature=0,
                                   logit_bias={"1000": 100}).choices[0].text,
            "echo": (echoed.text, echoed.logprobs.tokens),
            "stream + include_usage": (
                "".join(c.choices[0].text for c in chunks if c.choices),
                chunks[-1].usage.completion_tokens),
            "min_tokens": (held.choices[0].message.content,
                           held.usage.completion_tokens)}


def serve_checks(a, env: dict) -> dict | None:
    template = os.path.join(a.workdir, "qwen2.5_tools.jinja")
    with open(template, "w", encoding="utf-8") as f:
        f.write(QWEN25_TOOLS)
    port = free_port()
    server, address = start_serve(
        a.shardlm, a.gguf, ["--http-listen", f"127.0.0.1:{port}",
                            "--chat-template", template,
                            "--block-size", str(BLOCK), *KV], env=env)
    client = client_for(port)
    try:
        up = wait_until(lambda: answers(client), timeout=120, every=0.3)
        check(up, "serve answers the openai client")
        if not up:
            return None
        channel = grpc.insecure_channel(address)
        for name, part in [
                ("greedy", lambda: greedy_checks(client, port, a.shardlm,
                                                 a.gguf)),
                ("n", lambda: n_checks(client)),
                ("penalties", lambda: penalty_checks(client)),
                ("logit_bias", lambda: logit_bias_checks(client, channel)),
                ("prompt_logprobs",
                 lambda: prompt_logprobs_checks(client, address)),
                ("structured", lambda: structured_checks(client)),
                ("tools", lambda: tool_checks(client, port)),
                ("cached_tokens", lambda: cached_tokens_checks(client))]:
            t0 = time.monotonic()
            part()
            print(f"  ({name}: {time.monotonic() - t0:.1f} s)", flush=True)
        channel.close()
        return layout_results(client)
    finally:
        stop(server)


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--shardlm", required=True)
    ap.add_argument("--gguf", required=True)
    ap.add_argument("--workdir", required=True)
    a = ap.parse_args()
    os.makedirs(a.workdir, exist_ok=True)
    env = dict(os.environ)
    env.pop("SHARDLM_API_KEY", None)
    t0 = time.monotonic()
    reference = serve_checks(a, env)
    print(f"serve checks took {time.monotonic() - t0:.1f} s", flush=True)
    if reference is None:
        return exit_code()
    if shutil.which("mpirun") is None:
        skip("TP=2 x PP=2 under mpirun: no mpirun")
        return exit_code()
    port = free_port()
    template = os.path.join(a.workdir, "qwen2.5_tools.jinja")

    def wait(_address, proc, timeout) -> bool:
        client = client_for(port)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline and proc.poll() is None:
            if answers(client):
                return True
            time.sleep(0.5)
        return False

    log_path = os.path.join(a.workdir, "openai_cluster.log")
    with mpirun_cluster(a.shardlm, a.gguf, log_path, wait, env=env,
                        extra=["--http-listen", f"127.0.0.1:{port}",
                               "--chat-template", template,
                               "--block-size", str(BLOCK), *KV]) as addr:
        if addr:
            got = layout_results(client_for(port))
            for key, want in reference.items():
                check(got[key] == want,
                      f"TP=2 x PP=2 through the client: {key} as TP=PP=1 "
                      f"({got[key]!r} vs {want!r})")
    print(f"all took {time.monotonic() - t0:.1f} s", flush=True)
    return exit_code("the openai client gets what the references say")


if __name__ == "__main__":
    sys.exit(main())
