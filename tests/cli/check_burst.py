#!/usr/bin/env python3
"""A burst of 2,000 concurrent gRPC streams against `shardlm serve`.

Every stream either completes (a finish reason and its tokens) or is
refused with RESOURCE_EXHAUSTED (the gRPC call cap, --max-grpc-calls, or the
engine's queue, max_queued): nothing else, nothing lost, nothing hangs. The
server's peak resident memory stays within a bound above its idle level,
and it answers a normal request afterwards. Also: a priority above
--max-client-priority is refused, naming the flag.

  check_burst.py --shardlm BIN --gguf MODEL --workdir DIR
"""

from __future__ import annotations

import argparse
import asyncio
import os
import subprocess
import sys
from pathlib import Path

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, ".."))
sys.path.insert(0, os.path.join(HERE, "..", "..", "examples", "python"))
from testlib import FAILURES, check, start_serve, stop, wait_ready  # noqa: E402

STREAMS = 2000
CHANNELS = 8
RSS_BOUND = 768 << 20  # Peak over idle; measured about a quarter of it.


def kib(pid: int, field: str) -> int:
    for line in open(f"/proc/{pid}/status"):
        if line.startswith(field + ":"):
            return int(line.split()[1]) * 1024
    return 0


async def burst(address: str, pb2, pb2_grpc) -> dict[str, int]:
    import grpc
    outcomes: dict[str, int] = {}
    channels = [grpc.aio.insecure_channel(address) for _ in range(CHANNELS)]

    async def one(i: int) -> None:
        stub = pb2_grpc.InferenceStub(channels[i % CHANNELS])
        req = pb2.GenerateRequest(prompt=f"Count to {i % 50}:", max_tokens=4,
                                  ignore_eos=True)
        try:
            tokens, finish = 0, ""
            async for r in stub.Generate(req, timeout=300):
                tokens += len(r.token_ids)
                finish = r.finish_reason or finish
            key = "ok" if finish == "length" and tokens == 4 else \
                f"incomplete({finish},{tokens})"
        except grpc.aio.AioRpcError as e:
            key = e.code().name
        outcomes[key] = outcomes.get(key, 0) + 1

    await asyncio.gather(*(one(i) for i in range(STREAMS)))
    for c in channels:
        await c.close()
    return outcomes


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--shardlm", required=True)
    ap.add_argument("--gguf", required=True)
    ap.add_argument("--workdir", required=True)
    a = ap.parse_args()
    os.makedirs(a.workdir, exist_ok=True)
    import generate  # examples/python/generate.py: generates the stubs.
    pb2, pb2_grpc = generate.load_stubs(Path(a.workdir) / "stubs")
    server, addr = start_serve(a.shardlm, a.gguf, ["--threads", "2"])
    try:
        if not wait_ready(a.shardlm, addr, server):
            check(False, "the server starts")
            return 1
        idle = kib(server.pid, "VmRSS")
        outcomes = asyncio.run(burst(addr, pb2, pb2_grpc))
        peak = kib(server.pid, "VmHWM")
        ok = outcomes.get("ok", 0)
        refused = outcomes.get("RESOURCE_EXHAUSTED", 0)
        check(ok + refused == STREAMS,
              f"{STREAMS} concurrent streams: each completes or gets "
              f"RESOURCE_EXHAUSTED ({outcomes})")
        check(ok >= 256, f"at least the engine's queue is served ({ok})")
        check(peak - idle < RSS_BOUND,
              f"peak RSS {peak >> 20} MiB, {(peak - idle) >> 20} MiB over "
              f"idle (bound {RSS_BOUND >> 20} MiB)")
        r = subprocess.run([a.shardlm, "generate", "--server", addr,
                            "--prompt", "Hello", "--max-tokens", "3"],
                           capture_output=True, text=True, timeout=60)
        check(r.returncode == 0 and server.poll() is None,
              "the server still answers after the burst")
        import grpc
        with grpc.insecure_channel(addr) as channel:
            stub = pb2_grpc.InferenceStub(channel)
            try:
                list(stub.Generate(pb2.GenerateRequest(
                    prompt="Hello", max_tokens=3, priority=5), timeout=60))
                code, message = "OK", ""
            except grpc.RpcError as e:
                code, message = e.code().name, e.details()
        check(code == "INVALID_ARGUMENT" and "--max-client-priority" in message,
              f"priority 5 above the default limit 0 is refused "
              f"({code}: {message})")
    finally:
        stop(server)
    print(f"{len(FAILURES)} failed" if FAILURES else
          "all burst checks passed")
    return 1 if FAILURES else 0


if __name__ == "__main__":
    sys.exit(main())
