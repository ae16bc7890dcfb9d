#!/usr/bin/env python3
"""End-to-end check of the HTTP API of `shardlm serve` (OpenAI-style
/v1/completions and /v1/chat/completions, /v1/models, /metrics, /health,
/ready, the API key) on SmolLM2, with only the standard library as client.

The reference for every greedy text is `shardlm generate --model` run
locally (itself checked against a numpy forward pass by the reference
tests), so the HTTP layer must reproduce it byte for byte, streamed or not.

  check_http.py --shardlm BIN --gguf MODEL
"""

from __future__ import annotations

import argparse
import http.client
import json
import math
import os
import subprocess
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))
from testlib import (FAILURES, check, free_port, prometheus_series, run,  # noqa: E402
                     stop)

KEY = "test-key-123"


class Api:
    def __init__(self, port: int):
        self.port = port

    def request(self, method: str, path: str, body=None, key: str | None = KEY,
                raw: bytes | None = None):
        """Returns (status, headers, body bytes)."""
        conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=120)
        headers = {"Content-Type": "application/json"}
        if key is not None:
            headers["Authorization"] = f"Bearer {key}"
        data = raw if raw is not None else (
            None if body is None else json.dumps(body).encode())
        conn.request(method, path, body=data, headers=headers)
        r = conn.getresponse()
        out = r.read()
        conn.close()
        return r.status, dict(r.getheaders()), out

    def json(self, method: str, path: str, body=None, key: str | None = KEY):
        status, _, out = self.request(method, path, body, key)
        try:
            return status, json.loads(out)
        except json.JSONDecodeError:
            return status, {"raw": out.decode(errors="replace")}

    def stream(self, path: str, body) -> list:
        """The parsed SSE data events; the last is the string '[DONE]'."""
        status, headers, out = self.request("POST", path, body)
        assert status == 200, (status, out)
        assert headers.get("Content-Type") == "text/event-stream", headers
        events = []
        for block in out.decode().split("\n\n"):
            if not block.startswith("data: "):
                continue
            data = block[len("data: "):]
            events.append(data if data == "[DONE]" else json.loads(data))
        return events


def metric(text: str, name: str) -> float | None:
    for line in text.splitlines():
        if line.startswith(name + " "):
            return float(line.split()[-1])
    return None


def scrape(api: "Api") -> dict[str, float]:
    """Every series of /metrics: name with labels -> value."""
    _, _, text = api.request("GET", "/metrics", key=None)
    return prometheus_series(text.decode())


def metrics_workload(api: "Api", shardlm: str, grpc_addr: str, env: dict):
    """A known workload through both APIs moves the request, token and
    latency series by exactly its counts; the histograms are consistent."""
    before = scrape(api)
    http_prompt = 0
    for i in range(3):
        status, got = api.json("POST", "/v1/completions", {
            "prompt": f"Count to {i + 3}:", "max_tokens": 5,
            "ignore_eos": True, "temperature": 0})
        check(status == 200, f"metrics workload: HTTP request {i} ({status})")
        http_prompt += got.get("usage", {}).get("prompt_tokens", 0)
    for i in range(2):
        got = subprocess.run([shardlm, "generate", "--server", grpc_addr,
                              "--prompt", f"Hello {i}", "--max-tokens", "4",
                              "--ignore-eos"], capture_output=True, text=True,
                             timeout=60, env=env, stdin=subprocess.DEVNULL)
        check(got.returncode == 0, f"metrics workload: gRPC request {i}")
    after = scrape(api)

    def delta(name: str) -> float:
        return after.get(name, 0) - before.get(name, 0)

    want = {
        'shardlm_requests_total{api="http",finish_reason="length"}': 3,
        'shardlm_requests_total{api="grpc",finish_reason="length"}': 2,
        'shardlm_requests_total{api="http",finish_reason="error"}': 0,
        'shardlm_generation_tokens_total{api="http"}': 15,
        'shardlm_generation_tokens_total{api="grpc"}': 8,
        'shardlm_prompt_tokens_total{api="http"}': http_prompt,
        "shardlm_time_to_first_token_seconds_count": 5,
        "shardlm_request_e2e_seconds_count": 5,
        "shardlm_inter_token_latency_seconds_count": 3 * 4 + 2 * 3,
    }
    for name, n in want.items():
        check(delta(name) == n, f"/metrics: {name} moved by {n} "
              f"(by {delta(name):g})")
    check(0 < delta("shardlm_time_to_first_token_seconds_sum")
          <= delta("shardlm_request_e2e_seconds_sum"),
          "/metrics: time to first token within end-to-end time")
    for h in ("shardlm_request_e2e_seconds", "shardlm_inter_token_latency_seconds"):
        buckets = [v for k, v in after.items() if k.startswith(h + "_bucket")]
        check(buckets == sorted(buckets) and buckets
              and buckets[-1] == after[h + "_count"],
              f"/metrics: {h} buckets rise to its count")
    check(after.get("shardlm_process_resident_memory_bytes", 0) > 1 << 20,
          "/metrics: the coordinator's resident memory")


def metrics_options(a, env) -> None:
    """--metrics-auth puts /metrics behind the key (and needs one);
    --metrics-prefix-cache shows the prefix cache's hits."""
    flags = ["--metrics-auth", "--metrics-prefix-cache"]
    no_key = {k: v for k, v in env.items() if k != "SHARDLM_API_KEY"}
    got = subprocess.run(
        [a.shardlm, "serve", "--model", a.gguf, "--listen",
         f"127.0.0.1:{free_port()}", "--http-listen",
         f"127.0.0.1:{free_port()}", *flags], capture_output=True, text=True,
        timeout=120, env=no_key, stdin=subprocess.DEVNULL)
    check(got.returncode != 0 and "SHARDLM_API_KEY" in got.stderr,
          f"--metrics-auth without a key fails naming it "
          f"({got.stderr.strip()[-120:]})")
    http_port = free_port()
    server = subprocess.Popen(
        [a.shardlm, "serve", "--model", a.gguf, "--listen",
         f"127.0.0.1:{free_port()}", "--http-listen",
         f"127.0.0.1:{http_port}", *flags],
        stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL, env=env)
    api = Api(http_port)
    try:
        deadline = time.monotonic() + 120
        status = None
        while time.monotonic() < deadline and server.poll() is None:
            try:
                status = api.request("GET", "/health", key=None)[0]
                break
            except OSError:
                time.sleep(0.2)
        no, _, _ = api.request("GET", "/metrics", key=None)
        yes, _, text = api.request("GET", "/metrics")
        check(status == 200 and no == 401 and yes == 200,
              f"--metrics-auth: /metrics 401 without the key, 200 with it "
              f"({no}, {yes})")
        check(b"shardlm_prefix_cache_tokens_total" in text,
              "--metrics-prefix-cache shows the prefix cache's hits")
    finally:
        stop(server)


def echo_logprobs_checks(api: "Api", prompt: str) -> None:
    """echo with logprobs: the prompt tokens' logprobs come from the
    prefill's logits at every prompt position. Checked against another
    path: greedy decoding from `prompt` reports each generated token's
    logprob (and top 2) one decode step at a time; given prompt + that text
    as the prompt, the same tokens' prompt logprobs must be the same."""
    steps = 8
    status, dec = api.json("POST", "/v1/completions", {
        "prompt": prompt, "max_tokens": steps, "temperature": 0,
        "logprobs": 2})
    want = dec["choices"][0]["logprobs"] if status == 200 else {}
    text = dec["choices"][0]["text"] if status == 200 else ""
    req = {"prompt": prompt + text, "max_tokens": 2, "temperature": 0,
           "logprobs": 2, "echo": True}
    status, got = api.json("POST", "/v1/completions", req)
    lp = got["choices"][0]["logprobs"] if status == 200 else {}
    toks = lp.get("tokens", [])
    n_prompt = got.get("usage", {}).get("prompt_tokens", -1)
    close = lambda a, b: abs(a - b) <= 2e-3  # noqa: E731
    ok = (status == 200 and len(toks) == n_prompt + 2 and
          lp["token_logprobs"][0] is None and lp["top_logprobs"][0] is None
          and all(isinstance(x, float) for x in lp["token_logprobs"][1:]) and
          toks[n_prompt - steps:n_prompt] == want.get("tokens") and
          "".join(toks[:n_prompt]) == prompt + text and
          lp["text_offset"][n_prompt] == len((prompt + text).encode()))
    worst = 0.0
    if ok:
        for i in range(steps):
            j = n_prompt - steps + i
            a, b = lp["token_logprobs"][j], want["token_logprobs"][i]
            worst = max(worst, abs(a - b))
            ta, tb = lp["top_logprobs"][j], want["top_logprobs"][i]
            ok &= close(a, b) and sorted(ta) == sorted(tb) and all(
                close(ta[k], tb[k]) for k in tb)
    check(ok and got["usage"]["prompt_tokens_details"]["cached_tokens"] == 0,
          f"echo + logprobs: the last {steps} prompt tokens' logprobs and "
          f"top 2 equal greedy decoding's (worst |diff| {worst:.2g}); the "
          f"first is null; nothing from the prefix cache ({status} "
          f"{toks[-steps - 2:]} vs {want.get('tokens')})")
    # Streamed: the first chunk leads with the prompt's logprobs; the
    # chunks concatenate to the same logprobs.
    events = api.stream("/v1/completions", dict(req, stream=True))
    chunks = [e for e in events if e != "[DONE]"]
    joined = {k: [v for c in chunks for v in c["choices"][0]["logprobs"][k]]
              for k in ("tokens", "token_logprobs", "text_offset")}
    check(chunks and len(chunks[0]["choices"][0]["logprobs"]["tokens"]) ==
          n_prompt + 1 and joined["tokens"] == toks and
          all(a == b or close(a, b) for a, b in
              zip(joined["token_logprobs"][1:], lp["token_logprobs"][1:])) and
          joined["text_offset"] == lp["text_offset"],
          f"echo + logprobs streamed: the first chunk has the prompt's "
          f"{n_prompt} tokens and the first generated one; the same "
          f"logprobs ({len(joined['tokens'])} tokens)")
    # n = 2: every choice leads with the same prompt logprobs.
    status, two = api.json("POST", "/v1/completions", dict(req, n=2))
    firsts = [c["logprobs"]["token_logprobs"][:n_prompt]
              for c in two.get("choices", [])]
    check(status == 200 and len(firsts) == 2 and firsts[0] == firsts[1] and
          all(a == b or close(a, b) for a, b in
              zip(firsts[0][1:], lp["token_logprobs"][1:n_prompt])),
          f"echo + logprobs, n = 2: both choices carry the prompt's logprobs "
          f"({status})")


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--shardlm", required=True)
    ap.add_argument("--gguf", required=True)
    a = ap.parse_args()

    grpc_addr = f"127.0.0.1:{free_port()}"
    http_port = free_port()
    env = dict(os.environ, SHARDLM_API_KEY=KEY)
    server = subprocess.Popen(
        [a.shardlm, "serve", "--model", a.gguf, "--listen", grpc_addr,
         "--http-listen", f"127.0.0.1:{http_port}"],
        stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE, text=True, env=env)
    api = Api(http_port)
    try:
        # Live, then ready.
        deadline = time.monotonic() + 120
        live = False
        while time.monotonic() < deadline and server.poll() is None:
            try:
                live = api.request("GET", "/health", key=None)[0] == 200
            except OSError:
                live = False
            if live:
                break
            time.sleep(0.2)
        check(live, f"/health answers 200 on port {http_port}")
        if not live:
            return 1
        status, _, body = api.request("GET", "/ready", key=None)
        check(status == 200, f"/ready is 200 ({body!r})")

        # The API key guards /v1/*, not the probes.
        status, headers, _ = api.request("GET", "/v1/models", key=None)
        check(status == 401 and headers.get("WWW-Authenticate") == "Bearer",
              f"no API key: 401 with WWW-Authenticate ({status})")
        check(api.request("GET", "/v1/models", key="wrong")[0] == 401,
              "a wrong API key: 401")
        status, models = api.json("GET", "/v1/models")
        check(status == 200 and models["data"][0]["id"] != "" and
              models["data"][0]["max_model_len"] == 8192,
              f"/v1/models lists the model ({models})")
        model = models["data"][0]["id"]

        # Greedy completion == local generate.
        prompt = "The capital of France is"
        local = run([a.shardlm, "generate", "--model", a.gguf, "--prompt",
                     prompt, "--max-tokens", "24"])
        want = local.stdout[:-1]  # generate ends its output with a newline.
        req = {"model": model, "prompt": prompt, "max_tokens": 24,
               "temperature": 0}
        status, got = api.json("POST", "/v1/completions", req)
        check(status == 200 and got["choices"][0]["text"] == want,
              f"completion equals local generate: got {got}, want {want!r}")
        check(got.get("object") == "text_completion" and
              got["usage"]["prompt_tokens"] == 5 and
              got["usage"]["completion_tokens"] > 0 and
              got["choices"][0]["finish_reason"] in ("stop", "length"),
              f"completion object, usage and finish_reason ({got})")

        # Streamed: the chunks concatenate to the same text.
        events = api.stream("/v1/completions", dict(req, stream=True))
        chunks = [e for e in events if e != "[DONE]"]
        text = "".join(c["choices"][0]["text"] for c in chunks)
        check(events[-1] == "[DONE]" and text == want,
              f"streamed chunks concatenate to the same text ({text!r})")
        check(chunks[-1]["choices"][0]["finish_reason"] ==
              got["choices"][0]["finish_reason"] and
              all(c["choices"][0]["finish_reason"] is None
                  for c in chunks[:-1]) and
              chunks[-1]["usage"] == got["usage"],
              "only the last chunk has finish_reason and usage")

        # echo: the prompt leads each choice's text (n = 2 greedy: both),
        # streamed in each choice's first chunk; best_of == n is accepted
        # and ignored.
        status, got = api.json("POST", "/v1/completions",
                               dict(req, echo=True, n=2, best_of=2))
        texts = [c["text"] for c in got.get("choices", [])]
        check(status == 200 and texts == [prompt + want] * 2 and
              got["usage"]["prompt_tokens"] == 5,
              f"echo, n = 2, best_of = 2: the prompt then the completion in "
              f"both choices ({status} {texts})")
        events = api.stream("/v1/completions", dict(req, echo=True,
                                                    stream=True))
        chunks = [e for e in events if e != "[DONE]"]
        check(chunks and chunks[0]["choices"][0]["text"].startswith(prompt)
              and "".join(c["choices"][0]["text"] for c in chunks) ==
              prompt + want,
              f"echo streamed: the first chunk leads with the prompt "
              f"({[c['choices'][0]['text'] for c in chunks][:3]})")

        echo_logprobs_checks(api, prompt)

        # Chat == local generate --chat (the same template, the model's own).
        local_chat = run([a.shardlm, "generate", "--model", a.gguf, "--chat",
                          "--prompt", "Name a planet.", "--max-tokens", "16"])
        chat_req = {"messages": [{"role": "user", "content": "Name a planet."}],
                    "max_tokens": 16, "temperature": 0}
        status, chat = api.json("POST", "/v1/chat/completions", chat_req)
        check(status == 200 and chat["object"] == "chat.completion" and
              chat["choices"][0]["message"]["role"] == "assistant" and
              chat["choices"][0]["message"]["content"] ==
              local_chat.stdout[:-1],
              f"chat equals local generate --chat: got {chat}, "
              f"want {local_chat.stdout!r}")
        events = api.stream("/v1/chat/completions", dict(chat_req, stream=True))
        deltas = [e["choices"][0]["delta"] for e in events if e != "[DONE]"]
        check(deltas[0].get("role") == "assistant" and
              "".join(d.get("content", "") for d in deltas) ==
              chat["choices"][0]["message"]["content"] and
              events[0]["object"] == "chat.completion.chunk",
              "streamed chat deltas concatenate to the same message")

        # Stop strings: the text up to the first occurrence.
        stop_at = want[len(want) // 2:len(want) // 2 + 3]
        status, got = api.json("POST", "/v1/completions",
                               dict(req, stop=[stop_at, "zzzz"]))
        check(status == 200 and
              got["choices"][0]["text"] == want[:want.find(stop_at)] and
              got["choices"][0]["finish_reason"] == "stop",
              f"stop {stop_at!r} cuts the text before it ({got})")

        # Logprobs: greedy tokens are their own top-1, 3 alternatives each.
        status, got = api.json("POST", "/v1/completions",
                               dict(req, max_tokens=6, logprobs=3))
        lp = got["choices"][0]["logprobs"] if status == 200 else None
        ok = (lp is not None and len(lp["tokens"]) == 6 and
              all(len(t) == 3 for t in lp["top_logprobs"]) and
              "".join(lp["tokens"]) == got["choices"][0]["text"])
        for tok, logprob, top in zip(lp["tokens"] if lp else [],
                                     lp["token_logprobs"] if lp else [],
                                     lp["top_logprobs"] if lp else []):
            ok = ok and logprob <= 0 and math.isclose(
                logprob, max(top.values()), abs_tol=1e-6)
        check(ok, f"logprobs: 6 tokens, top 3 each, greedy is top-1 ({lp})")
        status, got = api.json("POST", "/v1/chat/completions",
                               dict(chat_req, max_tokens=4, logprobs=True,
                                    top_logprobs=2))
        content = got["choices"][0]["logprobs"]["content"] if status == 200 \
            else []
        check(len(content) == 4 and all(len(c["top_logprobs"]) == 2 and
                                        bytes(c["bytes"]).decode(
                                            errors="replace") == c["token"]
                                        for c in content),
              f"chat logprobs with top_logprobs 2 ({content})")

        # Bad requests: precise statuses, the server keeps serving.
        ok_req = {"prompt": "Hi", "max_tokens": 2}
        # (name, path, body, raw body, status, a piece of the message that
        # names the reason).
        cases = [
            ("not JSON", "/v1/completions", None, b"{nope", 400,
             "not a JSON object"),
            ("JSON array body", "/v1/completions", [1, 2], None, 400,
             "not a JSON object"),
            ("no prompt", "/v1/completions", {"max_tokens": 2}, None, 400,
             "'prompt' must be"),
            ("prompt of objects", "/v1/completions",
             {"prompt": [{"a": 1}]}, None, 400, "'prompt' must be"),
            ("n = 17", "/v1/completions", dict(ok_req, n=17), None, 400,
             "n must be 1 to 16"),
            ("echo with token ids", "/v1/completions",
             {"prompt": [1, 2], "max_tokens": 2, "echo": True}, None, 400,
             "'echo' needs a text 'prompt'"),
            ("echo on chat", "/v1/chat/completions",
             {"messages": [{"role": "user", "content": "Hi"}],
              "echo": True}, None, 400, "'echo' is for /v1/completions"),
            ("best_of other than n", "/v1/completions",
             dict(ok_req, n=2, best_of=3), None, 400,
             "'best_of' other than n is not supported"),
            ("negative temperature", "/v1/completions",
             dict(ok_req, temperature=-1), None, 400,
             "temperature must be >= 0"),
            ("top_p 2", "/v1/completions", dict(ok_req, top_p=2), None, 400,
             "top_p must be in (0, 1]"),
            ("max_tokens -5", "/v1/completions", dict(ok_req, max_tokens=-5),
             # Issue 39: the gRPC API's range and words.
             None, 400, "max_tokens must be in [1, "),
            ("max_tokens a string", "/v1/completions",
             dict(ok_req, max_tokens="9"), None, 400,
             "'max_tokens' has the wrong type"),
            ("max_tokens past the context", "/v1/completions",
             dict(ok_req, max_tokens=100000), None, 400,
             "the context window"),
            ("token id outside the vocabulary", "/v1/completions",
             {"prompt": [1, 999999], "max_tokens": 2}, None, 400,
             "999999 is outside the vocabulary"),
            ("logprobs 50", "/v1/completions", dict(ok_req, logprobs=50),
             None, 400, "logprobs must be in [0, 20]"),
            ("logprobs -1", "/v1/completions", dict(ok_req, logprobs=-1),
             None, 400, "logprobs must be in [0, 20], got -1"),
            ("top_logprobs -1", "/v1/chat/completions",
             dict(chat_req, logprobs=True, top_logprobs=-1), None, 400,
             "logprobs must be in [0, 20], got -1"),
            ("a million stop objects", "/v1/completions",
             dict(ok_req, stop=[{}] * 1000000), None, 400,
             "at most 8 stop strings in 'stop'"),
            ("9 stop strings", "/v1/completions",
             dict(ok_req, stop=[str(i) for i in range(9)]), None, 400,
             "at most 8 stop strings"),
            ("presence penalty 3", "/v1/completions",
             dict(ok_req, presence_penalty=3), None, 400,
             "presence_penalty must be in [-2, 2], got 3"),
            ("logit_bias key not an id", "/v1/completions",
             dict(ok_req, logit_bias={"x1": 2}), None, 400,
             "'logit_bias' keys must be token ids"),
            ("logit_bias id outside the vocabulary", "/v1/completions",
             dict(ok_req, logit_bias={"999999": 2}), None, 400,
             "logit_bias token 999999 is outside the vocabulary"),
            ("min_tokens over max_tokens", "/v1/completions",
             dict(ok_req, min_tokens=3), None, 400,
             "min_tokens must be in [0, max_tokens = 2], got 3"),
            ("another model", "/v1/completions",
             dict(ok_req, model="gpt-4"), None, 404,
             "model 'gpt-4' is not served here"),
            ("chat without messages", "/v1/chat/completions",
             {"max_tokens": 2}, None, 400, "'messages' is required"),
            ("chat role tool", "/v1/chat/completions",
             {"messages": [{"role": "tool", "content": "x"}]}, None, 400,
             "role 'tool'"),
            ("top_logprobs without logprobs", "/v1/chat/completions",
             dict(chat_req, top_logprobs=2), None, 400,
             "'top_logprobs' needs 'logprobs'"),
            ("unknown route", "/v1/embeddings", ok_req, None, 404,
             "no route /v1/embeddings"),
        ]
        for name, path, body, raw, want_status, want_msg in cases:
            status, _, out = api.request("POST", path, body, raw=raw)
            try:
                err = json.loads(out)["error"]["message"]
            except (ValueError, KeyError, TypeError):
                err = None
            check(status == want_status and err is not None and
                  want_msg in err,
                  f"{name}: {want_status} saying {want_msg!r} "
                  f"(got {status}: {err})")
        # Client strings come back cut to 256 bytes.
        status, _, out = api.request("POST", "/v1/completions",
                                     dict(ok_req, model="m" * 1000000))
        check(status == 404 and len(out) < 1000,
              f"a 1 MB model name: 404 of {len(out)} bytes")
        status, _, _ = api.request("GET", "/v1/completions")
        check(status == 405, f"GET /v1/completions: 405 ({status})")
        status, got = api.json("POST", "/v1/completions", ok_req)
        check(status == 200, "still serving after the bad requests")

        # A client that goes away mid-stream frees its request.
        conn = http.client.HTTPConnection("127.0.0.1", http_port, timeout=60)
        conn.request("POST", "/v1/completions", body=json.dumps(
            {"prompt": "Once", "max_tokens": 4000, "ignore_eos": True,
             "stream": True, "temperature": 0}),
            headers={"Authorization": f"Bearer {KEY}"})
        r = conn.getresponse()
        # The stream is chunked: readline() de-chunks (r.fp would not).
        first = r.readline()
        conn.close()
        r.close()
        running = None
        for _ in range(100):
            _, _, metrics = api.request("GET", "/metrics", key=None)
            running = metric(metrics.decode(), 'shardlm_requests{state="running"}')
            if running == 0:
                break
            time.sleep(0.1)
        check(first.startswith(b"data: ") and running == 0,
              f"a dropped stream stops its request (running {running})")
        used = metric(metrics.decode(),
                      'shardlm_kv_blocks{tier="device",state="used"}')
        check(used == 0, f"/metrics: no device block held ({used})")
        ok2xx = metric(metrics.decode(), 'shardlm_http_responses_total{class="2xx"}')
        bad4xx = metric(metrics.decode(), 'shardlm_http_responses_total{class="4xx"}')
        check(ok2xx is not None and ok2xx >= 8 and bad4xx is not None and
              bad4xx >= len(cases),
              f"/metrics counts responses (2xx {ok2xx}, 4xx {bad4xx})")

        # The gRPC API wants the key too.
        got = run([a.shardlm, "generate", "--server", grpc_addr, "--prompt",
                   "Hi", "--max-tokens", "2"], timeout=60)
        check(got.returncode != 0 and "API key" in got.stderr,
              f"gRPC without the key fails naming it ({got.stderr.strip()})")
        got = subprocess.run([a.shardlm, "generate", "--server", grpc_addr,
                              "--prompt", "Hi", "--max-tokens", "2"],
                             capture_output=True, text=True, timeout=60,
                             env=env, stdin=subprocess.DEVNULL)
        check(got.returncode == 0, f"gRPC with SHARDLM_API_KEY set works "
              f"({got.stderr.strip()})")
        metrics_workload(api, a.shardlm, grpc_addr, env)
        _, _, metrics = api.request("GET", "/metrics", key=None)
        check(b"shardlm_prefix_cache_tokens_total" not in metrics,
              "/metrics hides the prefix cache's hits by default")
    finally:
        stop(server)
    check(server.returncode == 0, f"SIGTERM stops the server with exit 0 "
          f"(rc {server.returncode})")
    metrics_options(a, env)
    if FAILURES:
        print(f"{len(FAILURES)} check(s) failed", file=sys.stderr)
        return 1
    print("all HTTP checks passed")
    return 0


if __name__ == "__main__":
    sys.exit(main())
