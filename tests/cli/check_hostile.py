#!/usr/bin/env python3
"""Hostile clients against `shardlm serve` on SmolLM2 (issue: no request can
kill or wedge the server). Every row of the table sends raw bytes over a
socket (HTTP) or a hand-encoded protobuf (gRPC, so that invalid UTF-8 and
oversized fields can be sent at all), checks the exact status, and then
checks that the server still answers a real one-token completion. After the
table: slowloris, a client that stops reading a stream, a half-closed
client, and 300 idle connections while the probes and the API must keep
answering. (That the probes outlive API clients holding every handler
thread is http_server_test's IdleConnectionsTakeNoThread... case.)

  check_hostile.py --shardlm BIN --gguf MODEL [--router]

With --router, the same table goes to a `shardlm router` (same key) in
front of the serve process, and must get the same answers (but
INVALID_ARGUMENT, not INTERNAL, for gRPC bytes that are no message); the
request and KV leak checks read the replica's /metrics.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import socket
import subprocess
import sys
import time

import grpc

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))
from testlib import FAILURES, check, free_port, stop  # noqa: E402
from testlib import pb_field as field  # noqa: E402
from testlib import pb_varint as varint  # noqa: E402

KEY = "hostile-key"
AUTH = f"Authorization: Bearer {KEY}\r\n".encode()


def read_response(s: socket.socket) -> bytes:
    """One response off `s`: its head and its body, by Content-Length,
    de-chunked, or until the server closes (the connection may stay open:
    keep-alive)."""
    data = b""

    def more() -> bool:
        nonlocal data
        try:
            chunk = s.recv(65536)
        except ConnectionResetError:
            return False
        data += chunk
        return bool(chunk)

    while b"\r\n\r\n" not in data:
        if not more():
            return data
    head, _, data = data.partition(b"\r\n\r\n")
    lower = head.lower()
    length = re.search(rb"\r\ncontent-length: *(\d+)", lower)
    if length:
        while len(data) < int(length.group(1)) and more():
            pass
        return head + b"\r\n\r\n" + data[:int(length.group(1))]
    if b"\r\ntransfer-encoding: chunked" in lower:
        body = b""
        while True:
            while b"\r\n" not in data:
                if not more():
                    return head + b"\r\n\r\n" + body
            size, _, rest = data.partition(b"\r\n")
            n = int(size, 16)
            while len(rest) < n + 2:
                if not more():
                    return head + b"\r\n\r\n" + body
                size, _, rest = data.partition(b"\r\n")
            body += rest[:n]
            data = rest[n + 2:]
            if n == 0:
                return head + b"\r\n\r\n" + body
    while more():
        pass
    return head + b"\r\n\r\n" + data


def exchange(port: int, data: bytes, timeout: float = 30,
             half_close: bool = False) -> bytes:
    """Sends `data` on a new connection, returns the response to it."""
    with socket.create_connection(("127.0.0.1", port), timeout=timeout) as s:
        try:
            s.sendall(data)
            if half_close:
                s.shutdown(socket.SHUT_WR)
        except (BrokenPipeError, ConnectionResetError):
            pass  # The server may answer and close before reading it all.
        return read_response(s)


def status_of(response: bytes) -> int | None:
    line = response.split(b"\r\n", 1)[0].split(b" ")
    if len(line) >= 2 and line[0].startswith(b"HTTP/1.") and line[1].isdigit():
        return int(line[1])
    return None


def error_message(response: bytes) -> str | None:
    body = response.split(b"\r\n\r\n", 1)[-1]
    try:
        return json.loads(body)["error"]["message"]
    except (ValueError, KeyError, TypeError):
        return None


def post(path: str, body: bytes, extra: bytes = b"") -> bytes:
    return (b"POST " + path.encode() + b" HTTP/1.1\r\nHost: x\r\n" + AUTH +
            extra + b"Content-Type: application/json\r\nContent-Length: " +
            str(len(body)).encode() + b"\r\n\r\n" + body)


def completion(prompt_json: bytes) -> bytes:
    return post("/v1/completions",
                b'{"prompt": ' + prompt_json + b', "max_tokens": 1}')


def jpost(path: str, obj) -> bytes:
    return post(path, json.dumps(obj).encode())


# (name, raw request, expected HTTP status). Statuses follow the API's
# mapping: malformed HTTP 400/411/413/431/505, bad fields 400, a wrong key
# 401, an unknown model or route 404.
def http_cases() -> list[tuple[str, bytes, int]]:
    deep = b"[" * 100000 + b"]" * 100000
    nested_messages = (b'{"messages": [{"role": "user", "content": ' +
                       b"[" * 40 + b"]" * 40 + b"}]}")
    return [
        # The request line and headers, byte by byte.
        ("non-UTF-8 path (crashed the server)", b"GET /\xff HTTP/1.1\r\n\r\n",
         400),
        ("non-UTF-8 path behind the key",
         b"GET /v1/\xff\xfe HTTP/1.1\r\n" + AUTH + b"\r\n", 400),
        ("non-UTF-8 method", b"\xff\xfe /v1/models HTTP/1.1\r\n\r\n", 400),
        ("method with a control byte", b"G\x01T / HTTP/1.1\r\n\r\n", 400),
        ("NUL in the path", b"GET /health\x00 HTTP/1.1\r\n\r\n", 400),
        ("DEL in the path", b"GET /he\x7falth HTTP/1.1\r\n\r\n", 400),
        ("absolute-form target", b"GET http://x/health HTTP/1.1\r\n\r\n", 400),
        ("asterisk target", b"OPTIONS * HTTP/1.1\r\n\r\n", 400),
        ("request line alone", b"GET\r\n\r\n", 400),
        ("empty request line", b"\r\n\r\n", 400),
        ("HTTP/2.0", b"GET /health HTTP/2.0\r\n\r\n", 505),
        ("HTTP/0.9 garbage version", b"GET /health HTTP/\xff\r\n\r\n", 505),
        ("non-UTF-8 header value is only bytes",
         b"GET /health HTTP/1.1\r\nX-A: \xff\xfe\xfd\r\n\r\n", 200),
        ("control byte in a header value",
         b"GET /health HTTP/1.1\r\nX-A: a\x01b\r\n\r\n", 400),
        ("bare LF inside a header line",
         b"GET /health HTTP/1.1\r\nX-A: a\nInjected: b\r\n\r\n", 400),
        ("non-UTF-8 header name", b"GET /health HTTP/1.1\r\n\xff: x\r\n\r\n",
         400),
        ("space in a header name",
         b"GET /health HTTP/1.1\r\nBad Name: x\r\n\r\n", 400),
        ("header without a colon", b"GET /health HTTP/1.1\r\nnocolon\r\n\r\n",
         400),
        ("non-UTF-8 API key",
         b"GET /v1/models HTTP/1.1\r\nAuthorization: Bearer \xff\xfe\r\n\r\n",
         401),
        ("API key with the wrong scheme",
         b"GET /v1/models HTTP/1.1\r\nAuthorization: Basic " +
         KEY.encode() + b"\r\n\r\n", 401),
        ("70 KB of headers", b"GET /health HTTP/1.1\r\nX-A: " + b"a" * 70000 +
         b"\r\n\r\n", 431),
        ("200 header lines", b"GET /health HTTP/1.1\r\n" +
         b"X-A: b\r\n" * 200 + b"\r\n", 431),
        ("two different Content-Lengths (smuggling)",
         b"POST /v1/completions HTTP/1.1\r\n" + AUTH +
         b"Content-Length: 2\r\nContent-Length: 3\r\n\r\n{}x", 400),
        ("negative Content-Length",
         b"POST /v1/completions HTTP/1.1\r\nContent-Length: -1\r\n\r\n", 400),
        ("signed Content-Length",
         b"POST /v1/completions HTTP/1.1\r\nContent-Length: +2\r\n\r\n{}", 400),
        ("Content-Length past 2^64",
         b"POST /v1/completions HTTP/1.1\r\nContent-Length: " +
         b"9" * 30 + b"\r\n\r\n", 400),
        ("body over 8 MiB declared",
         b"POST /v1/completions HTTP/1.1\r\nContent-Length: 9000000\r\n\r\n",
         413),
        ("chunked body", b"POST /v1/completions HTTP/1.1\r\n"
         b"Transfer-Encoding: chunked\r\n\r\n0\r\n\r\n", 411),
        # Bodies.
        ("non-UTF-8 bytes inside a JSON string", completion(b'"\xff\xfe"'),
         400),
        ("lone surrogate escape", completion(b'"\\ud800"'), 400),
        ("JSON nested 100000 deep", post("/v1/completions", deep), 400),
        ("chat content nested 40 deep",
         post("/v1/chat/completions", nested_messages), 400),
        ("content part whose type is a number (threw)",
         jpost("/v1/chat/completions",
               {"messages": [{"role": "user",
                              "content": [{"type": 5, "text": "x"}]}]}), 400),
        ("role that is a number", jpost("/v1/chat/completions", {
            "messages": [{"role": 7, "content": "x"}]}), 400),
        ("max_tokens 2^64 - 1", post("/v1/completions",
                                     b'{"prompt": "a", "max_tokens": '
                                     b'18446744073709551615}'), 400),
        ("token id 2^64 - 1", post("/v1/completions",
                                   b'{"prompt": [18446744073709551615]}'), 400),
        ("number beyond double", post("/v1/completions",
                                      b'{"prompt": "a", "temperature": 1e999}'),
         400),
        ("temperature as a string", jpost("/v1/completions", {
            "prompt": "a", "temperature": "NaN"}), 400),
        ("prompt of 2 MiB", jpost("/v1/completions", {
            "prompt": "a" * (2 << 20), "max_tokens": 1}), 400),
        ("300000 prompt token ids", jpost("/v1/completions", {
            "prompt": [1] * 300000, "max_tokens": 1}), 400),
        ("empty prompt array", jpost("/v1/completions", {"prompt": []}), 400),
        ("stop as an object", jpost("/v1/completions", {
            "prompt": "a", "stop": {"x": 1}}), 400),
        ("stop string of 1000 bytes", jpost("/v1/completions", {
            "prompt": "a", "stop": ["x" * 1000]}), 400),
        ("body null", post("/v1/completions", b"null"), 400),
        ("body a bare string", post("/v1/completions", b'"' + b"a" * 1000 +
                                    b'"'), 400),
        ("n = 1.5", jpost("/v1/completions", {"prompt": "a", "n": 1.5}), 400),
        ("model name of another model",
         jpost("/v1/completions", {"prompt": "a", "model": "\u00e9\u0000x"}),
         404),
        ("empty messages", jpost("/v1/chat/completions", {"messages": []}),
         400),
        ("DELETE /v1/models", b"DELETE /v1/models HTTP/1.1\r\n" + AUTH +
         b"\r\n", 405),
        ("percent-encoded bytes in an unknown route",
         b"GET /v1/%ff%00 HTTP/1.1\r\n" + AUTH + b"\r\n", 404),
    ]


# --- gRPC, with hand-encoded protobuf -------------------------------------





def packed(num: int, values: list[int]) -> bytes:
    return field(num, b"".join(varint(v) for v in values))


def grpc_cases() -> list[tuple[str, str, bytes, grpc.StatusCode]]:
    gen, tok = "/shardlm.v1.Inference/Generate", "/shardlm.v1.Inference/Tokenize"
    ok_tail = field(3, 1)  # max_tokens 1
    return [
        # Issue 39: the proto promises INVALID_ARGUMENT (it was INTERNAL).
        ("gRPC prompt of invalid UTF-8", gen, field(1, b"\xff\xfe") + ok_tail,
         grpc.StatusCode.INVALID_ARGUMENT),
        ("gRPC prompt of 2 MiB", gen, field(1, b"a" * (2 << 20)) + ok_tail,
         grpc.StatusCode.INVALID_ARGUMENT),
        ("gRPC message over 4 MiB", gen, field(1, b"a" * (5 << 20)),
         grpc.StatusCode.RESOURCE_EXHAUSTED),
        ("gRPC 300000 prompt token ids", gen, packed(2, [1] * 300000) + ok_tail,
         grpc.StatusCode.INVALID_ARGUMENT),
        ("gRPC 1000 stop token ids", gen,
         field(1, b"hi") + packed(5, [1] * 1000) + ok_tail,
         grpc.StatusCode.INVALID_ARGUMENT),
        ("gRPC negative prompt token id", gen, packed(2, [-5]) + ok_tail,
         grpc.StatusCode.INVALID_ARGUMENT),
        ("gRPC 9 stop strings", gen, field(1, b"hi") +
         b"".join(field(8, b"x") for _ in range(9)) + ok_tail,
         grpc.StatusCode.INVALID_ARGUMENT),
        ("gRPC garbage bytes", gen, b"\xff" * 64,
         grpc.StatusCode.INTERNAL),
        ("gRPC Tokenize of 2 MiB", tok, field(1, b"a" * (2 << 20)),
         grpc.StatusCode.INVALID_ARGUMENT),
    ]


def grpc_call(channel, method: str, body: bytes, key: str | None = KEY):
    """(status code, number of responses)."""
    metadata = [("authorization", f"Bearer {key}")] if key else []
    streaming = method.endswith("/Generate")
    ident = lambda b: b  # noqa: E731
    try:
        if streaming:
            call = channel.unary_stream(method, request_serializer=ident,
                                        response_deserializer=ident)
            n = sum(1 for _ in call(body, metadata=metadata, timeout=60))
        else:
            call = channel.unary_unary(method, request_serializer=ident,
                                       response_deserializer=ident)
            call(body, metadata=metadata, timeout=60)
            n = 1
        return grpc.StatusCode.OK, n
    except grpc.RpcError as e:
        return e.code(), 0


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--shardlm", required=True)
    ap.add_argument("--gguf", required=True)
    ap.add_argument("--router", action="store_true",
                    help="send everything through a router")
    a = ap.parse_args()

    grpc_port, port = free_port(), free_port()
    env = dict(os.environ, SHARDLM_API_KEY=KEY)
    replica = None
    metrics_port = port  # Where requests and KV blocks are counted.
    if a.router:
        replica_grpc, metrics_port = free_port(), free_port()
        replica = subprocess.Popen(
            [a.shardlm, "serve", "--model", a.gguf, "--listen",
             f"127.0.0.1:{replica_grpc}", "--http-listen",
             f"127.0.0.1:{metrics_port}"],
            stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL, env=env)
        cmd = [a.shardlm, "router", "--replica", f"127.0.0.1:{replica_grpc}",
               "--model", a.gguf]
    else:
        cmd = [a.shardlm, "serve", "--model", a.gguf]
    server = subprocess.Popen(
        cmd + ["--listen", f"127.0.0.1:{grpc_port}", "--http-listen",
               f"127.0.0.1:{port}"],
        stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE, text=True, env=env)
    good = completion(b'"The capital of France is"')

    class ServerDied(Exception):
        pass

    def serves(what: str) -> None:
        try:
            got = exchange(port, good)
        except OSError as e:
            got = str(e).encode()
        check(status_of(got) == 200 and server.poll() is None,
              f"  ... and then a real completion is 200 ({what})")
        if server.poll() is not None:
            raise ServerDied(f"the server died after: {what} "
                             f"(rc {server.returncode})")

    try:
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline and server.poll() is None:
            try:
                if status_of(exchange(port, b"GET /ready HTTP/1.1\r\n\r\n")) \
                        == 200:
                    break
            except OSError:
                pass
            time.sleep(0.2)
        check(server.poll() is None, f"shardlm {cmd[1]} started")
        if server.poll() is not None:
            return 1

        cases = http_cases()
        for name, raw, want in cases:
            got = exchange(port, raw)
            status = status_of(got)
            has_message = want == 200 or bool(error_message(got))
            check(status == want and has_message,
                  f"{name}: {want} (got {status}, {error_message(got)!r})")
            serves(name)

        channel = grpc.insecure_channel(f"127.0.0.1:{grpc_port}")
        gcases = grpc_cases()
        for name, method, body, want in gcases:
            if a.router and want == grpc.StatusCode.INTERNAL:
                # Bytes that are no message: a replica answers as gRPC's
                # generated code would, the router says what is wrong
                # (docs/router.md).
                want = grpc.StatusCode.INVALID_ARGUMENT
            code, _ = grpc_call(channel, method, body)
            check(code == want, f"{name}: {want.name} (got {code.name})")
            serves(name)
        code, n = grpc_call(channel, "/shardlm.v1.Inference/Generate",
                            field(1, b"Hi") + field(3, 2), key="wrong")
        check(code == grpc.StatusCode.UNAUTHENTICATED,
              f"gRPC wrong key: UNAUTHENTICATED (got {code.name})")
        code, n = grpc_call(channel, "/shardlm.v1.Inference/Generate",
                            field(1, b"Hi") + field(3, 2))
        check(code == grpc.StatusCode.OK and n >= 1,
              f"gRPC real request after the table: OK ({code.name}, {n})")
        check(len(cases) + len(gcases) >= 40,
              f"{len(cases) + len(gcases)} hostile requests in the table")

        # Slowloris: a head trickled byte by byte is cut at the header
        # timeout (10 s), not held for as long as the client likes.
        t0 = time.monotonic()
        with socket.create_connection(("127.0.0.1", port), timeout=30) as s:
            s.sendall(b"GET /health HTTP/1.1\r\n")
            got = b""
            try:
                for _ in range(40):
                    s.sendall(b"X-A: b\r\n")
                    time.sleep(0.5)
            except OSError:
                pass
            try:
                got = s.recv(4096)
            except OSError:
                pass
        took = time.monotonic() - t0
        check(status_of(got) == 408 and took < 18,
              f"slowloris: 408 after {took:.1f} s (header timeout 10 s)")
        serves("slowloris")

        # A client that asks for a long stream and stops reading: the server
        # keeps serving others meanwhile, and frees the request once the
        # client goes.
        stalled = socket.create_connection(("127.0.0.1", port), timeout=30)
        stalled.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
        stalled.sendall(jpost("/v1/completions", {
            "prompt": "Once", "max_tokens": 3000, "ignore_eos": True,
            "stream": True, "temperature": 0}))
        time.sleep(2)
        serves("while a client stops reading its stream")
        stalled.close()
        running = None
        for _ in range(300):
            metrics = exchange(metrics_port,
                               b"GET /metrics HTTP/1.1\r\n\r\n").decode()
            running = next((line.split()[-1] for line in metrics.splitlines()
                            if line.startswith(
                                'shardlm_requests{state="running"}')), None)
            if running == "0":
                break
            time.sleep(0.1)
        check(running == "0",
              f"the stalled stream's request ends once its client goes "
              f"(running {running})")

        # Half-closed: the request is whole, the client shuts its sending
        # side. Seen as a client that left (it cannot be told from one
        # without writing to it): the request is cancelled or answered,
        # never left running, and the server goes on.
        got = exchange(port, jpost("/v1/completions", {
            "prompt": "Hello", "max_tokens": 64, "ignore_eos": True}),
            half_close=True)
        check(status_of(got) in (200, 499, None),
              f"half-closed client: answered, cancelled (499) or dropped "
              f"({status_of(got)})")
        serves("after a half-closed client")

        # 300 idle connections cost the server fds, not threads: the probes
        # and the API keep answering.
        idle = []
        for _ in range(300):
            idle.append(socket.create_connection(("127.0.0.1", port),
                                                 timeout=30))
        time.sleep(0.5)
        health = status_of(exchange(port, b"GET /health HTTP/1.1\r\n\r\n"))
        ready = status_of(exchange(port, b"GET /ready HTTP/1.1\r\n\r\n"))
        busy = status_of(exchange(port, good))
        check(health == 200 and ready == 200 and busy == 200,
              f"300 idle connections: /health {health}, /ready {ready}, "
              f"a completion {busy}")
        for s in idle:
            s.close()
        time.sleep(0.5)
        serves("after the idle connections close")
        check(server.poll() is None, "the server is still running")
    except ServerDied as e:
        check(False, str(e))
    try:
        # Nothing hostile leaked a request or a KV block.
        if server.poll() is None:
            metrics = exchange(metrics_port,
                               b"GET /metrics HTTP/1.1\r\n\r\n").decode()
            figures = {line.rsplit(" ", 1)[0]: line.rsplit(" ", 1)[1]
                       for line in metrics.splitlines()
                       if line and not line.startswith("#")}
            leaked = {k: figures.get(k) for k in (
                'shardlm_requests{state="running"}',
                'shardlm_requests{state="waiting"}',
                'shardlm_kv_blocks{tier="device",state="used"}',
                'shardlm_kv_blocks{tier="host",state="used"}')}
            check(all(v == "0" for v in leaked.values()),
                  f"no request or KV block left behind ({leaked})")
    finally:
        stop(server)
        if replica is not None:
            stop(replica)
    err = server.stderr.read() if server.stderr else ""
    check(server.returncode == 0,
          f"SIGTERM stops the server with exit 0 (rc {server.returncode})")
    check("threw" not in err,
          f"no handler threw ({[l for l in err.splitlines() if 'threw' in l]})")
    if FAILURES:
        print(f"{len(FAILURES)} check(s) failed", file=sys.stderr)
        return 1
    print("all hostile-input checks passed")
    return 0


if __name__ == "__main__":
    sys.exit(main())
