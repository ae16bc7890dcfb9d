#!/usr/bin/env python3
"""Every GGUF block format shardlm reads, against the gguf package's numpy
decoder (an independent implementation of llama.cpp's layouts).

For each format and shape, writes blocks (llama.cpp's reference encoders
in the gguf package where it has them: Q8_0, Q4_0, Q4_1, Q5_0, Q5_1; else
random bytes, i.e. every code and sub-block scale, with finite f16 scales),
runs quant_dump on them, and requires

  - shardlm's decoder = gguf's dequantize within 1e-6 of each block's
    largest |value| (one rounding: shardlm forms d * q + m in one FMA);
  - Linear(x, w) of every decode kernel this CPU runs (portable, avx2,
    avx512: read from /proc/cpuinfo, capped by SHARDLM_CPU_ISA as the
    kernels are; a missing one fails) and the tiled prefill path (17 rows of x), on the whole row or
    a TP shard's column slice, within 1e-5 of sum(|w x|) (f32 summation
    order) of the float64 product of gguf's weights.

  check_quant_formats.py --tool build/tests/reference/quant_dump --workdir D
"""
import argparse
import json
import os
import subprocess
import sys

import numpy as np
from gguf import GGMLQuantizationType as T
from gguf import quants
from gguf.constants import GGML_QUANT_SIZES

# Byte offsets of each format's f16 fields: the scale d and, where there is
# one, the min m (Q4_1, Q5_1) or dmin (K-quants), as ggml-common.h's block
# structs place them.
F16_FIELDS = {
    "Q8_0": (0, None), "Q4_0": (0, None), "Q4_1": (0, 2), "Q5_0": (0, None),
    "Q5_1": (0, 2), "Q2_K": (80, 82), "Q3_K": (108, None), "Q4_K": (0, 2),
    "Q5_K": (0, 2), "Q6_K": (208, None), "IQ4_NL": (0, None),
    "IQ4_XS": (0, None), "MXFP4": (None, None),
}
ENCODABLE = {"Q8_0", "Q4_0", "Q4_1", "Q5_0", "Q5_1"}


ISAS = ("portable", "avx2", "avx512")
# The CPU flags each ISA's kernels need (kernels/cpu_isa.cc).
ISA_FLAGS = {"portable": set(), "avx2": {"avx2", "fma", "f16c"},
             "avx512": {"avx2", "fma", "f16c", "avx512f", "avx512bw",
                        "avx512vl"}}


def expected_kernels():
    """The decode kernels quant_dump must run here, and the note line for
    the others: this CPU's flags, capped by SHARDLM_CPU_ISA."""
    flags = set()
    with open("/proc/cpuinfo") as f:
        for line in f:
            if line.startswith("flags"):
                flags = set(line.split(":", 1)[1].split())
                break
    have = [i for i in ISAS if ISA_FLAGS[i] <= flags]
    cap = os.environ.get("SHARDLM_CPU_ISA", "")
    if cap in have:
        have = have[:have.index(cap) + 1]
    missing = [i for i in ISAS if i not in have]
    note = (f"[gate note] CPU kernels not tested here: {', '.join(missing)} "
            f"(this CPU's flags{', SHARDLM_CPU_ISA=' + cap if cap else ''})"
            if missing else "")
    return set(have), note


def make_blocks(name, rows, cols, rng):
    qtype = T[name]
    block, size = GGML_QUANT_SIZES[qtype]
    if name in ENCODABLE:
        w = rng.normal(0, 0.05, (rows, cols)).astype(np.float32)
        return quants.quantize(w, qtype).reshape(-1)
    n_blocks = rows * cols // block
    raw = rng.integers(0, 256, (n_blocks, size), dtype=np.uint8)
    d_off, m_off = F16_FIELDS[name]
    if name == "MXFP4":  # Byte 0, the e8m0 scale e: 2^(e - 128) in ~[1/256,
        # 1/32], random codes; and the subnormal and largest e once each.
        raw[:, 0] = rng.integers(120, 124, n_blocks)
        raw[0, 0] = 0
        if n_blocks > 1:
            raw[1, 0] = 1
        if n_blocks > 2:
            raw[2, 0] = 200
        return raw.reshape(-1)
    k = 1 / 16 if block == 256 else 1
    raw[:, d_off:d_off + 2] = (
        rng.uniform(0.01 * k, 0.05 * k, n_blocks).astype(np.float16)
        .view(np.uint8).reshape(n_blocks, 2))
    if m_off is not None:
        m = (rng.uniform(0.01 * k, 0.05 * k, n_blocks) if block == 256
             else rng.uniform(-0.2, 0.2, n_blocks))
        raw[:, m_off:m_off + 2] = (
            m.astype(np.float16).view(np.uint8).reshape(n_blocks, 2))
    return raw.reshape(-1)


def check(tool, workdir, name, rows, cols, n, cols_slice, rng, kernels):
    qtype = T[name]
    raw = make_blocks(name, rows, cols, rng)
    blocks_path = os.path.join(workdir, "blocks.bin")
    x_path = os.path.join(workdir, "x.bin")
    raw.tofile(blocks_path)
    c0, c1 = cols_slice or (0, cols)
    x = rng.normal(0, 1, (n, c1 - c0)).astype(np.float32)
    x.tofile(x_path)
    args = [tool, "--type", name, "--rows", str(rows), "--cols", str(cols),
            "--blocks", blocks_path, "--x", x_path, "--n", str(n)]
    if cols_slice:
        args += ["--cols-slice", f"{c0},{c1}"]
    out = subprocess.run(args, capture_output=True, text=True)
    if out.returncode != 0:
        sys.exit(f"quant_dump failed ({name} {rows}x{cols}): {out.stderr}")
    got = json.loads(out.stdout)

    want = quants.dequantize(raw.reshape(rows, -1), qtype).astype(np.float32)
    deq = np.array(got["dequant"], dtype=np.float32).reshape(rows, cols)
    block = GGML_QUANT_SIZES[qtype][0]
    scale = np.abs(want.reshape(-1, block)).max(axis=1, keepdims=True)
    err = np.abs(deq.reshape(-1, block).astype(np.float64) - want.reshape(-1, block))
    worst = float(np.nanmax(np.where(np.isnan(err), np.inf, err / np.maximum(scale, 1e-30))))
    failures = []
    if not worst <= 1e-6:
        failures.append(f"dequantize: worst error {worst:.3g} of the block max")

    w = want[:, c0:c1].astype(np.float64)
    ref = x.astype(np.float64) @ w.T
    mag = np.abs(x.astype(np.float64)) @ np.abs(w).T
    worst_linear = {}
    if set(got["linear"]) != kernels:
        failures.append(f"linear ran the kernels {sorted(got['linear'])}, "
                        f"not this CPU's {sorted(kernels)}")
    for kernel, y in got["linear"].items():
        y = np.array(y, dtype=np.float64).reshape(n, rows)
        rel = np.abs(y - ref) / np.maximum(mag, 1e-30)
        rel = np.where(np.isnan(rel), np.inf, rel)
        worst_linear[kernel] = float(rel.max())
        if not worst_linear[kernel] <= 1e-5:
            failures.append(f"linear ({kernel}): worst error "
                            f"{worst_linear[kernel]:.3g} of sum |w x|")
    shape = f"{rows}x{cols}" + (f" cols [{c0},{c1})" if cols_slice else "")
    kernels = " ".join(f"{k} {v:.1e}" for k, v in worst_linear.items())
    print(f"{name:7s} {shape:24s} n {n:2d}: dequant {worst:.1e}  linear {kernels}"
          f"  {'FAIL' if failures else 'ok'}")
    for f in failures:
        print(f"  {f}")
    return not failures


def main():
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--tool", required=True)
    ap.add_argument("--workdir", required=True)
    ap.add_argument("--seed", type=int, default=7)
    args = ap.parse_args()
    os.makedirs(args.workdir, exist_ok=True)
    rng = np.random.default_rng(args.seed)
    kernels, note = expected_kernels()
    if note:
        print(note)
    ok = True
    for name in F16_FIELDS:
        block = GGML_QUANT_SIZES[T[name]][0]
        # (rows, cols, cols_slice): a single block; rows of 256, 512 and
        # 4864 (19 super-blocks) values; a TP shard's columns of a 4864
        # row, cut on super-block edges; SmolLM2's 576-wide rows for the
        # 32-value formats.
        shapes = [(1, block, None), (7, 256, None), (5, 512, None),
                  (3, 4864, None), (6, 4864, (1280, 2560))]
        if block == 32:
            shapes += [(9, 576, None), (4, 576, (192, 384))]
        for rows, cols, cols_slice in shapes:
            for n in (1, 3, 17):
                ok &= check(args.tool, args.workdir, name, rows, cols, n,
                            cols_slice, rng, kernels)
    print("all formats match the gguf package's decoder" if ok else "FAILED")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
