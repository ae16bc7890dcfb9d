#!/usr/bin/env python3
"""By hand, not in ctest (transformers and torch are 5.6 GB): the numpy
reference (llama_ref.py) on a qwen35 GGUF against transformers'
Qwen3_5ForCausalLM (float64) on the same weights converted back to Hugging
Face's layout, the inverse of llama.cpp's converter: the value heads
untiled, A_log = log(-ssm_a), the (1 + w) norms less 1 (not the gated
norm), the convolution's [C, 1, W].

  python -m venv /tmp/tf && /tmp/tf/bin/pip install torch transformers gguf
  /tmp/tf/bin/python check_qwen35_transformers.py FAMILIES/qwen35.gguf
  /tmp/tf/bin/python check_qwen35_transformers.py FAMILIES/qwen35-hf

Measured (transformers 5.25.0, torch 2.15.0, tiny qwen35, GGUF seed 2 and
folder seed 101): every position of the prompts plus 32 greedy tokens
within 1.6e-4 (GGUF) and 2.8e-4 (folder), argmax equal; transformers computes its norms, softmax, RoPE and the delta rule
in float32 even in a float64 model, and with those casts edited to
float64 the gap falls to 1.9e-6 (its RoPE frequencies stay float32).
"""
import os
import sys

import numpy as np
import torch
from transformers import Qwen3_5ForCausalLM, Qwen3_5TextConfig

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import llama_ref  # noqa: E402
import make_synthetic_model  # noqa: E402

path = sys.argv[1]


def from_folder(d):
    """The folder as it is (make_family_models.py's qwen35-hf: Qwen3.5's
    ConditionalGeneration layout), its language model's weights renamed
    for Qwen3_5ForCausalLM."""
    import json
    from safetensors.numpy import load_file
    with open(os.path.join(d, "config.json")) as fh:
        hc = json.load(fh)
    text = {k: v for k, v in hc["text_config"].items()
            if k not in ("model_type", "dtype")}
    model = Qwen3_5ForCausalLM(Qwen3_5TextConfig(**text)).double().eval()
    lm = "model.language_model."
    sd = {("model." + k[len(lm):] if k.startswith(lm) else k):
          torch.from_numpy(v.astype(np.float64))
          for k, v in load_file(os.path.join(d, "model.safetensors")).items()}
    missing, unexpected = model.load_state_dict(sd, strict=False)
    print("missing", missing, "unexpected", unexpected)
    return model


def from_gguf(path):
    """The GGUF's weights converted back to Hugging Face's layout."""
    cfg, w = llama_ref.load_gguf(path)
    hk, hv, dk, dv = cfg.ssm_k_heads, cfg.ssm_v_heads, cfg.ssm_k_dim, cfg.ssm_v_dim
    r = hv // hk
    def untile(a, d, axis=0):
        a = np.moveaxis(a, axis, 0)
        rest = a.shape[1:]
        a = a.reshape(r, hk, d, *rest).transpose(1, 0, 2, *range(3, 3 + len(rest))).reshape(hv * d, *rest)
        return np.moveaxis(a, 0, axis)
    pairs = cfg.rotary_dim // 2  # Text: any sections give one RoPE.
    sections = [pairs - 2 * (pairs // 3), pairs // 3, pairs // 3]
    tc = Qwen3_5TextConfig(
        vocab_size=cfg.vocab_size, hidden_size=cfg.dim, intermediate_size=cfg.hidden_dim,
        num_hidden_layers=cfg.n_layers, num_attention_heads=cfg.n_heads,
        num_key_value_heads=cfg.n_kv_heads, head_dim=cfg.head_dim,
        linear_conv_kernel_dim=cfg.ssm_conv, linear_key_head_dim=dk, linear_value_head_dim=dv,
        linear_num_key_heads=hk, linear_num_value_heads=hv, rms_norm_eps=cfg.norm_eps,
        tie_word_embeddings=False,
        layer_types=["linear_attention" if cfg.is_linear(i) else "full_attention" for i in range(cfg.n_layers)],
        rope_parameters={"rope_type": "default", "rope_theta": cfg.rope_base,
                         "partial_rotary_factor": cfg.rotary_dim / cfg.head_dim,
                         "mrope_section": sections, "mrope_interleaved": True})
    model = Qwen3_5ForCausalLM(tc).double().eval()
    sd = {"model.embed_tokens.weight": w.tok_embd, "lm_head.weight": w.lm_head,
          "model.norm.weight": w.final_norm - 1}
    for i, L in enumerate(w.layers):
        p = f"model.layers.{i}."
        sd[p + "input_layernorm.weight"] = L.attn_norm - 1
        sd[p + "post_attention_layernorm.weight"] = L.ffn_norm - 1
        sd[p + "mlp.gate_proj.weight"] = L.w_gate
        sd[p + "mlp.up_proj.weight"] = L.w_up
        sd[p + "mlp.down_proj.weight"] = L.w_down
        if cfg.is_linear(i):
            la = p + "linear_attn."
            qk = 2 * hk * dk
            sd[la + "in_proj_qkv.weight"] = np.concatenate([L.ssm_qkv[:qk], untile(L.ssm_qkv[qk:], dv)])
            sd[la + "in_proj_z.weight"] = untile(L.ssm_z, dv)
            sd[la + "in_proj_b.weight"] = untile(L.ssm_beta, 1)
            sd[la + "in_proj_a.weight"] = untile(L.ssm_alpha, 1)
            sd[la + "dt_bias"] = untile(L.ssm_dt, 1)
            sd[la + "A_log"] = np.log(-untile(L.ssm_a, 1))
            sd[la + "conv1d.weight"] = np.concatenate([L.ssm_conv1d[:qk], untile(L.ssm_conv1d[qk:], dv)])[:, None, :]
            sd[la + "norm.weight"] = L.ssm_norm
            sd[la + "out_proj.weight"] = untile(L.ssm_out, dv, axis=1)
        else:
            sa = p + "self_attn."
            sd[sa + "q_proj.weight"] = L.wq
            sd[sa + "k_proj.weight"] = L.wk
            sd[sa + "v_proj.weight"] = L.wv
            sd[sa + "o_proj.weight"] = L.wo
            sd[sa + "q_norm.weight"] = L.q_norm - 1
            sd[sa + "k_norm.weight"] = L.k_norm - 1
    missing, unexpected = model.load_state_dict({k: torch.from_numpy(np.ascontiguousarray(v)) for k, v in sd.items()}, strict=False)
    print("missing", missing, "unexpected", unexpected)
    return cfg, w, model


if os.path.isdir(path):
    model = from_folder(path)
    ref = llama_ref.LlamaRef.load(path)
else:
    cfg, w, model = from_gguf(path)
    ref = llama_ref.LlamaRef(cfg, w)
worst, same = 0, True
for ids in make_synthetic_model.SYNTHETIC_PROMPTS:
    gen = ref.greedy(ids, 32)
    seq = list(ids) + gen
    a = ref.logits_all(seq)
    with torch.no_grad():
        b = model(torch.tensor([seq])).logits[0].numpy()
    e = np.abs(a - b).max()
    worst = max(worst, e)
    same &= bool(np.array_equal(a.argmax(1), b.argmax(1)))
    print(f"ids{len(ids)}: {len(seq)} positions, max |dlogit| {e:.3e}, argmax equal {np.array_equal(a.argmax(1), b.argmax(1))}")
print(f"worst {worst:.3e}")
sys.exit(0 if worst <= 1e-3 and same else 1)
