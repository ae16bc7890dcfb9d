#!/usr/bin/env python3
"""Qwen3.5's hybrid layers as `shardlm inspect` and `generate` read them
(issue 58):

- a GGUF holding only Qwen3.5-9B's published metadata (qwen35 as llama.cpp's
  converter writes it, no tensors): inspect names the 24 Gated DeltaNet
  layers and the 8 that attend (3, 7, ..., 31); --plan counts KV for those
  8 only, 8 x 4 KV heads x 256 x 2 (K, V) x 2 bytes = 32 KiB per token in
  bf16 (a quarter of the same model with attention everywhere) over the
  PP stages, halved per TP rank at --tp 2, and the recurrent state a sequence holds whatever its
  length, 24 x (3 x 8192 + 32 x 128 x 128) f32 values = 50.2 MiB;
- `generate` runs the tiny qwen35 model on the CPU, its startup line
  counting KV for the 2 attending layers of 8 only (2 x 2 KV heads x 32 x
  2 x 2 bytes = 0.5 KiB per token in f16) and naming the state slots;
- inspect reads the tiny model's Hugging Face folder as Qwen3.5 ships it
  (Qwen3_5ForConditionalGeneration: the config in text_config), its value
  heads in Hugging Face's grouped order.

  check_inspect_hybrid.py --shardlm BIN --gguf-out DIR [--tiny MODEL.gguf]
      [--tiny-hf MODEL-hf]
"""

from __future__ import annotations

import argparse
import os
import sys

import gguf

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, ".."))
from testlib import check, exit_code, run  # noqa: E402

# Qwen3.5-9B's text config, as llama.cpp's converter writes it for qwen35.
LAYERS, INTERVAL, KV_HEADS, HEAD = 32, 4, 4, 256
K_HEADS, V_HEADS, SSM_HEAD, CONV = 16, 32, 128, 4


def write_metadata(path: str) -> None:
    w = gguf.GGUFWriter(path, "qwen35")
    w.add_name("Qwen3.5-9B (metadata only)")
    w.add_block_count(LAYERS)
    w.add_context_length(262144)
    w.add_embedding_length(4096)
    w.add_feed_forward_length(12288)
    w.add_head_count(16)
    w.add_head_count_kv(KV_HEADS)
    w.add_key_length(HEAD)
    w.add_value_length(HEAD)
    w.add_rope_dimension_count(HEAD // 4)
    w.add_rope_dimension_sections([11, 11, 10, 0])
    w.add_rope_freq_base(1e7)
    w.add_layer_norm_rms_eps(1e-6)
    w.add_vocab_size(248320)
    w.add_ssm_conv_kernel(CONV)
    w.add_ssm_state_size(SSM_HEAD)
    w.add_ssm_group_count(K_HEADS)
    w.add_ssm_time_step_rank(V_HEADS)
    w.add_ssm_inner_size(V_HEADS * SSM_HEAD)
    w.add_full_attention_interval(INTERVAL)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


def plan(shardlm: str, model: str, tp: int, pp: int):
    r = run([shardlm, "inspect", model, "--plan", "--tp", str(tp), "--pp",
             str(pp), "--kv-cache-dtype", "bf16"])
    lines = r.stdout.splitlines()
    per_rank = [int(x.split()[1]) for x in lines if "attention layers x" in x]
    total = [int(x.split()[1]) for x in lines if x.startswith("all ")]
    state = [x for x in lines if x.startswith("recurrent state")]
    return r, per_rank, total, state


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--shardlm", required=True)
    ap.add_argument("--gguf-out", required=True)
    ap.add_argument("--tiny", help="a tiny qwen35 GGUF (make_family_"
                                   "models.py --family qwen35)")
    ap.add_argument("--tiny-hf", help="its Hugging Face folder (Qwen3.5's "
                                      "ConditionalGeneration layout)")
    a = ap.parse_args()
    os.makedirs(a.gguf_out, exist_ok=True)
    path = os.path.join(a.gguf_out, "qwen3.5-9b-metadata.gguf")
    write_metadata(path)

    attending = ", ".join(str(i) for i in range(INTERVAL - 1, LAYERS,
                                                INTERVAL))
    state_values = (CONV - 1) * (2 * K_HEADS + V_HEADS) * SSM_HEAD + \
        V_HEADS * SSM_HEAD * SSM_HEAD
    r = run([a.shardlm, "inspect", path])
    check(r.returncode == 0 and
          f"Gated DeltaNet in 24 of 32 layers (attention in {attending}, "
          f"gated): 16 q/k heads of 128, 32 value heads of 128 (tiled), "
          f"convolution 4 wide; state per sequence and layer: "
          f"{state_values} f32 values" in r.stdout
          and "rope_dims        64 of 256 (partial RoPE)" in r.stdout,
          f"inspect reads Qwen3.5-9B's layers ({r.returncode}: "
          f"{r.stdout[-600:]} {r.stderr.strip()[:300]})")

    per_token = 8 * KV_HEADS * HEAD * 2 * 2
    state = 24 * state_values * 4
    r, per_rank, total, state_line = plan(a.shardlm, path, 1, 2)
    # (A file without tensors weighs nothing, so the stages' split of the
    # layers is arbitrary: the ranks' sum is checked.)
    check(r.returncode == 0 and total == [per_token] and
          len(per_rank) == 2 and sum(per_rank) == per_token,
          f"--plan --pp 2: KV of the 8 attention layers only, "
          f"{per_token} bytes per token over the stages (got {per_rank}, "
          f"{total}; {r.stderr.strip()})")
    check(len(state_line) == 1 and f"{state} bytes" in state_line[0],
          f"--plan: the recurrent state per sequence, 24 x {state_values} "
          f"x 4 = {state} bytes (got {state_line})")
    r, per_rank, total, _ = plan(a.shardlm, path, 2, 1)
    check(r.returncode == 0 and per_rank == [per_token // 2] * 2,
          f"--plan --tp 2: each TP rank holds half the KV heads "
          f"(got {per_rank})")

    if a.tiny:
        r = run([a.shardlm, "generate", "--model", a.tiny, "--prompt", "x",
                 "--max-tokens", "1", "--device", "cpu"])
        check(r.returncode == 0 and "f16, 0.5 KiB per token" in r.stderr
              and "recurrent-state slots" in r.stderr,
              f"generate runs a qwen35 model, KV for its attending layers "
              f"only and the state slots named ({r.returncode}: "
              f"{r.stderr.strip()[-300:]})")
    if a.tiny_hf:
        # The folder's config in text_config, its value heads grouped.
        r = run([a.shardlm, "inspect", a.tiny_hf])
        check(r.returncode == 0 and "architecture     qwen3_5_text" in r.stdout
              and "Gated DeltaNet in 6 of 8 layers (attention in 3, 7, "
              "gated): 2 q/k heads of 16, 4 value heads of 16 (grouped), "
              "convolution 4 wide" in r.stdout
              and "rope_dims        8 of 32 (partial RoPE)" in r.stdout
              and "qk_norm          per head (q, k)" in r.stdout,
              f"inspect reads Qwen3.5's folder layout ({r.returncode}: "
              f"{r.stdout[:900]} {r.stderr.strip()[:300]})")
    return exit_code("inspect reads Qwen3.5's hybrid layers")


if __name__ == "__main__":
    sys.exit(main())
