"""Helpers shared by the end-to-end test scripts (tests/cli, tests/cluster):
a check that records failures, subprocess runs with timeouts, free ports,
and waiting for a shardlm server to answer.

Importing it also arms two diagnostics for a test that hangs or fails:
faulthandler dumps every thread's stack 20 s before ctest's limit
(SHARDLM_TEST_TIMEOUT_S, which tests/CMakeLists.txt sets from each test's
TIMEOUT), and the servers start_serve() starts log to files whose tails
are printed when the script ends with a failed check."""

from __future__ import annotations

import atexit
import contextlib
import faulthandler
import json
import os
import random
import signal
import socket
import subprocess
import tempfile
import time

FAILURES: list[str] = []
SKIPPED: list[str] = []
_SERVER_LOGS: list[str] = []  # start_serve()'s log files, oldest first.

faulthandler.enable()
with contextlib.suppress(ValueError):
    _limit = float(os.environ.get("SHARDLM_TEST_TIMEOUT_S", "0"))
    if _limit > 30:
        faulthandler.dump_traceback_later(_limit - 20, exit=False)


@atexit.register
def _server_logs_at_exit() -> None:
    """Prints the tail of each server's log after a failure, then removes
    the logs (kept, with their paths printed, after a failure)."""
    for path in _SERVER_LOGS:
        if FAILURES:
            try:
                with open(path, errors="replace") as f:
                    tail = f.readlines()[-20:]
            except OSError:
                continue
            print(f"--- server log {path}, last {len(tail)} lines:\n"
                  + "".join(tail), flush=True)
        else:
            with contextlib.suppress(OSError):
                os.unlink(path)


def check(cond: bool, what: str) -> None:
    """Prints ok/FAIL for one expectation and records a failure."""
    print(("ok   " if cond else "FAIL ") + what, flush=True)
    if not cond:
        FAILURES.append(what)


def skip(what: str) -> None:
    """Records a named part of the script that cannot run here (say why in
    `what`): the script then ends with exit 77, ctest's "skipped" (register
    it with SKIP_RETURN_CODE 77), never 0, so CI's skip gate sees it."""
    print("SKIP " + what, flush=True)
    SKIPPED.append(what)


def exit_code(passed: str = "all checks passed") -> int:
    """The script's exit status: 1 when a check failed, else 77 when a part
    was skipped, else 0; prints which."""
    if FAILURES:
        print(f"FAILED: {len(FAILURES)} check(s)")
        return 1
    if SKIPPED:
        print(f"no check failed, but {len(SKIPPED)} part(s) did not run: "
              + "; ".join(SKIPPED))
        return 77
    print(passed)
    return 0


def wait_until(done, timeout: float = 30, every: float = 0.1) -> bool:
    """Polls done() until it is true (True) or `timeout` seconds pass
    (False): a wait on an event with a deadline, instead of a fixed sleep
    that a slow machine outlasts."""
    deadline = time.monotonic() + timeout
    while not done():
        if time.monotonic() >= deadline:
            return False
        time.sleep(every)
    return True


def run(cmd: list[str], timeout: float = 300) -> subprocess.CompletedProcess:
    return subprocess.run(cmd, capture_output=True, text=True, timeout=timeout,
                          stdin=subprocess.DEVNULL)


_HANDED_OUT: set[int] = set()


def _ephemeral_low() -> int:
    try:
        with open("/proc/sys/net/ipv4/ip_local_port_range") as f:
            return int(f.read().split()[0])
    except (OSError, ValueError, IndexError):
        return 32768


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing holds now and that this process
    has not handed out before, for a server the test starts next.

    Not bind(0)'s answer: the kernel may give the same port to two calls in
    a row (check_lws once gave a coordinator's control port to a worker's
    health server, which took it first), and ports in the ephemeral range
    can be taken by any connect() or listener on port 0 (Gloo's, MPI's)
    before the server binds them. Ports below that range are given out
    only on request."""
    low = _ephemeral_low()
    first = max(1024, low - 12000)
    if low - first >= 1000:
        for _ in range(200):
            port = random.randrange(first, low)
            if port in _HANDED_OUT:
                continue
            with socket.socket() as s:
                try:
                    s.bind(("127.0.0.1", port))
                except OSError:
                    continue
            _HANDED_OUT.add(port)
            return port
    while True:  # A narrow range below the ephemeral one: bind(0), unique.
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        if port not in _HANDED_OUT:
            _HANDED_OUT.add(port)
            return port


def wait_ready(shardlm: str, addr: str, server: subprocess.Popen,
               timeout: float = 120) -> bool:
    """True once `shardlm generate --server addr` answers a 1-token request
    (it fails fast while nothing listens); False if the server exits or the
    timeout passes."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline and server.poll() is None:
        if run([shardlm, "generate", "--server", addr, "--prompt", "x",
                "--max-tokens", "1"]).returncode == 0:
            return True
        time.sleep(0.2)
    return False


def start_serve(shardlm: str, model: str, extra: list[str] | tuple = (),
                **popen_kwargs):
    """Starts `shardlm serve` (with `extra` flags) on a free local port;
    returns (process, addr). Unless popen_kwargs say otherwise, its output
    goes to a log file (in $SHARDLM_TEST_LOG_DIR, else the temp folder),
    whose tail is printed if the script ends with a failure."""
    addr = f"127.0.0.1:{free_port()}"
    if "stdout" not in popen_kwargs and "stderr" not in popen_kwargs:
        fd, path = tempfile.mkstemp(prefix="shardlm-serve-", suffix=".log",
                                    dir=os.environ.get("SHARDLM_TEST_LOG_DIR"))
        _SERVER_LOGS.append(path)
        popen_kwargs["stdout"] = fd
        popen_kwargs["stderr"] = subprocess.STDOUT
        try:
            return _popen_serve(shardlm, model, addr, extra, popen_kwargs)
        finally:
            os.close(fd)
    popen_kwargs.setdefault("stdout", subprocess.DEVNULL)
    popen_kwargs.setdefault("stderr", subprocess.DEVNULL)
    return _popen_serve(shardlm, model, addr, extra, popen_kwargs)


def _popen_serve(shardlm, model, addr, extra, popen_kwargs):
    server = subprocess.Popen(
        [shardlm, "serve", "--model", model, "--listen", addr, *extra],
        stdin=subprocess.DEVNULL, **popen_kwargs)
    return server, addr


def stop(server: subprocess.Popen) -> None:
    """SIGTERM, then SIGKILL if it has not exited within 20 s."""
    server.terminate()
    try:
        server.wait(timeout=20)
    except subprocess.TimeoutExpired:
        server.kill()
        server.wait()


MPIRUN = ["mpirun", "--oversubscribe"]
if os.geteuid() == 0:
    MPIRUN.insert(1, "--allow-run-as-root")


@contextlib.contextmanager
def mpirun_cluster(shardlm: str, model: str, log_path: str, wait,
                   tp: int = 2, pp: int = 2, env: dict | None = None,
                   timeout: float = 300, extra: list[str] | tuple = ()):
    """Runs `mpirun -np 1+tp*pp shardlm launch` (coordinator on rank 0, a
    worker per other rank; `extra` flags added to launch's) on a free local
    gRPC port, output to `log_path`.
    Yields the coordinator's address once wait(address, process, timeout)
    says it serves, or None after recording the failed check "the TP x PP
    cluster serves". On leaving, stops the whole process group (SIGTERM,
    SIGKILL after 30 s) and, when any check of the script has failed,
    prints the log's last 15 lines.

        with mpirun_cluster(shardlm, gguf, log, wait_grpc, env=env) as addr:
            if addr:
                got = texts(addr)  # compare with a TP=PP=1 reference
    """
    address = f"127.0.0.1:{free_port()}"
    with open(log_path, "w") as log:
        cluster = subprocess.Popen(
            MPIRUN + ["-np", str(1 + tp * pp), shardlm, "launch", "--model",
                      model, "--tp", str(tp), "--pp", str(pp), "--listen",
                      address, *extra],
            stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
            start_new_session=True, env=env)
        try:
            up = wait(address, cluster, timeout)
            check(up, f"the TP={tp} x PP={pp} cluster serves")
            yield address if up else None
        finally:
            if cluster.poll() is None:
                os.killpg(cluster.pid, signal.SIGTERM)
                try:
                    cluster.wait(timeout=30)
                except subprocess.TimeoutExpired:
                    os.killpg(cluster.pid, signal.SIGKILL)
                    cluster.wait()
    if FAILURES:
        with open(log_path) as f:
            print("cluster log tail:\n" + "".join(f.readlines()[-15:]))


def http_post_json(port: int, path: str, body: dict,
                   timeout: float = 60,
                   headers: dict | None = None) -> tuple[int, bytes]:
    """POSTs `body` as JSON to 127.0.0.1:port over one raw HTTP/1.1
    connection (no client library between the test and the server's
    framing); returns the status and the response body, de-chunked when
    the server sent it chunked (a stream: one chunk per write, so the raw
    bytes hold chunk-size lines wherever the writes fell). `headers`: more
    header fields."""
    raw = json.dumps(body).encode()
    more = "".join(f"{k}: {v}\r\n" for k, v in (headers or {}).items())
    req = (f"POST {path} HTTP/1.1\r\nHost: x\r\nContent-Type: application/"
           f"json\r\nContent-Length: {len(raw)}\r\n{more}Connection: close"
           f"\r\n\r\n").encode() + raw
    with socket.create_connection(("127.0.0.1", port), timeout=timeout) as s:
        s.sendall(req)
        data = b""
        while chunk := s.recv(65536):
            data += chunk
    head, _, body = data.partition(b"\r\n\r\n")
    if b"transfer-encoding: chunked" in head.lower():
        body = dechunk(body)
    return int(data.split(b" ", 2)[1]), body


def dechunk(raw: bytes) -> bytes:
    """An HTTP/1.1 chunked body's bytes (RFC 9112 7.1); a malformed or cut
    framing raises ValueError naming the offset."""
    out, at = b"", 0
    while True:
        line_end = raw.find(b"\r\n", at)
        if line_end < 0:
            raise ValueError(f"chunked body cut at byte {at}")
        size = int(raw[at:line_end].split(b";", 1)[0], 16)
        if size == 0:
            return out
        start = line_end + 2
        if raw[start + size:start + size + 2] != b"\r\n":
            raise ValueError(f"chunk at byte {at} not ended by CRLF")
        out += raw[start:start + size]
        at = start + size + 2


def prometheus_series(text: str) -> dict[str, float]:
    """Every series of a Prometheus text scrape: name with labels -> value."""
    out = {}
    for line in text.splitlines():
        if line and not line.startswith("#"):
            name, value = line.rsplit(" ", 1)
            out[name] = float(value)
    return out


# --- Greedy streams run in different batches -----------------------------

# How far apart two greedy runs of one stream may place their top two
# log-probabilities and still legitimately pick different tokens. Measured
# on a 2-core Zen 3 (SmolLM2 Q4_1, f16 KV): a stream run beside five
# others moved its log-probabilities by up to 2.4e-3 over 96 tokens
# against the same stream run alone (f32 KV: 1.8e-5; the same stream run
# alone twice: 0). A step of more than 16 rows goes through the GEMM, a
# lone prompt through the GEMV, and a last-bit difference becomes one of
# f16's rounding in the KV cache. Eight times the measured drift.
NEAR_TIE = 0.02


def greedy_divergence(got, want, tops, near_tie: float = NEAR_TIE):
    """None when `got` equals the undisturbed greedy run `want`, or when
    they part only where `want` had a near tie; otherwise why not.

    `want` is the undisturbed run's tokens (ids or texts), `tops` its two
    most likely alternatives at each position as (token, logprob), most
    likely first. `got` is the other run's tokens in the same form, or
    its text when `want` holds token texts. The runs may part once: at a
    position where the undisturbed run's top two were within `near_tie`
    and `got` took the runner-up. What follows is then a different
    (equally greedy) continuation and is not compared."""
    if isinstance(got, str):
        at = 0
        for t, token in enumerate(want):
            if got.startswith(token, at):
                at += len(token)
                continue
            return _parted_at(t, got[at:at + 40], tops, near_tie,
                              lambda alt: alt != "" and
                              got.startswith(alt, at))
        return None if at == len(got) else \
            f"{got[at:at + 40]!r} after the undisturbed text's end"
    for t, token in enumerate(want):
        if t >= len(got):
            return f"ends after {t} of {len(want)} tokens"
        if got[t] != token:
            return _parted_at(t, got[t], tops, near_tie,
                              lambda alt: alt == got[t])
    return None if len(got) == len(want) else \
        f"{len(got)} tokens, the undisturbed run {len(want)}"


def _parted_at(t, got_here, tops, near_tie, took):
    if t >= len(tops) or len(tops[t]) < 2:
        return f"parts at token {t} ({got_here!r}), no alternatives there"
    (first, lp1), (second, lp2) = tops[t][0], tops[t][1]
    gap = lp1 - lp2
    if gap > near_tie:
        return (f"parts at token {t} ({got_here!r}) where the undisturbed "
                f"run's top two were {gap:.3g} apart ({first!r} {lp1:.4f}, "
                f"{second!r} {lp2:.4f}), more than {near_tie}")
    if not took(second):
        return (f"parts at a near tie at token {t} ({first!r} vs "
                f"{second!r}, {gap:.3g} apart) but took {got_here!r}")
    print(f"note parts at token {t}: a near tie ({first!r} {lp1:.4f} vs "
          f"{second!r} {lp2:.4f}) went to the runner-up", flush=True)
    return None


# --- The protobuf wire format, for requests encoded by hand ----------------

def pb_varint(n: int) -> bytes:
    """A base-128 varint (negative numbers as their 64-bit two's
    complement, as protobuf encodes int32/int64)."""
    n &= (1 << 64) - 1
    out = b""
    while True:
        b = n & 0x7F
        n >>= 7
        out += bytes([b | (0x80 if n else 0)])
        if not n:
            return out


def pb_scalar(num: int, value: int) -> bytes:
    """Field `num` as a varint (wire type 0)."""
    return pb_varint(num << 3) + pb_varint(value)


def pb_bytes(num: int, value: bytes) -> bytes:
    """Field `num` as length-delimited bytes (wire type 2)."""
    return pb_varint(num << 3 | 2) + pb_varint(len(value)) + value


def pb_field(num: int, value) -> bytes:
    """pb_scalar for an int, pb_bytes otherwise."""
    return pb_scalar(num, value) if isinstance(value, int) else pb_bytes(
        num, value)


def pb_read_varint(buf: bytes, i: int) -> tuple[int, int]:
    """The varint at buf[i:], and the index after it."""
    n = shift = 0
    while True:
        b = buf[i]
        i += 1
        n |= (b & 0x7F) << shift
        shift += 7
        if not b & 0x80:
            return n, i


def pb_fields(buf: bytes) -> list[tuple[int, object]]:
    """(field number, value) of a message, in order: ints for varints,
    bytes for length-delimited fields (packed ints are left as bytes: see
    pb_ints); fixed-width fields are skipped."""
    out, i = [], 0
    while i < len(buf):
        key, i = pb_read_varint(buf, i)
        num, wire = key >> 3, key & 7
        if wire == 0:
            v, i = pb_read_varint(buf, i)
            out.append((num, v))
        elif wire == 2:
            n, i = pb_read_varint(buf, i)
            out.append((num, buf[i:i + n]))
            i += n
        elif wire == 5:
            i += 4
        elif wire == 1:
            i += 8
        else:
            raise ValueError(f"wire type {wire}")
    return out


def pb_ints(value) -> list[int]:
    """A repeated int field's value from pb_fields, packed or not."""
    if isinstance(value, int):
        return [value]
    out, j = [], 0
    while j < len(value):
        v, j = pb_read_varint(value, j)
        out.append(v)
    return out
