#!/usr/bin/env python3
"""Checks a GPU kit made by tests/gpu/kit.sh, on the machine that made it.

A kit must run on a bare GPU machine with at most 64 MiB copied to it, so:
  - it is under 60 MiB (the rest is the repository itself);
  - every NEEDED library of every ELF in it (binaries and libraries) is in
    the kit or on the allow-list of what such a machine has (glibc,
    libstdc++, libgcc_s, the CUDA driver, cudart, cuBLAS, NCCL);
  - MANIFEST names every binary, and the binaries session.sh calls are there;
  - the cut model is a valid GGUF whose tensors are byte for byte those of
    the model it was cut from, with block_count matching its blocks.
Usage: check_kit.py KIT_DIR SOURCE_MODEL
"""
import lzma
import os
import re
import subprocess
import sys
import tarfile
import tempfile

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))
from testlib import FAILURES, check  # noqa: E402

ALLOWED = re.compile(
    r"^(linux-vdso|ld-linux-x86-64|libc|libm|libpthread|libdl|librt|"
    r"libstdc\+\+|libgcc_s|libcuda|libcudart|libcublas|libcublasLt|libnccl)"
    r"\.so")
SESSION_BINARIES = {"cuda_backend_test", "kernels_cross_backend_test",
                   "forward_ops_gpu_test", "gpu_probe",
                   "nccl_communicator_test", "cuda_model_runner_test",
                   "cuda_engine_test", "gpu_decode_bench", "shardlm"}
MAX_BYTES = 60 << 20


def needed(path):
    out = subprocess.run(["readelf", "-d", path], capture_output=True,
                         text=True, check=True).stdout
    return re.findall(r"\(NEEDED\)\s+Shared library: \[([^\]]+)\]", out)


def is_elf(path):
    with open(path, "rb") as f:
        return f.read(4) == b"\x7fELF"


def check_model(cut_path, source_path):
    from gguf import GGUFReader
    import numpy as np

    cut = GGUFReader(cut_path)
    src = GGUFReader(source_path)
    arch = bytes(cut.fields["general.architecture"].parts[-1]).decode()
    count = int(cut.fields[f"{arch}.block_count"].parts[-1][0])
    blocks = {int(m.group(1)) for t in cut.tensors
              if (m := re.match(r"blk\.(\d+)\.", t.name))}
    check(blocks == set(range(count)),
          f"model: blocks {sorted(blocks)} are 0..block_count-1 ({count})")
    by_name = {t.name: t for t in src.tensors}
    differing = [t.name for t in cut.tensors
                 if t.name not in by_name
                 or t.tensor_type != by_name[t.name].tensor_type
                 or not np.array_equal(
                     np.asarray(t.data).view(np.uint8).ravel(),
                     np.asarray(by_name[t.name].data).view(np.uint8).ravel())]
    check(not differing, f"model: {len(cut.tensors)} tensors equal the "
          f"source's byte for byte (differing: {differing[:5]})")
    want = {k for k in src.fields if not k.startswith("GGUF.")}
    have = {k for k in cut.fields if not k.startswith("GGUF.")}
    check(want == have, f"model: the same {len(want)} metadata keys "
          f"(missing {sorted(want - have)[:5]}, extra {sorted(have - want)[:5]})")


def main():
    kit, source_model = sys.argv[1], sys.argv[2]
    total = sum(os.path.getsize(os.path.join(d, f))
                for d, _, files in os.walk(kit) for f in files)
    check(total < MAX_BYTES,
          f"size: {total / 2**20:.1f} MiB < {MAX_BYTES >> 20} MiB")

    with tempfile.TemporaryDirectory() as tmp:
        with tarfile.open(fileobj=lzma.open(os.path.join(kit, "kit.tar.xz"))) as t:
            t.extractall(tmp)
        bins = sorted(os.listdir(os.path.join(tmp, "bin")))
        libs = set(os.listdir(os.path.join(tmp, "lib")))
        check(SESSION_BINARIES <= set(bins),
              f"bin: has everything session.sh runs (missing "
              f"{sorted(SESSION_BINARIES - set(bins))})")
        manifest = open(os.path.join(kit, "MANIFEST")).read()
        check(all(b in manifest for b in bins), "MANIFEST names every binary")
        elfs = [os.path.join(tmp, "bin", b) for b in bins] + \
               [os.path.join(tmp, "lib", l) for l in sorted(libs)]
        unresolved = set()
        for path in elfs:
            if not is_elf(path):
                continue
            for lib in needed(path):
                if lib not in libs and not ALLOWED.match(lib):
                    unresolved.add(f"{os.path.basename(path)} -> {lib}")
        check(not unresolved,
              f"{len(elfs)} ELFs: every NEEDED library is in the kit or "
              f"allowed (unresolved: {sorted(unresolved)[:8]})")
        # A library packed but needed by nothing is dead weight.
        used = {lib for path in elfs if is_elf(path) for lib in needed(path)}
        check(libs <= used, f"lib: every packed library is needed "
              f"(unused: {sorted(libs - used)[:5]})")

    models = [f for f in os.listdir(os.path.join(kit, "models"))
              if f.endswith(".gguf")]
    check(len(models) == 1, f"models: one GGUF ({models})")
    if models:
        check_model(os.path.join(kit, "models", models[0]), source_model)

    if FAILURES:
        print(f"{len(FAILURES)} kit checks failed")
        sys.exit(1)
    print("the GPU kit is complete")


if __name__ == "__main__":
    main()
