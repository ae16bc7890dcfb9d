#!/usr/bin/env python3
"""Streams a completion from a shardlm server over the public gRPC API.

  python examples/python/generate.py --server 127.0.0.1:50051 \
      --prompt "The capital of France is" --max-tokens 24

The Python stubs are generated from proto/shardlm/v1/inference.proto with
grpcio-tools on first use (and again whenever the .proto is newer) into
--stubs-dir, by default examples/python/_generated/ (git-ignored).
"""

from __future__ import annotations

import argparse
import importlib
import os
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
PROTO_ROOT = HERE.parent.parent / "proto"
PROTO = "shardlm/v1/inference.proto"


def load_stubs(stubs_dir: Path):
    """Returns (inference_pb2, inference_pb2_grpc), generating them if needed."""
    proto = PROTO_ROOT / PROTO
    out = stubs_dir / "shardlm" / "v1"
    pb2 = out / "inference_pb2.py"
    pb2_grpc = out / "inference_pb2_grpc.py"
    stale = (not pb2.exists() or not pb2_grpc.exists()
             or pb2.stat().st_mtime < proto.stat().st_mtime)
    if stale:
        from grpc_tools import protoc  # grpcio-tools
        stubs_dir.mkdir(parents=True, exist_ok=True)
        rc = protoc.main([
            "grpc_tools.protoc", f"-I{PROTO_ROOT}",
            f"--python_out={stubs_dir}", f"--grpc_python_out={stubs_dir}",
            str(proto)])
        if rc != 0:
            sys.exit(f"generate.py: protoc failed on {proto} (exit {rc})")
    # The generated _grpc module imports `shardlm.v1.inference_pb2`;
    # shardlm/ and shardlm/v1/ are namespace packages under stubs_dir.
    sys.path.insert(0, str(stubs_dir))
    return (importlib.import_module("shardlm.v1.inference_pb2"),
            importlib.import_module("shardlm.v1.inference_pb2_grpc"))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--server", required=True, help="HOST:PORT of shardlm serve")
    ap.add_argument("--prompt", required=True, help="text to complete")
    ap.add_argument("--max-tokens", type=int, default=128)
    ap.add_argument("--temperature", type=float, default=0.0, help="0 = greedy")
    ap.add_argument("--top-k", type=int, default=0, help="0 = off")
    ap.add_argument("--top-p", type=float, default=1.0, help="1 = off")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--ignore-eos", action="store_true")
    ap.add_argument("--stop", action="append", default=[],
                    help="end where the text contains this (repeatable)")
    ap.add_argument("--logprobs", type=int, default=0,
                    help="print each token's logprob and N alternatives "
                         "to stderr (0 = off, at most 20)")
    ap.add_argument("--chat", action="store_true",
                    help="send the prompt as a user message; the server "
                         "renders it in its model's chat format")
    ap.add_argument("--tls-ca", type=Path,
                    help="PEM CA of the server's certificate: connect with TLS")
    ap.add_argument("--tls-cert", type=Path,
                    help="PEM client certificate for mutual TLS (with "
                         "--tls-key and --tls-ca)")
    ap.add_argument("--tls-key", type=Path, help="PEM key of --tls-cert")
    ap.add_argument("--timeout", type=float, default=300.0,
                    help="deadline of the request in seconds")
    ap.add_argument("--stubs-dir", type=Path,
                    default=Path(os.environ.get("SHARDLM_PY_STUBS",
                                                HERE / "_generated")),
                    help="where the generated stubs are cached")
    a = ap.parse_args()

    import grpc
    pb2, pb2_grpc = load_stubs(a.stubs_dir)

    text = {"messages": [pb2.ChatMessage(role="user", content=a.prompt)]} \
        if a.chat else {"prompt": a.prompt}
    request = pb2.GenerateRequest(
        **text,
        max_tokens=a.max_tokens,
        ignore_eos=a.ignore_eos,
        stop=a.stop,
        logprobs=a.logprobs,
        sampling=pb2.SamplingParams(temperature=a.temperature, top_k=a.top_k,
                                    top_p=a.top_p, seed=a.seed))
    out = sys.stdout.buffer
    logprobs = []  # One TokenLogprobs per token when --logprobs.
    if a.tls_ca is None:
        if a.tls_cert or a.tls_key:
            sys.exit("generate.py: --tls-cert and --tls-key need --tls-ca")
        channel = grpc.insecure_channel(a.server)
    else:
        if (a.tls_cert is None) != (a.tls_key is None):
            sys.exit("generate.py: --tls-cert and --tls-key go together")
        channel = grpc.secure_channel(a.server, grpc.ssl_channel_credentials(
            root_certificates=a.tls_ca.read_bytes(),
            private_key=a.tls_key.read_bytes() if a.tls_key else None,
            certificate_chain=a.tls_cert.read_bytes() if a.tls_cert else None))
    with channel:
        stub = pb2_grpc.InferenceStub(channel)
        try:
            # One response per token; the last carries finish_reason and usage.
            for response in stub.Generate(request, timeout=a.timeout):
                out.write(response.text.encode("utf-8"))
                out.flush()
                logprobs.extend(response.logprobs)
        except grpc.RpcError as e:
            out.write(b"\n")
            out.flush()
            if e.code() == grpc.StatusCode.UNAVAILABLE:
                print(f"generate.py: cannot reach the server at {a.server} "
                      f"(UNAVAILABLE: {e.details()}; is `shardlm serve` "
                      f"running there?)", file=sys.stderr)
            else:
                print(f"generate.py: {e.code().name} from {a.server}: "
                      f"{e.details()}", file=sys.stderr)
            return 1
    out.write(b"\n")
    out.flush()
    for i, lp in enumerate(logprobs):
        top = " ".join(f"{t.text!r} {t.logprob:.4f}" for t in lp.top)
        print(f"{i:4d}: {lp.token.text!r:16} {lp.token.logprob:9.4f} | {top}",
              file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
