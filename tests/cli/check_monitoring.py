#!/usr/bin/env python3
"""/metrics of a real cluster, and the dashboards and alerts built on it.

A TP=2 cluster under mpirun (a coordinator and two worker processes) with
the HTTP API, moved into a memory cgroup with an 8 GiB limit (cgroup v1's
memory hierarchy or cgroup v2; root needed), answers a few requests; then
its /metrics scrape must:

1. show every rank's memory and step-time series: resident bytes, the
   cgroup limit (every rank's and the coordinator's), weights and KV
   bytes, steps, seconds in steps and in communication, heartbeat age, up;
2. carry every metric that deploy/monitoring/alerts.yaml and
   grafana-dashboard.json query;
3. pass `promtool check metrics`, and the rules `promtool check rules`
   (Debian's prometheus package).

A part that cannot run here (no memory cgroup can be made, no promtool)
is named on a "SKIP" line after every other check ran, and the script
exits 77 (skipped); any failed check makes it exit 1.

  check_monitoring.py --shardlm BIN --gguf MODEL --workdir DIR
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import time
import urllib.request

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.join(HERE, "..", "..")
sys.path.insert(0, os.path.join(HERE, ".."))
sys.path.insert(0, os.path.join(HERE, "..", "cluster"))
from check_cluster import Cluster, generate  # noqa: E402
from testlib import (check, exit_code, free_port,  # noqa: E402
                     prometheus_series, skip)

MONITORING = os.path.join(ROOT, "deploy", "monitoring")
LIMIT = 8 << 30
# Series present only in some conditions, with the reason.
CONDITIONAL = {
    "shardlm_rank_memory_limit_bytes": "only under a cgroup memory limit",
    "shardlm_process_memory_limit_bytes": "only under a cgroup memory limit",
}


def own_group(controller: str) -> str:
    """This process's group in one hierarchy, from /proc/self/cgroup:
    "0::/path" for cgroup v2 (controller ""), "N:memory:/path" for v1's
    memory controller; "/" when not named."""
    try:
        with open("/proc/self/cgroup") as f:
            for line in f:
                _, names, path = line.rstrip("\n").split(":", 2)
                if names.split(",") == [controller] or (
                        not controller and names == ""):
                    return path or "/"
    except (OSError, ValueError):
        pass
    return "/"


def make_cgroup() -> tuple[str | None, str]:
    """A memory cgroup limited to LIMIT: (its cgroup.procs path, where it
    is), or (None, why none can be made here, each place tried).

    cgroup v1's memory hierarchy (/sys/fs/cgroup/memory): a child of this
    process's own memory group (so the test's processes stay inside
    whatever accounts for it), else of the hierarchy's root. cgroup v2
    (/sys/fs/cgroup): a child of the root, with the memory controller
    enabled for the root's children if it is not yet (refused inside a
    container whose root group holds processes: then the reason says so).
    A /sys/fs/cgroup that is a plain tmpfs (the hybrid layout) is no v2
    hierarchy and is not written to."""
    name = f"shardlm-test-{os.getpid()}"
    tried = []
    v1 = "/sys/fs/cgroup/memory"
    v2 = "/sys/fs/cgroup"
    candidates = []
    if os.path.exists(os.path.join(v1, "cgroup.procs")):
        own = own_group("memory")
        parents = [os.path.normpath(v1 + own)] if own != "/" else []
        candidates += [(p, "memory.limit_in_bytes", None)
                       for p in parents + [v1]]
    else:
        tried.append(f"{v1}: no cgroup v1 memory hierarchy mounted")
    if os.path.exists(os.path.join(v2, "cgroup.controllers")):
        candidates.append((v2, "memory.max", "cgroup.subtree_control"))
    else:
        tried.append(f"{v2}: not a cgroup v2 hierarchy (no "
                     "cgroup.controllers)")
    for parent, limit_file, subtree in candidates:
        if subtree is not None:
            try:
                with open(os.path.join(parent, "cgroup.controllers")) as f:
                    if "memory" not in f.read().split():
                        tried.append(f"{parent}: the memory controller is "
                                     "not available to this hierarchy")
                        continue
                with open(os.path.join(parent, subtree)) as f:
                    enabled = "memory" in f.read().split()
                if not enabled:
                    with open(os.path.join(parent, subtree), "w") as f:
                        f.write("+memory")
            except OSError as e:
                tried.append(f"{parent}: cannot enable the memory "
                             f"controller for its children ({e})")
                continue
        path = os.path.join(parent, name)
        try:
            os.mkdir(path)
        except OSError as e:
            tried.append(f"mkdir {path}: {e}")
            continue
        try:
            with open(os.path.join(path, limit_file), "w") as f:
                f.write(str(LIMIT))
            return os.path.join(path, "cgroup.procs"), path
        except OSError as e:
            tried.append(f"{path}/{limit_file}: {e}")
            os.rmdir(path)
    return None, "; ".join(tried) or "no cgroup hierarchy found"


def scrape(url: str) -> str:
    return urllib.request.urlopen(url, timeout=10).read().decode()


def queried_metrics() -> set[str]:
    """Metric names the alert rules and the dashboard's queries use."""
    texts = [open(os.path.join(MONITORING, "alerts.yaml")).read()]
    dash = json.load(open(os.path.join(MONITORING, "grafana-dashboard.json")))
    texts += [t["expr"] for p in dash["panels"] for t in p["targets"]]
    return {m for t in texts for m in re.findall(r"\bshardlm_[a-z0-9_]+", t)}


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--shardlm", required=True)
    ap.add_argument("--gguf", required=True)
    ap.add_argument("--workdir", required=True)
    a = ap.parse_args()
    os.makedirs(a.workdir, exist_ok=True)
    http = f"127.0.0.1:{free_port()}"
    c = Cluster(a.shardlm, a.gguf, 2, 1, os.path.join(a.workdir, "cluster.log"),
                ["--http-listen", http])
    procs, where = make_cgroup()
    cgroup_dir = os.path.dirname(procs) if procs else None
    try:
        up = c.wait_serving()
        check(up, "the cluster serves" + ("" if up else "\n" + c.tail()))
        if not up:
            return 1
        if procs:
            pids = c.worker_pids()
            check(sorted(pids) == [0, 1, 2],
                  f"the cluster's three ranks found ({pids})")
            try:
                for pid in pids.values():
                    with open(procs, "w") as f:
                        f.write(str(pid))
                print(f"ranks {sorted(pids)} moved into {where} "
                      f"(limit {LIMIT} B)")
            except OSError as e:
                where = f"cannot move a rank into {where} ({e})"
                procs = None
        if not procs:
            skip(f"cgroup checks (every rank's and the coordinator's "
                 f"memory limit series): no memory cgroup could be used "
                 f"here: {where}")
        for prompt in ("The capital of France is", "def add(a, b):"):
            r = generate(a.shardlm, ["--server", c.address], prompt, 8)
            check(r.returncode == 0, f"{prompt!r} answered")
        # The figures of the last steps come with each rank's next
        # heartbeat: scrape until both ranks' steps are counted, with a
        # deadline, instead of sleeping a fixed time.
        deadline = time.monotonic() + 30
        while True:
            text = scrape(f"http://{http}/metrics")
            steps = prometheus_series(text)
            if all(steps.get(f'shardlm_rank_steps_total{{rank="{r}"}}', -1)
                   >= 16 for r in (1, 2)) or time.monotonic() > deadline:
                break
            time.sleep(0.2)
        with open(os.path.join(a.workdir, "metrics.txt"), "w") as f:
            f.write(text)
        m = prometheus_series(text)
        for rank in (1, 2):
            def get(name: str, extra: str = "") -> float:
                return m.get(f'{name}{{rank="{rank}"{extra}}}', -1)
            check(get("shardlm_rank_up") == 1, f"rank {rank} is up")
            check(get("shardlm_rank_resident_memory_bytes") > 20 << 20,
                  f"rank {rank}'s resident memory "
                  f"({get('shardlm_rank_resident_memory_bytes'):.0f} B)")
            if procs:
                check(get("shardlm_rank_memory_limit_bytes") == LIMIT,
                      f"rank {rank}'s cgroup limit "
                      f"({get('shardlm_rank_memory_limit_bytes'):.0f})")
            check(get("shardlm_rank_weight_bytes") > 1 << 20,
                  f"rank {rank}'s weight bytes")
            check(get("shardlm_rank_kv_cache_bytes", ',tier="device"') > 0,
                  f"rank {rank}'s device KV bytes")
            check(get("shardlm_rank_steps_total") >= 16,
                  f"rank {rank}'s steps ({get('shardlm_rank_steps_total'):g})")
            check(0 < get("shardlm_rank_communication_seconds_total")
                  < get("shardlm_rank_step_seconds_total"),
                  f"rank {rank}'s communication time within its step time")
            # TP=2: both ranks are pipeline stage 0.
            compute = get("shardlm_rank_compute_seconds_total", ',stage="0"')
            check(abs(compute - (get("shardlm_rank_step_seconds_total")
                                 - get("shardlm_rank_communication_seconds_total")))
                  < 1e-3 and compute > 0,
                  f"rank {rank}'s compute seconds, stage 0 ({compute:g})")
            check(0 <= get("shardlm_rank_heartbeat_age_seconds") < 3,
                  f"rank {rank}'s heartbeat age "
                  f"({get('shardlm_rank_heartbeat_age_seconds'):.2f}s)")
        if procs:
            check(m.get("shardlm_process_memory_limit_bytes") == LIMIT,
                  f"the coordinator's cgroup limit "
                  f"({m.get('shardlm_process_memory_limit_bytes')})")
        check(m.get("shardlm_ready") == 1, "shardlm_ready is 1")
        check(any(k.startswith("shardlm_build_info{") and 'ranks="2"' in k
                  and 'kv_cache_dtype="f16"' in k
                  and 'precision="exact"' in k for k in m),
              "shardlm_build_info names the ranks, the KV dtype and the "
              "precision")
        present = {re.sub(r"\{.*", "", k) for k in m}
        for name in sorted(queried_metrics()):
            if name in CONDITIONAL and not procs:
                continue  # Part of the cgroup checks skipped above.
            found = name in present or f"{name}_bucket" in present
            check(found, f"{name}, queried by deploy/monitoring, is scraped")
        promtool = shutil.which("promtool")
        if promtool is None:
            skip("promtool checks: promtool is not installed "
                 "(scripts/install-deps.sh installs Debian's prometheus)")
        else:
            r = subprocess.run([promtool, "check", "metrics"], input=text,
                               capture_output=True, text=True)
            check(r.returncode == 0, "promtool check metrics "
                  f"({(r.stdout + r.stderr).strip()[-500:]})")
            r = subprocess.run([promtool, "check", "rules",
                                os.path.join(MONITORING, "alerts.yaml")],
                               capture_output=True, text=True)
            check(r.returncode == 0, "promtool check rules "
                  f"({(r.stdout + r.stderr).strip()[-500:]})")
    finally:
        c.stop()
        for _ in range(50):  # Empty once the exited processes are reaped.
            try:
                if cgroup_dir:
                    os.rmdir(cgroup_dir)
                break
            except OSError:
                time.sleep(0.1)
    return exit_code("all monitoring checks passed")


if __name__ == "__main__":
    sys.exit(main())
