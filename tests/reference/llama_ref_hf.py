"""The Hugging Face half of the numpy reference (llama_ref.py): a folder's
config.json read as transformers reads it, per model type, and its
safetensors (a hand-written parser, so BF16 and F8_E4M3 load without
torch) as the reference's Config and Weights. llama_ref.load_hf_dir calls
load_hf_dir here; see llama_ref.py's docstring for the conventions."""
from __future__ import annotations

import json
import os
import struct

import numpy as np

from llama_ref import (Config, Layer, Weights, _check_shapes, _f64,
                       _gated_delta_net_layer, yarn_get_mscale)

# ----------------------------------------------------------------------------
# safetensors (hand-written parser so BF16 works without torch)
# ----------------------------------------------------------------------------

_ST_DTYPES = {
    "F64": np.float64, "F32": np.float32, "F16": np.float16,
    "I64": np.int64, "I32": np.int32, "I16": np.int16, "I8": np.int8,
    "U8": np.uint8,
}


def read_safetensors(path: str) -> dict:
    """name -> float64 ndarray, for every tensor in one .safetensors file.

    Format: u64 little-endian header length N, N bytes of JSON
    {name: {dtype, shape, data_offsets: [begin, end]}, "__metadata__": ...},
    then the raw little-endian data (offsets relative to the data start).
    BF16 is widened exactly by shifting into the high half of an f32.
    """
    with open(path, "rb") as f:
        buf = f.read()
    (n,) = struct.unpack("<Q", buf[:8])
    header = json.loads(buf[8:8 + n])
    base = 8 + n
    out = {}
    for name, info in header.items():
        if name == "__metadata__":
            continue
        b, e = info["data_offsets"]
        raw = buf[base + b: base + e]
        shape = tuple(info["shape"])
        dt = info["dtype"]
        if dt == "BF16":
            u16 = np.frombuffer(raw, dtype="<u2")
            a = (u16.astype(np.uint32) << 16).view(np.float32)
        elif dt == "F8_E4M3":
            a = e4m3_values()[np.frombuffer(raw, dtype=np.uint8)]
        elif dt in _ST_DTYPES:
            a = np.frombuffer(raw, dtype=np.dtype(_ST_DTYPES[dt]).newbyteorder("<"))
        else:
            raise ValueError(f"{path}: tensor {name}: unsupported dtype {dt}")
        out[name] = _f64(a.reshape(shape))
    return out


def e4m3_values() -> np.ndarray:
    """The 256 values of OCP FP8 e4m3fn by code (float64): sign, 4 exponent
    bits biased by 7, 3 mantissa bits; exponent 0 subnormal (m/8 x 2^-6);
    0x7f and 0xff NaN, no infinities."""
    codes = np.arange(256)
    e, m = (codes >> 3) & 0xF, codes & 7
    v = np.where(e == 0, m / 8.0 * 2.0 ** -6,
                 (1 + m / 8.0) * 2.0 ** (e.astype(np.float64) - 7))
    v = np.where((e == 15) & (m == 7), np.nan, v)
    return np.where(codes & 0x80, -v, v)


def dequantize_fp8(t: dict, block: int) -> dict:
    """Every F8 weight times its weight_scale_inv (one per block x block
    values, as DeepSeek V3's checkpoints store them); the scales dropped."""
    out = {}
    for k, v in t.items():
        if k.endswith("_scale_inv"):
            continue
        s = t.get(k + "_scale_inv")
        if s is not None:
            full = np.repeat(np.repeat(s, block, axis=0), block, axis=1)
            v = v * full[:v.shape[0], :v.shape[1]]
        out[k] = v
    return out


def _load_hf_tensors(d: str) -> dict:
    single = os.path.join(d, "model.safetensors")
    index = os.path.join(d, "model.safetensors.index.json")
    if os.path.exists(single):
        return read_safetensors(single)
    if os.path.exists(index):
        with open(index) as f:
            files = sorted(set(json.load(f)["weight_map"].values()))
        out = {}
        for fn in files:
            out.update(read_safetensors(os.path.join(d, fn)))
        return out
    raise FileNotFoundError(f"{d}: no model.safetensors(.index.json)")


def _hf_rope_scaling(rs: dict | None, hc: dict) -> dict | None:
    """A config's rope_scaling, normalized (Config.rope_scaling)."""
    if not rs or rs.get("rope_type", rs.get("type")) in (None, "default"):
        return None
    scaling = dict(rs)
    scaling["type"] = rs.get("rope_type", rs.get("type"))
    if scaling["type"] not in ("linear", "llama3", "yarn", "dynamic"):
        raise ValueError(f"rope_scaling {rs} unsupported by the reference")
    if scaling["type"] == "yarn":
        scaling.setdefault("original_max_position_embeddings",
                           int(hc["max_position_embeddings"]))
    if scaling["type"] == "dynamic":
        # transformers' dynamic NTK compares the sequence length with
        # max_position_embeddings, whatever else rope_scaling holds.
        scaling["original_max_position_embeddings"] = int(
            hc["max_position_embeddings"])
    return scaling


def load_hf_dir(d: str):
    """Returns (Config, Weights) from a Hugging Face Llama directory."""
    with open(os.path.join(d, "config.json")) as f:
        hc = json.load(f)
    prefix = "model."
    if hc.get("model_type") in ("qwen3_5", "qwen3_5_moe"):
        # Qwen3_5ForConditionalGeneration, as Qwen3.5 ships: the language
        # model's config in text_config, its weights under
        # model.language_model. (the vision tower's are not read).
        hc = dict(hc["text_config"], **{
            k: hc[k] for k in ("tie_word_embeddings",) if k in hc})
        prefix = "model.language_model."
    n_heads = int(hc["num_attention_heads"])
    dim = int(hc["hidden_size"])
    head_dim = int(hc.get("head_dim") or dim // n_heads)
    scaling = _hf_rope_scaling(hc.get("rope_scaling"), hc)
    window, window_layers = 0, None
    n_layers = int(hc["num_hidden_layers"])
    if hc.get("model_type") == "qwen2":
        # transformers' Qwen2Config: sliding_window is None unless
        # use_sliding_window; layer_types defaults to "sliding_attention"
        # for layers i >= max_window_layers when there is a window, and
        # Qwen2Attention uses the window in the sliding layers only.
        sw = hc.get("sliding_window", 4096) if hc.get("use_sliding_window") \
            else None
        types = hc.get("layer_types") or [
            "sliding_attention"
            if sw is not None and i >= hc.get("max_window_layers", 28)
            else "full_attention" for i in range(n_layers)]
        if "sliding_attention" in types:
            if sw is None:
                raise ValueError("sliding_attention layers without a window")
            window = int(sw)
            window_layers = [t == "sliding_attention" for t in types]
    else:
        window = int(hc.get("sliding_window") or 0)
    model_type = hc.get("model_type")
    cfg = Config(
        dim=dim,
        hidden_dim=int(hc["intermediate_size"]),
        n_layers=int(hc["num_hidden_layers"]),
        n_heads=n_heads,
        n_kv_heads=int(hc.get("num_key_value_heads") or n_heads),
        head_dim=head_dim,
        vocab_size=int(hc["vocab_size"]),
        rope_base=float(hc.get("rope_theta", 10000.0)),
        norm_eps=float(hc.get("rms_norm_eps", 1e-6)),
        rope_style="half",
        rope_scaling=scaling,
        sliding_window=window,
        window_layers=window_layers,
        qk_norm=(model_type in ("qwen3", "qwen3_moe", "gemma3_text")
                 or (model_type == "glm4_moe" and bool(hc.get("use_qk_norm")))),
    )
    gemma = model_type in ("gemma3_text", "gemma2")
    if model_type == "gemma3_text":
        _gemma3_hf_config(cfg, hc, d)
    elif model_type == "gemma2":
        _gemma2_hf_config(cfg, hc, d)
    # transformers' MixtralSparseMoeBlock (always renormalized) and
    # Qwen3MoeSparseMoeBlock (norm_topk_prob).
    if model_type == "mixtral":
        cfg.n_experts = int(hc["num_local_experts"])
        cfg.experts_used = int(hc["num_experts_per_tok"])
        cfg.expert_hidden_dim = cfg.hidden_dim
        cfg.experts_norm = True
    elif model_type == "qwen3_moe":
        cfg.n_experts = int(hc["num_experts"])
        cfg.experts_used = int(hc["num_experts_per_tok"])
        cfg.expert_hidden_dim = int(hc["moe_intermediate_size"])
        cfg.experts_norm = bool(hc.get("norm_topk_prob", False))
    elif model_type == "glm4_moe":
        # transformers' Glm4MoeConfig (defaults as there), Glm4MoeTopkRouter
        # and Glm4MoeMoE; partial RoPE as its rotary embedding computes it.
        # Multi-token-prediction layers (model.layers.{num_hidden_layers}
        # on) are not read.
        rp = hc.get("rope_parameters") or {}
        prf = hc.get("partial_rotary_factor", rp.get("partial_rotary_factor",
                                                     0.5))
        if "rope_theta" not in hc and "rope_theta" in rp:
            cfg.rope_base = float(rp["rope_theta"])
        cfg.rope_dim = int(head_dim * float(prf))
        cfg.n_experts = int(hc.get("n_routed_experts", 128))
        cfg.experts_used = int(hc.get("num_experts_per_tok", 8))
        cfg.expert_hidden_dim = int(hc.get("moe_intermediate_size", 1408))
        cfg.experts_norm = bool(hc.get("norm_topk_prob", True))
        cfg.gating = "sigmoid"
        cfg.dense_layers = int(hc.get("first_k_dense_replace", 1))
        cfg.n_group = int(hc.get("n_group", 1))
        cfg.topk_group = int(hc.get("topk_group", 1))
        cfg.n_shared = int(hc.get("n_shared_experts", 1))
        cfg.routed_scale = float(hc.get("routed_scaling_factor", 1.0))
    elif model_type in ("deepseek_v3", "deepseek_v2"):
        _deepseek_hf_config(cfg, hc, d)
    elif model_type == "gpt_oss":
        _gpt_oss_hf_config(cfg, hc)
    elif model_type == "qwen3_5_text":
        _qwen35_hf_config(cfg, hc)
    elif model_type in ("qwen3_next", "qwen3_5_moe_text"):
        # transformers' Qwen3NextConfig and Qwen3_5MoeTextConfig: Qwen3.5's
        # layers, and a mixture in every layer with one shared expert gated
        # per token.
        _qwen35_hf_config(cfg, hc)
        cfg.n_experts = int(hc["num_experts"])
        cfg.experts_used = int(hc["num_experts_per_tok"])
        cfg.expert_hidden_dim = int(hc["moe_intermediate_size"])
        cfg.experts_norm = bool(hc.get("norm_topk_prob", True))
        cfg.n_shared = 1
        cfg.shared_hidden_dim = int(hc["shared_expert_intermediate_size"])
    t = _load_hf_tensors(d)
    if prefix != "model.":
        t = {("model." + k[len(prefix):] if k.startswith(prefix) else k): v
             for k, v in t.items()}
    if model_type == "gpt_oss":
        t = _gpt_oss_canonical_experts(t, cfg)
    q = hc.get("quantization_config")
    if q is not None and not (model_type == "gpt_oss"
                              and q.get("quant_method") == "mxfp4"):
        if q.get("quant_method") != "fp8" or q.get("fmt", "e4m3") != "e4m3":
            raise ValueError(f"{d}: quantization_config {q} unsupported")
        b0, b1 = q["weight_block_size"]
        assert b0 == b1
        t = dequantize_fp8(t, b0)
    if gemma or model_type in ("qwen3_5_text", "qwen3_next",
                               "qwen3_5_moe_text"):
        # GemmaRMSNorm's and Qwen3_5RMSNorm's 1 + w, as llama.cpp's
        # converter stores it (not Qwen3.5's gated norm, plain w).
        t = {k: v + 1.0 if k.endswith("norm.weight")
             and not k.endswith("linear_attn.norm.weight") else v
             for k, v in t.items()}
    moe_block, expert_names = (
        ("block_sparse_moe", ("w1", "w3", "w2")) if model_type == "mixtral"
        else ("mlp", ("gate_proj", "up_proj", "down_proj")))

    def experts(p, j):
        if model_type == "gpt_oss":  # _gpt_oss_canonical_experts' names
            return t[f"{p}mlp.experts.{expert_names[j]}"]
        return np.stack([t[f"{p}{moe_block}.experts.{e}.{expert_names[j]}"
                           f".weight"] for e in range(cfg.n_experts)])

    layers = []
    # Qwen3-Next's (and Qwen3.5-MoE's) one shared expert and its gate.
    shexp = ("mlp.shared_expert." if model_type in ("qwen3_next",
                                                    "qwen3_5_moe_text")
             else "mlp.shared_experts.")
    for i in range(cfg.n_layers):
        p = f"model.layers.{i}."
        moe = cfg.is_moe(i)
        shared = moe and cfg.n_shared > 0
        ffn = dict(
            ffn_norm=t[p + ("pre_feedforward_layernorm.weight" if gemma
                            else "post_attention_layernorm.weight")],
            w_gate=None if moe else t[p + "mlp.gate_proj.weight"],
            w_up=None if moe else t[p + "mlp.up_proj.weight"],
            w_down=None if moe else t[p + "mlp.down_proj.weight"],
            router=(t[f"{p}{moe_block}.gate.weight"]
                    if moe and model_type != "gpt_oss"
                    else t.get(p + "mlp.router.weight")),
            e_gate=experts(p, 0) if moe else None,
            e_up=experts(p, 1) if moe else None,
            e_down=experts(p, 2) if moe else None,
            e_bias=(t.get(f"{p}{moe_block}.gate.e_score_correction_bias")
                    if moe else None),
            s_gate=t[p + shexp + "gate_proj.weight"] if shared else None,
            s_up=t[p + shexp + "up_proj.weight"] if shared else None,
            s_down=t[p + shexp + "down_proj.weight"] if shared else None,
            s_gate_inp=(t[p + "mlp.shared_expert_gate.weight"].reshape(-1)
                        if shared and p + "mlp.shared_expert_gate.weight" in t
                        else None),
            router_b=t.get(p + "mlp.router.bias"),
            e_gate_b=t.get(p + "mlp.experts.gate_proj_bias"),
            e_up_b=t.get(p + "mlp.experts.up_proj_bias"),
            e_down_b=t.get(p + "mlp.experts.down_proj_bias"))
        if cfg.is_linear(i):
            layers.append(_qwen35_linear_layer(t, p, ffn, cfg))
            continue
        a = p + "self_attn."
        mla, lora = cfg.mla, cfg.q_lora_rank > 0
        layers.append(Layer(
            attn_norm=t[p + "input_layernorm.weight"],
            wq=None if mla and lora else t[a + "q_proj.weight"],
            wk=None if mla else t[a + "k_proj.weight"],
            wv=None if mla else t[a + "v_proj.weight"],
            wo=t[a + "o_proj.weight"],
            wq_a=t[a + "q_a_proj.weight"] if mla and lora else None,
            q_a_norm=t[a + "q_a_layernorm.weight"] if mla and lora else None,
            wq_b=t[a + "q_b_proj.weight"] if mla and lora else None,
            wkv_a=t[a + "kv_a_proj_with_mqa.weight"] if mla else None,
            kv_a_norm=t[a + "kv_a_layernorm.weight"] if mla else None,
            wkv_b=t[a + "kv_b_proj.weight"] if mla else None,
            attn_post_norm=(t[p + "post_attention_layernorm.weight"]
                            if gemma else None),
            ffn_post_norm=(t[p + "post_feedforward_layernorm.weight"]
                           if gemma else None),
            bq=t.get(p + "self_attn.q_proj.bias"),
            bk=t.get(p + "self_attn.k_proj.bias"),
            bv=t.get(p + "self_attn.v_proj.bias"),
            q_norm=t.get(p + "self_attn.q_norm.weight"),
            k_norm=t.get(p + "self_attn.k_norm.weight"),
            sinks=t.get(a + "sinks"),
            bo=t.get(a + "o_proj.bias"),
            **ffn,
        ))
    emb = t["model.embed_tokens.weight"]
    # Gemma3TextConfig ties them unless told (its checkpoints do not say).
    tied = bool(hc.get("tie_word_embeddings", gemma))
    if tied or "lm_head.weight" not in t:
        if not tied:
            raise ValueError(f"{d}: lm_head.weight missing and embeddings not tied")
        lm_head = emb
    else:
        lm_head = t["lm_head.weight"]
    w = Weights(tok_embd=emb, layers=layers,
                final_norm=t["model.norm.weight"], lm_head=lm_head)
    _check_shapes(cfg, w)
    return cfg, w


def _qwen35_hf_config(cfg: Config, hc: dict) -> None:
    """transformers' Qwen3_5TextConfig (its defaults): Gated DeltaNet layers
    as layer_types says (or all but every full_attention_interval-th),
    value heads in Hugging Face's grouped order, gated attention with QK
    norms, RoPE over partial_rotary_factor of each head (interleaved
    M-RoPE: one RoPE for text)."""
    rp = hc.get("rope_parameters") or {}
    cfg.rope_base = float(rp.get("rope_theta", hc.get("rope_theta", 1e7)))
    prf = float(rp.get("partial_rotary_factor",
                       hc.get("partial_rotary_factor", 0.25)))
    cfg.rope_dim = int(cfg.head_dim * prf)
    types = hc.get("layer_types") or [
        "linear_attention" if (i + 1) % hc.get("full_attention_interval", 4)
        else "full_attention" for i in range(cfg.n_layers)]
    cfg.linear_layers = [t == "linear_attention" for t in types]
    cfg.ssm_conv = int(hc.get("linear_conv_kernel_dim", 4))
    cfg.ssm_k_heads = int(hc.get("linear_num_key_heads", 16))
    cfg.ssm_v_heads = int(hc.get("linear_num_value_heads", 32))
    cfg.ssm_k_dim = int(hc.get("linear_key_head_dim", 128))
    cfg.ssm_v_dim = int(hc.get("linear_value_head_dim", 128))
    cfg.ssm_v_tiled = False
    cfg.attn_gate = True
    cfg.qk_norm = True


# transformers' names of a Gated DeltaNet layer's tensors (Qwen3_5Gated-
# DeltaNet, Qwen3NextGatedDeltaNet), by llama.cpp's: Qwen3.5's q/k/v and
# z, b and a apart; Qwen3-Next's fused per key head as llama.cpp's older
# ssm_in and its ssm_ba.
QWEN35_LINEAR_NAMES = {
    "attn_norm.weight": "input_layernorm.weight",
    "attn_qkv.weight": "linear_attn.in_proj_qkv.weight",
    "attn_gate.weight": "linear_attn.in_proj_z.weight",
    "ssm_beta.weight": "linear_attn.in_proj_b.weight",
    "ssm_alpha.weight": "linear_attn.in_proj_a.weight",
    "ssm_in.weight": "linear_attn.in_proj_qkvz.weight",
    "ssm_ba.weight": "linear_attn.in_proj_ba.weight",
    "ssm_dt.bias": "linear_attn.dt_bias",
    "ssm_norm.weight": "linear_attn.norm.weight",
    "ssm_out.weight": "linear_attn.out_proj.weight",
}


def _qwen35_linear_layer(t: dict, p: str, ffn: dict, cfg: Config) -> Layer:
    """A Gated DeltaNet layer in transformers' names, read as the GGUF
    reader reads llama.cpp's: ssm_a = -exp(A_log), the convolution [C, W];
    its FFN's fields `ffn`."""
    g = {k: t[p + hf] for k, hf in QWEN35_LINEAR_NAMES.items() if p + hf in t}
    g["ssm_a"] = -np.exp(t[p + "linear_attn.A_log"])
    conv = t[p + "linear_attn.conv1d.weight"]
    g["ssm_conv1d.weight"] = conv.reshape(conv.shape[0], -1)
    return _gated_delta_net_layer(g, "", ffn, cfg)


def _gpt_oss_hf_config(cfg: Config, hc: dict) -> None:
    """transformers' GptOssConfig: experts of intermediate_size with biases
    and the clamped SwiGLU, top-k then a softmax over the chosen; layer_types
    (default: even layers sliding) over sliding_window (default 128)."""
    if float(hc.get("swiglu_limit", 7.0)) != 7.0 or \
            float(hc.get("swiglu_alpha", 1.702)) != 1.702:
        raise ValueError("gpt-oss swiglu_limit / swiglu_alpha other than "
                         "7 / 1.702 unsupported by the reference")
    cfg.n_experts = int(hc.get("num_local_experts", 128))
    cfg.experts_used = int(hc.get("num_experts_per_tok",
                                  hc.get("experts_per_token", 4)))
    cfg.expert_hidden_dim = cfg.hidden_dim
    cfg.experts_norm = True
    cfg.swiglu_oai = True
    types = hc.get("layer_types") or [
        "sliding_attention" if (i + 1) % 2 else "full_attention"
        for i in range(cfg.n_layers)]
    cfg.sliding_window = int(hc.get("sliding_window") or 128)
    cfg.window_layers = [x == "sliding_attention" for x in types]


# FP4 e2m1 values by code (transformers' FP4_VALUES).
_FP4 = np.array([0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0,
                 -0.0, -0.5, -1.0, -1.5, -2.0, -3.0, -4.0, -6.0])


def decode_mxfp4(blocks: np.ndarray, scales: np.ndarray) -> np.ndarray:
    """gpt-oss's MXFP4 as transformers' convert_moe_packed_tensors decodes
    it: blocks [..., G, 16] u8, byte j values 2j (low nibble) and 2j + 1
    (high), times 2^(scale - 127) per block of 32; [..., G * 32]."""
    b = blocks.astype(np.uint8)
    vals = np.empty(b.shape[:-1] + (32,))
    vals[..., 0::2] = _FP4[b & 0x0F]
    vals[..., 1::2] = _FP4[b >> 4]
    vals *= np.exp2(scales.astype(np.int64) - 127)[..., None]
    return vals.reshape(b.shape[:-2] + (-1,))


def _gpt_oss_canonical_experts(t: dict, cfg: Config) -> dict:
    """gpt-oss's merged experts (MXFP4 _blocks / _scales, or dequantized
    [experts, in, out]) as mlp.experts.{gate,up,down}_proj [experts, out,
    in] and their biases, gate and up de-interleaved (gate the even
    outputs)."""
    t = dict(t)
    for i in range(cfg.n_layers):
        p = f"model.layers.{i}.mlp.experts."
        if p + "gate_up_proj_blocks" in t:
            gu = decode_mxfp4(t.pop(p + "gate_up_proj_blocks"),
                              t.pop(p + "gate_up_proj_scales"))
            down = decode_mxfp4(t.pop(p + "down_proj_blocks"),
                                t.pop(p + "down_proj_scales"))
        else:
            gu = t.pop(p + "gate_up_proj").transpose(0, 2, 1)
            down = t.pop(p + "down_proj").transpose(0, 2, 1)
        t[p + "gate_proj"], t[p + "up_proj"] = gu[:, 0::2], gu[:, 1::2]
        t[p + "down_proj"] = down
        b = t.pop(p + "gate_up_proj_bias")
        t[p + "gate_proj_bias"], t[p + "up_proj_bias"] = b[:, 0::2], b[:, 1::2]
    return t


def _gemma3_hf_config(cfg: Config, hc: dict, d: str) -> None:
    """transformers' Gemma3TextConfig / Gemma3TextModel (defaults as
    there). Layer types: layer_types, else every sliding_window_pattern-th
    layer (default 6) full attention, the others sliding_window. RoPE per
    layer type: rope_parameters["full_attention"] / ["sliding_attention"]
    (5.x), or the keys its convert_rope_params_to_dict turns into them:
    rope_theta (default 1e6) and rope_scaling for the full-attention
    layers, rope_local_base_freq (default 10000) for the sliding ones;
    rope_scaling updates the full-attention parameters when both are
    there. The softmax scale query_pre_attn_scalar^-0.5 (default 256), the
    embeddings times sqrt(hidden_size), a gelu_pytorch_tanh GeGLU FFN."""
    for key in ("final_logit_softcapping", "attn_logit_softcapping",
                "use_bidirectional_attention"):
        if hc.get(key):
            raise ValueError(f"{d}: {key} unsupported")
    act = hc.get("hidden_activation", "gelu_pytorch_tanh")
    if act != "gelu_pytorch_tanh":
        raise ValueError(f"{d}: hidden_activation {act!r} unsupported")
    rp = hc.get("rope_parameters") or {}
    full = dict(rp.get("full_attention") or {})
    full.update(hc.get("rope_scaling") or {})
    local = dict(rp.get("sliding_attention") or {})
    if local.get("rope_type", local.get("type", "default")) != "default":
        raise ValueError(f"{d}: sliding-window layers' RoPE {local} "
                         f"unsupported")
    cfg.rope_base = float(full.get("rope_theta", hc.get("rope_theta", 1e6)))
    cfg.rope_scaling = _hf_rope_scaling(full, hc)
    cfg.swa_rope_base = float(local.get(
        "rope_theta", hc.get("rope_local_base_freq", 10000.0)))
    pattern = int(hc.get("sliding_window_pattern", 6))
    types = hc.get("layer_types") or [
        "sliding_attention" if (i + 1) % pattern else "full_attention"
        for i in range(cfg.n_layers)]
    cfg.sliding_window = int(hc.get("sliding_window", 4096))
    cfg.window_layers = [t == "sliding_attention" for t in types]
    cfg.attn_scale = float(hc.get("query_pre_attn_scalar", 256)) ** -0.5
    cfg.embed_scale = float(np.sqrt(cfg.dim))
    cfg.ffn_act = "gelu_tanh"


def _gemma2_hf_config(cfg: Config, hc: dict, d: str) -> None:
    """transformers' Gemma2Config / Gemma2Model (defaults as there): layer
    types layer_types, else every other layer from the first sliding over
    sliding_window (4096); one RoPE (rope_parameters, else rope_theta and
    rope_scaling); the softmax scale query_pre_attn_scalar^-0.5 (256);
    attn_logit_softcapping (50) and final_logit_softcapping (30), None for
    none; the embeddings times sqrt(hidden_size), a gelu_pytorch_tanh
    GeGLU."""
    if hc.get("use_bidirectional_attention"):
        raise ValueError(f"{d}: use_bidirectional_attention unsupported")
    act = hc.get("hidden_activation", "gelu_pytorch_tanh")
    if act != "gelu_pytorch_tanh":
        raise ValueError(f"{d}: hidden_activation {act!r} unsupported")
    rp = hc.get("rope_parameters")
    if rp:
        cfg.rope_base = float(rp.get("rope_theta", cfg.rope_base))
        cfg.rope_scaling = _hf_rope_scaling(rp, hc)
    types = hc.get("layer_types") or [
        "sliding_attention" if (i + 1) % 2 else "full_attention"
        for i in range(cfg.n_layers)]
    cfg.sliding_window = int(hc.get("sliding_window", 4096))
    cfg.window_layers = [t == "sliding_attention" for t in types]
    cfg.attn_scale = float(hc.get("query_pre_attn_scalar", 256)) ** -0.5
    for key, dflt, field in (("attn_logit_softcapping", 50.0, "attn_softcap"),
                             ("final_logit_softcapping", 30.0,
                              "final_softcap")):
        v = hc.get(key, dflt)
        setattr(cfg, field, float(v) if v is not None else 0.0)
    cfg.embed_scale = float(np.sqrt(cfg.dim))
    cfg.ffn_act = "gelu_tanh"


def _deepseek_hf_config(cfg: Config, hc: dict, d: str) -> None:
    """transformers' DeepseekV3Config / DeepseekV3Attention /
    DeepseekV3TopkRouter (and DeepseekV2's, greedy routing only), defaults
    as there: multi-head latent attention, the MoE as GLM-4.5's (V3) or
    softmax top-k times routed_scaling_factor, never renormalized (V2)."""
    v3 = hc["model_type"] == "deepseek_v3"
    if hc.get("attention_bias"):
        raise ValueError(f"{d}: attention_bias unsupported")
    rp = hc.get("rope_scaling") or hc.get("rope_parameters") or {}
    if "rope_theta" not in hc and "rope_theta" in rp:
        cfg.rope_base = float(rp["rope_theta"])
    nope = int(hc.get("qk_nope_head_dim", 128))
    rope = int(hc.get("qk_rope_head_dim", 64))
    cfg.head_dim = nope + rope
    cfg.rope_dim = rope
    cfg.n_kv_heads = cfg.n_heads
    cfg.q_lora_rank = int(hc.get("q_lora_rank", 1536) or 0)
    cfg.kv_lora_rank = int(hc.get("kv_lora_rank", 512))
    cfg.v_head_dim = int(hc.get("v_head_dim", 128))
    # The q_a / kv_a norms are DeepseekV3RMSNorm(rank): eps 1e-6 whatever
    # rms_norm_eps is (llama.cpp uses rms_norm_eps: equal in DeepSeek's
    # configs).
    cfg.lora_norm_eps = 1e-6
    # rope_interleave (V3; default True): the q_pe / k_pe pairs
    # (x[2i], x[2i+1]) rotate (de-interleaved, rotated by halves: the same
    # dot products); V2's complex RoPE rotates the same pairs.
    cfg.rope_style = ("adjacent" if not v3 or hc.get("rope_interleave", True)
                      else "half")
    cfg.rope_scaling = None
    kind = rp.get("rope_type", rp.get("type")) if rp else None
    if kind == "yarn":
        # transformers' _compute_yarn_parameters: with
        # original_max_position_embeddings in rope_scaling, the factor is
        # max_position_embeddings over it; cos / sin times
        # attention_factor, by default yarn_get_mscale(f, mscale) /
        # yarn_get_mscale(f, mscale_all_dim) when both are set, else
        # yarn_get_mscale(f). DeepseekV3Attention's softmax scale times
        # yarn_get_mscale(rope_scaling["factor"], mscale_all_dim)^2 when
        # mscale_all_dim (DeepseekV2Attention's: never).
        max_pos = int(hc.get("max_position_embeddings", 4096 if v3 else 2048))
        f = float(rp["factor"])
        old = rp.get("original_max_position_embeddings")
        f_rope = max_pos / float(old) if old else f
        ms, mad = rp.get("mscale"), rp.get("mscale_all_dim")
        af = rp.get("attention_factor")
        if af is None:
            af = (yarn_get_mscale(f_rope, ms) / yarn_get_mscale(f_rope, mad)
                  if ms and mad else yarn_get_mscale(f_rope))
        cfg.rope_scaling = {
            "type": "yarn", "factor": f_rope,
            "original_max_position_embeddings": int(old or max_pos),
            "beta_fast": float(rp.get("beta_fast") or 32),
            "beta_slow": float(rp.get("beta_slow") or 1),
            "attention_factor": float(af)}
        if v3 and mad:
            m = yarn_get_mscale(f, mad)
            cfg.attn_scale = m * m / np.sqrt(cfg.head_dim)
    elif kind not in (None, "default"):
        raise ValueError(f"{d}: rope scaling {kind!r} unsupported")
    cfg.n_experts = int(hc.get("n_routed_experts", 256 if v3 else 64))
    cfg.experts_used = int(hc.get("num_experts_per_tok", 8) or 0)
    cfg.expert_hidden_dim = int(hc.get("moe_intermediate_size",
                                       2048 if v3 else 1407))
    cfg.dense_layers = int(hc.get("first_k_dense_replace", 3 if v3 else 0))
    cfg.n_shared = int(hc.get("n_shared_experts", 1 if v3 else 2) or 0)
    cfg.routed_scale = float(hc.get("routed_scaling_factor", 2.5 if v3 else 1))
    if v3:
        cfg.gating = "sigmoid"
        cfg.experts_norm = bool(hc.get("norm_topk_prob", True))
        cfg.n_group = int(hc.get("n_group", 8))
        cfg.topk_group = int(hc.get("topk_group", 4))
    else:
        if hc.get("topk_method", "greedy") != "greedy":
            raise ValueError(f"{d}: DeepSeek V2 topk_method "
                             f"{hc.get('topk_method')!r} unsupported")
        cfg.gating = "softmax"
        cfg.experts_norm = False
