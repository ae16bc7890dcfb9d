// Hyper-parameters of a Llama-family model (Llama 2/3, Mistral, Qwen2,
// Qwen3, Gemma 2/3, gpt-oss, the mixtures of experts Qwen3-MoE, Mixtral,
// GLM-4.5 and DeepSeek V2/V3, and the Qwen3.5 hybrids), read from GGUF
// metadata or from a Hugging Face config.json.
#ifndef SHARDLM_MODEL_MODEL_CONFIG_H_
#define SHARDLM_MODEL_MODEL_CONFIG_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "model/rope_scaling.h"

namespace shardlm {

// How a mixture's router turns logits into expert scores: a softmax over
// the experts (Qwen3-MoE, Mixtral) or each expert's sigmoid (GLM-4.5,
// DeepSeek V3). GGUF's expert_gating_func: 1 and 2.
enum class ExpertGating : uint8_t { kSoftmax, kSigmoid };

// The FFN's gate activation: SiLU (SwiGLU: Llama, Qwen, Mistral, the
// mixtures), GELU's tanh approximation (GeGLU: Gemma's gelu_pytorch_tanh)
// or gpt-oss's clamped SwiGLU: g = min(gate, 7), out = g sigmoid(1.702 g)
// (clamp(up, -7, 7) + 1).
enum class FfnActivation : uint8_t { kSilu, kGeluTanh, kSwigluOai };

struct ModelConfig {
  std::string architecture = "llama";
  std::string name;
  int64_t n_layers = 0;
  int64_t hidden = 0;      // Embedding width.
  int64_t ffn_hidden = 0;  // SwiGLU inner width.
  int64_t n_heads = 0;     // Query heads.
  int64_t n_kv_heads = 0;  // Key/value heads (GQA when < n_heads).
  int64_t head_dim = 0;
  int64_t vocab_size = 0;
  int64_t context_length = 0;
  float rope_theta = 10000.0f;
  float rms_norm_eps = 1e-5f;
  bool tied_embeddings = false;  // LM head reuses the token embedding.
  RopeStyle rope_style = RopeStyle::kRotateHalf;
  RopeScaling rope_scaling;
  // The Q, K and V projections add a bias (Qwen2).
  bool attention_bias = false;
  // 0: every query attends to its whole context. Otherwise, in the layers
  // window_layers marks (every layer when it is empty), to the last
  // `sliding_window` positions, itself included (Mistral v0.1: all layers;
  // Qwen2 with use_sliding_window: the layers from max_window_layers on).
  int64_t sliding_window = 0;
  // [n_layers] or empty; when set, sliding_window > 0 and some layer slides
  // (the readers drop a window no layer uses).
  std::vector<bool> window_layers;
  // Qwen3: q and k are RMS-normed per head (weights [head_dim], the
  // model's eps) after their projections and before RoPE.
  bool qk_norm = false;
  // Gemma 3: the RoPE base of the sliding-window layers, which rotate
  // unscaled (rope_theta and rope_scaling are the full layers'); 0: every
  // layer uses rope_theta and rope_scaling.
  float rope_local_theta = 0.0f;
  // Gemma 3: the embedding rows are multiplied by this (sqrt(hidden)).
  float embedding_scale = 1.0f;
  // Gemma 2/3: attention's and the FFN's outputs are RMS-normed (weights
  // post_attention_norm, post_ffw_norm) before their residual adds.
  bool post_norms = false;
  FfnActivation ffn_activation = FfnActivation::kSilu;
  // Added to every RMSNorm weight at load: 1 for Gemma's Hugging Face
  // checkpoints, whose norms multiply by (1 + w); llama.cpp's converter
  // stores 1 + w in GGUF (0 there); Qwen3.5's too, but for its Gated
  // DeltaNet layers' gated norm (ssm_norm), stored as w in both formats.
  float norm_weight_offset = 0.0f;
  // Mixture of experts (Qwen3-MoE, Mixtral): 0 for dense models. Every
  // layer's FFN is n_experts SwiGLU experts of expert_ffn_hidden columns;
  // a softmax router (gate, [n_experts, hidden]) picks n_experts_used per
  // token (ties to the lower index), weighted by their probabilities,
  // renormalized to sum to 1 when expert_weights_norm.
  int64_t n_experts = 0;
  int64_t n_experts_used = 0;
  int64_t expert_ffn_hidden = 0;
  bool expert_weights_norm = true;
  // GLM-4.5 / DeepSeek V3 routing (kernels/moe/routing.h RouterSpec):
  // sigmoid scores, a per-expert bias for choosing only (the layer's
  // exp_probs_b when expert_score_bias), group-limited choice, the chosen
  // weights times expert_weights_scale (routed_scaling_factor).
  ExpertGating expert_gating = ExpertGating::kSoftmax;
  bool expert_score_bias = false;
  int64_t expert_groups = 1;
  int64_t expert_groups_used = 1;
  float expert_weights_scale = 1.0f;
  // Experts every token goes through besides its routed ones, as one
  // SwiGLU FFN of n_shared_experts * expert_ffn_hidden columns (GLM-4.5,
  // DeepSeek V3).
  int64_t n_shared_experts = 0;
  // Qwen3.5-MoE: the shared expert's own width (0: n_shared_experts *
  // expert_ffn_hidden), and its output times sigmoid(w . x) per token
  // (LlamaLayerWeights::shared_gate_inp).
  int64_t shared_expert_ffn = 0;
  bool shared_expert_gate = false;
  // The first n_dense_layers layers of a mixture have a dense FFN of
  // ffn_hidden columns instead (first_k_dense_replace).
  int64_t n_dense_layers = 0;
  // Partial RoPE (GLM-4.5): only the first rope_dims dimensions of each
  // head rotate, paired within them; 0: all head_dim.
  int64_t rope_dims = 0;
  // Multi-head latent attention (DeepSeek V2/V3, Kimi K2; 0: none). Each
  // token caches, per layer, one latent of kv_lora_rank values (normed)
  // and the roped key part of rope_dims values, shared by every head;
  // head_dim is then a query/key head's width (qk_nope + rope_dims, the
  // rope part last) and v_head_dim a value head's. n_kv_heads = n_heads.
  int64_t kv_lora_rank = 0;
  int64_t q_lora_rank = 0;  // 0: q = wq x; else wq_b rmsnorm(wq_a x).
  int64_t v_head_dim = 0;
  // Multiplies attention's 1/sqrt(head_dim): DeepSeek's YaRN mscale^2,
  // Gemma's sqrt(head_dim / query_pre_attn_scalar).
  float attn_scale_factor = 1.0f;
  // Gemma 2's logit soft-capping, x -> cap * tanh(x / cap) (0: none): of
  // every scaled attention score before the mask and softmax, and of the
  // final logits.
  float attn_softcap = 0.0f;
  float final_softcap = 0.0f;
  // gpt-oss: attention sinks (one logit per query head, blk.N.attn_sinks,
  // in every softmax's denominator), a bias on the attention output
  // (attn_output.bias), and biases on the router's logits
  // (ffn_gate_inp.bias) and on every expert's three projections
  // (ffn_{gate,up,down}_exps.bias).
  bool attention_sinks = false;
  bool output_bias = false;
  bool expert_biases = false;
  // The eps of the q LoRA's and the latent's RMSNorms; 0: rms_norm_eps
  // (llama.cpp's reading; transformers' is 1e-6 whatever rms_norm_eps is).
  float latent_norm_eps = 0.0f;
  float LatentNormEps() const {
    return latent_norm_eps > 0 ? latent_norm_eps : rms_norm_eps;
  }
  // Hugging Face FP8 checkpoints (DeepSeek V3, Kimi K2): the side of the
  // square blocks each F8_E4M3 weight's weight_scale_inv scales
  // (quantization_config.weight_block_size); 0: none.
  int64_t fp8_block = 0;
  // Qwen3.5 / Qwen3-Next hybrids: [n_layers], true for a Gated DeltaNet
  // (linear attention) layer, whose state per sequence is fixed-size
  // instead of a KV entry per token; empty: no such layer. Such a layer
  // convolves [q | k | v] (ssm_k_heads heads of ssm_k_dim for q and k,
  // ssm_v_heads of ssm_v_dim for v) causally over ssm_conv_width tokens and
  // keeps a ssm_k_dim x ssm_v_dim state per value head; value head i reads
  // k head i % ssm_k_heads when ssm_v_tiled (llama.cpp's converter orders
  // them so), else i / (ssm_v_heads / ssm_k_heads) (Hugging Face's).
  std::vector<bool> linear_layers;
  int64_t ssm_conv_width = 0;
  int64_t ssm_k_heads = 0;
  int64_t ssm_k_dim = 0;
  int64_t ssm_v_heads = 0;
  int64_t ssm_v_dim = 0;
  bool ssm_v_tiled = false;
  // Qwen3.5's gated attention: wq makes, per head, head_dim query values
  // then head_dim gate values, and the attention's output is multiplied by
  // the gate's sigmoid before wo.
  bool attention_gate = false;
  // Multi-token-prediction layers stored after the n_layers the model
  // runs (GGUF nextn_predict_layers, HF num_nextn_predict_layers): skipped
  // when loading, not run (speculative decoding does not use them yet).
  int64_t n_nextn_layers = 0;
  int32_t bos_id = -1;
  int32_t eos_id = -1;

  bool is_moe() const { return n_experts > 0; }
  // Whether layer `layer` (0-based over the whole model) routes to experts.
  bool LayerIsMoe(int64_t layer) const {
    return is_moe() && layer >= n_dense_layers;
  }
  // Whether a mixture also has dense FFN layers (n_dense_layers > 0).
  bool HasDenseLayers() const { return !is_moe() || n_dense_layers > 0; }
  // Columns of the shared experts' FFN; 0 when none.
  int64_t SharedFfn() const {
    return shared_expert_ffn > 0 ? shared_expert_ffn
                                 : n_shared_experts * expert_ffn_hidden;
  }
  int64_t RotaryDims() const { return rope_dims > 0 ? rope_dims : head_dim; }
  bool is_mla() const { return kv_lora_rank > 0; }
  bool is_hybrid() const { return !linear_layers.empty(); }
  // Whether layer `layer` (0-based over the whole model) is a Gated
  // DeltaNet layer (no KV cache).
  bool LayerIsLinear(int64_t layer) const {
    return is_hybrid() && linear_layers[layer];
  }
  // Layers [begin, end) that attend (have a KV cache).
  int64_t AttentionLayers(int64_t begin, int64_t end) const;
  // A Gated DeltaNet layer's convolved channels (q, k and v) and its state
  // per sequence in f32 values: the convolution's last ssm_conv_width - 1
  // inputs and the value heads' ssm_k_dim x ssm_v_dim matrices.
  int64_t SsmConvChannels() const {
    return 2 * ssm_k_heads * ssm_k_dim + ssm_v_heads * ssm_v_dim;
  }
  int64_t SsmStateValues() const {
    return (ssm_conv_width - 1) * SsmConvChannels() +
           ssm_v_heads * ssm_k_dim * ssm_v_dim;
  }
  // What the KV cache holds per token and layer: n_kv_heads heads of
  // head_dim for K and as many for V, or under MLA one entry of
  // kv_lora_rank + rope_dims (V is its first kv_lora_rank values).
  int64_t CachedHeads() const { return is_mla() ? 1 : n_kv_heads; }
  int64_t CachedHeadDim() const {
    return is_mla() ? kv_lora_rank + RotaryDims() : head_dim;
  }
  // The FFN width a shard splits: the experts' for a mixture.
  int64_t SplitFfn() const { return is_moe() ? expert_ffn_hidden : ffn_hidden; }

  // InvalidArgument naming the field when a value is missing, absurd, or
  // inconsistent (e.g. n_heads not a multiple of n_kv_heads).
  absl::Status Validate() const;
  // The attention window of layer `layer` (0-based over the whole model);
  // 0: full causal attention.
  int64_t LayerWindow(int64_t layer) const {
    if (sliding_window <= 0) return 0;
    return window_layers.empty() || window_layers[layer] ? sliding_window : 0;
  }
  // The RoPE table of a head. Requires Validate().ok().
  RopeTable Rope() const {
    return MakeRopeTable(rope_style, rope_theta, RotaryDims(), rope_scaling);
  }
  // The RoPE table of the sliding-window layers when they have their own
  // base (rope_local_theta > 0; Gemma 3), else Rope().
  RopeTable LocalRope() const {
    return rope_local_theta > 0
               ? MakeRopeTable(rope_style, rope_local_theta, RotaryDims(), {})
               : Rope();
  }
  // Whether layer `layer` rotates with LocalRope().
  bool LayerRopeIsLocal(int64_t layer) const {
    return rope_local_theta > 0 && LayerWindow(layer) > 0;
  }
  std::string DebugString() const;
};

}  // namespace shardlm

#endif  // SHARDLM_MODEL_MODEL_CONFIG_H_
