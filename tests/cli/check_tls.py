#!/usr/bin/env python3
"""TLS on both public APIs of `shardlm serve` (gRPC and HTTP), with
certificates made here by the openssl command (a test CA, a server
certificate for 127.0.0.1, a client certificate, and a second CA that
signed none of them).

  check_tls.py --shardlm BIN --gguf MODEL [--workdir DIR]

Server with --tls-cert/--tls-key:
  - gRPC with --tls-ca gives the same greedy text as the local CLI; plain
    gRPC and gRPC trusting the other CA are refused;
  - HTTPS trusting the CA answers /health and a completion with the same
    text; plaintext HTTP to that port gets no HTTP answer; HTTPS trusting
    the other CA fails verification; the server still serves after each.
Server with --tls-client-ca as well (mutual TLS):
  - a client without a certificate is refused on both APIs; with one the
    CA signed, both answer.
Bad flags: a key that does not match the certificate, a missing file, a
key without a certificate: exit 2 (or 1) naming the problem, before any
model is loaded.
"""

from __future__ import annotations

import argparse
import http.client
import json
import os
import socket
import ssl
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))
from testlib import FAILURES, check, free_port, run, start_serve, stop  # noqa: E402

PROMPT = "The capital of France is"


def openssl(*args, cwd):
    subprocess.run(["openssl", *args], cwd=cwd, check=True,
                   capture_output=True, timeout=60)


def make_pki(d: str) -> None:
    """ca.pem/ca.key, server.pem/server.key (127.0.0.1), client.pem/
    client.key (signed by ca), other-ca.pem, other.key (another key)."""
    for ca in ("ca", "other-ca"):
        openssl("req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "2",
                "-subj", f"/CN=shardlm test {ca}", "-keyout", f"{ca}.key",
                "-out", f"{ca}.pem", cwd=d)
    with open(os.path.join(d, "san.ext"), "w") as f:
        f.write("subjectAltName=IP:127.0.0.1,DNS:localhost\n")
    for name in ("server", "client"):
        openssl("req", "-newkey", "rsa:2048", "-nodes", "-subj",
                f"/CN=shardlm test {name}", "-keyout", f"{name}.key",
                "-out", f"{name}.csr", cwd=d)
        openssl("x509", "-req", "-in", f"{name}.csr", "-CA", "ca.pem",
                "-CAkey", "ca.key", "-CAcreateserial", "-days", "2",
                "-extfile", "san.ext", "-out", f"{name}.pem", cwd=d)
    openssl("genpkey", "-algorithm", "RSA", "-out", "other.key", cwd=d)


def https(port, path, ca, body=None, cert=None):
    """(status, body) over HTTPS trusting `ca`; raises on TLS failures."""
    ctx = ssl.create_default_context(cafile=ca)
    if cert is not None:
        ctx.load_cert_chain(*cert)
    conn = http.client.HTTPSConnection("127.0.0.1", port, context=ctx,
                                       timeout=120)
    if body is None:
        conn.request("GET", path)
    else:
        conn.request("POST", path, body=json.dumps(body),
                     headers={"Content-Type": "application/json"})
    r = conn.getresponse()
    out = r.read()
    conn.close()
    return r.status, out


def tls_fails(fn) -> str:
    """'' when `fn` raised a TLS or connection error, else what it gave."""
    try:
        return f"answered {fn()!r}"
    except (ssl.SSLError, ConnectionError, OSError):
        return ""


def plaintext_answer(port) -> bytes:
    """What a plaintext HTTP request to the port gets back (b'' if the
    server closes without an HTTP answer)."""
    with socket.create_connection(("127.0.0.1", port), timeout=10) as s:
        s.sendall(b"GET /health HTTP/1.1\r\nHost: x\r\n\r\n")
        try:
            data = s.recv(4096)
        except (ConnectionError, socket.timeout):
            return b""
    return data


def grpc_generate(shardlm, addr, tls_args):
    return run([shardlm, "generate", "--server", addr, "--prompt", PROMPT,
                "--max-tokens", "8", *tls_args], timeout=120)


def wait_tls_ready(shardlm, addr, server, tls_args, timeout=120):
    import time
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline and server.poll() is None:
        p = run([shardlm, "generate", "--server", addr, "--prompt", "x",
                 "--max-tokens", "1", *tls_args])
        if p.returncode == 0:
            return True
        time.sleep(0.3)
    return False


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--shardlm", required=True)
    ap.add_argument("--gguf", required=True)
    ap.add_argument("--workdir")
    a = ap.parse_args()
    d = a.workdir or tempfile.mkdtemp(prefix="shardlm-tls-")
    os.makedirs(d, exist_ok=True)
    make_pki(d)
    p = lambda name: os.path.join(d, name)  # noqa: E731
    local = run([a.shardlm, "generate", "--model", a.gguf, "--prompt", PROMPT,
                 "--max-tokens", "8"])
    check(local.returncode == 0, f"local generate ({local.stderr[-300:]})")
    want = local.stdout

    # Bad TLS flags fail at once, naming the problem.
    for extra, needle in [
            (["--tls-cert", p("server.pem"), "--tls-key", p("other.key")],
             "does not match"),
            (["--tls-cert", p("server.pem"), "--tls-key", p("missing.key")],
             "missing.key"),
            (["--tls-key", p("server.key")], "--tls-cert"),
            (["--tls-client-ca", p("ca.pem")], "--tls-client-ca")]:
        server, addr = start_serve(a.shardlm, a.gguf,
                                   ["--http-listen", f"127.0.0.1:{free_port()}",
                                    *extra],
                                   stderr=subprocess.PIPE, text=True)
        try:
            _, err = server.communicate(timeout=120)
        except subprocess.TimeoutExpired:
            stop(server)
            err = "(still running)"
        check(server.returncode not in (0, None) and needle in err,
              f"serve {' '.join(os.path.basename(x) for x in extra)} fails "
              f"naming '{needle}' (exit {server.returncode}: {err.strip()[-200:]})")

    # TLS on both APIs.
    http_port = free_port()
    server, addr = start_serve(
        a.shardlm, a.gguf, ["--http-listen", f"127.0.0.1:{http_port}",
                            "--tls-cert", p("server.pem"),
                            "--tls-key", p("server.key")])
    ca = ["--tls-ca", p("ca.pem")]
    try:
        check(wait_tls_ready(a.shardlm, addr, server, ca), "TLS server ready")
        got = grpc_generate(a.shardlm, addr, ca)
        check(got.returncode == 0 and got.stdout == want,
              f"gRPC over TLS equals local: got {got.stdout!r} want {want!r}")
        plain = grpc_generate(a.shardlm, addr, [])
        check(plain.returncode != 0, "plaintext gRPC is refused")
        other = grpc_generate(a.shardlm, addr, ["--tls-ca", p("other-ca.pem")])
        check(other.returncode != 0, "gRPC trusting another CA is refused")
        status, body = https(http_port, "/health", p("ca.pem"))
        check(status == 200, f"HTTPS /health: {status} {body[:100]!r}")
        status, body = https(http_port, "/v1/completions", p("ca.pem"),
                             {"prompt": PROMPT, "max_tokens": 8,
                              "temperature": 0})
        text = json.loads(body)["choices"][0]["text"] if status == 200 else ""
        check(status == 200 and text + "\n" == want,
              f"HTTPS completion equals local: {status} {text!r}")
        answer = plaintext_answer(http_port)
        check(not answer.startswith(b"HTTP/"),
              f"plaintext HTTP gets no HTTP answer (got {answer[:40]!r})")
        check(tls_fails(lambda: https(http_port, "/health",
                                      p("other-ca.pem"))) == "",
              "HTTPS trusting another CA fails verification")
        status, _ = https(http_port, "/health", p("ca.pem"))
        check(status == 200, "HTTPS still answers after the bad clients")
        got = grpc_generate(a.shardlm, addr, ca)
        check(got.returncode == 0 and got.stdout == want,
              "gRPC over TLS still answers after the bad clients")
    finally:
        stop(server)

    # Mutual TLS.
    http_port = free_port()
    server, addr = start_serve(
        a.shardlm, a.gguf, ["--http-listen", f"127.0.0.1:{http_port}",
                            "--tls-cert", p("server.pem"),
                            "--tls-key", p("server.key"),
                            "--tls-client-ca", p("ca.pem")])
    mtls = ca + ["--tls-cert", p("client.pem"), "--tls-key", p("client.key")]
    try:
        check(wait_tls_ready(a.shardlm, addr, server, mtls),
              "mutual-TLS server ready")
        got = grpc_generate(a.shardlm, addr, mtls)
        check(got.returncode == 0 and got.stdout == want,
              f"gRPC with a client certificate equals local: {got.stdout!r}")
        nocert = grpc_generate(a.shardlm, addr, ca)
        check(nocert.returncode != 0,
              "gRPC without a client certificate is refused")
        check(tls_fails(lambda: https(http_port, "/health", p("ca.pem"))) == "",
              "HTTPS without a client certificate is refused")
        status, _ = https(http_port, "/health", p("ca.pem"),
                          cert=(p("client.pem"), p("client.key")))
        check(status == 200, "HTTPS with a client certificate answers")
        example = os.path.join(os.path.dirname(__file__), "..", "..",
                               "examples", "python", "generate.py")
        py = run([sys.executable, example, "--server", addr, "--prompt",
                  PROMPT, "--max-tokens", "8", *mtls,
                  "--stubs-dir", os.path.join(d, "stubs")], timeout=300)
        check(py.returncode == 0 and py.stdout == want,
              f"the Python example with mutual TLS equals local: "
              f"{py.stdout!r} ({py.stderr.strip()[-200:]})")
    finally:
        stop(server)

    if FAILURES:
        print(f"FAILED: {len(FAILURES)} checks")
        return 1
    print("all TLS checks passed")
    return 0


if __name__ == "__main__":
    sys.exit(main())
