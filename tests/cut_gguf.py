#!/usr/bin/env python3
"""Writes a Llama-family GGUF cut to its first N transformer blocks,
optionally with its matrices re-encoded in another block format.

The GPU kit must fit in 64 MiB with its binaries, and SmolLM2-135M is 94 MiB.
Its first blocks, its embedding, final norm and tokenizer are still real
weights: a GPU-vs-CPU parity check on them exercises real value ranges and
the real tokenizer. Every metadata key is copied unchanged except
`<arch>.block_count`; tensors of blocks >= N are dropped; quantized tensors
are copied byte for byte (no requantization).

With --requantize Q8_0|Q4_0|Q4_1|Q5_0|Q5_1 every 2-D weight matrix is
dequantized and quantized again to that format (gguf.quants, llama.cpp's
reference encoders), so that tests get a real-weights model in each format
the CPU kernels read; F32 writes them dequantized, the input llama.cpp's
quantizer takes for the K-quants (tests/quantize_gguf.py).

With --context-length N, `<arch>.context_length` says N (the weights are
unchanged): long-context benchmarks on a real model beyond its trained
window, for scaling, not for quality.

Usage: cut_gguf.py IN.gguf OUT.gguf [--blocks N] [--requantize TYPE]
                   [--context-length N]
"""
import argparse
import re
import sys

import numpy as np
from gguf import GGMLQuantizationType, GGUFReader, GGUFValueType, GGUFWriter
from gguf import quants


def field_value(field):
    """A reader field as the Python value GGUFWriter.add_key_value takes."""
    vtype = field.types[0]
    if vtype == GGUFValueType.STRING:
        return bytes(field.parts[field.data[0]]).decode("utf-8")
    if vtype == GGUFValueType.ARRAY:
        sub = field.types[1] if len(field.types) > 1 else None
        if sub == GGUFValueType.STRING:
            return [bytes(field.parts[i]).decode("utf-8") for i in field.data]
        return [field.parts[i].tolist()[0] for i in field.data]
    return field.parts[field.data[0]].tolist()[0]


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("src")
    ap.add_argument("dst")
    ap.add_argument("--blocks", type=int, help="default: all")
    ap.add_argument("--requantize",
                    choices=["Q8_0", "Q4_0", "Q4_1", "Q5_0", "Q5_1", "F32"])
    ap.add_argument("--context-length", type=int)
    args = ap.parse_args()
    target = (GGMLQuantizationType[args.requantize]
              if args.requantize else None)

    reader = GGUFReader(args.src)
    arch = field_value(reader.fields["general.architecture"])
    count_key = f"{arch}.block_count"
    have = field_value(reader.fields[count_key])
    if args.blocks is None:
        args.blocks = have
    context_key = f"{arch}.context_length"
    if not 1 <= args.blocks <= have:
        sys.exit(f"cut_gguf: --blocks must be in [1, {have}], got {args.blocks}")

    writer = GGUFWriter(args.dst, arch)
    for name, field in reader.fields.items():
        # GGUFWriter writes the header fields and the architecture itself.
        if name.startswith("GGUF.") or name == "general.architecture":
            continue
        vtype = field.types[0]
        sub = field.types[1] if vtype == GGUFValueType.ARRAY else None
        value = args.blocks if name == count_key else field_value(field)
        if name == context_key and args.context_length:
            value = args.context_length
        writer.add_key_value(name, value, vtype, sub_type=sub)

    block = re.compile(r"^blk\.(\d+)\.")
    kept = 0
    for t in reader.tensors:
        m = block.match(t.name)
        if m and int(m.group(1)) >= args.blocks:
            continue
        data = np.asarray(t.data)
        dtype = t.tensor_type
        if target is not None and len(t.shape) == 2 and dtype != target:
            values = quants.dequantize(data, dtype).astype(np.float32)
            data = (values if target == GGMLQuantizationType.F32
                    else quants.quantize(values, target))
            dtype = target
        # Quantized data comes as raw bytes; the writer recovers the logical
        # shape from the byte shape and the type.
        writer.add_tensor(t.name, data, raw_dtype=dtype)
        kept += 1

    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    print(f"cut_gguf: {args.dst}: {args.blocks} of {have} blocks, {kept} tensors"
          + (f", matrices as {args.requantize}" if target is not None else ""))


if __name__ == "__main__":
    main()
