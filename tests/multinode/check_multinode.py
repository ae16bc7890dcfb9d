#!/usr/bin/env python3
"""The cluster across hosts: mpirun over TCP between network namespaces.

Each "host" is a network namespace with its own address in 198.18.0.0/24,
its own host name (which resolves nowhere) and no route out; a bridge in a
namespace of its own joins them (tests/multinode/netns.py). mpirun starts
on host 0 and reaches the others through an rsh agent that enters their
namespace, with TCP as the only transport between ranks.

1. Equivalence: TP=2 x PP=2 with the coordinator on host 0 and the workers
   spread over the other hosts (one per host; then two per host, TP inside
   a host) answers a client on another host with the text and per-step
   log-probabilities of TP = PP = 1 in one process; the coordinator says
   which host holds which rank and advertises its address on the test
   subnet (not its host name); the TP peers' traffic crosses the link
   (an established TCP connection between their hosts) and no worker maps
   Open MPI's shared-memory segments.
2. A name is not an address: told to advertise its host name, the
   coordinator's workers say that the name does not resolve, and the
   launch ends on its startup timeout.
3. A pulled cable: host 3's link taken down mid-stream fails the stream
   with UNAVAILABLE naming rank 3 within 10 s and turns /ready to 503;
   with the link back, the cluster does not serve (UNAVAILABLE naming
   rank 3 again), and every worker process has exited within 20 s.

Needs root, `ip` (iproute2), `unshare` and `tc`; elsewhere it exits 77
(ctest: skipped) with the reason.

  check_multinode.py --shardlm BIN --gguf MODEL --workdir DIR
"""

from __future__ import annotations

import argparse
import contextlib
import os
import signal
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, ".."))
sys.path.insert(0, os.path.join(HERE, "..", "cluster"))
import check_cluster  # noqa: E402
from check_cluster import (KV, PROMPTS, check_like_local,  # noqa: E402
                           local_references)
from testlib import FAILURES, check  # noqa: E402

import netns  # noqa: E402

API_PORT = 50051  # Every namespace has its own ports.
HTTP_PORT = 8080


class Cluster(check_cluster.Cluster):
    """`mpirun ... shardlm launch` started on hosts[0] of `h` (waiting,
    stopping and the log's tail as in check_cluster.py)."""

    def __init__(self, h: netns.Hosts, a, hosts: list[int], slots: list[int],
                 tp: int, pp: int, log: str, extra: list[str] | tuple = ()):
        self.h, self.hosts, self.log_path = h, hosts, log
        self.log = open(log, "w")
        cmd = h.mpirun(hosts, slots) + [
            a.shardlm, "launch", "--model", a.gguf, "--tp", str(tp),
            "--pp", str(pp), "--listen", f"0.0.0.0:{API_PORT}",
            "--http-listen", f"0.0.0.0:{HTTP_PORT}",
            "--worker-timeout-ms", "3000", *extra]
        self.proc = subprocess.Popen(
            h.cmd(hosts[0], cmd), env=dict(os.environ, **h.agent_env()),
            stdout=self.log, stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL, start_new_session=True)
        self.server = f"{h.address(hosts[0])}:{API_PORT}"

    def text(self) -> str:
        with open(self.log_path) as f:
            return f.read()

    def stop(self) -> None:
        """Stops mpirun, then its ranks: mpirun can return before a rank in
        another namespace has closed its ports, and the next cluster on
        these hosts listens on the same ones (a CI run's next coordinator
        found 0.0.0.0:50051 still in use). Waits up to 20 s for them to
        exit, then kills what is left."""
        super().stop()
        deadline = time.time() + 20
        while (time.time() < deadline
               and any(self.shardlm_pids(x) for x in self.hosts)):
            time.sleep(0.2)
        left = [p for x in self.hosts for p in self.shardlm_pids(x)]
        for pid in left:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        deadline = time.time() + 10
        while (left and time.time() < deadline
               and any(self.shardlm_pids(x) for x in self.hosts)):
            time.sleep(0.2)

    def shardlm_pids(self, host: int) -> list[int]:
        pids = []
        out = subprocess.run(["ip", "netns", "pids", self.h.ns(host)],
                             capture_output=True, text=True).stdout.split()
        for pid in map(int, out):
            try:
                cmdline = open(f"/proc/{pid}/cmdline", "rb").read()
            except OSError:
                continue
            if b"shardlm\0launch" in cmdline:
                pids.append(pid)
        return pids


def established(h: netns.Hosts, host: int) -> set[tuple[str, str]]:
    """(local, remote) IPv4 addresses of host's established TCP connections."""
    def ip(hexaddr: str) -> str:
        b = bytes.fromhex(hexaddr.split(":")[0])
        return ".".join(str(x) for x in reversed(b))
    out = subprocess.run(["ip", "netns", "exec", h.ns(host), "cat",
                          "/proc/net/tcp"], capture_output=True,
                         text=True).stdout.splitlines()[1:]
    pairs = set()
    for line in out:
        f = line.split()
        if len(f) > 3 and f[3] == "01":
            pairs.add((ip(f[1]), ip(f[2])))
    return pairs


def equivalence(h: netns.Hosts, a, local: dict, hosts: list[int],
                slots: list[int], tag: str):
    c = Cluster(h, a, hosts, slots, 2, 2,
                os.path.join(a.workdir, f"{tag}.log"), KV)
    try:
        up = c.wait_serving()
        check(up, f"[{tag}] the cluster forms across hosts"
              + ("" if up else "\n" + c.tail()))
        if not up:
            return
        log = c.text()
        rank = 0
        where = {}  # rank -> host index
        for host, n in zip(hosts, slots):
            for _ in range(n):
                where[rank] = host
                rank += 1
        for host in hosts:
            ranks = [r for r, x in where.items() if x == host]
            line = next((l for l in log.splitlines() if l.startswith(
                f"[shardlm] host {h.hostname(host)} {h.address(host)}:")), "")
            named = all(f"{r} (" in line for r in ranks)
            check(named, f"[{tag}] the launch says host {h.hostname(host)} "
                  f"holds rank(s) {ranks} ({line!r})")
        dial = f"workers dial {h.address(hosts[0])}:"
        check(dial in log and h.hostname(hosts[0]) + ":" not in log.split(
            "workers dial")[1].splitlines()[0],
              f"[{tag}] the coordinator advertises its test-subnet address, "
              f"not its host name")
        client = next(x for x in range(h.n) if x != hosts[0])
        for p in PROMPTS:
            t0 = time.time()
            r = h.run(client, [a.shardlm, "generate", "--server", c.server,
                               "--prompt", p, "--max-tokens", "32",
                               "--ignore-eos", "--logprobs", "5"],
                      timeout=300)
            check_like_local(f"{tag}, client on host {client}", p, r, local[p],
                             time.time() - t0)
        # Ranks 1 and 2 are stage 0's TP pair: their all-reduces cross the
        # link when they sit on different hosts.
        if where[1] != where[2]:
            a1, a2 = h.address(where[1]), h.address(where[2])
            pairs = established(h, where[1])
            check((a1, a2) in pairs or (a1, a2) in {(r, l) for l, r in pairs},
                  f"[{tag}] ranks 1 and 2 talk TCP over the test subnet "
                  f"({a1} <-> {a2})")
        shm = []
        for host in set(where.values()) - {hosts[0]}:
            for pid in c.shardlm_pids(host):
                try:
                    maps = open(f"/proc/{pid}/maps").read()
                except OSError:
                    continue
                if "vader" in maps or "/dev/shm/" in maps:
                    shm.append(pid)
        check(not shm, f"[{tag}] no worker maps shared memory ({shm})")
    finally:
        c.stop()


HTTP_GET = """
import sys, urllib.error, urllib.request
try:
    print(urllib.request.urlopen(sys.argv[1], timeout=3).status)
except urllib.error.HTTPError as e:
    print(e.code)
except OSError as e:
    print(e)
"""


def http_status(h: netns.Hosts, host: int, path: str) -> str:
    """The status of GET path on host's HTTP API, asked from that host."""
    r = h.run(host, [sys.executable, "-c", HTTP_GET,
                     f"http://127.0.0.1:{HTTP_PORT}{path}"], timeout=10)
    return r.stdout.strip()


def pulled_cable(h: netns.Hosts, a):
    hosts, victim = [0, 1, 2, 3, 4], 3
    c = Cluster(h, a, hosts, [1] * 5, 2, 2,
                os.path.join(a.workdir, "link_down.log"))
    try:
        up = c.wait_serving()
        check(up, "[link] the cluster forms" + ("" if up else "\n" + c.tail()))
        if not up:
            return
        check(http_status(h, 0, "/ready") == "200", "[link] /ready is 200")
        client = subprocess.Popen(
            h.cmd(1, [a.shardlm, "generate", "--server", c.server, "--prompt",
                      "Tell me a long story about a dragon.", "--max-tokens",
                      "3000", "--ignore-eos"]),
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        first = client.stdout.read(1)  # Generating: a token arrived.
        h.link(victim, up=False)
        pulled = time.time()
        try:
            out, err = client.communicate(timeout=60)
        except subprocess.TimeoutExpired:
            client.kill()
            out, err = client.communicate()
            err += " (hung: killed after 60 s)"
        took = time.time() - pulled
        check(client.returncode != 0 and "UNAVAILABLE" in err
              and f"rank {victim}" in err,
              f"[link] the stream fails with UNAVAILABLE naming rank {victim} "
              f"({err.strip()[-300:]})")
        check(took <= 10, f"[link] within 10 s of the link going down "
              f"({took:.1f}s)")
        check(len(first + out) > 0, "[link] tokens streamed before")
        ready = http_status(h, 0, "/ready")
        check(ready == "503", f"[link] /ready is 503 ({ready})")
        h.link(victim, up=True)
        # The event to wait for: the workers see the failed cluster once
        # the link is back, and exit; then the cluster must stay failed.
        deadline = time.time() + 20
        left = []
        while time.time() < deadline:
            left = [p for x in hosts[1:] for p in c.shardlm_pids(x)]
            if not left:
                break
            time.sleep(0.5)
        check(not left, f"[link] every worker process exits within 20 s of "
              f"the link's return (left: {left})\n" + c.tail())
        r = h.run(1, [a.shardlm, "generate", "--server", c.server, "--prompt",
                      "hi", "--max-tokens", "4"], timeout=30)
        check(r.returncode != 0 and "UNAVAILABLE" in r.stderr
              and f"rank {victim}" in r.stderr,
              f"[link] with the link back, requests still fail naming rank "
              f"{victim}, not half-served ({r.stderr.strip()[-200:]})")
        check(c.proc.poll() is None and c.shardlm_pids(0),
              "[link] the coordinator stays up to answer")
    finally:
        c.stop()


def unresolvable_name(h: netns.Hosts, a):
    """A coordinator told to advertise its host name (which resolves
    nowhere, as on many real nodes): the workers say so, and the launch
    ends on its startup timeout instead of hanging."""
    c = Cluster(h, a, [0, 1, 2], [1, 1, 1], 1, 2,
                os.path.join(a.workdir, "unresolvable.log"),
                ["--advertise-address", h.hostname(0),
                 "--startup-timeout-s", "8"])
    try:
        try:
            c.proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            pass
        log = c.text()
        check(c.proc.poll() is not None, "[name] the launch ends")
        check(f"the name '{h.hostname(0)}' does not resolve" in log,
              "[name] the workers say the advertised name does not resolve"
              + ("" if "does not resolve" in log else "\n" + c.tail()))
        check("never registered" in log,
              "[name] the coordinator names the ranks that never registered")
    finally:
        c.stop()


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--shardlm", required=True)
    ap.add_argument("--gguf", required=True)
    ap.add_argument("--workdir", required=True)
    a = ap.parse_args()
    a.shardlm, a.gguf = os.path.abspath(a.shardlm), os.path.abspath(a.gguf)
    why = netns.unavailable()
    if why:
        print(f"SKIP: {why}")
        return 77
    os.makedirs(a.workdir, exist_ok=True)
    local = local_references(a, a.gguf, "one process")
    with netns.Hosts(5) as h:
        equivalence(h, a, local, [0, 1, 2, 3, 4], [1] * 5, "5 hosts")
        equivalence(h, a, local, [0, 1, 2], [1, 2, 2], "3 hosts")
        pulled_cable(h, a)
        unresolvable_name(h, a)
    left = [l for l in subprocess.run(["ip", "netns", "list"],
                                      capture_output=True,
                                      text=True).stdout.splitlines()
            if l.startswith(h.tag)]
    check(not left, f"the namespaces are gone ({left})")
    print(f"{len(FAILURES)} failed" if FAILURES else "all multinode checks passed")
    return 1 if FAILURES else 0


if __name__ == "__main__":
    sys.exit(main())
