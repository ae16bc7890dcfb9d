#!/usr/bin/env python3
"""/metrics of a real cluster, and the dashboards and alerts built on it.

A TP=2 cluster under mpirun (a coordinator and two worker processes) with
the HTTP API, moved into a memory cgroup with an 8 GiB limit when one can
be made here, answers a few requests; then its /metrics scrape must:

1. show every rank's memory and step-time series: resident bytes, the
   cgroup limit (when the cgroup was made), weights and KV bytes, steps,
   seconds in steps and in communication, heartbeat age, up;
2. carry every metric that deploy/monitoring/alerts.yaml and
   grafana-dashboard.json query;
3. pass `promtool check metrics`, and the rules `promtool check rules`
   (Debian's prometheus package; without it the script exits 77, skipped).

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


def make_cgroup() -> str | None:
    """A memory cgroup limited to LIMIT (v2, else v1); its cgroup.procs
    path, or None when none can be made here."""
    name = f"shardlm-test-{os.getpid()}"
    for root, limit_file in (("/sys/fs/cgroup", "memory.max"),
                             ("/sys/fs/cgroup/memory",
                              "memory.limit_in_bytes")):
        path = os.path.join(root, name)
        try:
            os.mkdir(path)
        except OSError:
            continue
        if not os.path.exists(os.path.join(path, "cgroup.procs")):
            os.rmdir(path)  # A plain directory: no cgroup hierarchy here.
            continue
        try:
            with open(os.path.join(path, limit_file), "w") as f:
                f.write(str(LIMIT))
            return os.path.join(path, "cgroup.procs")
        except OSError:
            os.rmdir(path)
    return None


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
    procs = make_cgroup()
    try:
        up = c.wait_serving()
        check(up, "the cluster serves" + ("" if up else "\n" + c.tail()))
        if not up:
            return 1
        if procs:
            for pid in c.worker_pids().values():
                with open(procs, "w") as f:
                    f.write(str(pid))
        else:
            print("note: no memory cgroup can be made here; the limit "
                  "series are not checked")
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
        check(m.get("shardlm_ready") == 1, "shardlm_ready is 1")
        check(any(k.startswith("shardlm_build_info{") and 'ranks="2"' in k
                  and 'kv_cache_dtype="f16"' in k for k in m),
              "shardlm_build_info names the ranks and the KV dtype")
        present = {re.sub(r"\{.*", "", k) for k in m}
        for name in sorted(queried_metrics()):
            if name in CONDITIONAL and not procs:
                print(f"note: {name} not checked ({CONDITIONAL[name]})")
                continue
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
                if procs:
                    os.rmdir(os.path.dirname(procs))
                break
            except OSError:
                time.sleep(0.1)
    return exit_code("all monitoring checks passed")


if __name__ == "__main__":
    sys.exit(main())
