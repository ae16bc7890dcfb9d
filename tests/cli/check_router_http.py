#!/usr/bin/env python3
"""`shardlm router` (issue 36) beyond gRPC: the OpenAI-style HTTP API, the
API key and TLS, and --replicas-dns, in front of two `shardlm serve`
replicas (--threads 1), a direct request to a replica as the reference:

- /v1/completions and /v1/chat/completions through the router, streamed
  and not, give the same text, finish reason and usage as the replica
  (greedy); /v1/models agrees; bad requests get the replica's status (a
  wrong model, malformed JSON, a bad field, a wrong method);
- kill -9 of a replica under HTTP load (streamed requests): every stream
  it served resumes elsewhere with the undisturbed text, and requests sent
  while it dies all succeed;
- with SHARDLM_API_KEY and TLS (certificates made here with openssl) on
  the router's ports and mutual TLS to the replica (and mutual TLS on the
  router's ports too): no key is 401 / UNAUTHENTICATED,
  the key gives the reference text over HTTPS and gRPC over TLS, plaintext
  gets no answer; a --replica-tls-ca that is not a file is an error naming
  the flag;
- --replicas-dns localhost:PORT finds the replica; a name that does not
  resolve and a value that is not NAME:PORT are errors naming them;
- SIGTERM drains: /ready 503 and new requests refused at once, the stream
  in flight runs to its end, exit 0.

  check_router_http.py --shardlm BIN --gguf MODEL --workdir DIR
"""

from __future__ import annotations

import argparse
import http.client
import json
import os
import signal
import ssl
import subprocess
import sys
import threading
import time
from pathlib import Path

import grpc

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, ".."))
sys.path.insert(0, os.path.join(HERE, "..", "..", "examples", "python"))
from testlib import (check, exit_code, free_port,  # noqa: E402
                     greedy_divergence, prometheus_series, start_serve, stop,
                     wait_ready, wait_until)
import generate  # noqa: E402


def request(port, method, path, body=None, key=None, ca=None,
            timeout=120):
    """(status, headers dict, body text) of one HTTP(S) request."""
    if ca is None:
        conn = http.client.HTTPConnection("127.0.0.1", port, timeout=timeout)
    else:
        conn = http.client.HTTPSConnection(
            "127.0.0.1", port, timeout=timeout,
            context=ssl.create_default_context(cafile=ca))
    headers = {"Content-Type": "application/json"}
    if key is not None:
        headers["Authorization"] = f"Bearer {key}"
    raw = body if isinstance(body, (bytes, type(None))) else \
        json.dumps(body).encode()
    try:
        conn.request(method, path, body=raw, headers=headers)
        r = conn.getresponse()
        return r.status, dict(r.getheaders()), r.read().decode()
    finally:
        conn.close()


def completion(port, chat, prompt, max_tokens=12, stream=False, key=None,
               ca=None, extra=None):
    """(status, text, finish_reason, usage) of one completion; for an
    error, (status, error body, None, None). The usage leaves out
    prompt_tokens_details: its cached_tokens depend on what the replica's
    prefix cache held, not on the route."""
    body = {"max_tokens": max_tokens, "temperature": 0, "stream": stream}
    if chat:
        body["messages"] = [{"role": "user", "content": prompt}]
    else:
        body["prompt"] = prompt
    if stream:
        body["stream_options"] = {"include_usage": True}
    body.update(extra or {})
    path = "/v1/chat/completions" if chat else "/v1/completions"
    status, _, text = request(port, "POST", path, body, key=key, ca=ca)
    if status != 200:
        return status, text, None, None
    if not stream:
        out = json.loads(text)
        c = out["choices"][0]
        got = c["message"]["content"] if chat else c["text"]
        return status, got, c["finish_reason"], _counts(out["usage"])
    got, finish, usage, done = "", None, None, False
    for line in text.split("\n"):
        if not line.startswith("data: "):
            continue
        data = line[len("data: "):]
        if data == "[DONE]":
            done = True
            continue
        chunk = json.loads(data)
        if "error" in chunk:
            return 500, data, None, None
        if chunk.get("usage"):
            usage = chunk["usage"]
        for c in chunk["choices"]:
            got += (c["delta"].get("content", "") if chat else c["text"])
            finish = c["finish_reason"] or finish
    return (status if done else 0), got, finish, _counts(usage)


def greedy_steps(port, chat, prompt, max_tokens, extra=None):
    """(token texts, top two (text, logprob) per token) of one greedy
    completion asked with logprobs: what greedy_divergence compares a
    run in another batch against."""
    body = {"max_tokens": max_tokens, "temperature": 0}
    if chat:
        body.update(messages=[{"role": "user", "content": prompt}],
                    logprobs=True, top_logprobs=2)
    else:
        body.update(prompt=prompt, logprobs=2)
    body.update(extra or {})
    path = "/v1/chat/completions" if chat else "/v1/completions"
    status, _, text = request(port, "POST", path, body)
    if status != 200:
        raise RuntimeError(f"{path} with logprobs: {status} {text}")
    lp = json.loads(text)["choices"][0]["logprobs"]
    if chat:
        return ([s["token"] for s in lp["content"]],
                [[(a["token"], a["logprob"]) for a in s["top_logprobs"]]
                 for s in lp["content"]])
    return lp["tokens"], [sorted(top.items(), key=lambda kv: -kv[1])
                          for top in lp["top_logprobs"]]


def _counts(usage):
    if usage is None:
        return None
    return {k: v for k, v in usage.items() if k != "prompt_tokens_details"}


def metrics(port):
    status, _, body = request(port, "GET", "/metrics")
    return prometheus_series(body) if status == 200 else {}


def start_router(shardlm, args, log, env=None):
    port, http_port = free_port(), free_port()
    cmd = [shardlm, "router", "--listen", f"127.0.0.1:{port}",
           "--http-listen", f"127.0.0.1:{http_port}", *args]
    proc = subprocess.Popen(cmd, stdin=subprocess.DEVNULL,
                            stdout=subprocess.DEVNULL,
                            stderr=open(log, "w"), env=env)
    return proc, f"127.0.0.1:{port}", http_port


def ready(port, n, timeout=30, ca=None):
    return wait_until(lambda: _ready_count(port, ca) == n, timeout=timeout)


def _ready_count(port, ca):
    try:
        status, _, body = request(port, "GET", "/metrics", ca=ca, timeout=5)
    except OSError:
        return -1
    return prometheus_series(body).get("shardlm_router_replicas_ready") \
        if status == 200 else -1


def run_to_end(cmd, log, timeout=30):
    """(exit code, stderr) of a command expected to exit by itself."""
    with open(log, "w") as err:
        p = subprocess.Popen(cmd, stdin=subprocess.DEVNULL,
                             stdout=subprocess.DEVNULL, stderr=err)
        try:
            rc = p.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait()
            rc = None
    return rc, Path(log).read_text()


def openssl(*args, cwd):
    subprocess.run(["openssl", *args], cwd=cwd, check=True,
                   capture_output=True, timeout=60)


def make_pki(d):
    """ca.pem/ca.key, server.pem/server.key for 127.0.0.1 and
    client.pem/client.key, both signed by ca."""
    openssl("req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "2",
            "-subj", "/CN=shardlm router test ca", "-keyout", "ca.key",
            "-out", "ca.pem", cwd=d)
    with open(os.path.join(d, "san.ext"), "w") as f:
        f.write("subjectAltName=IP:127.0.0.1,DNS:localhost\n")
    for name in ("server", "client"):
        openssl("req", "-newkey", "rsa:2048", "-nodes", "-subj",
                f"/CN=shardlm router test {name}", "-keyout", f"{name}.key",
                "-out", f"{name}.csr", cwd=d)
        openssl("x509", "-req", "-in", f"{name}.csr", "-CA", "ca.pem",
                "-CAkey", "ca.key", "-CAcreateserial", "-days", "2",
                "-extfile", "san.ext", "-out", f"{name}.pem", cwd=d)


CASES = [  # (chat, prompt, stream, extra fields)
    (False, "The capital of France is", False, None),
    (False, "The capital of France is", True, None),
    (True, "Name three colors.", False, None),
    (True, "Name three colors.", True, None),
    (False, "Count to twenty: 1, 2, 3,", False, {"stop": [" 7"]}),
    (False, "List three prime numbers:", True, {"logprobs": 2}),
]


def check_parity(router_http, direct_http):
    for chat, prompt, stream, extra in CASES:
        want = completion(direct_http, chat, prompt, stream=stream,
                          extra=extra)
        got = completion(router_http, chat, prompt, stream=stream,
                         extra=extra)
        what = f"{'chat' if chat else 'completion'} '{prompt}' " \
               f"(stream {stream}, {extra})"
        check(want[0] == 200 and want[1], f"direct {what}: {want}")
        check(got == want, f"router {what} equals direct: {got!r} vs "
              f"{want!r}")

    s1, _, b1 = request(router_http, "GET", "/v1/models")
    s2, _, b2 = request(direct_http, "GET", "/v1/models")
    check(s1 == s2 == 200 and json.loads(b1)["data"] ==
          json.loads(b2)["data"], f"/v1/models agrees: {b1} vs {b2}")

    # Errors: decided by the same code, on the router or on the replica.
    bad = [
        ("a wrong model", "POST", "/v1/completions",
         {"model": "no-such-model", "prompt": "x"}),
        ("malformed JSON", "POST", "/v1/completions", b"{\"prompt\": "),
        ("a bad temperature", "POST", "/v1/completions",
         {"prompt": "x", "temperature": -1}),
        ("a context overflow", "POST", "/v1/completions",
         {"prompt": "x", "max_tokens": 10 ** 6}),
        ("a wrong method", "GET", "/v1/chat/completions", None),
        ("an unknown route", "POST", "/v1/embeddings", {"input": "x"}),
    ]
    for what, method, path, body in bad:
        s1, _, b1 = request(router_http, method, path, body)
        s2, _, b2 = request(direct_http, method, path, body)
        e1 = json.loads(b1).get("error", {}) if b1.startswith("{") else {}
        e2 = json.loads(b2).get("error", {}) if b2.startswith("{") else {}
        check(s1 == s2 and s1 >= 400 and e1.get("type") == e2.get("type")
              and e1.get("message", "").endswith(e2.get("message", "?")),
              f"{what}: the replica's status and error through the router "
              f"({s1} {b1.strip()} vs {s2} {b2.strip()})")


def check_kill_under_load(shardlm, gguf, replicas, addrs, https,
                          router_http, work):
    direct_http = https[0]
    jobs = [f"Tell a long story about a lighthouse keeper number {i}."
            for i in range(6)]
    long = {"ignore_eos": True}
    want = {p: completion(direct_http, False, p, 96, stream=True, extra=long)
            for p in jobs}
    late = [f"Write a short poem about the sea, verse {i}." for i in range(4)]
    want.update({p: completion(direct_http, True, p, 8) for p in late})
    # The same runs with their top two log-probabilities, for near ties.
    steps = {p: greedy_steps(direct_http, p in late, p, 8 if p in late
                             else 96, extra=None if p in late else long)
             for p in jobs + late}
    for p in jobs + late:
        check("".join(steps[p][0]) == want[p][1],
              f"'{p}': the run with logprobs repeats the undisturbed text")
    m0 = metrics(router_http)
    results = {}

    def run(prompt, chat, n, stream):
        results[prompt] = completion(router_http, chat, prompt, n,
                                     stream=stream,
                                     extra=long if stream else None)

    threads = [threading.Thread(target=run, args=(p, False, 96, True))
               for p in jobs]
    for t in threads:
        t.start()
    # Under way: every request reached a replica, and some tokens flowed.
    check(wait_until(lambda: sum(
        metrics(router_http).get(f'shardlm_router_requests_total'
                                 f'{{replica="{r}"}}', 0) -
        m0.get(f'shardlm_router_requests_total{{replica="{r}"}}', 0)
        for r in addrs) >= len(jobs), timeout=60), "every stream routed")
    time.sleep(0.5)
    m1 = metrics(router_http)
    per = [m1.get(f'shardlm_router_requests_total{{replica="{r}"}}', 0) -
           m0.get(f'shardlm_router_requests_total{{replica="{r}"}}', 0)
           for r in addrs]
    victim = max(range(len(addrs)), key=lambda i: per[i])
    # Requests that start while the victim dies: none may be lost.
    late_threads = [threading.Thread(target=run, args=(p, True, 8, False))
                    for p in late]
    for t in late_threads[:2]:
        t.start()
    replicas[victim].send_signal(signal.SIGKILL)
    replicas[victim].wait()
    for t in late_threads[2:]:
        t.start()
    for t in threads + late_threads:
        t.join(timeout=180)
    # Greedy, but the streams ran beside each other and the resumed ones
    # were prefilled again: where the undisturbed run had a near tie the
    # texts may part (testlib.NEAR_TIE); anywhere else they are equal.
    for p in jobs + late:
        chat = p in late
        tokens, tops = steps[p]
        got = results.get(p)
        why = "no result" if got is None else \
            greedy_divergence(got[1], tokens, tops)
        # A parted chat reply may stop elsewhere; the streams ignore EOS.
        same_end = got is not None and (got[2:] == want[p][2:] or (
            chat and got[1] != want[p][1]))
        check(got is not None and got[0] == want[p][0] and same_end and
              why is None,
              f"'{p}' after the kill equals the undisturbed run, but for "
              f"near ties: {why or 'yes'}; {got!r} vs {want[p]!r}")
    m2 = metrics(router_http)
    check(all(want[p][2] == "length" and len(want[p][1]) > 200
              for p in jobs), "the streams ran 96 tokens each")
    check(m2.get("shardlm_router_resumes_total", 0) >= 1,
          f"the victim's streams ({per[victim]}) were resumed "
          f"({m2.get('shardlm_router_resumes_total')} resumes)")
    # Back on its address for the checks that follow.
    replicas[victim] = subprocess.Popen(
        [shardlm, "serve", "--model", gguf, "--listen", addrs[victim],
         "--threads", "1", "--http-listen", f"127.0.0.1:{https[victim]}"],
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=open(work / "replica-restarted.log", "w"))
    check(ready(router_http, 2, timeout=60), "the killed replica is back")


def check_security(a, pb2, pb2_grpc, work, reference):
    pki = work / "pki"
    pki.mkdir(exist_ok=True)
    make_pki(str(pki))
    ca, cert, key = str(pki / "ca.pem"), str(pki / "server.pem"), \
        str(pki / "server.key")
    env = dict(os.environ, SHARDLM_API_KEY="router-test-key")
    ccert, ckey = str(pki / "client.pem"), str(pki / "client.key")
    # The replica wants a client certificate (mutual TLS): the router
    # presents one with --replica-tls-cert/--replica-tls-key.
    replica, raddr = start_serve(
        a.shardlm, a.gguf, ["--threads", "1", "--tls-cert", cert,
                            "--tls-key", key, "--tls-client-ca", ca],
        stderr=open(work / "tls-replica.log", "w"), env=env)
    procs = [replica]
    try:
        router, gaddr, hport = start_router(
            a.shardlm, ["--replica", raddr, "--replica-tls-ca", ca,
                        "--replica-tls-cert", ccert, "--replica-tls-key",
                        ckey, "--tls-cert", cert, "--tls-key", key],
            work / "tls-router.log", env=env)
        procs.append(router)
        check(wait_until(lambda: _ready_count(hport, ca) == 1, timeout=120),
              "the router reaches its mutual-TLS replica with the key")
        # Without a client certificate the replica refuses the router.
        nocert, _, ncport = start_router(
            a.shardlm, ["--replica", raddr, "--replica-tls-ca", ca],
            work / "tls-router-nocert.log", env=env)
        procs.append(nocert)
        # Awaited, not slept for: the router says it tried the replica and
        # failed (then, not before, "not ready" means something).
        nocert_log = work / "tls-router-nocert.log"
        check(wait_until(lambda: f"replica {raddr}: GetModelInfo" in
                         nocert_log.read_text(errors="replace"), timeout=60),
              "without --replica-tls-cert the router's call to the replica "
              "fails, and its log says so")
        check(_ready_count(ncport, None) == 0,
              "without --replica-tls-cert the mutual-TLS replica is not "
              "ready to the router")
        status, _, body = request(hport, "POST", "/v1/completions",
                                  {"prompt": "x", "max_tokens": 1}, ca=ca)
        check(status == 401 and "API key" in body,
              f"HTTPS without the key: 401 ({status} {body.strip()})")
        status, _, body = request(hport, "POST", "/v1/completions",
                                  {"prompt": "x", "max_tokens": 1},
                                  key="wrong", ca=ca)
        check(status == 401, f"HTTPS with a wrong key: 401 ({status})")
        got = completion(hport, False, CASES[0][1], key="router-test-key",
                         ca=ca)
        check(got == reference, f"HTTPS with the key: the reference text "
              f"({got!r} vs {reference!r})")
        creds = grpc.ssl_channel_credentials(open(ca, "rb").read())
        stub = pb2_grpc.InferenceStub(grpc.secure_channel(gaddr, creds))
        req = pb2.GenerateRequest(prompt=CASES[0][1], max_tokens=12)
        try:
            list(stub.Generate(req, timeout=60))
            check(False, "gRPC without the key is refused")
        except grpc.RpcError as e:
            check(e.code() == grpc.StatusCode.UNAUTHENTICATED,
                  f"gRPC over TLS without the key: UNAUTHENTICATED "
                  f"({e.code()})")
        text = "".join(r.text for r in stub.Generate(
            req, timeout=60,
            metadata=[("authorization", "Bearer router-test-key")]))
        check(text == reference[1], f"gRPC over TLS with the key: the "
              f"reference text ({text!r})")
        plain = pb2_grpc.InferenceStub(grpc.insecure_channel(gaddr))
        try:
            plain.GetModelInfo(pb2.GetModelInfoRequest(), timeout=5)
            check(False, "plaintext gRPC to the TLS port is refused")
        except grpc.RpcError as e:
            check(e.code() == grpc.StatusCode.UNAVAILABLE,
                  f"plaintext gRPC to the TLS port fails ({e.code()})")
        try:
            status, _, _ = request(hport, "GET", "/health", timeout=5)
            check(False, f"plaintext HTTP to the HTTPS port: {status}")
        except (OSError, http.client.HTTPException):
            check(True, "plaintext HTTP to the HTTPS port gets no answer")
        check(router.poll() is None, "the TLS router still runs")

        # Mutual TLS on the router's own ports (--tls-client-ca).
        mtls, mgaddr, mport = start_router(
            a.shardlm, ["--replica", raddr, "--replica-tls-ca", ca,
                        "--replica-tls-cert", ccert, "--replica-tls-key",
                        ckey, "--tls-cert", cert, "--tls-key", key,
                        "--tls-client-ca", ca],
            work / "mtls-router.log", env=env)
        procs.append(mtls)

        def https_with_cert():
            ctx = ssl.create_default_context(cafile=ca)
            ctx.load_cert_chain(ccert, ckey)
            conn = http.client.HTTPSConnection("127.0.0.1", mport, timeout=10,
                                               context=ctx)
            try:
                conn.request("GET", "/health")
                return conn.getresponse().status
            except OSError:
                return 0
            finally:
                conn.close()

        check(wait_until(lambda: https_with_cert() == 200, timeout=30),
              "mutual TLS on the router: HTTPS with a client certificate")
        try:
            status, _, _ = request(mport, "GET", "/health", ca=ca, timeout=5)
            check(False, f"mutual TLS: HTTPS without a client certificate "
                  f"is refused ({status})")
        except (OSError, http.client.HTTPException):
            check(True, "mutual TLS: HTTPS without a client certificate is "
                  "refused")
        good = grpc.ssl_channel_credentials(
            open(ca, "rb").read(), open(ckey, "rb").read(),
            open(ccert, "rb").read())
        mstub = pb2_grpc.InferenceStub(grpc.secure_channel(mgaddr, good))
        text = "".join(r.text for r in mstub.Generate(
            req, timeout=60,
            metadata=[("authorization", "Bearer router-test-key")]))
        check(text == reference[1], "mutual TLS: gRPC with a client "
              "certificate gets the reference text")
        bare = pb2_grpc.InferenceStub(grpc.secure_channel(mgaddr, creds))
        try:
            bare.GetModelInfo(pb2.GetModelInfoRequest(), timeout=5)
            check(False, "mutual TLS: gRPC without a client certificate is "
                  "refused")
        except grpc.RpcError as e:
            check(e.code() == grpc.StatusCode.UNAVAILABLE,
                  f"mutual TLS: gRPC without a client certificate fails "
                  f"({e.code()})")

        rc, log = run_to_end(
            [a.shardlm, "router", "--replica", raddr, "--replica-tls-ca",
             str(pki / "missing.pem"), "--listen", "127.0.0.1:0"],
            work / "tls-bad.log")
        check(rc == 1 and "--replica-tls-ca" in log and "missing.pem" in log,
              f"a missing --replica-tls-ca names the flag and file (rc {rc}: "
              f"{log.strip()})")
    finally:
        for p in procs:
            stop(p)


def check_dns(a, addr, work, reference):
    port = addr.rsplit(":", 1)[1]
    router, _, hport = start_router(
        a.shardlm, ["--replicas-dns", f"localhost:{port}",
                    "--dns-interval-ms", "500"], work / "dns-router.log")
    try:
        check(ready(hport, 1), "--replicas-dns localhost:PORT: 1 replica "
              "ready")
        got = completion(hport, False, CASES[0][1])
        check(got == reference, f"through the DNS-found replica: the "
              f"reference text ({got!r})")
        series = metrics(hport)
        check(any(k.startswith("shardlm_router_requests_total") and
                  f':{port}"' in k and v >= 1 for k, v in series.items()),
              "the request went to the resolved address")
    finally:
        stop(router)
    rc, log = run_to_end(
        [a.shardlm, "router", "--replicas-dns", "no-such-replica.invalid:5",
         "--dns-wait-s", "0", "--listen", "127.0.0.1:0"],
        work / "dns-bad.log")
    check(rc == 1 and "no-such-replica.invalid" in log,
          f"an unresolvable name is an error naming it (rc {rc}: "
          f"{log.strip()})")
    # Waiting for a name that does not resolve yet: SIGTERM ends the wait.
    waiting = subprocess.Popen(
        [a.shardlm, "router", "--replicas-dns", "not-yet.invalid:5",
         "--dns-wait-s", "60", "--listen", "127.0.0.1:0"],
        stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
        stderr=open(work / "dns-wait.log", "w"))
    check(wait_until(lambda: "retrying" in
                     (work / "dns-wait.log").read_text(), timeout=10),
          "waiting for --replicas-dns, it says so")
    waiting.send_signal(signal.SIGTERM)
    try:
        rc = waiting.wait(timeout=5)
    except subprocess.TimeoutExpired:
        waiting.kill()
        rc = None
    check(rc == 0, f"SIGTERM while waiting for DNS: exit 0 at once (rc {rc})")
    rc, log = run_to_end(
        [a.shardlm, "router", "--replicas-dns", "leaders-without-port"],
        work / "dns-flag.log")
    check(rc == 2 and "leaders-without-port" in log,
          f"--replicas-dns without a port: a usage error naming it (rc {rc})")


def check_drain(a, addr, work):
    """SIGTERM: /ready 503 and new requests refused at once, the stream in
    flight runs to its end, then exit 0."""
    router, _, hport = start_router(
        a.shardlm, ["--replica", addr, "--drain-timeout-s", "60"],
        work / "drain-router.log")
    try:
        check(ready(hport, 1), "drain router: 1 replica ready")
        prompt = "Describe a long walk along the river, step by step."
        long = {"ignore_eos": True}
        want = completion(hport, False, prompt, 96, stream=True, extra=long)
        got = {}
        t = threading.Thread(target=lambda: got.update(r=completion(
            hport, False, prompt, 96, stream=True, extra=long)))
        t.start()
        time.sleep(0.5)
        router.send_signal(signal.SIGTERM)
        check(wait_until(lambda: request(hport, "GET", "/ready")[0] == 503,
                         timeout=2, every=0.05),
              "draining: /ready is 503 at once")
        status, _, body = request(hport, "POST", "/v1/completions",
                                  {"prompt": "x", "max_tokens": 1})
        check(status == 503 and "draining" in body,
              f"draining: a new request is 503 ({status} {body.strip()})")
        t.join(timeout=120)
        check(got.get("r") == want and want[2] == "length",
              f"the stream in flight ran to its end: {got.get('r')!r}")
        rc = router.wait(timeout=30)
        check(rc == 0, f"drained router exits 0 (rc {rc})")
    finally:
        if router.poll() is None:
            stop(router)


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--shardlm", required=True)
    ap.add_argument("--gguf", required=True)
    ap.add_argument("--workdir", required=True)
    a = ap.parse_args()
    work = Path(a.workdir)
    work.mkdir(parents=True, exist_ok=True)
    pb2, pb2_grpc = generate.load_stubs(work / "stubs")
    t0 = time.monotonic()

    replicas, addrs, https = [], [], []
    for i in range(2):
        http_port = free_port()
        proc, addr = start_serve(
            a.shardlm, a.gguf, ["--threads", "1", "--http-listen",
                                f"127.0.0.1:{http_port}"],
            stderr=open(work / f"replica{i}.log", "w"))
        replicas.append(proc)
        addrs.append(addr)
        https.append(http_port)
    routers = []
    try:
        for proc, addr in zip(replicas, addrs):
            check(wait_ready(a.shardlm, addr, proc), f"replica {addr} ready")
        router, _, rhttp = start_router(
            a.shardlm, ["--policy", "round-robin", "--model", a.gguf] +
            [x for r in addrs for x in ("--replica", r)],
            work / "router.log")
        routers.append(router)
        check(ready(rhttp, 2), "the router sees 2 replicas ready")
        t = time.monotonic()
        check_parity(rhttp, https[0])
        print(f"parity: {time.monotonic() - t:.1f} s")
        reference = completion(https[0], False, CASES[0][1])
        t = time.monotonic()
        check_kill_under_load(a.shardlm, a.gguf, replicas, addrs, https,
                              rhttp, work)
        print(f"kill under HTTP load: {time.monotonic() - t:.1f} s")
        check(router.poll() is None, "the router still runs")
        t = time.monotonic()
        check_security(a, pb2, pb2_grpc, work, reference)
        print(f"key and TLS: {time.monotonic() - t:.1f} s")
        t = time.monotonic()
        check_dns(a, addrs[0], work, reference)
        print(f"DNS: {time.monotonic() - t:.1f} s")
        t = time.monotonic()
        check_drain(a, addrs[0], work)
        print(f"drain: {time.monotonic() - t:.1f} s")
    finally:
        for r in routers:
            stop(r)
        for r in replicas:
            stop(r)
    print(f"check_router_http: {time.monotonic() - t0:.1f} s")
    return exit_code("all router HTTP, security and DNS checks passed")


if __name__ == "__main__":
    sys.exit(main())
