#!/usr/bin/env python3
"""The control plane between `shardlm coordinator` and `shardlm worker`
closed to strangers (issue #10 part 4), with processes.

1. Hostile first messages: while the coordinator waits for its workers,
   strangers without the cluster token send a 200 MiB first message on
   Connect, a 200 MiB StoreSet and a StoreGet; each is refused with
   UNAUTHENTICATED, as are 32 Connect calls with 64 MiB messages at once
   (8 connections), and the coordinator's peak resident memory grows by
   less than HOSTILE_RSS_BOUND over the whole barrage (measured from
   /proc: VmHWM reset through clear_refs before, read after). Then the real
   workers join and the cluster serves.
2. Mutual TLS (--control-tls-cert/--control-tls-key/--control-tls-ca on
   coordinator and worker, certificates made here with openssl: a cluster
   CA, a certificate for 127.0.0.1 that both ends use, and another CA's):
   bad files fail at start naming the file; a worker without a
   certificate, one whose certificate another CA signed, and a plaintext
   gRPC client are refused; the cluster still starts (tp 1 x pp 2, the
   rendezvous store over TLS too) with the right workers and serves.
3. The same under mpirun (`shardlm launch` with the same flags): a
   missing file fails every rank at start, naming it; tp 1 x pp 2 serves.

  check_control_plane.py --shardlm BIN --gguf MODEL --workdir DIR
"""

from __future__ import annotations

import argparse
import os
import shutil
import signal
import subprocess
import sys
import threading
import time

import grpc

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))
from testlib import check, exit_code, free_port, run, skip  # noqa: E402

TOKEN = "control-plane-test-token-0123456789"
PROMPT = "The capital of France is"
MIB = 1 << 20
HOSTILE_BYTES = 200 * MIB
# What the barrage may add to the coordinator's peak RSS: gRPC's buffers
# for a few connections and streams, far below one hostile message.
HOSTILE_RSS_BOUND = 32 * MIB


# --- protobuf by hand (no generated stubs needed) -------------------------

def varint(n: int) -> bytes:
    out = bytearray()
    while True:
        b = n & 0x7F
        n >>= 7
        if n:
            out.append(b | 0x80)
        else:
            out.append(b)
            return bytes(out)


def field_bytes(num: int, payload: bytes) -> bytes:
    return varint(num << 3 | 2) + varint(len(payload)) + payload


def field_int(num: int, value: int) -> bytes:
    return varint(num << 3) + varint(value)


def register_message(rank: int, host: bytes, token: str = "") -> bytes:
    """WorkerMessage{register: Register{rank, host, cluster_token}}."""
    reg = field_int(1, rank) + field_bytes(2, host)
    if token:
        reg += field_bytes(7, token.encode())
    return field_bytes(1, reg)


def raw_channel(addr: str, creds=None) -> grpc.Channel:
    options = [("grpc.max_send_message_length", -1),
               ("grpc.max_receive_message_length", -1)]
    if creds is None:
        return grpc.insecure_channel(addr, options=options)
    return grpc.secure_channel(addr, creds, options=options)


def connect_status(channel: grpc.Channel, first: bytes, metadata=(),
                   timeout: float = 60) -> grpc.StatusCode:
    """Opens Connect, sends `first`, and returns how the call ended."""
    call = channel.stream_stream("/shardlm.v1.Control/Connect")
    try:
        for _ in call(iter([first]), metadata=metadata, timeout=timeout):
            pass
        return grpc.StatusCode.OK
    except grpc.RpcError as e:
        return e.code()


def unary_status(channel: grpc.Channel, method: str, request: bytes,
                 metadata=(), timeout: float = 60) -> grpc.StatusCode:
    try:
        channel.unary_unary(f"/shardlm.v1.Control/{method}")(
            request, metadata=metadata, timeout=timeout)
        return grpc.StatusCode.OK
    except grpc.RpcError as e:
        return e.code()


# --- processes -------------------------------------------------------------

def proc_status(pid: int, key: str) -> int:
    """A /proc/PID/status figure in bytes (VmRSS, VmHWM)."""
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith(key + ":"):
                return int(line.split()[1]) * 1024
    raise KeyError(key)


def reset_peak_rss(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/clear_refs", "w") as f:
            f.write("5")
        return True
    except OSError:
        return False


class Cluster:
    """A `shardlm coordinator` and its `shardlm worker` processes, each
    with its own log."""

    def __init__(self, a, tag: str, tp: int = 1, pp: int = 1):
        self.a, self.tag, self.tp, self.pp = a, tag, tp, pp
        self.api = f"127.0.0.1:{free_port()}"
        self.control = f"127.0.0.1:{free_port()}"
        self.procs: dict[str, subprocess.Popen] = {}

    def log_path(self, name: str) -> str:
        return os.path.join(self.a.workdir, f"{self.tag}_{name}.log")

    def spawn(self, name: str, args: list[str],
              token: str = TOKEN) -> subprocess.Popen:
        env = dict(os.environ, SHARDLM_CLUSTER_TOKEN=token)
        p = subprocess.Popen([self.a.shardlm, *args], env=env,
                             stdin=subprocess.DEVNULL,
                             stdout=open(self.log_path(name), "w"),
                             stderr=subprocess.STDOUT, start_new_session=True)
        self.procs[name] = p
        return p

    def start_coordinator(self, extra=()) -> subprocess.Popen:
        return self.spawn("coordinator", [
            "coordinator", "--model", self.a.gguf, "--tp", str(self.tp),
            "--pp", str(self.pp), "--listen", self.api, "--control-listen",
            self.control, "--startup-timeout-s", "120", *extra])

    def start_worker(self, rank: int, extra=(), name: str | None = None,
                     token: str = TOKEN) -> subprocess.Popen:
        return self.spawn(name or f"worker{rank}", [
            "worker", "--model", self.a.gguf, "--coordinator", self.control,
            "--rank", str(rank), *extra], token=token)

    def log(self, name: str) -> str:
        with open(self.log_path(name)) as f:
            return f.read()

    def wait_log(self, name: str, needle: str, timeout: float = 120) -> bool:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if needle in self.log(name):
                return True
            if self.procs[name].poll() is not None:
                return needle in self.log(name)
            time.sleep(0.2)
        return False

    def serves(self, want: str) -> bool:
        r = run([self.a.shardlm, "generate", "--server", self.api, "--prompt",
                 PROMPT, "--max-tokens", "8"], timeout=120)
        return r.returncode == 0 and r.stdout == want

    def stop(self):
        for p in self.procs.values():
            if p.poll() is None:
                os.killpg(p.pid, signal.SIGKILL)
                p.wait()


def hostile(a, want: str) -> None:
    c = Cluster(a, "hostile")
    try:
        coord = c.start_coordinator()
        up = c.wait_log("coordinator", "waiting up to")
        check(up, "[hostile] the coordinator listens for workers")
        if not up:
            return
        time.sleep(0.5)
        channel = raw_channel(c.control)
        # One small refused call first: connection set up, code paths run.
        unary_status(channel, "StoreGet", field_bytes(2, b"warm"))
        rss_before = proc_status(coord.pid, "VmRSS")
        can_reset = reset_peak_rss(coord.pid)
        big = b"x" * HOSTILE_BYTES
        codes = {
            "Connect, no token, 200 MiB Register": connect_status(
                channel, register_message(1, big)),
            "Connect, wrong token, 200 MiB Register": connect_status(
                channel, register_message(1, big, "wrong-token-0123456789"),
                metadata=(("shardlm-cluster-token", "wrong-token-01234567"),)),
            "StoreSet, no token, 200 MiB value": unary_status(
                channel, "StoreSet", field_bytes(2, b"k") + field_bytes(3, big)),
            "StoreGet, no token": unary_status(
                channel, "StoreGet", field_bytes(2, b"k")),
        }
        # And at once: 8 connections, 4 streams each, 64 MiB messages.
        msg = register_message(1, big[:64 * MIB])
        parallel: list[grpc.StatusCode] = []
        channels = [raw_channel(c.control) for _ in range(8)]

        def barrage(ch):
            calls = [threading.Thread(
                target=lambda: parallel.append(connect_status(ch, msg)))
                for _ in range(4)]
            for t in calls:
                t.start()
            for t in calls:
                t.join()

        threads = [threading.Thread(target=barrage, args=(ch,))
                   for ch in channels]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        for ch in channels:
            ch.close()
        codes["32 Connect calls at once, no token, 64 MiB each"] = (
            parallel[0] if set(parallel) == {parallel[0]} and
            len(parallel) == 32 else f"mixed: {parallel}")
        del big, msg
        growth = proc_status(coord.pid, "VmHWM" if can_reset else "VmRSS") \
            - rss_before
        for what, code in codes.items():
            check(code == grpc.StatusCode.UNAUTHENTICATED,
                  f"[hostile] {what}: refused UNAUTHENTICATED ({code})")
        print(f"coordinator RSS {rss_before / MIB:.1f} MiB before; peak "
              f"growth over the barrage {growth / MIB:.1f} MiB "
              f"({'VmHWM' if can_reset else 'VmRSS'})")
        check(growth < HOSTILE_RSS_BOUND,
              f"[hostile] the coordinator's peak RSS grew by "
              f"{growth / MIB:.1f} MiB (< {HOSTILE_RSS_BOUND // MIB} MiB) "
              f"under 3 messages of {HOSTILE_BYTES // MIB} MiB and 32 of "
              f"64 MiB")
        channel.close()
        check(coord.poll() is None, "[hostile] the coordinator is still up")
        c.start_worker(1)
        ready = c.wait_log("coordinator", "[shardlm] serving")
        check(ready, "[hostile] the real worker joins after the strangers"
              + ("" if ready else ":\n" + c.log("coordinator")[-800:]))
        if ready:
            check(c.serves(want), "[hostile] the cluster serves")
    finally:
        c.stop()


# --- mutual TLS ------------------------------------------------------------

def openssl(d: str, *args: str) -> None:
    subprocess.run(["openssl", *args], cwd=d, check=True,
                   capture_output=True, timeout=60)


def make_pki(d: str) -> None:
    """ca.pem (the cluster CA), node.pem/node.key (127.0.0.1, signed by
    ca: the coordinator's and the workers' certificate), other-ca.pem and
    stranger.pem/stranger.key (signed by other-ca), garbage.pem."""
    for ca in ("ca", "other-ca"):
        openssl(d, "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days",
                "2", "-subj", f"/CN=shardlm control test {ca}", "-keyout",
                f"{ca}.key", "-out", f"{ca}.pem")
    with open(os.path.join(d, "san.ext"), "w") as f:
        f.write("subjectAltName=IP:127.0.0.1,DNS:localhost\n")
    for name, ca in (("node", "ca"), ("stranger", "other-ca")):
        openssl(d, "req", "-newkey", "rsa:2048", "-nodes", "-subj",
                f"/CN=shardlm control test {name}", "-keyout", f"{name}.key",
                "-out", f"{name}.csr")
        openssl(d, "x509", "-req", "-in", f"{name}.csr", "-CA", f"{ca}.pem",
                "-CAkey", f"{ca}.key", "-CAcreateserial", "-days", "2",
                "-extfile", "san.ext", "-out", f"{name}.pem")
    with open(os.path.join(d, "garbage.pem"), "w") as f:
        f.write("-----BEGIN CERTIFICATE-----\nnot base64\n"
                "-----END CERTIFICATE-----\n")


def tls_flags(d: str, cert="node.pem", key="node.key", ca="ca.pem"):
    return ["--control-tls-cert", os.path.join(d, cert),
            "--control-tls-key", os.path.join(d, key),
            "--control-tls-ca", os.path.join(d, ca)]


def bad_flags(a, d: str) -> None:
    p = lambda n: os.path.join(d, n)  # noqa: E731
    cases = [
        (["--control-tls-cert", p("node.pem"), "--control-tls-key",
          p("stranger.key"), "--control-tls-ca", p("ca.pem")],
         "does not match"),
        (tls_flags(d, ca="missing-ca.pem"), "missing-ca.pem"),
        (tls_flags(d, ca="garbage.pem"), "garbage.pem"),
        (tls_flags(d, key="missing.key"), "missing.key"),
        (["--control-tls-cert", p("node.pem"), "--control-tls-key",
          p("node.key")], "--control-tls-ca"),
    ]
    for extra, needle in cases:
        for role in ("coordinator", "worker"):
            c = Cluster(a, "badflags")
            proc = (c.start_coordinator(extra) if role == "coordinator"
                    else c.start_worker(1, [*extra, "--join-timeout-s", "5"]))
            try:
                proc.wait(timeout=60)
            except subprocess.TimeoutExpired:
                pass
            c.stop()
            out = c.log(role if role == "coordinator" else "worker1")
            check(proc.returncode not in (0, None) and needle in out,
                  f"[mtls] {role} {' '.join(os.path.basename(x) for x in extra)}"
                  f" fails at start naming '{needle}' (exit "
                  f"{proc.returncode}: {out.strip()[-200:]})")


def mtls(a, d: str, want: str) -> None:
    c = Cluster(a, "mtls", tp=1, pp=2)
    try:
        c.start_coordinator(tls_flags(d))
        up = c.wait_log("coordinator", "waiting up to")
        check(up, "[mtls] the coordinator listens for workers over TLS")
        if not up:
            return
        # Strangers first: each must be refused and leave no trace.
        plain = c.start_worker(1, ["--join-timeout-s", "6"], name="plain")
        other = c.start_worker(1, [*tls_flags(d, "stranger.pem",
                                              "stranger.key"),
                                   "--join-timeout-s", "6"], name="other")
        # Trusts the right CA but has no certificate of its own.
        with open(os.path.join(d, "ca.pem"), "rb") as f:
            creds = grpc.ssl_channel_credentials(root_certificates=f.read())
        nocert = connect_status(raw_channel(c.control, creds),
                                register_message(1, b"nocert", TOKEN),
                                metadata=(("shardlm-cluster-token", TOKEN),),
                                timeout=10)
        check(nocert != grpc.StatusCode.OK,
              f"[mtls] a client without a certificate is refused ({nocert})")
        plaintext = connect_status(raw_channel(c.control),
                                   register_message(1, b"plain", TOKEN),
                                   metadata=(("shardlm-cluster-token", TOKEN),),
                                   timeout=10)
        check(plaintext == grpc.StatusCode.UNAVAILABLE,
              f"[mtls] plaintext gRPC to the TLS control plane is refused "
              f"({plaintext})")
        for name, proc in (("plain", plain), ("other", other)):
            try:
                proc.wait(timeout=60)
            except subprocess.TimeoutExpired:
                pass
            out = c.log(name)
            check(proc.returncode not in (0, None)
                  and "cannot reach the coordinator" in out,
                  f"[mtls] a worker {'without a certificate' if name == 'plain' else 'with another CA' + chr(39) + 's certificate'}"
                  f" is refused (exit {proc.returncode}: {out.strip()[-240:]})")
        check(c.procs["coordinator"].poll() is None,
              "[mtls] the coordinator is still waiting, undisturbed")
        for r in (1, 2):
            c.start_worker(r, tls_flags(d))
        ready = c.wait_log("coordinator", "[shardlm] serving")
        check(ready, "[mtls] tp 1 x pp 2 forms over mutual TLS (control "
              "stream and rendezvous store)"
              + ("" if ready else ":\n" + c.log("coordinator")[-800:]))
        if ready:
            check(c.serves(want), "[mtls] the cluster serves over mutual TLS")
    finally:
        c.stop()


def launch_mtls(a, d: str, want: str) -> None:
    mpirun = shutil.which("mpirun")
    if mpirun is None:
        skip("[launch]: no mpirun (scripts/install-deps.sh installs "
             "openmpi-bin)")
        return
    cmd = [mpirun, "--oversubscribe", "-np", "3"]
    if os.geteuid() == 0:
        cmd.append("--allow-run-as-root")
    bad = subprocess.run(
        [*cmd, a.shardlm, "launch", "--model", a.gguf, "--tp", "1", "--pp",
         "2", "--listen", f"127.0.0.1:{free_port()}",
         *tls_flags(d, ca="missing-ca.pem")],
        stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=120)
    check(bad.returncode != 0 and "missing-ca.pem" in bad.stderr,
          f"[launch] a missing --control-tls-ca fails at start naming the "
          f"file (exit {bad.returncode}: {bad.stderr.strip()[-200:]})")
    api = f"127.0.0.1:{free_port()}"
    log = os.path.join(a.workdir, "launch_mtls.log")
    proc = subprocess.Popen(
        [*cmd, a.shardlm, "launch", "--model", a.gguf, "--tp", "1", "--pp",
         "2", "--listen", api, *tls_flags(d)],
        stdin=subprocess.DEVNULL, stdout=open(log, "w"),
        stderr=subprocess.STDOUT, start_new_session=True)
    try:
        deadline = time.monotonic() + 180
        ready = False
        while time.monotonic() < deadline and proc.poll() is None:
            with open(log) as f:
                if "[shardlm] serving" in f.read():
                    ready = True
                    break
            time.sleep(0.3)
        with open(log) as f:
            text = f.read()
        check(ready, "[launch] mpirun ... launch --control-tls-* serves"
              + ("" if ready else ":\n" + text[-800:]))
        if ready:
            r = run([a.shardlm, "generate", "--server", api, "--prompt",
                     PROMPT, "--max-tokens", "8"], timeout=120)
            check(r.returncode == 0 and r.stdout == want,
                  f"[launch] its answer equals the local one ({r.stdout!r})")
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()


def main() -> int:
    ap = argparse.ArgumentParser(
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--shardlm", required=True)
    ap.add_argument("--gguf", required=True)
    ap.add_argument("--workdir", required=True)
    ap.add_argument("--only", choices=["hostile", "mtls", "launch"])
    a = ap.parse_args()
    os.makedirs(a.workdir, exist_ok=True)
    local = run([a.shardlm, "generate", "--model", a.gguf, "--prompt", PROMPT,
                 "--max-tokens", "8"])
    check(local.returncode == 0, f"local generate ({local.stderr[-300:]})")
    want = local.stdout
    if a.only in (None, "hostile"):
        hostile(a, want)
    if a.only in (None, "mtls", "launch"):
        d = os.path.join(a.workdir, "pki")
        os.makedirs(d, exist_ok=True)
        make_pki(d)
        if a.only in (None, "mtls"):
            bad_flags(a, d)
            mtls(a, d, want)
        if a.only in (None, "launch"):
            launch_mtls(a, d, want)
    return exit_code("all control-plane checks passed")


if __name__ == "__main__":
    sys.exit(main())
