"""Hosts on one machine: network namespaces joined by a bridge.

`Hosts(n)` makes n "hosts", each a network namespace with one veth link
to a bridge that lives in a namespace of its own (the switch), an address
in a benchmarking subnet (198.18.0.0/15, RFC 2544: never routed on the
Internet), loopback up and no default route. Nothing is attached to the
root namespace, so no packet of the test can leave the machine. Each host
also gets its own host name (a UTS namespace entered per command), which
resolves nowhere: as on real nodes, a name is not an address.

Commands enter a host with `Hosts.cmd(i, argv)`; mpirun reaches the other
hosts through `netns-rsh` (its rsh agent), which maps a host's address to
its namespace. Everything is deleted on exit, on failure, and on SIGTERM;
namespaces left by a killed earlier run (its pid gone) are deleted first.

    with Hosts(5) as h:
        h.run(0, ["ip", "addr"])
        h.link(3, up=False)     # host 3's cable pulled
        h.shape(1, "100mbit")   # host 1's link shaped by tc tbf
"""

from __future__ import annotations

import os
import re
import shutil
import signal
import subprocess

PREFIX = "slm"
AGENT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "netns-rsh")


def unavailable() -> str:
    """Why hosts cannot be made here ("" when they can)."""
    if os.geteuid() != 0:
        return "network namespaces need root"
    for tool in ("ip", "unshare", "tc"):
        if shutil.which(tool) is None:
            return f"'{tool}' is not installed"
    probe = f"{PREFIX}probe{os.getpid()}"
    r = subprocess.run(["ip", "netns", "add", probe], capture_output=True,
                       text=True)
    if r.returncode != 0:
        return f"cannot make a network namespace: {r.stderr.strip()}"
    subprocess.run(["ip", "netns", "del", probe], capture_output=True)
    return ""


def _sh(*argv: str, check: bool = True) -> subprocess.CompletedProcess:
    r = subprocess.run(list(argv), capture_output=True, text=True)
    if check and r.returncode != 0:
        raise RuntimeError(f"{' '.join(argv)}: {r.stderr.strip()}")
    return r


def remove_stale() -> None:
    """Deletes namespaces of earlier runs whose process is gone."""
    for line in _sh("ip", "netns", "list").stdout.splitlines():
        m = re.match(rf"({PREFIX}(\d+)\w*)", line)
        if m and not os.path.exists(f"/proc/{m.group(2)}"):
            _sh("ip", "netns", "del", m.group(1), check=False)


class Hosts:
    def __init__(self, n: int, subnet: int = 0):
        self.n = n
        self.tag = f"{PREFIX}{os.getpid()}"
        self.switch = f"{self.tag}sw"
        self.net = f"198.18.{subnet}"
        self.cidr = f"{self.net}.0/24"
        self.made: list[str] = []
        self._old_term = None

    def ns(self, i: int) -> str:
        return f"{self.tag}h{i}"

    def address(self, i: int) -> str:
        return f"{self.net}.{i + 1}"

    def hostname(self, i: int) -> str:
        return f"node{i}"

    def __enter__(self) -> "Hosts":
        remove_stale()
        # A SIGTERM (ctest's timeout) still deletes the namespaces.
        self._old_term = signal.signal(
            signal.SIGTERM, lambda *_: (self.close(), os._exit(143)))
        try:
            self._make()
        except BaseException:
            self.close()
            raise
        return self

    def __exit__(self, *exc) -> None:
        self.close()
        if self._old_term is not None:
            signal.signal(signal.SIGTERM, self._old_term)

    def _make(self) -> None:
        _sh("ip", "netns", "add", self.switch)
        self.made.append(self.switch)
        sw = ["ip", "netns", "exec", self.switch]
        _sh(*sw, "ip", "link", "add", "br0", "type", "bridge")
        _sh(*sw, "ip", "link", "set", "br0", "up")
        for i in range(self.n):
            ns = self.ns(i)
            _sh("ip", "netns", "add", ns)
            self.made.append(ns)
            _sh("ip", "link", "add", "eth0", "netns", ns, "type", "veth",
                "peer", "name", f"port{i}", "netns", self.switch)
            _sh(*sw, "ip", "link", "set", f"port{i}", "master", "br0")
            _sh(*sw, "ip", "link", "set", f"port{i}", "up")
            h = ["ip", "netns", "exec", ns]
            _sh(*h, "ip", "addr", "add", f"{self.address(i)}/24", "dev", "eth0")
            _sh(*h, "ip", "link", "set", "eth0", "up")
            _sh(*h, "ip", "link", "set", "lo", "up")
            routes = _sh(*h, "ip", "route", "show").stdout
            if "default" in routes:
                raise RuntimeError(f"{ns} has a default route: {routes}")

    def close(self) -> None:
        # Processes left in a namespace keep it alive: end them first.
        for ns in self.made:
            pids = _sh("ip", "netns", "pids", ns, check=False).stdout.split()
            for pid in pids:
                try:
                    os.kill(int(pid), signal.SIGKILL)
                except (OSError, ValueError):
                    pass
        for ns in reversed(self.made):
            _sh("ip", "netns", "del", ns, check=False)
        self.made = []

    def cmd(self, i: int, argv: list[str]) -> list[str]:
        """argv run on host i: its namespace and its host name."""
        return ["ip", "netns", "exec", self.ns(i), "unshare", "--uts", "sh",
                "-c", 'hostname "$0" && exec "$@"', self.hostname(i), *argv]

    def run(self, i: int, argv: list[str], timeout: float = 60,
            **kw) -> subprocess.CompletedProcess:
        return subprocess.run(self.cmd(i, argv), capture_output=True,
                              text=True, timeout=timeout,
                              stdin=subprocess.DEVNULL, **kw)

    def agent_env(self) -> dict[str, str]:
        """Environment for mpirun's rsh agent: address -> namespace, name."""
        return {"SHARDLM_NETNS_HOSTS": " ".join(
            f"{self.address(i)}={self.ns(i)}={self.hostname(i)}"
            for i in range(self.n))}

    def mpirun(self, hosts: list[int], slots: list[int]) -> list[str]:
        """mpirun across `hosts` (with `slots` ranks each, in rank order),
        over TCP on the test subnet only: no shared memory, no loopback
        between ranks, no other interface. Run it on hosts[0]."""
        hostfile = os.path.join("/tmp", f"{self.tag}.hosts")
        with open(hostfile, "w") as f:
            for i, s in zip(hosts, slots):
                f.write(f"{self.address(i)} slots={s}\n")
        argv = ["mpirun", "--hostfile", hostfile, "-np", str(sum(slots)),
                "--map-by", "slot", "--enable-recovery",
                "--mca", "plm_rsh_agent", AGENT,
                "--mca", "pml", "ob1", "--mca", "btl", "tcp,self",
                "--mca", "btl_tcp_if_include", self.cidr,
                "--mca", "oob_tcp_if_include", self.cidr,
                "-x", "SHARDLM_NETNS_HOSTS"]
        if os.geteuid() == 0:
            argv.insert(1, "--allow-run-as-root")
        return argv

    def link(self, i: int, up: bool) -> None:
        """Host i's cable in or out (the switch's port, as a pulled plug)."""
        _sh("ip", "netns", "exec", self.switch, "ip", "link", "set",
            f"port{i}", "up" if up else "down")

    def shape(self, i: int, rate: str | None) -> None:
        """Host i's link (both directions) shaped to `rate` ("1gbit",
        "100mbit"...) by tc tbf, or unshaped with None. The bucket holds
        10 ms of traffic (at least 32 KiB), as a real NIC's queue would."""
        for ns, dev in ((self.ns(i), "eth0"), (self.switch, f"port{i}")):
            _sh("ip", "netns", "exec", ns, "tc", "qdisc", "del", "dev", dev,
                "root", check=False)
            if rate is not None:
                m = re.fullmatch(r"(\d+)([kmg]?)bit", rate)
                if not m:
                    raise ValueError(f"rate '{rate}': want e.g. 100mbit")
                bits = int(m.group(1)) * {"": 1, "k": 10**3, "m": 10**6,
                                          "g": 10**9}[m.group(2)]
                burst = max(32 * 1024, bits // 8 // 100)
                _sh("ip", "netns", "exec", ns, "tc", "qdisc", "add", "dev",
                    dev, "root", "tbf", "rate", rate, "burst", str(burst),
                    "latency", "50ms")
