#!/usr/bin/env python3
"""Independent numpy reference for the Llama forward pass (float64 throughout).

Written in the spirit of llama2.c: one readable function per op, no tricks.
It is the oracle the C++ forward pass (tests/reference/forward_dump.cc) is
checked against by check_forward.py, so it deliberately shares no code with
the C++ side and only uses numpy, the `gguf` package (GGUF parsing and
dequantization) and a tiny hand-written safetensors parser.

Two weight loaders:
  * load_gguf(path)      llama.cpp GGUF. llama.cpp's converter permuted the
                         Q/K rows, so RoPE rotates ADJACENT pairs
                         (x[2i], x[2i+1]).
  * load_hf_dir(path)    Hugging Face directory: config.json +
                         model.safetensors (or a sharded index). RoPE rotates
                         HALVES (x[i], x[i + head_dim/2]).
GLM-4.5 (GGUF glm4moe, HF glm4_moe) and Qwen2 / Qwen3 GGUFs use NeoX RoPE
(halves) too. GLM-4.5's RoPE is partial: only the first rope_dim dims of
each head rotate (halves of rope_dim), the rest pass through.
DeepSeek V2 / V3 (GGUF deepseek2, HF deepseek_v3 / deepseek_v2) use
multi-head latent attention (mla_attention): RoPE rotates only the last
rope_dim dims of each q head and the one shared k_pe, ADJACENT pairs in
both readings (llama.cpp's "normal" RoPE on unpermuted weights; HF's
rope_interleave / complex-pair RoPE rotate the same pairs).
Gemma 3 (GGUF gemma3, HF gemma3_text): NeoX RoPE in both readings, the
embeddings times sqrt(dim), RMS norms after attention and after the FFN too
(before each residual add), QK-norm, a GELU (tanh) FFN, a tied LM head, and
every 6th layer global (full attention, RoPE base 1e6 with the file's
scaling) with the others local (a sliding window, RoPE base 10000 unscaled).
HF's Gemma3RMSNorm multiplies by (1 + w): load_hf_dir adds the 1 to every
norm weight, as llama.cpp's converter does to what it writes to GGUF.
Gemma 2 (GGUF gemma2, HF gemma2): Gemma 3's layer without QK-norm, every
other layer (from the first) local, one RoPE for all, and soft-capping:
each scaled attention score and each final logit x becomes cap tanh(x /
cap) (caps attn_softcap and final_softcap).
gpt-oss (GGUF gpt-oss, llama.cpp's openai-moe graph): every other layer
(from the first) windowed, NeoX RoPE, Q/K/V and output biases, attention
sinks (a per-head logit in every softmax's denominator, with no value), a
mixture whose router logits have a bias, softmax over the k chosen
logits, experts with biases and the clamped SwiGLU (gate clamped above at
7, up to [-7, 7], gate * sigmoid(1.702 gate) * (up + 1)).
Qwen3.5 (GGUF qwen35): hybrid. Gated DeltaNet layers (gated_delta_net: a
causal convolution, then the gated delta rule's recurrent state per value
head, then a gated RMS norm) in all but every full_attention_interval-th,
which is gated attention (Qwen3's with a sigmoid gate on its output) with
NeoX RoPE over rope.dimension_count dims. logits_all and forward run the
recurrence token by token: the reference for a chunked C++ form.

Model API:
  model.logits_all(tokens) -> (T, vocab) float64 logits for every position
  model.greedy(tokens, n)  -> list of n argmax ids (no EOS stopping)

Command line (sanity check by hand):
  llama_ref.py --model M.gguf --prompt "The capital of France is" --steps 32
  llama_ref.py --model synthetic_dir --tokens 1,2,3 --steps 8
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import sys
import time

import numpy as np


# ----------------------------------------------------------------------------
# Config and weights
# ----------------------------------------------------------------------------

@dataclasses.dataclass
class Config:
    dim: int             # hidden size
    hidden_dim: int      # FFN intermediate size
    n_layers: int
    n_heads: int
    n_kv_heads: int
    head_dim: int
    vocab_size: int
    rope_base: float
    norm_eps: float
    rope_style: str      # "adjacent" (GGUF) or "half" (HF rotate_half)
    # RoPE scaling, normalized: {"type": "linear"|"llama3"|"yarn"|"dynamic",
    # ...} with transformers' parameter names, or None.
    rope_scaling: dict | None = None
    # GGUF rope_freqs.weight: per-pair divisors of the frequencies.
    freq_factors: np.ndarray | None = None
    sliding_window: int = 0  # 0: full causal attention.
    # Per layer, whether sliding_window applies (Qwen2's use_sliding_window:
    # the layers from max_window_layers on); None: every layer.
    window_layers: list | None = None
    qk_norm: bool = False     # Qwen3: RMSNorm of each q / k head before RoPE
    # Mixture of experts (0: dense): n_experts SwiGLU experts of
    # expert_hidden_dim columns, top experts_used by softmax probability
    # (ties to the lower index), weights renormalized when experts_norm.
    n_experts: int = 0
    experts_used: int = 0
    expert_hidden_dim: int = 0
    experts_norm: bool = True
    # GLM-4.5 (transformers' Glm4MoeTopkRouter / llama.cpp's glm4moe). The
    # defaults leave every other family as it was.
    rope_dim: int = 0         # Dims of each head RoPE rotates; 0: head_dim.
    dense_layers: int = 0     # Leading layers with a dense FFN (hidden_dim).
    gating: str = "softmax"   # "sigmoid": GLM's router (route_sigmoid).
    n_group: int = 1          # Expert groups; topk_group of them kept.
    topk_group: int = 1
    n_shared: int = 0         # Shared experts: one SwiGLU of n_shared x
                              # expert_hidden_dim columns, added for all.
    # Qwen3.5-MoE / Qwen3-Next: the shared expert's width
    # (expert_shared_feed_forward_length; 0: n_shared x expert_hidden_dim)
    # and its gate, sigmoid(w . h) per token (Layer.s_gate_inp).
    shared_hidden_dim: int = 0
    routed_scale: float = 1.0  # Routed weights times this (after norm).
    # DeepSeek V2 / V3 multi-head latent attention, on when kv_lora_rank > 0
    # (mla_attention): head_dim is the q / k head, qk_nope + rope_dim (the
    # roped part LAST); v_head_dim the value head; n_kv_heads == n_heads.
    q_lora_rank: int = 0      # 0: q = wq x; else wq_b rmsnorm(wq_a x).
    kv_lora_rank: int = 0
    v_head_dim: int = 0
    lora_norm_eps: float = 0.0  # eps of the q_a / kv_a norms; 0: norm_eps.
    attn_scale: float = 0.0   # softmax scale; 0: 1 / sqrt(head_dim).
    # Gemma 3: the embeddings times embed_scale; the dense FFN's activation
    # ("silu": SwiGLU, "gelu_tanh": GeGLU); the RoPE base of the layers
    # with a window (layer_window), unscaled (0: theirs is the others').
    embed_scale: float = 1.0
    ffn_act: str = "silu"
    swa_rope_base: float = 0.0
    # Gemma 2's soft-capping (0: none) of the scaled attention scores and
    # of the final logits.
    attn_softcap: float = 0.0
    final_softcap: float = 0.0
    # gpt-oss's clamped SwiGLU in the experts (Layer.sinks, .bo and the
    # router and expert biases are per layer).
    swiglu_oai: bool = False
    # Qwen3.5 / Qwen3-Next hybrids (gated_delta_net): per layer, whether it
    # is a Gated DeltaNet (linear attention) layer (None: none is). Its
    # q / k heads (ssm_k_heads of ssm_k_dim) and value heads (ssm_v_heads
    # of ssm_v_dim; a multiple of the k heads), its causal convolution's
    # width ssm_conv. Value head i reads k head i % ssm_k_heads when
    # ssm_v_tiled (llama.cpp's converter reorders them so), else i // (the
    # ratio) (Hugging Face's repeat_interleave).
    linear_layers: list | None = None
    ssm_conv: int = 0
    ssm_k_heads: int = 0
    ssm_k_dim: int = 0
    ssm_v_heads: int = 0
    ssm_v_dim: int = 0
    ssm_v_tiled: bool = False
    # Qwen3.5's gated attention: wq makes, per head, head_dim query values
    # then head_dim gate values; the attention's output times their sigmoid.
    attn_gate: bool = False

    @property
    def mla(self) -> bool:
        return self.kv_lora_rank > 0

    def is_linear(self, layer: int) -> bool:
        return self.linear_layers is not None and self.linear_layers[layer]

    @property
    def ssm_conv_dim(self) -> int:
        """The convolved channels: q, k (each ssm_k_heads x ssm_k_dim), v."""
        return (2 * self.ssm_k_heads * self.ssm_k_dim
                + self.ssm_v_heads * self.ssm_v_dim)

    def layer_window(self, layer: int) -> int:
        if self.window_layers is not None and not self.window_layers[layer]:
            return 0
        return self.sliding_window

    def is_moe(self, layer: int) -> bool:
        return self.n_experts > 0 and layer >= self.dense_layers

    @property
    def rotary_dim(self) -> int:
        return self.rope_dim or self.head_dim


@dataclasses.dataclass
class Layer:
    attn_norm: np.ndarray  # (dim,)
    wq: np.ndarray         # (n_heads*head_dim, dim)
    wk: np.ndarray         # (n_kv_heads*head_dim, dim)
    wv: np.ndarray         # (n_kv_heads*head_dim, dim)
    wo: np.ndarray         # (dim, n_heads*head_dim)
    ffn_norm: np.ndarray   # (dim,)
    w_gate: np.ndarray     # (hidden_dim, dim)
    w_up: np.ndarray       # (hidden_dim, dim)
    w_down: np.ndarray     # (dim, hidden_dim)
    bq: np.ndarray | None = None  # (n_heads*head_dim,) Qwen2 biases
    bk: np.ndarray | None = None  # (n_kv_heads*head_dim,)
    bv: np.ndarray | None = None  # (n_kv_heads*head_dim,)
    q_norm: np.ndarray | None = None  # (head_dim,) Qwen3
    k_norm: np.ndarray | None = None  # (head_dim,)
    # Gemma 3: RMS norms of the attention's and the FFN's outputs, before
    # each is added to the residual.
    attn_post_norm: np.ndarray | None = None  # (dim,)
    ffn_post_norm: np.ndarray | None = None   # (dim,)
    router: np.ndarray | None = None  # (n_experts, dim) mixtures
    e_gate: np.ndarray | None = None  # (n_experts, expert_hidden_dim, dim)
    e_up: np.ndarray | None = None    # (n_experts, expert_hidden_dim, dim)
    e_down: np.ndarray | None = None  # (n_experts, dim, expert_hidden_dim)
    e_bias: np.ndarray | None = None  # (n_experts,) GLM's score correction
    s_gate: np.ndarray | None = None  # (n_shared*expert_hidden_dim, dim)
    s_up: np.ndarray | None = None    # (n_shared*expert_hidden_dim, dim)
    s_down: np.ndarray | None = None  # (dim, n_shared*expert_hidden_dim)
    s_gate_inp: np.ndarray | None = None  # (dim,) the shared expert's gate
    # gpt-oss: attention sinks (n_heads,), the output bias (dim,), the
    # router's logit bias (n_experts,), the experts' biases (n_experts,
    # expert_hidden_dim) for gate and up, (n_experts, dim) for down.
    sinks: np.ndarray | None = None
    bo: np.ndarray | None = None
    router_b: np.ndarray | None = None
    e_gate_b: np.ndarray | None = None
    e_up_b: np.ndarray | None = None
    e_down_b: np.ndarray | None = None
    # Multi-head latent attention (Config.mla; wq, wk, wv None but for wq
    # without q_lora_rank), HF's layout:
    wq_a: np.ndarray | None = None       # (q_lora_rank, dim)
    q_a_norm: np.ndarray | None = None   # (q_lora_rank,)
    wq_b: np.ndarray | None = None       # (n_heads*head_dim, q_lora_rank)
    wkv_a: np.ndarray | None = None      # (kv_lora_rank + rope_dim, dim)
    kv_a_norm: np.ndarray | None = None  # (kv_lora_rank,)
    # (n_heads*(qk_nope + v_head_dim), kv_lora_rank): per head, qk_nope
    # rows of k_nope then v_head_dim rows of v (HF kv_b_proj).
    wkv_b: np.ndarray | None = None
    # Gated DeltaNet (Config.is_linear; wq, wk, wv, wo None), with
    # C = Config.ssm_conv_dim, Hv = ssm_v_heads, V = Hv * ssm_v_dim:
    ssm_qkv: np.ndarray | None = None    # (C, dim): [q | k | v] channels
    ssm_z: np.ndarray | None = None      # (V, dim): the output gate
    ssm_beta: np.ndarray | None = None   # (Hv, dim): sigmoid -> beta
    ssm_alpha: np.ndarray | None = None  # (Hv, dim): the decay's input
    ssm_dt: np.ndarray | None = None     # (Hv,): its bias
    ssm_a: np.ndarray | None = None      # (Hv,): -exp(A_log)
    ssm_conv1d: np.ndarray | None = None  # (C, ssm_conv)
    ssm_norm: np.ndarray | None = None   # (ssm_v_dim,): gated RMS norm
    ssm_out: np.ndarray | None = None    # (dim, V)


@dataclasses.dataclass
class Weights:
    tok_embd: np.ndarray   # (vocab, dim)
    layers: list
    final_norm: np.ndarray  # (dim,)
    lm_head: np.ndarray    # (vocab, dim); the embedding itself when tied


def _f64(a) -> np.ndarray:
    return np.ascontiguousarray(np.asarray(a, dtype=np.float64))


def _check_shapes(cfg: Config, w: Weights) -> None:
    q = cfg.n_heads * cfg.head_dim
    kv = cfg.n_kv_heads * cfg.head_dim
    want = {
        "tok_embd": (w.tok_embd, (cfg.vocab_size, cfg.dim)),
        "final_norm": (w.final_norm, (cfg.dim,)),
        "lm_head": (w.lm_head, (cfg.vocab_size, cfg.dim)),
    }
    for i, L in enumerate(w.layers):
        want.update({
            f"{i}.attn_norm": (L.attn_norm, (cfg.dim,)),
            f"{i}.ffn_norm": (L.ffn_norm, (cfg.dim,)),
        })
        if cfg.is_linear(i):
            C, hv = cfg.ssm_conv_dim, cfg.ssm_v_heads
            V = hv * cfg.ssm_v_dim
            want.update({
                f"{i}.ssm_qkv": (L.ssm_qkv, (C, cfg.dim)),
                f"{i}.ssm_z": (L.ssm_z, (V, cfg.dim)),
                f"{i}.ssm_beta": (L.ssm_beta, (hv, cfg.dim)),
                f"{i}.ssm_alpha": (L.ssm_alpha, (hv, cfg.dim)),
                f"{i}.ssm_dt": (L.ssm_dt, (hv,)),
                f"{i}.ssm_a": (L.ssm_a, (hv,)),
                f"{i}.ssm_conv1d": (L.ssm_conv1d, (C, cfg.ssm_conv)),
                f"{i}.ssm_norm": (L.ssm_norm, (cfg.ssm_v_dim,)),
                f"{i}.ssm_out": (L.ssm_out, (cfg.dim, V)),
            })
        elif cfg.mla:
            r, R = cfg.rotary_dim, cfg.kv_lora_rank
            nope = cfg.head_dim - r
            if cfg.q_lora_rank:
                want.update({
                    f"{i}.wq_a": (L.wq_a, (cfg.q_lora_rank, cfg.dim)),
                    f"{i}.q_a_norm": (L.q_a_norm, (cfg.q_lora_rank,)),
                    f"{i}.wq_b": (L.wq_b, (q, cfg.q_lora_rank))})
            else:
                want[f"{i}.wq"] = (L.wq, (q, cfg.dim))
            want.update({
                f"{i}.wkv_a": (L.wkv_a, (R + r, cfg.dim)),
                f"{i}.kv_a_norm": (L.kv_a_norm, (R,)),
                f"{i}.wkv_b": (L.wkv_b,
                               (cfg.n_heads * (nope + cfg.v_head_dim), R)),
                f"{i}.wo": (L.wo, (cfg.dim, cfg.n_heads * cfg.v_head_dim)),
            })
        else:
            want.update({
                f"{i}.wq": (L.wq, (2 * q if cfg.attn_gate else q, cfg.dim)),
                f"{i}.wk": (L.wk, (kv, cfg.dim)),
                f"{i}.wv": (L.wv, (kv, cfg.dim)),
                f"{i}.wo": (L.wo, (cfg.dim, q)),
            })
        if cfg.is_moe(i):
            e, f = cfg.n_experts, cfg.expert_hidden_dim
            want.update({
                f"{i}.router": (L.router, (e, cfg.dim)),
                f"{i}.e_gate": (L.e_gate, (e, f, cfg.dim)),
                f"{i}.e_up": (L.e_up, (e, f, cfg.dim)),
                f"{i}.e_down": (L.e_down, (e, cfg.dim, f)),
            })
            if cfg.gating == "sigmoid":
                want[f"{i}.e_bias"] = (L.e_bias, (e,))
            if cfg.n_shared:
                sf = cfg.shared_hidden_dim or cfg.n_shared * f
                if L.s_gate_inp is not None:
                    want[f"{i}.s_gate_inp"] = (L.s_gate_inp, (cfg.dim,))
                want.update({
                    f"{i}.s_gate": (L.s_gate, (sf, cfg.dim)),
                    f"{i}.s_up": (L.s_up, (sf, cfg.dim)),
                    f"{i}.s_down": (L.s_down, (cfg.dim, sf)),
                })
        else:
            want.update({
                f"{i}.w_gate": (L.w_gate, (cfg.hidden_dim, cfg.dim)),
                f"{i}.w_up": (L.w_up, (cfg.hidden_dim, cfg.dim)),
                f"{i}.w_down": (L.w_down, (cfg.dim, cfg.hidden_dim)),
            })
        if cfg.qk_norm and not cfg.is_linear(i):
            want.update({f"{i}.q_norm": (L.q_norm, (cfg.head_dim,)),
                         f"{i}.k_norm": (L.k_norm, (cfg.head_dim,))})
        for name in ("attn_post_norm", "ffn_post_norm"):
            if getattr(L, name) is not None:
                want[f"{i}.{name}"] = (getattr(L, name), (cfg.dim,))
    assert len(w.layers) == cfg.n_layers
    assert cfg.n_heads % cfg.n_kv_heads == 0
    assert cfg.rotary_dim % 2 == 0 and cfg.rotary_dim <= cfg.head_dim
    assert cfg.gating in ("softmax", "sigmoid")
    assert cfg.ffn_act == "silu" or (cfg.ffn_act == "gelu_tanh"
                                     and not cfg.n_experts)
    if cfg.n_experts:
        assert cfg.n_experts % cfg.n_group == 0
        assert cfg.topk_group <= cfg.n_group
        if cfg.gating == "softmax":  # route(): no bias or groups
            assert cfg.n_group == 1
    if cfg.linear_layers is not None:
        assert len(cfg.linear_layers) == cfg.n_layers
        assert cfg.ssm_v_heads % cfg.ssm_k_heads == 0 and cfg.ssm_conv > 0
    if cfg.mla:
        assert cfg.n_kv_heads == cfg.n_heads and cfg.v_head_dim > 0
        assert cfg.rotary_dim < cfg.head_dim
        assert not cfg.qk_norm and cfg.sliding_window == 0
    for name, (arr, shape) in want.items():
        if arr.shape != shape:
            raise ValueError(f"weight {name}: shape {arr.shape}, want {shape}")


# ----------------------------------------------------------------------------
# GGUF loader
# ----------------------------------------------------------------------------

def _gguf_field(reader, key, default=None):
    f = reader.fields.get(key)
    if f is None:
        return default
    return f.contents()


def yarn_get_mscale(scale: float, mscale: float = 1.0) -> float:
    """DeepSeek's (and transformers') YaRN magnitude: 0.1 mscale ln(scale)
    + 1, or 1 when scale <= 1."""
    return 1.0 if scale <= 1 else 0.1 * mscale * np.log(scale) + 1.0


def _deepseek2_yarn(cfg: Config, yarn_log_multiplier: float) -> None:
    """YaRN of a deepseek2 GGUF as llama.cpp runs it (llama-context's
    yarn_attn_factor, deepseek2.cpp's kq_scale): the file's
    rope.scaling.yarn_log_multiplier is 0.1 x HF's mscale_all_dim (the
    converter's factor, which llama.cpp's loader divides back out). With
    mscale_all_dim != 0, cos / sin unscaled (llama.cpp takes HF's mscale to
    be mscale_all_dim's value, so their ratio is 1) and the softmax scale
    times yarn_get_mscale(factor, mscale_all_dim)^2, as HF's DeepseekV3
    with mscale == mscale_all_dim (every DeepSeek config); without it, cos
    / sin times yarn_get_mscale(factor) and the softmax scale times its
    square too (llama.cpp's kq_scale takes the attention factor's square
    whatever it is)."""
    f = cfg.rope_scaling["factor"]
    # Divided by 0.1 in float32, as llama.cpp does (0.1f / 0.1f is 1).
    mscale_all_dim = yarn_log_multiplier / float(np.float32(0.1))
    attn_factor = 1.0 if mscale_all_dim else yarn_get_mscale(f)
    cfg.rope_scaling["attention_factor"] = attn_factor
    m = attn_factor * yarn_get_mscale(f, mscale_all_dim)
    cfg.attn_scale = m * m / np.sqrt(cfg.head_dim)


def _gemma3_gguf(cfg: Config, kv) -> None:
    """Gemma 3 as llama.cpp runs a gemma3 GGUF (llama-model.cpp's hparams,
    models/gemma3.cpp): the embeddings times sqrt(n_embd); the window
    (attention.sliding_window, required) in the layers
    attention.sliding_window_pattern says: a period p (default 6: layer i
    local when i % p < p - 1, so 5, 11, ... global; 0: all local), or one
    bool a layer (true: local), as llama.cpp's set_swa_pattern and
    get_key_or_arr read it (the converter writes neither); the window's
    layers with RoPE base 10000 (rope.freq_base_swa, when the file has it)
    and no scaling, the others with rope.freq_base and the file's scaling;
    the softmax scale 1 / sqrt(head_dim) (no key holds HF's
    query_pre_attn_scalar), but 1 / sqrt(n_embd / n_head) for 62 layers
    (the 27B, whose query_pre_attn_scalar that is). The norm weights are
    used as they are: the converter stored Gemma's 1 + w."""
    if kv("final_logit_softcapping", 0.0) or kv("attn_logit_softcapping", 0.0):
        raise ValueError("gemma3: logit soft-capping unsupported")
    cfg.embed_scale = float(np.sqrt(cfg.dim))
    cfg.ffn_act = "gelu_tanh"
    cfg.sliding_window = int(kv("attention.sliding_window"))
    pattern = kv("attention.sliding_window_pattern", 6)
    if isinstance(pattern, list):
        if len(pattern) != cfg.n_layers:
            raise ValueError(f"gemma3: sliding_window_pattern of "
                             f"{len(pattern)} layers, want {cfg.n_layers}")
        cfg.window_layers = [bool(b) for b in pattern]
    else:
        p = int(pattern)
        cfg.window_layers = [p == 0 or i % p < p - 1
                             for i in range(cfg.n_layers)]
    cfg.swa_rope_base = float(kv("rope.freq_base_swa", 10000.0))
    if cfg.n_layers == 62:
        cfg.attn_scale = 1.0 / np.sqrt(cfg.dim // cfg.n_heads)


def _gemma2_gguf(cfg: Config, kv) -> None:
    """Gemma 2 as llama.cpp runs a gemma2 GGUF (llama-model.cpp's hparams,
    models/gemma2.cpp): Gemma 3's embedding scale, GeGLU and post norms;
    every other layer local from the first (set_swa_pattern(2)) over
    attention.sliding_window (default 4096), one RoPE; soft-capping by
    attn_logit_softcapping (default 50) and final_logit_softcapping
    (default 30); the softmax scale 1 / sqrt(head_dim), but 1 / sqrt(n_embd
    / n_head) for 46 layers (the 27B)."""
    cfg.embed_scale = float(np.sqrt(cfg.dim))
    cfg.ffn_act = "gelu_tanh"
    cfg.sliding_window = int(kv("attention.sliding_window", 4096))
    cfg.window_layers = [i % 2 == 0 for i in range(cfg.n_layers)]
    cfg.attn_softcap = float(kv("attn_logit_softcapping", 50.0))
    cfg.final_softcap = float(kv("final_logit_softcapping", 30.0))
    if cfg.n_layers == 46:
        cfg.attn_scale = 1.0 / np.sqrt(cfg.dim // cfg.n_heads)


def load_gguf(path: str):
    """Returns (Config, Weights) from a llama.cpp GGUF file."""
    import gguf

    reader = gguf.GGUFReader(path)
    arch = _gguf_field(reader, "general.architecture")
    if arch not in ("llama", "qwen2", "qwen3", "qwen3moe", "glm4moe",
                    "deepseek2", "gemma2", "gemma3", "gpt-oss", "qwen35",
                    "qwen35moe", "qwen3next"):
        raise ValueError(f"{path}: architecture {arch!r}, want llama, qwen2, "
                         f"qwen3, qwen3moe, glm4moe, deepseek2, gemma2, "
                         f"gemma3, gpt-oss, qwen35, qwen35moe or qwen3next")

    def kv(key, default=None):
        v = _gguf_field(reader, f"{arch}.{key}", default)
        if v is None:
            raise ValueError(f"{path}: missing {arch}.{key}")
        return v

    dim = int(kv("embedding_length"))
    n_heads = int(kv("attention.head_count"))
    head_dim = int(kv("attention.key_length", dim // n_heads))
    mla = arch == "deepseek2"
    if mla:
        # llama.cpp's deepseek2, two layouts. Today's converter: MLA as
        # MQA over the latent (head_count_kv 1, key_length kv_lora_rank +
        # rope, value_length kv_lora_rank), the heads' sizes in
        # key_length_mla (qk_nope + rope) and value_length_mla (v_head_dim),
        # kv_b split into attn_k_b / attn_v_b. Older files: no *_mla keys,
        # key_length / value_length the heads' sizes, attn_kv_b merged.
        head_dim = int(kv("attention.key_length_mla", 0)) or head_dim

    tensors = {}
    for t in reader.tensors:
        # dequantize() returns an array whose LAST axis is GGUF's first
        # (fastest-varying) dim: a weight with GGUF dims [in, out] comes back
        # as (out, in), which is exactly the y = W @ x layout we want.
        a = gguf.quants.dequantize(t.data, t.tensor_type)
        want = tuple(int(d) for d in reversed(list(t.shape)))
        a = np.asarray(a).reshape(want)
        tensors[t.name] = _f64(a)

    tok_embd = tensors["token_embd.weight"]
    vocab = int(kv("vocab_size", tok_embd.shape[0]))
    cfg = Config(
        dim=dim,
        hidden_dim=int(kv("feed_forward_length")),
        n_layers=int(kv("block_count")),
        n_heads=n_heads,
        n_kv_heads=(n_heads if mla
                    else int(kv("attention.head_count_kv", n_heads))),
        head_dim=head_dim,
        vocab_size=vocab,
        rope_base=float(kv("rope.freq_base", 10000.0)),
        norm_eps=float(kv("attention.layer_norm_rms_epsilon")),
        # llama.cpp runs Llama with "normal" RoPE on its permuted Q/K rows
        # (adjacent pairs), DeepSeek's with "normal" RoPE on unpermuted
        # rows (the pairs DeepSeek's own code rotates), and Qwen2 / Qwen3 /
        # GLM-4.5 / Gemma 3 with NeoX RoPE (halves).
        rope_style="adjacent" if arch in ("llama", "deepseek2") else "half",
        sliding_window=int(kv("attention.sliding_window", 0)),
        # (any layer's: a hybrid's first layer may have no attention)
        qk_norm=any(n.endswith(".attn_q_norm.weight") for n in tensors),
        n_experts=int(kv("expert_count", 0)),
    )
    if cfg.n_experts:
        cfg.experts_used = int(kv("expert_used_count"))
        cfg.expert_hidden_dim = int(kv("expert_feed_forward_length",
                                       cfg.hidden_dim))
        # llama.cpp renormalizes the top-k weights of qwen3moe and llama
        # (Mixtral) mixtures.
        cfg.experts_norm = bool(kv("expert_weights_norm", True))
    if arch in ("glm4moe", "deepseek2"):
        # llama.cpp's glm4moe: sigmoid gating unless the file says
        # otherwise, no renormalization unless expert_weights_norm, and
        # the weights always times expert_weights_scale (so it is required).
        # Its multi-token-prediction (NextN) blocks are the file's last;
        # the forward pass runs the others, as llama.cpp's does.
        # deepseek2 the same, but softmax gating when the file does not say
        # (DeepSeek V2's files) and the scale optional (its converter
        # writes routed_scaling_factor whenever config.json has one).
        cfg.n_layers -= int(kv("nextn_predict_layers", 0))
        gating = int(kv("expert_gating_func", 2 if arch == "glm4moe" else 1))
        if gating not in (1, 2):
            raise ValueError(f"{path}: expert_gating_func {gating} unsupported")
        cfg.gating = "sigmoid" if gating == 2 else "softmax"
        cfg.experts_norm = bool(kv("expert_weights_norm", False))
        cfg.routed_scale = float(kv("expert_weights_scale",
                                    None if arch == "glm4moe" else 1.0))
        cfg.dense_layers = int(kv("leading_dense_block_count", 0))
        cfg.n_shared = int(kv("expert_shared_count"))
        cfg.n_group = max(1, int(kv("expert_group_count", 1)))
        cfg.topk_group = max(1, int(kv("expert_group_used_count", 1)))
        if cfg.gating == "softmax" and cfg.n_group > 1:
            raise ValueError(f"{path}: expert groups with softmax gating "
                             f"unsupported")
    if arch == "gemma3":
        _gemma3_gguf(cfg, kv)
    if arch == "gemma2":
        _gemma2_gguf(cfg, kv)
    if arch == "gpt-oss":  # llama.cpp's set_swa_pattern(2), openai-moe.
        cfg.window_layers = [i % 2 == 0 for i in range(cfg.n_layers)]
        cfg.swiglu_oai = True
        cfg.experts_norm = True  # softmax over the chosen logits
    if arch in ("qwen35", "qwen35moe", "qwen3next"):
        _qwen35_gguf(cfg, kv)
        # Qwen3-Next's converter keeps transformers' grouped value heads.
        cfg.ssm_v_tiled = arch != "qwen3next"
    if arch in ("qwen35moe", "qwen3next"):
        # llama.cpp's qwen35moe: softmax routing, the top-k renormalized,
        # and a shared expert (when the file has one) gated per token.
        cfg.n_shared = int("blk.0.ffn_gate_shexp.weight" in tensors)
        cfg.shared_hidden_dim = int(kv("expert_shared_feed_forward_length",
                                       cfg.expert_hidden_dim))
    if mla:
        cfg.q_lora_rank = int(kv("attention.q_lora_rank", 0))
        cfg.kv_lora_rank = int(kv("attention.kv_lora_rank"))
        cfg.v_head_dim = int(kv("attention.value_length_mla", 0)
                             or kv("attention.value_length"))
        cfg.lora_norm_eps = cfg.norm_eps  # llama.cpp: one eps for all norms
    st = str(kv("rope.scaling.type", "none"))
    if st == "linear":
        cfg.rope_scaling = {"type": "linear",
                            "factor": float(kv("rope.scaling.factor"))}
    elif st == "yarn":
        cfg.rope_scaling = {
            "type": "yarn", "factor": float(kv("rope.scaling.factor")),
            "original_max_position_embeddings":
                int(kv("rope.scaling.original_context_length")),
            "beta_fast": float(kv("rope.scaling.yarn_beta_fast", 32.0)),
            "beta_slow": float(kv("rope.scaling.yarn_beta_slow", 1.0))}
        if mla:
            _deepseek2_yarn(cfg, float(kv("rope.scaling.yarn_log_multiplier",
                                          0.0)))
    elif st != "none":
        raise ValueError(f"{path}: rope.scaling.type {st!r} unsupported")
    if "rope_freqs.weight" in tensors:
        cfg.freq_factors = tensors["rope_freqs.weight"].reshape(-1)
    rope_dims = int(kv("rope.dimension_count", head_dim))
    if rope_dims != head_dim:
        # ggml's rope with n_dims < head_dim: the first n_dims rotate,
        # frequencies base^(-2i/n_dims), the rest pass through.
        if rope_dims % 2 or rope_dims > head_dim:
            raise ValueError(f"{path}: RoPE over {rope_dims} of {head_dim} dims")
        cfg.rope_dim = rope_dims

    def experts(p, kind):
        """Merged (n_experts, rows, cols), or stacked per-expert tensors."""
        if p + kind + "_exps.weight" in tensors:
            return tensors[p + kind + "_exps.weight"]
        return np.stack([tensors[f"{p}{kind}.{e}.weight"]
                         for e in range(cfg.n_experts)])

    # GLM-4.5's pre-FFN norm (HF post_attention_layernorm) is named
    # post_attention_norm in its GGUFs; Gemma 3's post_attention_norm is
    # the norm of the attention's output (HF post_attention_layernorm too),
    # its pre-FFN norm ffn_norm.
    ffn_norm = ("post_attention_norm"
                if arch in ("glm4moe", "gpt-oss", "qwen35", "qwen35moe",
                            "qwen3next") else "ffn_norm")
    gemma = arch in ("gemma2", "gemma3")
    def kv_b(p):
        """HF's merged kv_b_proj: attn_kv_b (older files) as it is, or
        rebuilt from attn_k_b (n_heads, kv_lora_rank, qk_nope), transposed
        per head by the converter, and attn_v_b (n_heads, v_head_dim,
        kv_lora_rank)."""
        if p + "attn_kv_b.weight" in tensors:
            return tensors[p + "attn_kv_b.weight"]
        kb = tensors[p + "attn_k_b.weight"].transpose(0, 2, 1)
        vb = tensors[p + "attn_v_b.weight"]
        return _f64(np.concatenate([kb, vb], axis=1).reshape(
            -1, cfg.kv_lora_rank))

    layers = []
    for i in range(cfg.n_layers):
        p = f"blk.{i}."
        moe = cfg.is_moe(i)
        shared = moe and cfg.n_shared > 0
        ffn = dict(
            ffn_norm=tensors[p + ffn_norm + ".weight"],
            w_gate=None if moe else tensors[p + "ffn_gate.weight"],
            w_up=None if moe else tensors[p + "ffn_up.weight"],
            w_down=None if moe else tensors[p + "ffn_down.weight"],
            router=tensors[p + "ffn_gate_inp.weight"] if moe else None,
            e_gate=experts(p, "ffn_gate") if moe else None,
            e_up=experts(p, "ffn_up") if moe else None,
            e_down=experts(p, "ffn_down") if moe else None,
            e_bias=tensors.get(p + "exp_probs_b.bias") if moe else None,
            s_gate=tensors[p + "ffn_gate_shexp.weight"] if shared else None,
            s_up=tensors[p + "ffn_up_shexp.weight"] if shared else None,
            s_down=tensors[p + "ffn_down_shexp.weight"] if shared else None,
            s_gate_inp=(tensors[p + "ffn_gate_inp_shexp.weight"].reshape(-1)
                        if shared and p + "ffn_gate_inp_shexp.weight"
                        in tensors else None),
            router_b=tensors.get(p + "ffn_gate_inp.bias") if moe else None,
            e_gate_b=tensors.get(p + "ffn_gate_exps.bias") if moe else None,
            e_up_b=tensors.get(p + "ffn_up_exps.bias") if moe else None,
            e_down_b=tensors.get(p + "ffn_down_exps.bias") if moe else None)
        if cfg.is_linear(i):
            layers.append(_gated_delta_net_layer(tensors, p, ffn, cfg))
            continue
        lora = mla and cfg.q_lora_rank > 0
        layers.append(Layer(
            attn_norm=tensors[p + "attn_norm.weight"],
            wq=None if lora else tensors[p + "attn_q.weight"],
            wk=None if mla else tensors[p + "attn_k.weight"],
            wv=None if mla else tensors[p + "attn_v.weight"],
            wo=tensors[p + "attn_output.weight"],
            wq_a=tensors[p + "attn_q_a.weight"] if lora else None,
            q_a_norm=tensors[p + "attn_q_a_norm.weight"] if lora else None,
            wq_b=tensors[p + "attn_q_b.weight"] if lora else None,
            wkv_a=tensors[p + "attn_kv_a_mqa.weight"] if mla else None,
            kv_a_norm=tensors[p + "attn_kv_a_norm.weight"] if mla else None,
            wkv_b=kv_b(p) if mla else None,
            bq=tensors.get(p + "attn_q.bias"),
            bk=tensors.get(p + "attn_k.bias"),
            bv=tensors.get(p + "attn_v.bias"),
            q_norm=tensors.get(p + "attn_q_norm.weight"),
            k_norm=tensors.get(p + "attn_k_norm.weight"),
            attn_post_norm=(tensors[p + "post_attention_norm.weight"]
                            if gemma else None),
            ffn_post_norm=(tensors[p + "post_ffw_norm.weight"]
                           if gemma else None),
            sinks=tensors.get(p + "attn_sinks.weight"),
            bo=tensors.get(p + "attn_output.bias"),
            **ffn,
        ))
    w = Weights(
        tok_embd=tok_embd,
        layers=layers,
        final_norm=tensors["output_norm.weight"],
        lm_head=tensors.get("output.weight", tok_embd),  # tied when absent
    )
    _check_shapes(cfg, w)
    return cfg, w


def _qwen35_gguf(cfg: Config, kv) -> None:
    """llama.cpp's qwen35: Gated DeltaNet layers but every
    full_attention_interval-th (attention.recurrent_layers, when the file
    has it, says which), gated attention, and the ssm.* sizes as its
    converter writes them: state_size the k (and v) head, group_count the
    k heads, time_step_rank the v heads, inner_size all v values. The
    converter reorders the v heads tiled (Config.ssm_v_tiled). Its RoPE is
    interleaved M-RoPE, which for text (one position in every section) is
    NeoX RoPE over rope.dimension_count dims."""
    interval = int(kv("full_attention_interval", 4))
    recurrent = kv("attention.recurrent_layers", [])
    if len(recurrent):
        cfg.linear_layers = [bool(r) for r in recurrent][:cfg.n_layers]
    else:
        cfg.linear_layers = [(i + 1) % interval != 0
                             for i in range(cfg.n_layers)]
    cfg.ssm_conv = int(kv("ssm.conv_kernel"))
    cfg.ssm_k_dim = cfg.ssm_v_dim = int(kv("ssm.state_size"))
    cfg.ssm_k_heads = int(kv("ssm.group_count"))
    cfg.ssm_v_heads = int(kv("ssm.time_step_rank"))
    if int(kv("ssm.inner_size")) != cfg.ssm_v_heads * cfg.ssm_v_dim:
        raise ValueError("qwen35: ssm.inner_size is not time_step_rank x "
                         "state_size")
    cfg.ssm_v_tiled = True
    cfg.attn_gate = True


def split_qwen3next_ba(ba: np.ndarray, hk: int) -> tuple:
    """llama.cpp's qwen3next ssm_ba (2 hv, dim): per key head g, the betas
    of its hv / hk value heads, then their alphas. Returns (beta, alpha),
    each (hv, dim) in value-head order."""
    r = ba.shape[0] // (2 * hk)
    groups = ba.reshape(hk, 2, r, -1)
    return (groups[:, 0].reshape(hk * r, -1), groups[:, 1].reshape(hk * r, -1))


def split_qwen3next_qkvz(qkvz: np.ndarray, hk: int, dk: int,
                         dv: int) -> tuple:
    """A legacy qwen3next GGUF's ssm_in (rows per key head g: q (dk), k
    (dk), its value heads' v (r dv), their z (r dv)). Returns (qkv, z):
    [all q | all k | all v] and z, value heads in order."""
    r = (qkvz.shape[0] // hk - 2 * dk) // (2 * dv)
    g = qkvz.reshape(hk, 2 * dk + 2 * r * dv, -1)
    q, k = g[:, :dk], g[:, dk:2 * dk]
    v, z = g[:, 2 * dk:2 * dk + r * dv], g[:, 2 * dk + r * dv:]
    cols = qkvz.shape[1]
    qkv = np.concatenate([q.reshape(-1, cols), k.reshape(-1, cols),
                          v.reshape(-1, cols)])
    return qkv, z.reshape(-1, cols)


def _gated_delta_net_layer(tensors: dict, p: str, ffn: dict,
                           cfg: Config) -> Layer:
    """A Gated DeltaNet layer of a qwen35 or qwen3next GGUF (llama.cpp's
    names: qwen3next's beta and alpha in one ssm_ba, and in older files
    q, k, v and z in one ssm_in), its FFN's fields `ffn`."""
    if p + "ssm_in.weight" in tensors:
        qkv, z = split_qwen3next_qkvz(tensors[p + "ssm_in.weight"],
                                      cfg.ssm_k_heads, cfg.ssm_k_dim,
                                      cfg.ssm_v_dim)
    else:
        qkv, z = tensors[p + "attn_qkv.weight"], tensors[p + "attn_gate.weight"]
    if p + "ssm_ba.weight" in tensors:
        beta, alpha = split_qwen3next_ba(tensors[p + "ssm_ba.weight"],
                                         cfg.ssm_k_heads)
    else:
        beta, alpha = tensors[p + "ssm_beta.weight"], tensors[
            p + "ssm_alpha.weight"]
    return Layer(
        attn_norm=tensors[p + "attn_norm.weight"],
        wq=None, wk=None, wv=None, wo=None,
        **ffn,
        ssm_qkv=qkv,
        ssm_z=z,
        ssm_beta=beta,
        ssm_alpha=alpha,
        ssm_dt=tensors[p + "ssm_dt.bias"].reshape(-1),
        ssm_a=tensors[p + "ssm_a"].reshape(-1),
        ssm_conv1d=tensors[p + "ssm_conv1d.weight"],
        ssm_norm=tensors[p + "ssm_norm.weight"],
        ssm_out=tensors[p + "ssm_out.weight"])


def load_hf_dir(d: str):
    """Returns (Config, Weights) from a Hugging Face folder: llama_ref_hf.py,
    imported here (it imports this module)."""
    import llama_ref_hf
    return llama_ref_hf.load_hf_dir(d)


# ----------------------------------------------------------------------------
# The ops
# ----------------------------------------------------------------------------

def rmsnorm(x: np.ndarray, w: np.ndarray, eps: float) -> np.ndarray:
    """x: (T, dim). x / sqrt(mean(x^2) + eps) * w, per row."""
    ms = np.mean(x * x, axis=-1, keepdims=True)
    return x / np.sqrt(ms + eps) * w


def silu(x: np.ndarray) -> np.ndarray:
    return x / (1.0 + np.exp(-x))


def swiglu_oai(gate: np.ndarray, up: np.ndarray) -> np.ndarray:
    """gpt-oss's clamped SwiGLU (transformers' GptOssExperts, ggml's
    swiglu_oai): alpha 1.702, limit 7."""
    g = np.minimum(gate, 7.0)
    u = np.clip(up, -7.0, 7.0)
    return g / (1.0 + np.exp(-1.702 * g)) * (u + 1.0)


def gelu_tanh(x: np.ndarray) -> np.ndarray:
    """GELU's tanh approximation (transformers' gelu_pytorch_tanh, ggml's
    gelu)."""
    return 0.5 * x * (1.0 + np.tanh(np.sqrt(2.0 / np.pi)
                                    * (x + 0.044715 * x ** 3)))


def rope_frequencies(head_dim: int, base: float, scaling: dict | None,
                     freq_factors: np.ndarray | None):
    """(inv_freq of shape (head_dim/2,), magnitude scale of cos and sin),
    following transformers' modeling_rope_utils for each scaling type and
    ggml's rope (theta divided by freq_factors) for GGUF's rope_freqs."""
    i = np.arange(head_dim // 2, dtype=np.float64)
    inv = base ** (-2.0 * i / head_dim)
    mscale = 1.0
    kind = scaling["type"] if scaling else None
    if kind == "dynamic":
        # Static NTK (docs/design-notes.md): transformers'
        # _compute_dynamic_ntk_parameters evaluated once, at the longest
        # sequence served (factor x the original context), for every
        # position: base x (factor x seq_len / original - (factor - 1))
        # ^ (dim / (dim - 2)).
        f = scaling["factor"]
        original = scaling["original_max_position_embeddings"]
        seq_len = f * original
        ntk_base = base * ((f * seq_len / original) - (f - 1)) ** (
            head_dim / (head_dim - 2))
        inv = 1.0 / ntk_base ** (np.arange(0, head_dim, 2) / head_dim)
    elif kind == "linear":
        inv = inv / scaling["factor"]
    elif kind == "llama3":
        f = scaling["factor"]
        lo, hi = scaling["low_freq_factor"], scaling["high_freq_factor"]
        old = scaling["original_max_position_embeddings"]
        wavelen = 2 * np.pi / inv
        smooth = (old / wavelen - lo) / (hi - lo)
        mid = (1 - smooth) * inv / f + smooth * inv
        inv = np.where(wavelen > old / lo, inv / f,
                       np.where(wavelen < old / hi, inv, mid))
    elif kind == "yarn":
        f = scaling["factor"]
        old = scaling["original_max_position_embeddings"]
        beta_fast = scaling.get("beta_fast") or 32
        beta_slow = scaling.get("beta_slow") or 1

        def corr_dim(rotations):
            return (head_dim * np.log(old / (rotations * 2 * np.pi))
                    / (2 * np.log(base)))
        low, high = corr_dim(beta_fast), corr_dim(beta_slow)
        if scaling.get("truncate", True):  # gpt-oss's config says false
            low, high = np.floor(low), np.ceil(high)
        low, high = max(low, 0), min(high, head_dim - 1)
        if low == high:
            high += 0.001
        ramp = np.clip((i - low) / (high - low), 0, 1)
        keep = 1 - ramp  # 1: extrapolate (trained frequency), 0: interpolate
        inv = inv / f * (1 - keep) + inv * keep
        mscale = scaling.get("attention_factor") or (0.1 * np.log(f) + 1.0)
    if freq_factors is not None:
        inv = inv / freq_factors
    return inv, mscale


def rope_tables(positions: np.ndarray, head_dim: int, base: float,
                scaling: dict | None = None,
                freq_factors: np.ndarray | None = None):
    """cos, sin of shape (T, head_dim/2): angle = pos * inv_freq[i], where
    inv_freq[i] = base^(-2i/head_dim) before scaling."""
    inv, mscale = rope_frequencies(head_dim, base, scaling, freq_factors)
    ang = positions.astype(np.float64)[:, None] * inv[None, :]
    return np.cos(ang) * mscale, np.sin(ang) * mscale


def apply_rope(x: np.ndarray, cos: np.ndarray, sin: np.ndarray, style: str):
    """x: (T, n_heads, head_dim). Rotates pair i by angle[:, i]. With
    fewer angles than head_dim/2 (partial RoPE: cos, sin of shape
    (T, rope_dim/2)), only x[..., :rope_dim] rotates, its pairs formed
    within those dims; the rest passes through."""
    rd = 2 * cos.shape[-1]
    if rd < x.shape[-1]:
        out = x.copy()
        out[..., :rd] = apply_rope(x[..., :rd], cos, sin, style)
        return out
    c = cos[:, None, :]
    s = sin[:, None, :]
    out = np.empty_like(x)
    if style == "adjacent":      # pairs (x[2i], x[2i+1])  -- GGUF
        a, b = x[..., 0::2], x[..., 1::2]
        out[..., 0::2] = a * c - b * s
        out[..., 1::2] = a * s + b * c
    elif style == "half":        # pairs (x[i], x[i+hd/2]) -- HF rotate_half
        h = x.shape[-1] // 2
        a, b = x[..., :h], x[..., h:]
        out[..., :h] = a * c - b * s
        out[..., h:] = a * s + b * c
    else:
        raise ValueError(style)
    return out


def softmax(x: np.ndarray, axis=-1) -> np.ndarray:
    m = np.max(x, axis=axis, keepdims=True)
    e = np.exp(x - m)
    return e / np.sum(e, axis=axis, keepdims=True)


def route(logits: np.ndarray, top_k: int, renormalize: bool):
    """One token's experts: softmax of the router logits (n_experts,), the
    top_k probabilities (ties to the lower expert index: a stable sort),
    renormalized to sum to 1 when asked. Returns ([(expert, weight)], the
    logit gap between the last chosen and the first unchosen expert)."""
    p = softmax(logits)
    ranked = np.argsort(-p, kind="stable")
    order = ranked[:top_k]
    w = p[order]
    if renormalize:
        w = w / np.sum(w)
    gap = (float(logits[ranked[top_k - 1]] - logits[ranked[top_k]])
           if top_k < len(p) else float("inf"))
    return list(zip(order.tolist(), w.tolist())), gap


def sigmoid(x: np.ndarray) -> np.ndarray:
    return 1.0 / (1.0 + np.exp(-x))


def route_sigmoid(logits: np.ndarray, bias: np.ndarray | None, c: Config):
    """One token's experts by GLM-4.5's router (transformers'
    Glm4MoeTopkRouter, as DeepSeek-V3's): scores = sigmoid(logits);
    choice = scores + bias; the experts in n_group contiguous groups, each
    scored by the sum of its top 2 choices; the topk_group best groups kept
    (ties to the lower index) and the others' choices set to 0.0 (as
    transformers' masked_fill; llama.cpp sets -inf, the same choice when
    the gap below is positive); the top experts_used by masked choice
    (ties to the lower index), weighted by their scores (not choices),
    divided by their sum (+1e-20) when experts_norm, times routed_scale.
    Returns ([(expert, weight)], gap): gap, in choice units, the smaller of
    the last chosen expert's masked choice minus the largest unchosen one
    (masked zeros included) and, with groups, the last kept group's score
    minus the best dropped one's."""
    scores = sigmoid(logits)
    choice = scores + bias if bias is not None else scores.copy()
    n, k = len(choice), c.experts_used
    gap = float("inf")
    if c.n_group > 1:
        groups = choice.reshape(c.n_group, n // c.n_group)
        gscore = np.sort(groups, axis=1)[:, -2:].sum(axis=1)
        granked = np.argsort(-gscore, kind="stable")
        kept = granked[:c.topk_group]
        if c.topk_group < c.n_group:
            gap = float(gscore[granked[c.topk_group - 1]]
                        - gscore[granked[c.topk_group]])
        keep = np.zeros(c.n_group, dtype=bool)
        keep[kept] = True
        choice = np.where(np.repeat(keep, n // c.n_group), choice, 0.0)
    ranked = np.argsort(-choice, kind="stable")
    order = ranked[:k]
    if k < n:
        gap = min(gap, float(choice[ranked[k - 1]] - choice[ranked[k]]))
    w = scores[order]
    if c.experts_norm:
        w = w / (np.sum(w) + 1e-20)
    w = w * c.routed_scale
    return list(zip(order.tolist(), w.tolist())), gap


def moe_ffn(h: np.ndarray, L: "Layer", c: Config, gaps=None) -> np.ndarray:
    """h: (T, dim). Each token through its routed experts' SwiGLU FFNs,
    weighted, plus the shared experts' FFN when there are any. Appends each
    routing's gap to `gaps` (a list) when given."""
    out = np.zeros_like(h)
    logits = h @ L.router.T                                 # (T, n_experts)
    if L.router_b is not None:  # gpt-oss
        logits = logits + L.router_b
    for t in range(h.shape[0]):
        if c.gating == "sigmoid":
            chosen, gap = route_sigmoid(logits[t], L.e_bias, c)
        else:  # times routed_scale: DeepSeek V2's (1 elsewhere)
            chosen, gap = route(logits[t], c.experts_used, c.experts_norm)
            chosen = [(e, wt * c.routed_scale) for e, wt in chosen]
        if gaps is not None:
            gaps.append(gap)
        for e, wt in chosen:
            g, u = L.e_gate[e] @ h[t], L.e_up[e] @ h[t]
            if L.e_gate_b is not None:  # gpt-oss
                g, u = g + L.e_gate_b[e], u + L.e_up_b[e]
            y = swiglu_oai(g, u) if c.swiglu_oai else silu(g) * u
            d = L.e_down[e] @ y
            if L.e_down_b is not None:
                d = d + L.e_down_b[e]
            out[t] += wt * d
    if c.n_shared:
        shared = (silu(h @ L.s_gate.T) * (h @ L.s_up.T)) @ L.s_down.T
        if L.s_gate_inp is not None:  # Qwen3.5-MoE: gated per token
            shared = shared * sigmoid(h @ L.s_gate_inp)[:, None]
        out = out + shared
    return out


# ----------------------------------------------------------------------------
# The model
# ----------------------------------------------------------------------------

def round_kv(x: np.ndarray, dtype: str) -> np.ndarray:
    """The values a KV cache of `dtype` stores for `x` (round to nearest
    even), back in float64: "f32", "f16", "bf16", or "int8" (per row of
    the last axis, one token's head: scale max|x| / 127, computed in
    float32 as the C++ kernel does)."""
    x32 = np.asarray(x, dtype=np.float32)
    if dtype == "int8":
        amax = np.max(np.abs(x32), axis=-1, keepdims=True)
        scale = amax / np.float32(127)
        inv = np.where(scale > 0, np.float32(1) / np.where(scale > 0, scale, 1),
                       np.float32(0)).astype(np.float32)
        q = np.clip(np.rint(x32 * inv), -127, 127).astype(np.float32)
        return (q * scale).astype(np.float64)
    if dtype == "f32":
        return x32.astype(np.float64)
    if dtype == "f16":
        return x32.astype(np.float16).astype(np.float64)
    if dtype == "bf16":
        bits = x32.view(np.uint32).astype(np.uint64)
        bits = ((bits + 0x7FFF + ((bits >> 16) & 1)) >> 16) << 16
        return bits.astype(np.uint32).view(np.float32).astype(np.float64)
    raise ValueError(f"KV cache dtype {dtype!r}: expected f32, f16, bf16 "
                     f"or int8")


class LlamaRef:
    def __init__(self, cfg: Config, w: Weights, kv_dtype: str = "f32",
                 mla_absorb: bool = False):
        """kv_dtype: what the cache stores K and V as (round_kv); the
        math stays float64. mla_absorb: multi-head latent attention in the
        absorbed form (mla_attention), the same numbers to rounding."""
        self.cfg = cfg
        self.w = w
        round_kv(np.zeros(1), kv_dtype)  # Validates the name.
        self.kv_dtype = kv_dtype
        self.mla_absorb = mla_absorb
        # Mixtures: every routing's logit gap between the last chosen and
        # the first unchosen expert (a near-tie there could route the C++
        # side's f32 differently), over the model's life; with sigmoid
        # gating, route_sigmoid's gap in choice units instead.
        self.route_gaps = []
        self.reset()

    @classmethod
    def load(cls, path: str, kv_dtype: str = "f32",
             mla_absorb: bool = False) -> "LlamaRef":
        load = load_hf_dir if os.path.isdir(path) else load_gguf
        return cls(*load(path), kv_dtype=kv_dtype, mla_absorb=mla_absorb)

    def reset(self):
        """Empties the KV cache. With multi-head latent attention it holds,
        per token and layer, the normalized latent c_kv (k_cache, shape
        (S, kv_lora_rank)) and the roped k_pe (v_cache, (S, rope_dim)),
        each rounded as one row by round_kv."""
        c = self.cfg
        if c.mla:
            self.k_cache = [np.zeros((0, c.kv_lora_rank)) for _ in range(c.n_layers)]
            self.v_cache = [np.zeros((0, c.rotary_dim)) for _ in range(c.n_layers)]
        else:
            self.k_cache = [np.zeros((0, c.n_kv_heads, c.head_dim)) for _ in range(c.n_layers)]
            self.v_cache = [np.zeros((0, c.n_kv_heads, c.head_dim)) for _ in range(c.n_layers)]
        # Gated DeltaNet layers: the last ssm_conv - 1 inputs of the
        # convolution (zeros before the first token) and the recurrent
        # state, (ssm_v_heads, ssm_k_dim, ssm_v_dim) per layer.
        self.conv_state = [np.zeros((max(c.ssm_conv - 1, 0), c.ssm_conv_dim))
                           for _ in range(c.n_layers)]
        self.ssm_state = [np.zeros((c.ssm_v_heads, c.ssm_k_dim, c.ssm_v_dim))
                          for _ in range(c.n_layers)]
        self.pos = 0

    def gated_delta_net(self, li: int, L: "Layer", h: np.ndarray):
        """A Gated DeltaNet layer (transformers' Qwen3_5GatedDeltaNet /
        Qwen3NextGatedDeltaNet, in its recurrent form) of h (T, dim),
        normed; returns (T, dim). Per token t:

          [q | k | v] = silu(causal depthwise conv over time of wqkv h)
          beta = sigmoid(w_beta h);  g = a * softplus(w_alpha h + dt)
          per value head i, with k head j (Config.ssm_v_tiled):
            q = l2norm(q_j) / sqrt(dk);  k = l2norm(k_j)
            S = exp(g_i) S;  S += k (x) beta_i (v_i - S^T k);  o_i = S^T q
            o_i = rmsnorm(o_i) * silu(z_i)       (z = wz h, per v head)
          out = w_out [o_0 | ... | o_{Hv-1}]

        l2norm(x) = x / sqrt(sum x^2 + 1e-6). The state S (dk, dv) per
        value head and the convolution's last inputs carry over between
        calls (reset)."""
        c = self.cfg
        T, K = h.shape[0], c.ssm_conv
        hk, hv, dk, dv = c.ssm_k_heads, c.ssm_v_heads, c.ssm_k_dim, c.ssm_v_dim
        mixed = h @ L.ssm_qkv.T                               # (T, C)
        padded = np.concatenate([self.conv_state[li], mixed], axis=0)
        conv = np.zeros_like(mixed)
        for j in range(K):  # tap j reads the input K - 1 - j tokens back
            conv += padded[j:j + T] * L.ssm_conv1d[:, j]
        self.conv_state[li] = padded[T:]
        conv = silu(conv)
        q = conv[:, :hk * dk].reshape(T, hk, dk)
        k = conv[:, hk * dk:2 * hk * dk].reshape(T, hk, dk)
        v = conv[:, 2 * hk * dk:].reshape(T, hv, dv)

        def l2norm(x):
            return x / np.sqrt(np.sum(x * x, axis=-1, keepdims=True) + 1e-6)

        q = l2norm(q) / np.sqrt(dk)
        k = l2norm(k)
        beta = sigmoid(h @ L.ssm_beta.T)                      # (T, hv)
        a = h @ L.ssm_alpha.T + L.ssm_dt
        softplus = np.logaddexp(0.0, a)
        decay = np.exp(L.ssm_a * softplus)                    # (T, hv)
        S = self.ssm_state[li].copy()
        o = np.empty((T, hv, dv))
        for t in range(T):
            for i in range(hv):
                j = i % hk if c.ssm_v_tiled else i // (hv // hk)
                S[i] *= decay[t, i]
                delta = (v[t, i] - S[i].T @ k[t, j]) * beta[t, i]
                S[i] += np.outer(k[t, j], delta)
                o[t, i] = S[i].T @ q[t, j]
        self.ssm_state[li] = S
        z = (h @ L.ssm_z.T).reshape(T, hv, dv)
        o = rmsnorm(o, L.ssm_norm, c.norm_eps) * silu(z)
        return o.reshape(T, hv * dv) @ L.ssm_out.T

    def mla_attention(self, li: int, L: "Layer", h: np.ndarray, cos, sin,
                      mask: np.ndarray) -> np.ndarray:
        """DeepSeek V2 / V3 multi-head latent attention (transformers'
        DeepseekV3Attention) of h (T, dim), normed; returns (T, dim).

          q = wq_b rmsnorm(wq_a h)  (or wq h)   per head [q_nope | q_pe]
          [c_kv | k_pe] = wkv_a h;  c_kv = rmsnorm(c_kv)
          q_pe, k_pe roped (k_pe: one for all heads)
          per head: [k_nope | v] = kv_b c_kv
                    score = (q_nope . k_nope + q_pe . k_pe) * attn_scale
                    out = softmax(score) v
          o = wo [out_0 | ... | out_{H-1}]

        The cache holds c_kv and k_pe (reset). Absorbed (self.mla_absorb,
        llama.cpp's MLA form): q_nope . k_nope = (kv_b_K^T q_nope) . c_kv
        and softmax . v = kv_b_V (softmax . c_kv), per head."""
        c = self.cfg
        T, H, r, R = h.shape[0], c.n_heads, c.rotary_dim, c.kv_lora_rank
        nope, vd = c.head_dim - r, c.v_head_dim
        eps = c.lora_norm_eps or c.norm_eps
        if c.q_lora_rank:
            q = rmsnorm(h @ L.wq_a.T, L.q_a_norm, eps) @ L.wq_b.T
        else:
            q = h @ L.wq.T
        q = q.reshape(T, H, nope + r)
        q_nope = q[..., :nope]
        q_pe = apply_rope(q[..., nope:], cos, sin, c.rope_style)
        kv = h @ L.wkv_a.T                                   # (T, R + r)
        ckv = rmsnorm(kv[:, :R], L.kv_a_norm, eps)
        k_pe = apply_rope(kv[:, None, R:], cos, sin, c.rope_style)[:, 0]
        ckv = round_kv(ckv, self.kv_dtype)
        k_pe = round_kv(k_pe, self.kv_dtype)
        C = np.concatenate([self.k_cache[li], ckv], axis=0)  # (S, R)
        P = np.concatenate([self.v_cache[li], k_pe], axis=0)  # (S, r)
        self.k_cache[li], self.v_cache[li] = C, P
        kvb = L.wkv_b.reshape(H, nope + vd, R)
        wk, wv = kvb[:, :nope, :], kvb[:, nope:, :]  # (H, nope, R), (H, vd, R)
        scale = c.attn_scale or 1.0 / np.sqrt(c.head_dim)
        out = np.empty((T, H, vd))
        for hh in range(H):
            rope_scores = q_pe[:, hh, :] @ P.T                # (T, S)
            if self.mla_absorb:
                q_lat = q_nope[:, hh, :] @ wk[hh]            # (T, R)
                p = softmax((q_lat @ C.T + rope_scores) * scale + mask)
                out[:, hh, :] = (p @ C) @ wv[hh].T
            else:
                k_nope, v = C @ wk[hh].T, C @ wv[hh].T       # (S, nope), (S, vd)
                p = softmax((q_nope[:, hh, :] @ k_nope.T + rope_scores)
                            * scale + mask)
                out[:, hh, :] = p @ v
        return out.reshape(T, H * vd) @ L.wo.T

    def gqa_attention(self, li: int, L: "Layer", h: np.ndarray, positions,
                      cos, sin) -> np.ndarray:
        """Grouped-query attention of h (T, dim), normed; returns (T, dim)."""
        c = self.cfg
        T = h.shape[0]
        group = c.n_heads // c.n_kv_heads
        scale = c.attn_scale or 1.0 / np.sqrt(c.head_dim)
        q, k, v = h @ L.wq.T, h @ L.wk.T, h @ L.wv.T
        if L.bq is not None:
            q, k, v = q + L.bq, k + L.bk, v + L.bv
        gate = None
        if c.attn_gate:  # Qwen3.5: per head, the query then its gate
            qg = q.reshape(T, c.n_heads, 2, c.head_dim)
            q, gate = qg[:, :, 0, :], qg[:, :, 1, :]
        q = q.reshape(T, c.n_heads, c.head_dim)
        k = k.reshape(T, c.n_kv_heads, c.head_dim)
        v = v.reshape(T, c.n_kv_heads, c.head_dim)
        if c.qk_norm:  # Qwen3, Gemma 3: each head RMS-normed, then RoPE
            q = rmsnorm(q, L.q_norm, c.norm_eps)
            k = rmsnorm(k, L.k_norm, c.norm_eps)
        q = apply_rope(q, cos, sin, c.rope_style)
        k = apply_rope(k, cos, sin, c.rope_style)
        k, v = round_kv(k, self.kv_dtype), round_kv(v, self.kv_dtype)
        K = np.concatenate([self.k_cache[li], k], axis=0)  # (S, kvh, hd)
        V = np.concatenate([self.v_cache[li], v], axis=0)
        self.k_cache[li], self.v_cache[li] = K, V
        S = K.shape[0]
        # causal mask: query at absolute position p sees keys 0..p (the
        # last `window` of them when this layer has one)
        kpos = np.arange(S)
        seen = kpos[None, :] <= positions[:, None]
        window = c.layer_window(li)
        if window > 0:
            seen &= positions[:, None] - kpos[None, :] < window
        mask = np.where(seen, 0.0, -np.inf)
        att_out = np.empty((T, c.n_heads, c.head_dim))
        for hq in range(c.n_heads):
            hk = hq // group                    # GQA: query head -> KV head
            scores = (q[:, hq, :] @ K[:, hk, :].T) * scale  # (T, S)
            if c.attn_softcap:  # Gemma 2
                scores = c.attn_softcap * np.tanh(scores / c.attn_softcap)
            scores = scores + mask
            if L.sinks is not None:  # gpt-oss: the sink's column, no value
                s = np.concatenate(
                    [scores, np.full((T, 1), L.sinks[hq])], axis=1)
                att_out[:, hq, :] = softmax(s)[:, :-1] @ V[:, hk, :]
            else:
                att_out[:, hq, :] = softmax(scores) @ V[:, hk, :]
        if gate is not None:
            att_out = att_out * sigmoid(gate)
        out = att_out.reshape(T, -1) @ L.wo.T
        return out + L.bo if L.bo is not None else out

    def forward(self, tokens) -> np.ndarray:
        """Appends `tokens` to the sequence in the KV cache; returns their
        logits, shape (len(tokens), vocab)."""
        c, w = self.cfg, self.w
        tokens = np.asarray(tokens, dtype=np.int64)
        T = len(tokens)
        if T == 0:
            return np.zeros((0, c.vocab_size))
        if tokens.min() < 0 or tokens.max() >= c.vocab_size:
            raise ValueError("token id out of range")
        positions = np.arange(self.pos, self.pos + T)
        rope = rope_tables(positions, c.rotary_dim, c.rope_base,
                           c.rope_scaling, c.freq_factors)
        if c.swa_rope_base:
            swa_rope = rope_tables(positions, c.rotary_dim, c.swa_rope_base)
        act = gelu_tanh if c.ffn_act == "gelu_tanh" else silu

        x = w.tok_embd[tokens] * c.embed_scale              # (T, dim)
        for li, L in enumerate(w.layers):
            cos, sin = (swa_rope if c.swa_rope_base and c.layer_window(li)
                        else rope)
            # --- attention ---
            h = rmsnorm(x, L.attn_norm, c.norm_eps)
            if c.is_linear(li):
                a = self.gated_delta_net(li, L, h)
            elif c.mla:
                seen = np.arange(self.pos + T)[None, :] <= positions[:, None]
                a = self.mla_attention(li, L, h, cos, sin,
                                       np.where(seen, 0.0, -np.inf))
            else:
                a = self.gqa_attention(li, L, h, positions, cos, sin)
            if L.attn_post_norm is not None:
                a = rmsnorm(a, L.attn_post_norm, c.norm_eps)
            x = x + a
            # --- SwiGLU (or GeGLU) FFN, or a mixture of them ---
            h = rmsnorm(x, L.ffn_norm, c.norm_eps)
            if c.is_moe(li):
                f = moe_ffn(h, L, c, self.route_gaps)
            else:
                f = (act(h @ L.w_gate.T) * (h @ L.w_up.T)) @ L.w_down.T
            if L.ffn_post_norm is not None:
                f = rmsnorm(f, L.ffn_post_norm, c.norm_eps)
            x = x + f

        x = rmsnorm(x, w.final_norm, c.norm_eps)
        self.pos += T
        logits = x @ w.lm_head.T                            # (T, vocab)
        if c.final_softcap:  # Gemma 2
            logits = c.final_softcap * np.tanh(logits / c.final_softcap)
        return logits

    def logits_all(self, tokens) -> np.ndarray:
        """Logits for every position of `tokens`, from an empty cache."""
        self.reset()
        return self.forward(tokens)

    def greedy(self, tokens, n: int, return_logits: bool = False):
        """Exactly n greedy (argmax) ids after `tokens`; no EOS stopping.
        With return_logits, also returns the (n, vocab) logits each id was
        chosen from (row 0 = last prompt position)."""
        self.reset()
        out, rows = [], []
        logits = self.forward(tokens)[-1]
        for step in range(n):
            rows.append(logits)
            nxt = int(np.argmax(logits))
            out.append(nxt)
            if step + 1 < n:
                logits = self.forward([nxt])[-1]
        if return_logits:
            return out, np.array(rows)
        return out


def top2_margin(logits: np.ndarray) -> float:
    """top-1 minus top-2 logit of a 1-D logits vector."""
    p = np.partition(logits, -2)
    return float(p[-1] - p[-2])


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", required=True, help=".gguf file or HF directory")
    g = ap.add_mutually_exclusive_group(required=True)
    g.add_argument("--prompt", help="text (needs a GGUF for the tokenizer)")
    g.add_argument("--tokens", help="comma-separated token ids")
    ap.add_argument("--tokenizer-gguf", help="GGUF to take the tokenizer from "
                    "(default: --model when it is a GGUF)")
    ap.add_argument("--steps", type=int, default=32)
    ap.add_argument("--json", action="store_true",
                    help="print {logits, greedy} like forward_dump does")
    a = ap.parse_args(argv)

    tok = None
    tk_src = a.tokenizer_gguf or (a.model if not os.path.isdir(a.model) else None)
    if a.prompt is not None or (tk_src and not a.json):
        if tk_src is None:
            ap.error("--prompt needs a GGUF tokenizer (--tokenizer-gguf)")
        sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
        import hf_tokenizer
        tok = hf_tokenizer.build_from_gguf(tk_src)
    if a.prompt is not None:
        ids = tok.encode(a.prompt).ids
    else:
        ids = [int(s) for s in a.tokens.split(",") if s.strip()]

    t0 = time.time()
    m = LlamaRef.load(a.model)
    t1 = time.time()
    gen, rows = m.greedy(ids, a.steps, return_logits=True)
    t2 = time.time()
    if a.json:
        print(json.dumps({"logits": rows[0].tolist(), "greedy": gen}))
        return 0
    print(f"prompt ids ({len(ids)}): {ids}")
    print(f"greedy ids: {gen}")
    if tok is not None:
        print(f"text: {tok.decode(ids + gen, skip_special_tokens=False)!r}")
    margins = [top2_margin(r) for r in rows]
    print(f"min top1-top2 margin over steps: {min(margins):.4g}")
    print(f"load {t1 - t0:.1f}s, greedy {a.steps} steps {t2 - t1:.1f}s",
          file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
