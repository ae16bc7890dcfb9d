#!/usr/bin/env python3
"""Writes tiny seeded random models of each supported family, in both file
formats, for checking the C++ forward pass against the numpy reference
(llama_ref.py) and llama.cpp (check_llama_cpp.py).

  make_family_models.py OUTDIR --family llama3|qwen2|mistral|yarn|linear|
                                       dynamic|qwen2_swa|qwen3|qwen3moe|
                                       mixtral|glm4moe|deepseek3|
                                       deepseek3_nolora|deepseek3_yarn|
                                       deepseek3_fp8|gemma2|gemma3|gpt_oss|
                                       gpt_oss_hf|kquant|qwen3moe_mxfp4|
                                       qwen35

OUTDIR/FAMILY.gguf    F32 GGUF with the family's real metadata keys (the
                      `gguf` package's writer) and SmolLM2's byte-level BPE
                      vocabulary, so llama.cpp can load it (not for dynamic
                      and qwen2_swa, which GGUF has no keys for).
OUTDIR/FAMILY-hf/     config.json (the family's transformers config) and
                      model.safetensors (F32).

The two files hold different random draws (each format is checked against
the reference reading that same file). Families, all with odd GQA groups
(6 query heads over 2 KV heads; the deepseek3 ones 6 heads, no GQA), 5
layers (an uneven PP split) and head_dim 16:
  llama3   Llama 3.1: untied LM head, rope_theta 500000, llama3 RoPE
           scaling (factor 8, low/high freq factor 1/4, original context
           8192; in GGUF as rope_freqs.weight, as llama.cpp's converter
           writes it).
  qwen2    Qwen2.5: Q/K/V biases, tied embeddings, rope_theta 1e6, NeoX
           RoPE in GGUF (no Q/K permutation).
  mistral  Mistral v0.1: sliding-window attention over 20 positions
           (llama.attention.sliding_window in GGUF).
  yarn     Qwen2 with YaRN scaling (factor 4, original context 32).
  linear   Llama with linear RoPE scaling (factor 4).
  dynamic  Llama with dynamic NTK scaling (the older "type" key, factor
           2.5): served statically, the base scaled for 2.5 x 4096.
  qwen2_swa  Qwen2 with use_sliding_window: a window of 20 positions in
           layers 2-4 (max_window_layers 2), full attention in 0-1.
  glm4moe  GLM-4.5 (llama.cpp's glm4moe, transformers' Glm4MoeForCausalLM):
           Q/K/V biases, partial RoPE (partial_rotary_factor 0.5: 8 of
           head_dim 16 rotate, NeoX style), layer 0 a dense FFN
           (first_k_dense_replace 1), layers 1-4 8 experts of 64 columns
           routed by sigmoid plus a correction bias, in 2 groups of which
           1 is kept (the group-limited choice), top 2, renormalized, times
           routed_scaling_factor 2.5, plus 1 shared expert. GGUF tokenizer
           pre "qwen2" (llama.cpp's "glm4" pre-tokenizer is not what
           SmolLM2's vocabulary was trained with).
  deepseek3  DeepSeek V3 (llama.cpp's deepseek2, transformers'
           DeepseekV3ForCausalLM): multi-head latent attention, 6 heads
           (no GQA: every head its own k_nope / v from the shared latent),
           q LoRA rank 48 (q_a, its norm, q_b), kv LoRA rank 32, q / k head
           16 unroped (qk_nope) + 8 roped (qk_rope, one k_pe for all heads,
           adjacent pairs), v head 12; the MoE as glm4moe's but 4 groups
           keeping 2; no attention biases; rms_norm_eps 1e-6 (what transformers'
           q_a / kv_a norms use whatever the config says). GGUF as
           llama.cpp's converter writes it today: MLA keys (key_length
           kv_lora + rope, value_length kv_lora, *_mla the heads' sizes),
           head_count_kv 1, kv_b split into attn_k_b / attn_v_b.
  deepseek3_nolora  deepseek3 without q LoRA (q_proj, as DeepSeek-V2-Lite),
           the GGUF in the older layout: attn_kv_b merged, key_length /
           value_length the heads' sizes (24, 12), no *_mla keys,
           head_count_kv 6; q_lora_rank 0 written (llama.cpp requires the
           key unless the block count is a "lite" one, 26 or 27).
  deepseek3_yarn  deepseek3 with DeepSeek V3's YaRN (factor 4, original
           context 1024 of 4096, beta_fast 32, beta_slow 1, mscale =
           mscale_all_dim = 1): cos / sin unscaled, the softmax scale times
           (0.1 ln 4 + 1)^2; in GGUF rope.scaling.yarn_log_multiplier 0.1.
  deepseek3_fp8  deepseek3's folder as DeepSeek V3 ships its weights
           (Hugging Face only): every *_proj.weight, the experts' too, as
           F8_E4M3 codes with an F32 weight_scale_inv per 16 x 16 block
           (quantization_config fp8, weight_block_size [16, 16]; the real
           ones are 128 x 128), the router, norms and embeddings F32.
  gemma3   Gemma 3 text (llama.cpp's gemma3, transformers'
           Gemma3ForCausalLM): 7 layers, head_dim 24 (6 x 24 != hidden 96),
           tied, QK-norm, norms after attention and after the FFN too, a
           GeGLU (tanh) FFN, the embeddings times sqrt(96); layer 5 global
           (every 6th), RoPE base 1e6 with linear scaling (factor 8, as the
           4B+ models ship), the others local, a window of 20 and RoPE base
           10000 unscaled. Random norm weights around 1: stored as they are
           in GGUF (llama.cpp's converter writes Gemma's 1 + w), minus 1 in
           the folder (Gemma3RMSNorm multiplies by 1 + w). GGUF as the
           converter writes it: no key for the layer pattern (llama.cpp's 6)
           or the softmax scale (llama.cpp's 1 / sqrt(head_dim)),
           rope.freq_base_swa 10000; tokenizer pre "smollm" (SmolLM2's own:
           Gemma's vocabulary is SentencePiece). The folder with
           query_pre_attn_scalar 32 (not head_dim: its scale 32^-0.5), the
           keys of Gemma 3's config.json (rope_theta, rope_scaling,
           rope_local_base_freq, sliding_window_pattern) and what
           transformers 5's Gemma3TextConfig makes of them (layer_types,
           rope_parameters keyed by layer type), which agree.
  gemma2   Gemma 2 (llama.cpp's gemma2, transformers' Gemma2ForCausalLM):
           gemma3's shapes and norms without QK-norm, 6 layers, every
           other one (0, 2, 4) local over a window of 20, one RoPE (base
           10000), and soft-capping tight enough to matter: attention
           scores at ATTN_SOFTCAP, final logits at FINAL_SOFTCAP (Gemma
           2's are 50 and 30, for scores and logits far larger than these
           tiny models make). query_pre_attn_scalar 32 in the folder; the
           GGUF as the converter writes it (both caps, the window).
  qwen3moe_mxfp4  qwen3moe's GGUF with its expert matrices (ffn_*_exps) in
           MXFP4, quantized by the gguf package as gpt-oss's experts ship
           (GGUF only; hidden 96 and expert FFN 64 are whole 32-value
           blocks, so TP 2 cuts none).
  gpt_oss  gpt-oss (llama.cpp's gpt-oss, GGUF only): every other layer
           (0, 2, 4) windowed over 20 positions; Q/K/V and output biases;
           attention sinks of the scores' size (N(1, 2)); 8 experts, top 2,
           softmax over the chosen, a router bias, expert biases large
           enough (gate and up N(0, 4)) that the clamped SwiGLU's limits
           (gate above 7, up to +-7) bite; experts in F32 (so llama.cpp,
           whose MXFP4 matmul quantizes activations, compares at 1e-4).
  gpt_oss_hf  gpt_oss's shapes as OpenAI's folders ship them (Hugging Face
           only, transformers' GptOssForCausalLM): the experts merged, in
           MXFP4 (_blocks and _scales, quantized by the gguf package, gate
           and up interleaved by row, their bias too), the router
           (mlp.router), sinks (self_attn.sinks); layer_types; YaRN with
           truncate false (factor 32, original context 4096, as gpt-oss;
           its correction range is fractional here, 2.02 to 4.35 of 8).
  qwen35   Qwen3.5 (llama.cpp's qwen35; transformers' Qwen3_5ForCondition-
           alGeneration's folder, without its vision tower): 8 layers, Gated
           DeltaNet (linear attention) in all but every 4th (3 and 7):
           2 q / k heads serving 4 value heads, all of 16, tiled as the
           converter writes them (value head i reads k head i % 2), a
           causal convolution 4 wide, decays of exp(-0.02) to exp(-1.5) or
           so a token; the others gated attention (a sigmoid gate per
           query value, made by attn_q beside the query), QK norms, RoPE
           over 8 of head_dim 32 (interleaved M-RoPE sections, one
           position for text); an untied LM head. The folder holds the
           value heads grouped (Hugging Face's order), A_log, norms as w
           for 1 + w (but the gated one), the text config in text_config
           and the weights under model.language_model.
  kquant   Llama with every matrix row a multiple of 256 (hidden 256,
           FFN 512, 12 query / 6 KV heads of 64), GGUF only, for the
           K-quants: written with --quantize TYPE as OUTDIR/kquant-TYPE.gguf
           too (llama.cpp's quantizer, tests/quantize_gguf.py). At TP = 4
           the KV heads split 2, 2, 1, 1, so ranks 2 and 3 hold 128 query
           columns of 256-value super-blocks, and FFN columns split on 32
           (2 super-blocks over 4 ranks): both row-parallel matrices cut
           blocks.

The model is only written when, on the fixed prompts, every one of 32
reference greedy steps has a top-1 minus top-2 logit margin above
--min-margin (so the greedy comparisons are never decided by a near-tie);
otherwise the next seed is tried.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import struct
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import check_forward  # noqa: E402
import llama_ref  # noqa: E402
import llama_ref_hf  # noqa: E402
import make_synthetic_model  # noqa: E402

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)),
                                ".."))
import quantize_gguf  # noqa: E402

TOKENIZER_GGUF_DEFAULT = os.path.join(
    os.path.dirname(os.path.abspath(__file__)), "..", "..", "models",
    "SmolLM2-135M-Instruct.Q4_1.gguf")
VOCAB = 49152
# The gemma2 family's soft-caps, against what its weights make uncapped
# (seed 1, 60 tokens): scaled attention scores up to ~6 (a typical row's
# largest ~3.7), logits up to ~110 with a top 1 ~90 and a top-2 margin
# ~50. Both caps bend most of those values hard; a smaller final cap
# would flatten the top logits into near-ties.
ATTN_SOFTCAP = 2.0
FINAL_SOFTCAP = 60.0
BASE = dict(hidden=96, ffn=160, layers=5, heads=6, kv_heads=2, head_dim=16,
            eps=1e-5, context=4096, theta=10000.0, tied=False, bias=False,
            window=0, scaling=None, formats=("gguf", "hf"), qk_norm=False,
            experts=0, experts_used=0, expert_ffn=0, experts_norm=True,
            router_gain=4.0, rotary_factor=1.0, dense_layers=0,
            gating="softmax", groups=1, groups_used=1, shared_experts=0,
            routed_scale=1.0, q_lora=0, kv_lora=0, qk_rope=0, v_head=0,
            legacy_kv_b=False, post_norms=False)
# The deepseek3 families' settings; head_dim is qk_nope_head_dim.
DEEPSEEK3 = dict(gguf_arch="deepseek2", hf_type="deepseek_v3", pre="qwen2",
                 eps=1e-6, kv_heads=6, head_dim=16, q_lora=48, kv_lora=32,
                 qk_rope=8, v_head=12, experts=8, experts_used=2,
                 expert_ffn=64, experts_norm=True, router_gain=2.0,
                 dense_layers=1, gating="sigmoid", groups=4, groups_used=2,
                 shared_experts=1, routed_scale=2.5)
FAMILIES = {
    "llama3": dict(gguf_arch="llama", hf_type="llama", pre="llama-bpe",
                   theta=500000.0,
                   scaling={"rope_type": "llama3", "factor": 8.0,
                            "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                            "original_max_position_embeddings": 8192}),
    "qwen2": dict(gguf_arch="qwen2", hf_type="qwen2", pre="qwen2",
                  theta=1e6, tied=True, bias=True, eps=1e-6),
    "mistral": dict(gguf_arch="llama", hf_type="mistral", pre="llama-bpe",
                    window=20,
                    seeds=(2, 101)),
    "yarn": dict(gguf_arch="qwen2", hf_type="qwen2", pre="qwen2", theta=1e6,
                 bias=True,
                 scaling={"rope_type": "yarn", "factor": 4.0,
                          "original_max_position_embeddings": 32},
                 seeds=(3, 101)),
    "linear": dict(gguf_arch="llama", hf_type="llama", pre="llama-bpe",
                   scaling={"rope_type": "linear", "factor": 4.0},
                   seeds=(5, 101)),
    "dynamic": dict(hf_type="llama", formats=("hf",),
                    scaling={"type": "dynamic", "factor": 2.5}),
    "qwen3": dict(gguf_arch="qwen3", hf_type="qwen3", pre="qwen2",
                  theta=1e6, tied=True, eps=1e-6, head_dim=24, qk_norm=True),
    "qwen3moe": dict(gguf_arch="qwen3moe", hf_type="qwen3_moe", pre="qwen2",
                     theta=1e6, eps=1e-6, head_dim=24, qk_norm=True,
                     experts=8, experts_used=2, expert_ffn=64,
                     experts_norm=True,
                     seeds=(2, 101)),
    # qwen3moe's GGUF with every expert matrix in MXFP4 (gpt-oss's format).
    "qwen3moe_mxfp4": dict(gguf_arch="qwen3moe", hf_type="qwen3_moe",
                           pre="qwen2", theta=1e6, eps=1e-6, head_dim=24,
                           qk_norm=True, experts=8, experts_used=2,
                           expert_ffn=64, experts_norm=True,
                           formats=("gguf",), expert_quant="MXFP4"),
    "mixtral": dict(gguf_arch="llama", hf_type="mixtral", pre="llama-bpe",
                    theta=1e6, heads=8, kv_heads=4, head_dim=12, experts=6,
                    experts_used=2, expert_ffn=128,
                    seeds=(1, 103)),
    # The router's gain 2 (not 4): sigmoid scores spread over (0, 1)
    # rather than saturating (near-ties between saturated scores).
    "glm4moe": dict(gguf_arch="glm4moe", hf_type="glm4_moe", pre="qwen2",
                    theta=1e6, bias=True, experts=8, experts_used=2,
                    expert_ffn=64, experts_norm=True, router_gain=2.0,
                    rotary_factor=0.5, dense_layers=1, gating="sigmoid",
                    groups=2, groups_used=1, shared_experts=1,
                    routed_scale=2.5),
    "deepseek3": DEEPSEEK3,
    "deepseek3_nolora": dict(DEEPSEEK3, q_lora=0, legacy_kv_b=True,
                             seeds=(3, 101)),
    # DeepSeek V3's FP8 checkpoint form (HF only): every projection in
    # F8_E4M3 with a weight_scale_inv per 16 x 16 block (128 x 128 in the
    # real ones; 16 here so that the tiny matrices hold several blocks and
    # partial ones at their edges).
    "deepseek3_fp8": dict(DEEPSEEK3, formats=("hf",), fp8_block=16),
    "deepseek3_yarn": dict(
        DEEPSEEK3, scaling={"rope_type": "yarn", "factor": 4.0,
                            "original_max_position_embeddings": 1024,
                            "beta_fast": 32.0, "beta_slow": 1.0,
                            "mscale": 1.0, "mscale_all_dim": 1.0},
                           seeds=(1, 104)),
    "gemma3": dict(gguf_arch="gemma3", hf_type="gemma3_text", pre="smollm",
                   layers=7, head_dim=24, eps=1e-6, theta=1e6, tied=True,
                   qk_norm=True, post_norms=True, window=20,
                   scaling={"rope_type": "linear", "factor": 8.0},
                   swa_theta=10000.0, query_pre_attn_scalar=32),
    "gemma2": dict(gguf_arch="gemma2", hf_type="gemma2", pre="smollm",
                   layers=6, head_dim=24, eps=1e-6, theta=10000.0,
                   tied=True, post_norms=True, window=20,
                   query_pre_attn_scalar=32, attn_softcap=ATTN_SOFTCAP,
                   final_softcap=FINAL_SOFTCAP),
    "gpt_oss": dict(gguf_arch="gpt-oss", hf_type="gpt_oss", pre="qwen2",
                    formats=("gguf",), theta=150000.0, bias=True, window=20,
                    experts=8, experts_used=2, expert_ffn=64,
                    experts_norm=True, oai=True,
                    seeds=(5, 101)),
    # gpt-oss's folder as OpenAI ships it: experts in MXFP4 (_blocks and
    # _scales, gate and up interleaved), YaRN with truncate false.
    "gpt_oss_hf": dict(hf_type="gpt_oss", formats=("hf",), theta=150000.0,
                       bias=True, window=20, experts=8, experts_used=2,
                       expert_ffn=64, experts_norm=True, oai=True,
                       scaling={"rope_type": "yarn", "factor": 32.0,
                                "beta_fast": 32.0, "beta_slow": 1.0,
                                "truncate": False,
                                "original_max_position_embeddings": 4096}),
    "kquant": dict(gguf_arch="llama", hf_type="llama", pre="llama-bpe",
                   hidden=256, ffn=512, heads=12, kv_heads=6, head_dim=64,
                   formats=("gguf",)),
    # Qwen3.5 (llama.cpp's qwen35, GGUF only): Gated DeltaNet layers but
    # every 4th (3 and 7), whose 2 k heads serve 4 value heads (tiled, as
    # the converter writes them); gated attention with QK-norm and RoPE
    # over 8 of 32 dims; an untied LM head.
    "qwen35": dict(gguf_arch="qwen35", hf_type="qwen3_5_text", pre="qwen2",
                   layers=8, head_dim=32, theta=1e7,
                   eps=1e-6, qk_norm=True, rotary_factor=0.25,
                   attn_gate=True, full_attention_interval=4, ssm_conv=4,
                   ssm_k_heads=2, ssm_v_heads=4, ssm_head=16,
                   seeds=(2, 101)),
    # Qwen3.5-MoE (llama.cpp's qwen35moe, and its ConditionalGeneration
    # folder): qwen35's layers with a mixture in every layer: 8 experts of
    # 64 (top 2, renormalized) and a shared expert of 96 gated per token by
    # sigmoid(w . h).
    "qwen35moe": dict(gguf_arch="qwen35moe", hf_type="qwen3_5_moe_text",
                      pre="qwen2", layers=8, head_dim=32, theta=1e7,
                      eps=1e-6, qk_norm=True, rotary_factor=0.25,
                      attn_gate=True, full_attention_interval=4, ssm_conv=4,
                      ssm_k_heads=2, ssm_v_heads=4, ssm_head=16, experts=8,
                      experts_used=2, expert_ffn=64, experts_norm=True,
                      shared_experts=1, shared_ffn=96, shared_gate=True,
                      seeds=(5, 107)),
    # Qwen3-Next (llama.cpp's qwen3next, and Qwen3NextForCausalLM's folder):
    # qwen35moe's layers with the value heads grouped (value head i reads
    # key head i / 2) and each layer's betas and alphas in one ssm_ba, as
    # the converter writes them (the folder fuses q, k, v and z per key
    # head too).
    "qwen3next": dict(gguf_arch="qwen3next", hf_type="qwen3_next",
                      pre="qwen2", layers=8, head_dim=32, theta=1e7,
                      eps=1e-6, qk_norm=True, rotary_factor=0.25,
                      attn_gate=True, full_attention_interval=4, ssm_conv=4,
                      ssm_k_heads=2, ssm_v_heads=4, ssm_head=16, experts=8,
                      experts_used=2, expert_ffn=64, experts_norm=True,
                      shared_experts=1, shared_ffn=96, shared_gate=True,
                      seeds=(8, 104)),
    "qwen2_swa": dict(hf_type="qwen2", formats=("hf",), theta=1e6,
                      tied=True, bias=True, eps=1e-6, window=20,
                      max_window_layers=2),
}
HF_ARCH = {"llama": "LlamaForCausalLM", "qwen2": "Qwen2ForCausalLM",
           "mistral": "MistralForCausalLM", "qwen3": "Qwen3ForCausalLM",
           "qwen3_moe": "Qwen3MoeForCausalLM",
           "mixtral": "MixtralForCausalLM",
           "glm4_moe": "Glm4MoeForCausalLM",
           "deepseek_v3": "DeepseekV3ForCausalLM",
           "gemma2": "Gemma2ForCausalLM",
           "gemma3_text": "Gemma3ForCausalLM",
           "gpt_oss": "GptOssForCausalLM"}
STEPS = 32


def family(name: str) -> dict:
    f = dict(BASE)
    f.update(FAMILIES[name])
    return f


def draw(f: dict, seed: int) -> dict:
    """Canonical (GGUF-named) float32 tensors, numpy layout (out, in)."""
    rng = np.random.default_rng(seed)
    h, d = f["hidden"], f["head_dim"]
    q, kv = f["heads"] * d, f["kv_heads"] * d

    def lin(out_f, in_f, gain=1.0):
        return (rng.standard_normal((out_f, in_f)) * gain /
                np.sqrt(in_f)).astype(np.float32)

    def norm(n):
        return (1.0 + 0.1 * rng.standard_normal(n)).astype(np.float32)

    t = {"token_embd.weight": lin(VOCAB, h, gain=np.sqrt(h)),
         "output_norm.weight": norm(h)}
    if not f["tied"]:
        t["output.weight"] = lin(VOCAB, h, gain=10.0)
    for i in range(f["layers"]):
        p = f"blk.{i}."
        t[p + "attn_norm.weight"] = norm(h)
        if is_linear(f, i):
            draw_gated_delta_net(f, t, p, rng, lin, norm)
        elif f["kv_lora"]:
            # Multi-head latent attention, kv_b merged as HF's kv_b_proj
            # (write_gguf splits it).
            nh, r, vd, R = f["heads"], f["qk_rope"], f["v_head"], f["kv_lora"]
            qk = nh * (d + r)
            if f["q_lora"]:
                t[p + "attn_q_a.weight"] = lin(f["q_lora"], h)
                t[p + "attn_q_a_norm.weight"] = norm(f["q_lora"])
                t[p + "attn_q_b.weight"] = lin(qk, f["q_lora"])
            else:
                t[p + "attn_q.weight"] = lin(qk, h)
            t[p + "attn_kv_a_mqa.weight"] = lin(R + r, h)
            t[p + "attn_kv_a_norm.weight"] = norm(R)
            t[p + "attn_kv_b.weight"] = lin(nh * (d + vd), R)
            t[p + "attn_output.weight"] = lin(h, nh * vd)
        else:
            t[p + "attn_q.weight"] = lin(2 * q if f.get("attn_gate") else q,
                                         h)
            t[p + "attn_k.weight"] = lin(kv, h)
            t[p + "attn_v.weight"] = lin(kv, h)
            if f["bias"]:
                for n, size in (("q", q), ("k", kv), ("v", kv)):
                    t[p + f"attn_{n}.bias"] = (
                        0.5 * rng.standard_normal(size)).astype(np.float32)
            t[p + "attn_output.weight"] = lin(h, q)
            if f.get("oai"):  # gpt-oss: sinks per head, an output bias.
                t[p + "attn_sinks.weight"] = (
                    1.0 + 2.0 * rng.standard_normal(f["heads"])
                ).astype(np.float32)
                t[p + "attn_output.bias"] = (
                    0.5 * rng.standard_normal(h)).astype(np.float32)
        if f["qk_norm"] and not is_linear(f, i):
            t[p + "attn_q_norm.weight"] = norm(d)
            t[p + "attn_k_norm.weight"] = norm(d)
        if f["post_norms"]:
            t[p + "post_attention_norm.weight"] = norm(h)
        t[p + "ffn_norm.weight"] = norm(h)
        if f["experts"] and i >= f["dense_layers"]:
            # The router with a larger gain, so that routings are decisive;
            # experts merged as llama.cpp's files hold them.
            e, fe = f["experts"], f["expert_ffn"]
            t[p + "ffn_gate_inp.weight"] = lin(e, h, gain=f["router_gain"])
            t[p + "ffn_gate_exps.weight"] = np.stack(
                [lin(fe, h) for _ in range(e)])
            t[p + "ffn_up_exps.weight"] = np.stack(
                [lin(fe, h) for _ in range(e)])
            t[p + "ffn_down_exps.weight"] = np.stack(
                [lin(h, fe) for _ in range(e)])
            if f["gating"] == "sigmoid":  # e_score_correction_bias
                t[p + "exp_probs_b.bias"] = (
                    0.1 * rng.standard_normal(e)).astype(np.float32)
            if f.get("oai"):  # gpt-oss's router and expert biases.
                for name, shape, sd in (("ffn_gate_inp.bias", (e,), 1.0),
                                        ("ffn_gate_exps.bias", (e, fe), 4.0),
                                        ("ffn_up_exps.bias", (e, fe), 4.0),
                                        ("ffn_down_exps.bias", (e, h), 0.5)):
                    t[p + name] = (sd * rng.standard_normal(shape)).astype(
                        np.float32)
            if f["shared_experts"]:
                fs = f.get("shared_ffn") or fe * f["shared_experts"]
                if f.get("shared_gate"):  # Qwen3.5-MoE's, per token.
                    t[p + "ffn_gate_inp_shexp.weight"] = (
                        rng.standard_normal(h) / np.sqrt(h)).astype(
                            np.float32)
                t[p + "ffn_gate_shexp.weight"] = lin(fs, h)
                t[p + "ffn_up_shexp.weight"] = lin(fs, h)
                t[p + "ffn_down_shexp.weight"] = lin(h, fs)
        else:
            t[p + "ffn_gate.weight"] = lin(f["ffn"], h)
            t[p + "ffn_up.weight"] = lin(f["ffn"], h)
            t[p + "ffn_down.weight"] = lin(h, f["ffn"])
        if f["post_norms"]:
            t[p + "post_ffw_norm.weight"] = norm(h)
    return t


def is_linear(f: dict, layer: int) -> bool:
    """A Gated DeltaNet layer: all but every full_attention_interval-th."""
    n = f.get("full_attention_interval", 0)
    return n > 0 and (layer + 1) % n != 0


def draw_gated_delta_net(f: dict, t: dict, p: str, rng, lin, norm) -> None:
    """A Gated DeltaNet layer's tensors, llama.cpp's names and layout: the
    v heads tiled (value head i reads k head i % k_heads). The decay a x
    softplus(alpha + dt) spans exp(-0.02) to exp(-1.5) or so a token, and
    beta sigmoid(N(0, 1)), so that the state both keeps and forgets."""
    h, dk = f["hidden"], f["ssm_head"]
    hk, hv = f["ssm_k_heads"], f["ssm_v_heads"]
    conv_dim = (2 * hk + hv) * dk
    t[p + "attn_qkv.weight"] = lin(conv_dim, h)
    t[p + "attn_gate.weight"] = lin(hv * dk, h)
    t[p + "ssm_beta.weight"] = lin(hv, h)
    t[p + "ssm_alpha.weight"] = lin(hv, h)
    t[p + "ssm_dt.bias"] = (-1.0 + 0.5 * rng.standard_normal(hv)).astype(
        np.float32)
    t[p + "ssm_a"] = (-rng.uniform(0.5, 4.0, hv)).astype(np.float32)
    t[p + "ssm_conv1d.weight"] = (0.5 * rng.standard_normal(
        (conv_dim, f["ssm_conv"]))).astype(np.float32)
    t[p + "ssm_norm.weight"] = norm(dk)
    t[p + "ssm_out.weight"] = lin(h, hv * dk)


def llama3_freq_factors(f: dict) -> np.ndarray:
    """What llama.cpp's converter (convert_hf_to_gguf.py, LlamaModel)
    stores as rope_freqs.weight for llama3 scaling: per pair, the divisor
    of its frequency."""
    s, d = f["scaling"], f["head_dim"]
    freqs = 1.0 / (f["theta"] ** (np.arange(0, d, 2, dtype=np.float64) / d))
    old = s["original_max_position_embeddings"]
    lo_wl, hi_wl = old / s["low_freq_factor"], old / s["high_freq_factor"]
    out = []
    for fr in freqs:
        wavelen = 2 * np.pi / fr
        if wavelen < hi_wl:
            out.append(1.0)
        elif wavelen > lo_wl:
            out.append(s["factor"])
        else:
            smooth = ((old / wavelen - s["low_freq_factor"]) /
                      (s["high_freq_factor"] - s["low_freq_factor"]))
            out.append(1 / ((1 - smooth) / s["factor"] + smooth))
    return np.asarray(out, dtype=np.float32)


def rotary_dims(f: dict) -> int:
    """The dims of each head RoPE rotates (transformers' and llama.cpp's
    converter's int(head_dim * partial_rotary_factor))."""
    return int(f["head_dim"] * f["rotary_factor"])


def write_gguf(path: str, f: dict, t: dict, tokenizer_gguf: str) -> None:
    import gguf
    src = gguf.GGUFReader(tokenizer_gguf)

    def field(key):
        return src.fields[key].contents()

    arch = f["gguf_arch"]
    mla = arch == "deepseek2"
    w = gguf.GGUFWriter(path, arch)
    w.add_name(f"tiny-{arch}")
    w.add_block_count(f["layers"])
    w.add_context_length(f["context"])
    w.add_embedding_length(f["hidden"])
    # Mixtral's experts are its FFN; Qwen3-MoE's have a width of their own
    # (GLM-4.5's too, its leading dense layers that of the FFN).
    w.add_feed_forward_length(
        f["expert_ffn"] if f["experts"] and arch == "llama" else f["ffn"])
    if f["experts"]:
        w.add_expert_count(f["experts"])
        w.add_expert_used_count(f["experts_used"])
        if arch != "llama":
            w.add_expert_feed_forward_length(f["expert_ffn"])
    if arch == "glm4moe":  # As llama.cpp's converter (Glm4MoeModel) writes.
        w.add_expert_shared_count(f["shared_experts"])
        w.add_leading_dense_block_count(f["dense_layers"])
        w.add_expert_gating_func(gguf.ExpertGatingFuncType.SIGMOID)
        w.add_expert_weights_scale(f["routed_scale"])
        w.add_expert_weights_norm(f["experts_norm"])
        w.add_expert_group_count(f["groups"])
        w.add_expert_group_used_count(f["groups_used"])
        w.add_nextn_predict_layers(0)
    if mla:  # As llama.cpp's converter (DeepseekV2Model) writes.
        nope, r, R = f["head_dim"], f["qk_rope"], f["kv_lora"]
        w.add_vocab_size(VOCAB)
        w.add_leading_dense_block_count(f["dense_layers"])
        # The converter writes q_lora_rank only with q LoRA; llama.cpp
        # requires it unless the block count is a "lite" one (26, 27).
        w.add_q_lora_rank(f["q_lora"])
        w.add_kv_lora_rank(R)
        if f["legacy_kv_b"]:  # Before the converter split kv_b.
            w.add_key_length(nope + r)
            w.add_value_length(f["v_head"])
        else:
            w.add_key_length(R + r)
            w.add_value_length(R)
            w.add_key_length_mla(nope + r)
            w.add_value_length_mla(f["v_head"])
        w.add_expert_shared_count(f["shared_experts"])
        w.add_expert_weights_scale(f["routed_scale"])
        if f["experts_norm"]:
            w.add_expert_weights_norm(True)
        w.add_expert_gating_func(gguf.ExpertGatingFuncType.SIGMOID)
        w.add_expert_group_count(f["groups"])
        w.add_expert_group_used_count(f["groups_used"])
    w.add_head_count(f["heads"])
    # MLA as llama.cpp runs it: MQA over the latent.
    w.add_head_count_kv(1 if mla and not f["legacy_kv_b"] else f["kv_heads"])
    w.add_rope_freq_base(f["theta"])
    w.add_layer_norm_rms_eps(f["eps"])
    w.add_rope_dimension_count(f["qk_rope"] if mla else rotary_dims(f))
    # As Qwen3's files say; GLM-4.5's and Gemma 3's always (their
    # converters write them whenever config.json has head_dim).
    if not mla and (f["head_dim"] * f["heads"] != f["hidden"]
                    or arch in ("glm4moe", "gemma2", "gemma3")):
        w.add_key_length(f["head_dim"])
        w.add_value_length(f["head_dim"])
    w.add_file_type(gguf.LlamaFileType.ALL_F32)
    if f["window"]:
        w.add_sliding_window(f["window"])
    if arch == "gemma3":  # The converter's, from rope_parameters.
        w.add_rope_freq_base_swa(f["swa_theta"])
    if arch in ("qwen35moe", "qwen3next"):  # Qwen2MoeModel's part.
        w.add_expert_shared_feed_forward_length(f["shared_ffn"])
    if arch in ("qwen35", "qwen35moe", "qwen3next"):
        # As llama.cpp's converter (Qwen3_5TextModel, Qwen3_5MoeTextModel).
        w.add_ssm_conv_kernel(f["ssm_conv"])
        w.add_ssm_state_size(f["ssm_head"])
        w.add_ssm_group_count(f["ssm_k_heads"])
        w.add_ssm_time_step_rank(f["ssm_v_heads"])
        w.add_ssm_inner_size(f["ssm_v_heads"] * f["ssm_head"])
        w.add_full_attention_interval(f["full_attention_interval"])
        # Interleaved M-RoPE's sections, pairs of the rotated dims (text
        # gives every section the same position).
        pairs = rotary_dims(f) // 2
        w.add_rope_dimension_sections(
            [pairs - 2 * (pairs // 3), pairs // 3, pairs // 3, 0])
    if arch == "gemma2":
        w.add_attn_logit_softcapping(f["attn_softcap"])
        w.add_final_logit_softcapping(f["final_softcap"])
    s = f["scaling"]
    if s and s["rope_type"] == "linear":
        w.add_rope_scaling_type(gguf.RopeScalingType.LINEAR)
        w.add_rope_scaling_factor(s["factor"])
    elif s and s["rope_type"] == "yarn":
        w.add_rope_scaling_type(gguf.RopeScalingType.YARN)
        w.add_rope_scaling_factor(s["factor"])
        w.add_rope_scaling_orig_ctx_len(s["original_max_position_embeddings"])
        if mla and s.get("mscale_all_dim"):
            # The converter's 0.1 x mscale_all_dim (llama.cpp divides it
            # back out).
            w.add_rope_scaling_yarn_log_mul(0.1 * s["mscale_all_dim"])
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre(f["pre"])
    w.add_token_list(field("tokenizer.ggml.tokens"))
    w.add_token_types(field("tokenizer.ggml.token_type"))
    w.add_token_merges(field("tokenizer.ggml.merges"))
    w.add_bos_token_id(int(field("tokenizer.ggml.bos_token_id")))
    w.add_eos_token_id(int(field("tokenizer.ggml.eos_token_id")))
    if s and s["rope_type"] == "llama3":
        w.add_tensor("rope_freqs.weight", llama3_freq_factors(f))
    for name, a in t.items():
        if arch == "qwen3next" and name.endswith(".ssm_alpha.weight"):
            continue  # Written with the betas, in ssm_ba.
        if arch == "qwen3next" and name.endswith(".ssm_beta.weight"):
            # Per key head: its value heads' betas, then their alphas.
            alpha = t[name.replace("ssm_beta", "ssm_alpha")]
            hk, cols = f["ssm_k_heads"], a.shape[1]
            ba = np.concatenate([a.reshape(hk, 1, -1, cols),
                                 alpha.reshape(hk, 1, -1, cols)], axis=1)
            w.add_tensor(name.replace("ssm_beta", "ssm_ba"),
                         np.ascontiguousarray(ba.reshape(-1, cols)))
            continue
        if (arch in ("glm4moe", "gpt-oss", "qwen35", "qwen35moe",
                     "qwen3next") and name.endswith(".ffn_norm.weight")):
            # GLM-4.5's and gpt-oss's pre-FFN norm (HF post_attention_
            # layernorm) is the arch's ATTN_POST_NORM in llama.cpp (it has
            # no FFN_NORM).
            name = name.replace(".ffn_norm.", ".post_attention_norm.")
        if (mla and not f["legacy_kv_b"]
                and name.endswith(".attn_kv_b.weight")):
            # The converter's split: per head, attn_k_b the k_nope rows
            # transposed (n_heads, kv_lora, qk_nope), attn_v_b the v rows
            # (n_heads, v_head, kv_lora): GGUF dims [qk_nope, kv_lora,
            # n_heads] and [kv_lora, v_head, n_heads].
            kvb = a.reshape(f["heads"], f["head_dim"] + f["v_head"], -1)
            w.add_tensor(name.replace("attn_kv_b", "attn_k_b"),
                         np.ascontiguousarray(
                             kvb[:, :f["head_dim"], :].transpose(0, 2, 1)))
            w.add_tensor(name.replace("attn_kv_b", "attn_v_b"),
                         np.ascontiguousarray(kvb[:, f["head_dim"]:, :]))
            continue
        if f.get("expert_quant") and name.endswith("_exps.weight"):
            # The experts in a block format, as gpt-oss ships them
            # (MXFP4): the gguf package's quantizer, its blocks as they are.
            qtype = gguf.GGMLQuantizationType[f["expert_quant"]]
            w.add_tensor(name, gguf.quants.quantize(a, qtype),
                         raw_dtype=qtype)
            continue
        w.add_tensor(name, a)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


HF_NAMES = {"attn_norm.weight": "input_layernorm.weight",
            "ffn_norm.weight": "post_attention_layernorm.weight",
            "attn_q.weight": "self_attn.q_proj.weight",
            "attn_k.weight": "self_attn.k_proj.weight",
            "attn_v.weight": "self_attn.v_proj.weight",
            "attn_q.bias": "self_attn.q_proj.bias",
            "attn_k.bias": "self_attn.k_proj.bias",
            "attn_v.bias": "self_attn.v_proj.bias",
            "attn_output.weight": "self_attn.o_proj.weight",
            "ffn_gate.weight": "mlp.gate_proj.weight",
            "ffn_up.weight": "mlp.up_proj.weight",
            "ffn_down.weight": "mlp.down_proj.weight",
            "attn_q_norm.weight": "self_attn.q_norm.weight",
            "attn_q_a.weight": "self_attn.q_a_proj.weight",
            "attn_q_a_norm.weight": "self_attn.q_a_layernorm.weight",
            "attn_q_b.weight": "self_attn.q_b_proj.weight",
            "attn_kv_a_mqa.weight": "self_attn.kv_a_proj_with_mqa.weight",
            "attn_kv_a_norm.weight": "self_attn.kv_a_layernorm.weight",
            "attn_kv_b.weight": "self_attn.kv_b_proj.weight",
            "attn_k_norm.weight": "self_attn.k_norm.weight",
            "exp_probs_b.bias": "mlp.gate.e_score_correction_bias",
            "ffn_gate_shexp.weight": "mlp.shared_experts.gate_proj.weight",
            "ffn_up_shexp.weight": "mlp.shared_experts.up_proj.weight",
            "ffn_down_shexp.weight": "mlp.shared_experts.down_proj.weight"}
# Gemma's four norms a layer: HF's post_attention_layernorm is the norm
# of the attention's output, pre_feedforward_layernorm the FFN's input's.
GEMMA3_HF_NAMES = dict(
    HF_NAMES, **{"ffn_norm.weight": "pre_feedforward_layernorm.weight",
                 "post_attention_norm.weight":
                     "post_attention_layernorm.weight",
                 "post_ffw_norm.weight": "post_feedforward_layernorm.weight"})


def untile_v_heads(a: np.ndarray, f: dict, d: int, axis: int = 0):
    """The inverse of llama.cpp's converter's _reorder_v_heads along `axis`
    (value head i of GGUF's tiled order back to Hugging Face's grouped
    order, heads of d values)."""
    hk, hv = f["ssm_k_heads"], f["ssm_v_heads"]
    a = np.moveaxis(a, axis, 0)
    rest = a.shape[1:]
    a = a.reshape(hv // hk, hk, d, *rest).swapaxes(0, 1).reshape(hv * d, *rest)
    return np.ascontiguousarray(np.moveaxis(a, 0, axis))


def hf_qwen_attention(out: dict, t: dict, p: str, sa: str) -> None:
    """Qwen3.5's and Qwen3-Next's gated attention in transformers' names
    (under `sa`) from layer `p`'s canonical tensors: q (with its gates), k,
    v, o, and the QK norms as w - 1."""
    for g, h in (("q", "q"), ("k", "k"), ("v", "v"), ("output", "o")):
        out[f"{sa}{h}_proj.weight"] = t[f"{p}attn_{g}.weight"]
    out[sa + "q_norm.weight"] = t[p + "attn_q_norm.weight"] - 1.0
    out[sa + "k_norm.weight"] = t[p + "attn_k_norm.weight"] - 1.0


def hf_qwen_mixture(out: dict, t: dict, p: str, m: str, f: dict) -> None:
    """Qwen3.5-MoE's and Qwen3-Next's mixture in transformers' names (under
    `m`): the router, the experts one tensor each (as their checkpoints
    hold them), the shared expert and its gate ([1, hidden])."""
    out[m + "gate.weight"] = t[p + "ffn_gate_inp.weight"]
    for e in range(f["experts"]):
        for g in ("gate", "up", "down"):
            out[f"{m}experts.{e}.{g}_proj.weight"] = (
                t[f"{p}ffn_{g}_exps.weight"][e])
    for g in ("gate", "up", "down"):
        out[f"{m}shared_expert.{g}_proj.weight"] = t[f"{p}ffn_{g}_shexp.weight"]
    out[m + "shared_expert_gate.weight"] = (
        t[p + "ffn_gate_inp_shexp.weight"][None, :])


def write_hf_qwen35(d: str, f: dict, t: dict) -> None:
    """Qwen3.5 as its folders ship it (Qwen3_5ForConditionalGeneration: the
    text config in text_config, the weights under model.language_model.),
    without the vision tower: the canonical (GGUF) tensors converted back
    as check_qwen35_transformers.py does (value heads untiled, A_log =
    log(-ssm_a), the (1 + w) norms less 1 but the gated one, conv1d [C, 1,
    W]); that script holds this layout to transformers."""
    from safetensors.numpy import save_file
    os.makedirs(d, exist_ok=True)
    hk, dk = f["ssm_k_heads"], f["ssm_head"]
    pairs = rotary_dims(f) // 2
    moe = f["experts"] > 0
    text = {
        "model_type": "qwen3_5_moe_text" if moe else "qwen3_5_text",
        "vocab_size": VOCAB,
        "hidden_size": f["hidden"], "intermediate_size": f["ffn"],
        "num_hidden_layers": f["layers"],
        "num_attention_heads": f["heads"],
        "num_key_value_heads": f["kv_heads"], "head_dim": f["head_dim"],
        "hidden_act": "silu", "max_position_embeddings": f["context"],
        "rms_norm_eps": f["eps"], "tie_word_embeddings": f["tied"],
        "attention_bias": False, "attention_dropout": 0.0,
        "linear_conv_kernel_dim": f["ssm_conv"],
        "linear_key_head_dim": dk, "linear_value_head_dim": dk,
        "linear_num_key_heads": hk,
        "linear_num_value_heads": f["ssm_v_heads"],
        "layer_types": ["linear_attention" if is_linear(f, i)
                        else "full_attention" for i in range(f["layers"])],
        "full_attention_interval": f["full_attention_interval"],
        "rope_parameters": {
            "rope_type": "default", "rope_theta": f["theta"],
            "partial_rotary_factor": f["rotary_factor"],
            "mrope_section": [pairs - 2 * (pairs // 3), pairs // 3,
                              pairs // 3],
            "mrope_interleaved": True},
        "bos_token_id": 1, "eos_token_id": 2, "dtype": "float32"}
    if moe:  # Qwen3.5-MoE: a mixture in every layer, one shared expert.
        text.update({
            "num_experts": f["experts"],
            "num_experts_per_tok": f["experts_used"],
            "moe_intermediate_size": f["expert_ffn"],
            "shared_expert_intermediate_size": f["shared_ffn"],
            "norm_topk_prob": f["experts_norm"]})
    config = {"architectures": ["Qwen3_5MoeForConditionalGeneration" if moe
                                else "Qwen3_5ForConditionalGeneration"],
              "model_type": "qwen3_5_moe" if moe else "qwen3_5",
              "text_config": text, "tie_word_embeddings": f["tied"]}
    with open(os.path.join(d, "config.json"), "w") as fh:
        json.dump(config, fh, indent=2)
    lm = "model.language_model."
    out = {lm + "embed_tokens.weight": t["token_embd.weight"],
           lm + "norm.weight": t["output_norm.weight"] - 1.0}
    if "output.weight" in t:
        out["lm_head.weight"] = t["output.weight"]
    qk = 2 * hk * dk
    for i in range(f["layers"]):
        p, pre = f"blk.{i}.", f"{lm}layers.{i}."
        out[pre + "input_layernorm.weight"] = t[p + "attn_norm.weight"] - 1.0
        out[pre + "post_attention_layernorm.weight"] = (
            t[p + "ffn_norm.weight"] - 1.0)
        if moe:
            hf_qwen_mixture(out, t, p, pre + "mlp.", f)
        else:
            for g in ("gate", "up", "down"):
                out[f"{pre}mlp.{g}_proj.weight"] = t[f"{p}ffn_{g}.weight"]
        if is_linear(f, i):
            la = pre + "linear_attn."
            qkv = t[p + "attn_qkv.weight"]
            out[la + "in_proj_qkv.weight"] = np.concatenate(
                [qkv[:qk], untile_v_heads(qkv[qk:], f, dk)])
            out[la + "in_proj_z.weight"] = untile_v_heads(
                t[p + "attn_gate.weight"], f, dk)
            out[la + "in_proj_b.weight"] = untile_v_heads(
                t[p + "ssm_beta.weight"], f, 1)
            out[la + "in_proj_a.weight"] = untile_v_heads(
                t[p + "ssm_alpha.weight"], f, 1)
            out[la + "dt_bias"] = untile_v_heads(t[p + "ssm_dt.bias"], f, 1)
            out[la + "A_log"] = np.log(
                -untile_v_heads(t[p + "ssm_a"], f, 1)).astype(np.float32)
            conv = t[p + "ssm_conv1d.weight"]
            out[la + "conv1d.weight"] = np.concatenate(
                [conv[:qk], untile_v_heads(conv[qk:], f, dk)])[:, None, :]
            out[la + "norm.weight"] = t[p + "ssm_norm.weight"]
            out[la + "out_proj.weight"] = untile_v_heads(
                t[p + "ssm_out.weight"], f, dk, axis=1)
        else:
            hf_qwen_attention(out, t, p, pre + "self_attn.")
    save_file({k: np.ascontiguousarray(v) for k, v in out.items()},
              os.path.join(d, "model.safetensors"))


def write_hf_qwen3next(d: str, f: dict, t: dict) -> None:
    """Qwen3-Next as its folders ship it (Qwen3NextForCausalLM): the
    canonical tensors converted back as llama.cpp's converter reads them
    (Qwen3NextModel): q, k, v and z fused per key head in in_proj_qkvz,
    b and a per key head in in_proj_ba, A_log = log(-ssm_a), conv1d [C, 1,
    W], the (1 + w) norms less 1 but the gated one; the experts one
    tensor each, the shared expert and its gate ([1, hidden])."""
    from safetensors.numpy import save_file
    os.makedirs(d, exist_ok=True)
    hk, hv, dk = f["ssm_k_heads"], f["ssm_v_heads"], f["ssm_head"]
    r = hv // hk
    config = {
        "architectures": ["Qwen3NextForCausalLM"], "model_type": "qwen3_next",
        "vocab_size": VOCAB, "hidden_size": f["hidden"],
        "intermediate_size": f["ffn"], "num_hidden_layers": f["layers"],
        "num_attention_heads": f["heads"],
        "num_key_value_heads": f["kv_heads"], "head_dim": f["head_dim"],
        "hidden_act": "silu", "max_position_embeddings": f["context"],
        "rms_norm_eps": f["eps"], "tie_word_embeddings": f["tied"],
        "rope_theta": f["theta"], "partial_rotary_factor": f["rotary_factor"],
        "attention_bias": False, "linear_conv_kernel_dim": f["ssm_conv"],
        "linear_key_head_dim": dk, "linear_value_head_dim": dk,
        "linear_num_key_heads": hk, "linear_num_value_heads": hv,
        "layer_types": ["linear_attention" if is_linear(f, i)
                        else "full_attention" for i in range(f["layers"])],
        "full_attention_interval": f["full_attention_interval"],
        "num_experts": f["experts"], "num_experts_per_tok": f["experts_used"],
        "moe_intermediate_size": f["expert_ffn"],
        "shared_expert_intermediate_size": f["shared_ffn"],
        "norm_topk_prob": f["experts_norm"], "decoder_sparse_step": 1,
        "mlp_only_layers": [], "bos_token_id": 1, "eos_token_id": 2,
        "torch_dtype": "float32"}
    with open(os.path.join(d, "config.json"), "w") as fh:
        json.dump(config, fh, indent=2)
    out = {"model.embed_tokens.weight": t["token_embd.weight"],
           "model.norm.weight": t["output_norm.weight"] - 1.0}
    if "output.weight" in t:
        out["lm_head.weight"] = t["output.weight"]
    for i in range(f["layers"]):
        p, pre = f"blk.{i}.", f"model.layers.{i}."
        out[pre + "input_layernorm.weight"] = t[p + "attn_norm.weight"] - 1.0
        out[pre + "post_attention_layernorm.weight"] = (
            t[p + "ffn_norm.weight"] - 1.0)
        hf_qwen_mixture(out, t, p, pre + "mlp.", f)
        if is_linear(f, i):
            la = pre + "linear_attn."
            qkv, z = t[p + "attn_qkv.weight"], t[p + "attn_gate.weight"]
            q, k, v = qkv[:hk * dk], qkv[hk * dk:2 * hk * dk], qkv[2 * hk * dk:]
            cols = qkv.shape[1]
            out[la + "in_proj_qkvz.weight"] = np.concatenate([
                np.concatenate([q[g * dk:(g + 1) * dk], k[g * dk:(g + 1) * dk],
                                v[g * r * dk:(g + 1) * r * dk],
                                z[g * r * dk:(g + 1) * r * dk]])
                for g in range(hk)]).reshape(-1, cols)
            b, a = t[p + "ssm_beta.weight"], t[p + "ssm_alpha.weight"]
            out[la + "in_proj_ba.weight"] = np.concatenate([
                np.concatenate([b[g * r:(g + 1) * r], a[g * r:(g + 1) * r]])
                for g in range(hk)])
            out[la + "dt_bias"] = t[p + "ssm_dt.bias"]
            out[la + "A_log"] = np.log(-t[p + "ssm_a"]).astype(np.float32)
            out[la + "conv1d.weight"] = t[p + "ssm_conv1d.weight"][:, None, :]
            out[la + "norm.weight"] = t[p + "ssm_norm.weight"]
            out[la + "out_proj.weight"] = t[p + "ssm_out.weight"]
        else:
            hf_qwen_attention(out, t, p, pre + "self_attn.")
    save_file({k: np.ascontiguousarray(v) for k, v in out.items()},
              os.path.join(d, "model.safetensors"))


def write_hf(d: str, f: dict, t: dict) -> None:
    if f["hf_type"] in ("qwen3_5_text", "qwen3_5_moe_text"):
        write_hf_qwen35(d, f, t)
        return
    if f["hf_type"] == "qwen3_next":
        write_hf_qwen3next(d, f, t)
        return
    from safetensors.numpy import save_file
    os.makedirs(d, exist_ok=True)
    config = {
        "architectures": [HF_ARCH[f["hf_type"]]],
        "model_type": f["hf_type"],
        "hidden_size": f["hidden"],
        "intermediate_size": f["ffn"],
        "num_hidden_layers": f["layers"],
        "num_attention_heads": f["heads"],
        "num_key_value_heads": f["kv_heads"],
        "max_position_embeddings": f["context"],
        "rope_theta": f["theta"],
        "rope_scaling": f["scaling"],
        "rms_norm_eps": f["eps"],
        "hidden_act": "silu",
        "vocab_size": VOCAB,
        "tie_word_embeddings": f["tied"],
        "bos_token_id": 1,
        "eos_token_id": 2,
        "torch_dtype": "float32",
    }
    if f["head_dim"] * f["heads"] != f["hidden"] or f["qk_norm"]:
        config["head_dim"] = f["head_dim"]
    if f["hf_type"] == "mixtral":
        config.update(num_local_experts=f["experts"],
                      num_experts_per_tok=f["experts_used"],
                      intermediate_size=f["expert_ffn"])
    elif f["hf_type"] == "qwen3_moe":
        config.update(num_experts=f["experts"],
                      num_experts_per_tok=f["experts_used"],
                      moe_intermediate_size=f["expert_ffn"],
                      norm_topk_prob=f["experts_norm"],
                      decoder_sparse_step=1, mlp_only_layers=[])
    elif f["hf_type"] == "glm4_moe":  # As GLM-4.5's config.json has them.
        config.update(n_routed_experts=f["experts"],
                      num_experts_per_tok=f["experts_used"],
                      moe_intermediate_size=f["expert_ffn"],
                      norm_topk_prob=f["experts_norm"],
                      first_k_dense_replace=f["dense_layers"],
                      n_group=f["groups"], topk_group=f["groups_used"],
                      n_shared_experts=f["shared_experts"],
                      routed_scaling_factor=f["routed_scale"],
                      partial_rotary_factor=f["rotary_factor"],
                      attention_bias=f["bias"], use_qk_norm=f["qk_norm"],
                      head_dim=f["head_dim"], num_nextn_predict_layers=0,
                      attention_dropout=0.0)
    elif f["hf_type"] == "deepseek_v3":  # As DeepSeek-V3's config.json.
        config.update(n_routed_experts=f["experts"],
                      num_experts_per_tok=f["experts_used"],
                      moe_intermediate_size=f["expert_ffn"],
                      norm_topk_prob=f["experts_norm"],
                      first_k_dense_replace=f["dense_layers"],
                      n_group=f["groups"], topk_group=f["groups_used"],
                      n_shared_experts=f["shared_experts"],
                      routed_scaling_factor=f["routed_scale"],
                      topk_method="noaux_tc", scoring_func="sigmoid",
                      q_lora_rank=f["q_lora"] or None,
                      kv_lora_rank=f["kv_lora"],
                      qk_nope_head_dim=f["head_dim"],
                      qk_rope_head_dim=f["qk_rope"],
                      v_head_dim=f["v_head"], rope_interleave=True,
                      attention_bias=False, attention_dropout=0.0,
                      num_nextn_predict_layers=0)
    elif f["hf_type"] == "gemma3_text":
        # Gemma 3's config.json keys (rope_theta and rope_scaling, both the
        # global layers', are BASE's), and transformers 5's per layer type.
        # Every 6th layer global, as llama.cpp assumes without a GGUF key.
        del config["hidden_act"]
        pattern = 6
        config.update(
            hidden_activation="gelu_pytorch_tanh",
            query_pre_attn_scalar=f["query_pre_attn_scalar"],
            sliding_window=f["window"], sliding_window_pattern=pattern,
            layer_types=["sliding_attention" if (i + 1) % pattern
                         else "full_attention" for i in range(f["layers"])],
            rope_local_base_freq=f["swa_theta"],
            rope_parameters={
                "full_attention": dict(f["scaling"], rope_theta=f["theta"]),
                "sliding_attention": {"rope_type": "default",
                                      "rope_theta": f["swa_theta"]}},
            final_logit_softcapping=None, attn_logit_softcapping=None,
            attention_bias=False, attention_dropout=0.0)
    elif f["hf_type"] == "gemma2":  # As Gemma 2's config.json.
        del config["hidden_act"]
        config.update(
            hidden_activation="gelu_pytorch_tanh",
            query_pre_attn_scalar=f["query_pre_attn_scalar"],
            sliding_window=f["window"],
            attn_logit_softcapping=f["attn_softcap"],
            final_logit_softcapping=f["final_softcap"],
            attention_bias=False, attention_dropout=0.0)
    elif f["hf_type"] == "gpt_oss":  # As gpt-oss-20b's config.json.
        config.update(
            num_local_experts=f["experts"],
            num_experts_per_tok=f["experts_used"],
            experts_per_token=f["experts_used"],
            intermediate_size=f["expert_ffn"], head_dim=f["head_dim"],
            sliding_window=f["window"],
            layer_types=["sliding_attention" if i % 2 == 0
                         else "full_attention" for i in range(f["layers"])],
            attention_bias=True, attention_dropout=0.0, swiglu_limit=7.0,
            initial_context_length=4096,
            quantization_config={
                "quant_method": "mxfp4",
                "modules_to_not_convert": [
                    "model.layers.*.self_attn", "model.layers.*.mlp.router",
                    "model.embed_tokens", "lm_head"]})
    if f["hf_type"] == "qwen2" and f["window"]:
        config.update(use_sliding_window=True, sliding_window=f["window"],
                      max_window_layers=f["max_window_layers"])
    elif f["hf_type"] == "qwen2":  # As Qwen2.5 configs ship.
        config.update(use_sliding_window=False, sliding_window=f["context"],
                      max_window_layers=f["layers"])
    elif f["hf_type"] == "mistral":
        config["sliding_window"] = f["window"] or None
    with open(os.path.join(d, "config.json"), "w") as fh:
        json.dump(config, fh, indent=2)
    names = HF_NAMES
    if f["hf_type"] in ("gemma2", "gemma3_text"):  # RMSNorm's x (1 + w).
        names = GEMMA3_HF_NAMES
        t = {k: a - 1.0 if k.endswith("norm.weight") else a
             for k, a in t.items()}
    out = {"model.embed_tokens.weight": t["token_embd.weight"],
           "model.norm.weight": t["output_norm.weight"]}
    if "output.weight" in t:
        out["lm_head.weight"] = t["output.weight"]
    moe_block, expert_names = (
        ("block_sparse_moe", ("w1", "w3", "w2")) if f["hf_type"] == "mixtral"
        else ("mlp", ("gate_proj", "up_proj", "down_proj")))
    for name, a in t.items():
        if not name.startswith("blk."):
            continue
        _, i, rest = name.split(".", 2)
        pre = f"model.layers.{i}."
        if rest == "ffn_gate_inp.weight":
            out[f"{pre}{moe_block}.gate.weight"] = a
        elif rest.endswith("_exps.weight"):
            kind = ("ffn_gate", "ffn_up", "ffn_down").index(
                rest[:-len("_exps.weight")])
            for e in range(a.shape[0]):
                out[f"{pre}{moe_block}.experts.{e}.{expert_names[kind]}"
                    f".weight"] = a[e]
        elif f["hf_type"] == "gpt_oss" and rest not in names:
            continue  # gpt_oss_hf_tensors' own
        else:
            out[pre + names[rest]] = a
    if f["hf_type"] == "gpt_oss":
        out = gpt_oss_hf_tensors(f, t, out)
    path = os.path.join(d, "model.safetensors")
    if f.get("fp8_block"):
        write_fp8_safetensors(path, out, f["fp8_block"])
        config["quantization_config"] = {
            "quant_method": "fp8", "fmt": "e4m3",
            "activation_scheme": "dynamic",
            "weight_block_size": [f["fp8_block"], f["fp8_block"]]}
        with open(os.path.join(d, "config.json"), "w") as fh:
            json.dump(config, fh, indent=2)
        return
    save_file({k: np.ascontiguousarray(v) for k, v in out.items()}, path)


def mxfp4_hf(a: np.ndarray) -> tuple:
    """`a` [..., n] (n a multiple of 32) in MXFP4 as gpt-oss's folders hold
    it, quantized by the gguf package: blocks [..., n / 32, 16] u8 (byte j
    values 2j low and 2j + 1 high) and scales [..., n / 32] u8 (e8m0)."""
    import gguf
    q = gguf.quants.quantize(np.ascontiguousarray(a, dtype=np.float32),
                             gguf.GGMLQuantizationType.MXFP4)
    q = q.reshape(a.shape[:-1] + (a.shape[-1] // 32, 17))
    qs = q[..., 1:]  # GGUF: byte j values j (low) and j + 16 (high)
    vals = np.concatenate([qs & 0x0F, qs >> 4], axis=-1)
    blocks = (vals[..., 0::2] | (vals[..., 1::2] << 4)).astype(np.uint8)
    return blocks, np.ascontiguousarray(q[..., 0])


def gpt_oss_hf_tensors(f: dict, t: dict, out: dict) -> dict:
    """gpt-oss's names: the router, sinks, the output bias, and the merged
    experts in MXFP4 with gate and up interleaved by row (gate even)."""
    out = {k: v for k, v in out.items() if ".mlp.gate." not in k and
           ".mlp.experts." not in k}
    for i in range(f["layers"]):
        p, pre = f"blk.{i}.", f"model.layers.{i}."
        out[pre + "self_attn.sinks"] = t[p + "attn_sinks.weight"]
        out[pre + "self_attn.o_proj.bias"] = t[p + "attn_output.bias"]
        out[pre + "mlp.router.weight"] = t[p + "ffn_gate_inp.weight"]
        out[pre + "mlp.router.bias"] = t[p + "ffn_gate_inp.bias"]
        e = pre + "mlp.experts."
        gate, up = t[p + "ffn_gate_exps.weight"], t[p + "ffn_up_exps.weight"]
        gu = np.empty((gate.shape[0], 2 * gate.shape[1], gate.shape[2]),
                      dtype=np.float32)
        gu[:, 0::2], gu[:, 1::2] = gate, up
        out[e + "gate_up_proj_blocks"], out[e + "gate_up_proj_scales"] = \
            mxfp4_hf(gu)
        out[e + "down_proj_blocks"], out[e + "down_proj_scales"] = \
            mxfp4_hf(t[p + "ffn_down_exps.weight"])
        gb, ub = t[p + "ffn_gate_exps.bias"], t[p + "ffn_up_exps.bias"]
        bias = np.empty((gb.shape[0], 2 * gb.shape[1]), dtype=np.float32)
        bias[:, 0::2], bias[:, 1::2] = gb, ub
        out[e + "gate_up_proj_bias"] = bias
        out[e + "down_proj_bias"] = t[p + "ffn_down_exps.bias"]
    return out


def write_fp8_safetensors(path: str, tensors: dict, block: int) -> None:
    """tensors as safetensors, the projections (every *_proj.weight, the
    experts' included; not the router, norms or embeddings, as DeepSeek V3
    ships them) as F8_E4M3 codes, each block x block block scaled to the
    format's range by an F32 weight_scale_inv (the value is code x scale),
    rounded to the nearest code."""
    values = llama_ref_hf.e4m3_values()
    order = np.argsort(values[~np.isnan(values)], kind="stable")
    finite = np.flatnonzero(~np.isnan(values))[order]
    table = values[finite]
    entries = {}
    for name, a in tensors.items():
        a = np.asarray(a, dtype=np.float32)
        if not name.endswith("_proj.weight") or a.ndim != 2:
            entries[name] = ("F32", a.tobytes(), a.shape)
            continue
        rows, cols = a.shape
        br, bc = -(-rows // block), -(-cols // block)
        scale = np.zeros((br, bc), dtype=np.float32)
        codes = np.zeros(a.shape, dtype=np.uint8)
        for i in range(br):
            for j in range(bc):
                w = a[i * block:(i + 1) * block, j * block:(j + 1) * block]
                s = np.float32(max(float(np.abs(w).max()), 1e-12) / 448.0)
                x = w.astype(np.float64) / s
                k = np.clip(np.searchsorted(table, x), 1, len(table) - 1)
                nearer = np.where(np.abs(table[k - 1] - x) <= np.abs(table[k] - x),
                                  k - 1, k)
                codes[i * block:(i + 1) * block,
                      j * block:(j + 1) * block] = finite[nearer]
                scale[i, j] = s
        entries[name] = ("F8_E4M3", codes.tobytes(), a.shape)
        entries[name + "_scale_inv"] = ("F32", scale.tobytes(), scale.shape)
    header, data, at = {}, [], 0
    for name in sorted(entries):
        dtype, raw, shape = entries[name]
        header[name] = {"dtype": dtype, "shape": list(shape),
                        "data_offsets": [at, at + len(raw)]}
        data.append(raw)
        at += len(raw)
    text = json.dumps(header).encode()
    text += b" " * (-len(text) % 8)
    with open(path, "wb") as fh:
        fh.write(struct.pack("<Q", len(text)) + text + b"".join(data))


# A mixture's routings must be decisive too: the last chosen expert's
# router logit above the first unchosen one's by this much (f32 moves
# logits of ~10 by ~1e-6).
MIN_ROUTE_GAP = 1e-3
# With sigmoid gating (GLM-4.5) the gaps are llama_ref.route_sigmoid's, in
# choice units (sigmoid scores plus the correction bias, O(1)): the last
# chosen expert's group-masked choice above the best unchosen one's, masked
# zeros included (so transformers' masking with 0 and llama.cpp's with -inf
# choose alike), and the last kept group's score (sum of its top 2
# choices) above the best dropped group's. f32 moves those by ~1e-7
# (router logits of ~1 by ~1e-7, times sigmoid' <= 1/4, plus rounding).
MIN_SIGMOID_ROUTE_GAP = 1e-4


def min_margin_of(path: str) -> float:
    """The smallest top-2 logit margin over the prompts' greedy steps, or
    0 when some routing of a mixture is a near-tie."""
    ref = llama_ref.LlamaRef.load(path)
    # The same runs as check_forward.py's (--id-prompts, 32 steps, f32 KV):
    # kept in its cache (SHARDLM_REFERENCE_CACHE) for the checks to read.
    cache = check_forward.CachedReference(path, "f32")
    worst = float("inf")
    for ids in make_synthetic_model.SYNTHETIC_PROMPTS:
        greedy, rows = ref.greedy(ids, STEPS, return_logits=True)
        cache.store(ids, STEPS, greedy, rows)
        worst = min(worst, min(llama_ref.top2_margin(r) for r in rows))
    sigmoid = ref.cfg.gating == "sigmoid"
    limit = MIN_SIGMOID_ROUTE_GAP if sigmoid else MIN_ROUTE_GAP
    if ref.route_gaps and min(ref.route_gaps) <= limit:
        print(f"{path}: a routing near-tie ({'choice' if sigmoid else 'logit'}"
              f" gap {min(ref.route_gaps):.2g})")
        return 0.0
    return worst


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("outdir")
    ap.add_argument("--family", required=True, choices=sorted(FAMILIES))
    ap.add_argument("--tokenizer-gguf", default=TOKENIZER_GGUF_DEFAULT,
                    help="GGUF whose vocabulary the GGUF model carries")
    ap.add_argument("--min-margin", type=float,
                    default=make_synthetic_model.DEFAULT_MIN_MARGIN)
    ap.add_argument("--seed", type=int, default=1, help="first seed tried")
    ap.add_argument("--quantize", choices=sorted(quantize_gguf.FTYPES),
                    help="also write OUTDIR/FAMILY-TYPE.gguf, quantized by "
                    "llama.cpp; the margins are checked on that file")
    a = ap.parse_args(argv)
    f = family(a.family)
    os.makedirs(a.outdir, exist_ok=True)
    # ctest runs a fixture again in every ctest run that selects one of
    # its tests (test.sh runs the reference checks and the llama.cpp
    # checks apart): the same draws are not searched for again while the
    # stamp says they came from these arguments, these sources and this
    # vocabulary file.
    stamp_path = os.path.join(a.outdir, f".{a.family}.stamp")
    stamp = inputs_digest(argv if argv is not None else sys.argv[1:],
                          a.tokenizer_gguf)
    outputs = [os.path.join(a.outdir, f"{a.family}.gguf"),
               os.path.join(a.outdir, f"{a.family}-hf")]
    outputs = [p for k, p in enumerate(outputs)
               if ("gguf", "hf")[k] in f["formats"]]
    if a.quantize:
        outputs.append(os.path.join(a.outdir,
                                    f"{a.family}-{a.quantize}.gguf"))
    if os.path.exists(stamp_path):
        with open(stamp_path, encoding="utf-8") as fh:
            if fh.read() == stamp and all(map(os.path.exists, outputs)):
                print(f"{a.outdir}: the {a.family} models are up to date "
                      f"({stamp_path})")
                return 0
        os.remove(stamp_path)
    targets = [(os.path.join(a.outdir, f"{a.family}.gguf"),
                lambda p, t: write_gguf(p, f, t, a.tokenizer_gguf)),
               (os.path.join(a.outdir, f"{a.family}-hf"),
                lambda p, t: write_hf(p, f, t))]
    for k, (path, write) in enumerate(targets):
        if ("gguf", "hf")[k] not in f["formats"]:
            continue
        # A family may name the first seed of each format (the ones found
        # to clear the margins), saving the search its slow draws.
        first = f["seeds"][k] if "seeds" in f and a.seed == 1 else \
            a.seed + 100 * k
        for seed in range(first, first + 20):
            write(path, draw(f, seed))
            checked = path
            if a.quantize and path.endswith(".gguf"):
                checked = os.path.join(a.outdir, f"{a.family}-{a.quantize}.gguf")
                try:
                    quantize_gguf.quantize(path, checked, a.quantize)
                except quantize_gguf.NoLlamaCpp as e:
                    print(f"make_family_models: {e}", file=sys.stderr)
                    return 77
            m = min_margin_of(checked)
            if m > a.min_margin:
                print(f"{checked}: seed {seed}, reference min top-2 margin "
                      f"{m:.3g} over {STEPS} greedy steps")
                break
            print(f"{checked}: seed {seed} has a near-tie (margin {m:.3g}); "
                  f"trying the next")
        else:
            print(f"error: no seed gives margins above {a.min_margin}",
                  file=sys.stderr)
            return 1
    with open(stamp_path, "w", encoding="utf-8") as fh:
        fh.write(stamp)
    return 0


def inputs_digest(args: list[str], tokenizer_gguf: str) -> str:
    """A digest of what the written models depend on: the arguments, the
    sources of this script and of the local modules it draws and checks
    with (the reference, the quantizer), and the vocabulary file's size
    and modification time."""
    h = hashlib.sha256("\0".join(args).encode())
    here = os.path.dirname(os.path.abspath(__file__))
    sources = sorted(
        m.__file__ for m in list(sys.modules.values())
        if getattr(m, "__file__", None) and
        os.path.abspath(m.__file__).startswith(os.path.dirname(here)))
    for path in sources:
        with open(path, "rb") as fh:
            h.update(path.encode() + b"\0" + fh.read())
    st = os.stat(tokenizer_gguf)
    h.update(f"{st.st_size} {st.st_mtime_ns}".encode())
    return h.hexdigest() + "\n"


if __name__ == "__main__":
    sys.exit(main())
