#!/usr/bin/env python3
"""Quantizes a GGUF with llama.cpp's own quantizer (llama_model_quantize,
through llama-cpp-python), as `llama-quantize IN OUT TYPE` does: the mixes
users download (Q4_K_M, Q5_K_M, Q3_K_M: K-quants with Q5_0 / Q8_0 / Q6_K
on the tensors llama.cpp chooses), for tests of the formats shardlm reads.

  quantize_gguf.py IN.gguf OUT.gguf TYPE

TYPE: Q4_K_M, Q5_K_M, Q6_K, Q3_K_M, Q2_K, Q5_0, IQ4_XS (llama.cpp's names).
IN should hold F32 (or F16) matrices (tests/cut_gguf.py --requantize F32).
Exits 77 (a skip, which CI's gate refuses) when llama-cpp-python is not
installed: scripts/install-deps.sh --tests installs it.
"""
import sys

FTYPES = {"Q8_0": 7, "Q5_0": 8, "Q2_K": 10, "Q3_K_M": 12, "Q4_K_M": 15, "Q5_K_M": 17,
          "Q6_K": 18, "IQ4_XS": 30}


class NoLlamaCpp(Exception):
    pass


def quantize(src: str, dst: str, name: str) -> None:
    """Writes dst: src quantized to llama.cpp type `name` (FTYPES)."""
    try:
        import llama_cpp  # noqa: PLC0415
    except ImportError as e:
        raise NoLlamaCpp("llama-cpp-python is not installed "
                         "(scripts/install-deps.sh --tests)") from e
    llama_cpp.llama_backend_init()
    params = llama_cpp.llama_model_quantize_default_params()
    params.ftype = FTYPES[name]
    params.nthread = 1
    rc = llama_cpp.llama_model_quantize(src.encode(), dst.encode(), params)
    if rc != 0:
        raise RuntimeError(f"llama_model_quantize({src}, {name}) returned {rc}")


def main():
    if len(sys.argv) != 4 or sys.argv[3] not in FTYPES:
        sys.exit(f"usage: quantize_gguf.py IN.gguf OUT.gguf "
                 f"{'|'.join(FTYPES)}")
    src, dst, name = sys.argv[1:]
    try:
        quantize(src, dst, name)
    except NoLlamaCpp as e:
        print(f"quantize_gguf: {e}", file=sys.stderr)
        return 77
    print(f"quantize_gguf: {dst}: {name} (llama.cpp's quantizer)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
