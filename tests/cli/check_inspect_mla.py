#!/usr/bin/env python3
"""DeepSeek V3's latent attention as `shardlm inspect` and `generate` read
it (issue 56):

- a GGUF holding only DeepSeek V3's published metadata (deepseek2 in
  llama.cpp's MLA layout, no tensors): inspect prints the latent
  attention's sizes, and --plan's KV cache per token is (512 + 64) x 61 x
  2 bytes over the PP stages (one latent per layer, no V), the whole of
  it on each TP rank (the latent is replicated over TP), and in int8 a
  byte per value plus an f32 scale per entry;
- `generate` on the tiny deepseek3 model (5 layers, latent 32 + RoPE 8)
  answers, and says its KV cache holds the latent's 400 bytes (0.4 KiB)
  per token in f16, not the 2 x 6 x 24 x 2 x 5 = 2880 of heads expanded;
  with --cp 2 it is refused, naming latent attention.

  check_inspect_mla.py --shardlm BIN --gguf-out DIR [--tiny MODEL.gguf]
"""

from __future__ import annotations

import argparse
import os
import sys

import gguf

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, ".."))
from testlib import check, exit_code, run  # noqa: E402

# DeepSeek V3's config.json (deepseek-ai/DeepSeek-V3), as llama.cpp's
# converter writes it for deepseek2.
LAYERS, KV_LORA, ROPE = 61, 512, 64


def write_v3_metadata(path: str) -> None:
    w = gguf.GGUFWriter(path, "deepseek2")
    w.add_name("DeepSeek-V3 (metadata only)")
    w.add_block_count(LAYERS)
    w.add_context_length(163840)
    w.add_embedding_length(7168)
    w.add_feed_forward_length(18432)
    w.add_head_count(128)
    w.add_head_count_kv(1)
    w.add_key_length(KV_LORA + ROPE)
    w.add_value_length(KV_LORA)
    w.add_uint32("deepseek2.attention.key_length_mla", 192)
    w.add_uint32("deepseek2.attention.value_length_mla", 128)
    w.add_q_lora_rank(1536)
    w.add_kv_lora_rank(KV_LORA)
    w.add_rope_dimension_count(ROPE)
    w.add_rope_freq_base(10000.0)
    w.add_layer_norm_rms_eps(1e-6)
    w.add_vocab_size(129280)
    w.add_leading_dense_block_count(3)
    w.add_expert_count(256)
    w.add_expert_used_count(8)
    w.add_expert_feed_forward_length(2048)
    w.add_expert_shared_count(1)
    w.add_expert_weights_scale(2.5)
    w.add_expert_weights_norm(True)
    w.add_expert_gating_func(gguf.ExpertGatingFuncType.SIGMOID)
    w.add_uint32("deepseek2.expert_group_count", 8)
    w.add_uint32("deepseek2.expert_group_used_count", 4)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


def plan_kv(shardlm: str, model: str, tp: int, pp: int, dtype: str):
    r = run([shardlm, "inspect", model, "--plan", "--tp", str(tp), "--pp",
             str(pp), "--kv-cache-dtype", dtype])
    lines = r.stdout.splitlines()
    per_rank = [int(x.split()[1]) for x in lines if "one latent of" in x]
    total = [int(x.split()[1]) for x in lines if x.startswith("all ")]
    return r, per_rank, total


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--shardlm", required=True)
    ap.add_argument("--gguf-out", required=True)
    ap.add_argument("--tiny", help="a tiny deepseek2 GGUF (make_family_"
                                   "models.py --family deepseek3)")
    a = ap.parse_args()
    os.makedirs(a.gguf_out, exist_ok=True)
    v3 = os.path.join(a.gguf_out, "deepseek-v3-metadata.gguf")
    write_v3_metadata(v3)

    r = run([a.shardlm, "inspect", v3])
    check(r.returncode == 0 and "latent attention kv_lora_rank 512, "
          "q_lora_rank 1536, q/k head 192 (RoPE on its last 64), v head 128"
          in r.stdout and "cached per token and layer: 576 values" in r.stdout,
          f"inspect reads DeepSeek V3's latent attention "
          f"({r.returncode}: {r.stderr.strip()[:200]})")
    check("routing          sigmoid, groups 4 of 8, weights x 2.5"
          in r.stdout and "shared experts   1 (FFN 2048)" in r.stdout
          and "dense layers     0-2" in r.stdout,
          "inspect reads its routing, shared expert and dense layers")

    per_token = (KV_LORA + ROPE) * LAYERS * 2
    r, per_rank, total = plan_kv(a.shardlm, v3, 1, 2, "bf16")
    check(r.returncode == 0 and total == [per_token] and len(per_rank) == 2,
          f"--plan --pp 2: KV per token (512 + 64) x 61 x 2 = {per_token} "
          f"over the stages (got {per_rank}, {total}; {r.stderr.strip()})")
    r, per_rank, total = plan_kv(a.shardlm, v3, 8, 1, "bf16")
    check(r.returncode == 0 and per_rank == [per_token] * 8,
          f"--plan --tp 8: each TP rank holds the whole latent, {per_token} "
          f"bytes per token (got {per_rank})")
    # int8: a byte per value and an f32 scale per entry and token.
    r, per_rank, total = plan_kv(a.shardlm, v3, 1, 1, "int8")
    check(total == [(KV_LORA + ROPE + 4) * LAYERS],
          f"--kv-cache-dtype int8: (576 + 4) x 61 bytes per token "
          f"(got {total})")

    if a.tiny:
        r = run([a.shardlm, "generate", "--model", a.tiny, "--prompt", "x",
                 "--max-tokens", "4"])
        check(r.returncode == 0 and r.stdout.strip() != "",
              f"generate answers on a deepseek2 model ({r.returncode}: "
              f"{r.stderr.strip()[-300:]})")
        r_cp = run([a.shardlm, "generate", "--model", a.tiny, "--prompt",
                    "x", "--max-tokens", "1", "--cp", "2"])
        check(r_cp.returncode != 0 and "latent attention" in r_cp.stderr and
              "--cp 1" in r_cp.stderr,
              f"generate --cp 2 is refused, naming latent attention "
              f"({r_cp.returncode}: {r_cp.stderr.strip()[-200:]})")
        check("f16, 0.4 KiB per token" in r.stderr,
              f"generate's KV cache holds the latent, (32 + 8) x 5 x 2 = 400 "
              f"bytes per token ({r.stderr.strip()[-300:]})")
    return exit_code("inspect and generate read latent attention")


if __name__ == "__main__":
    sys.exit(main())
