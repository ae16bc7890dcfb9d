#include "model/model_config.h"

#include <algorithm>
#include <cmath>
#include <iterator>
#include <string_view>
#include <tuple>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "core/status.h"

namespace shardlm {
namespace {

absl::Status CheckRange(std::string_view field, int64_t v, int64_t lo,
                        int64_t hi) {
  if (v < lo || v > hi) {
    return absl::InvalidArgumentError(absl::StrCat("model config: ", Sv(field),
                                                   " = ", v, " is outside [",
                                                   lo, ", ", hi, "]"));
  }
  return absl::OkStatus();
}

std::string RopeScalingString(const RopeScaling& s) {
  std::string out = RopeScalingName(s.type);
  switch (s.type) {
    case RopeScalingType::kNone:
      break;
    case RopeScalingType::kLinear:
      absl::StrAppend(&out, " (factor ", s.factor, ")");
      break;
    case RopeScalingType::kLlama3:
      absl::StrAppend(&out, " (factor ", s.factor, ", low/high freq factor ",
                      s.low_freq_factor, "/", s.high_freq_factor,
                      ", original context ", s.original_context, ")");
      break;
    case RopeScalingType::kYarn:
      absl::StrAppend(&out, " (factor ", s.factor, ", original context ",
                      s.original_context, ", beta ", s.beta_fast, "/",
                      s.beta_slow, s.truncate ? "" : ", not truncated", ")");
      break;
    case RopeScalingType::kDynamic:
      absl::StrAppend(&out, " NTK, static (factor ", s.factor,
                      ", original context ", s.original_context,
                      "; the base scaled once for factor x that)");
      break;
  }
  if (!s.freq_factors.empty()) {
    const char* factors =
        "per-pair frequency factors (GGUF rope_freqs, as llama.cpp stores "
        "llama3 scaling)";
    out = s.type == RopeScalingType::kNone ? factors
                                           : absl::StrCat(out, " + ", factors);
  }
  return out;
}

std::string WindowString(const ModelConfig& c) {
  if (c.sliding_window <= 0) return "none";
  std::string out = absl::StrCat(c.sliding_window, " positions");
  if (c.window_layers.empty()) return out;
  std::vector<int64_t> layers;
  for (int64_t l = 0; l < c.n_layers; ++l) {
    if (c.LayerWindow(l) > 0) layers.push_back(l);
  }
  const bool suffix =
      !layers.empty() && layers.back() == c.n_layers - 1 &&
      layers.back() - layers.front() + 1 == static_cast<int64_t>(layers.size());
  if (suffix) {
    absl::StrAppend(&out, " in layers ", layers.front(), "-", layers.back(),
                    " (the others attend to all)");
  } else {
    absl::StrAppend(&out, " in layers ", absl::StrJoin(layers, ", "),
                    " (the others attend to all)");
  }
  return out;
}

// The lines only some families have: partial RoPE, GLM-4.5's routing.
std::string ExtrasString(const ModelConfig& c) {
  std::string out;
  if (c.is_mla()) {
    absl::StrAppendFormat(
        &out,
        "latent attention kv_lora_rank %d, q_lora_rank %d, q/k head %d "
        "(RoPE on its last %d), v head %d; cached per token and layer: "
        "%d values\n",
        c.kv_lora_rank, c.q_lora_rank, c.head_dim, c.RotaryDims(), c.v_head_dim,
        c.CachedHeadDim());
    if (c.attn_scale_factor != 1.0f) {
      absl::StrAppendFormat(&out, "attention scale  %g / sqrt(%d)\n",
                            c.attn_scale_factor, c.head_dim);
    }
  } else if (c.rope_dims != 0 && c.rope_dims != c.head_dim) {
    absl::StrAppend(&out, "rope_dims        ", c.rope_dims, " of ", c.head_dim,
                    " (partial RoPE)\n");
  } else if (c.attn_scale_factor != 1.0f) {
    absl::StrAppendFormat(&out, "attention scale  %g / sqrt(%d)\n",
                          c.attn_scale_factor, c.head_dim);
  }
  if (c.is_hybrid()) {
    std::vector<int64_t> attention;
    for (int64_t l = 0; l < c.n_layers; ++l) {
      if (!c.LayerIsLinear(l)) attention.push_back(l);
    }
    absl::StrAppendFormat(
        &out,
        "linear attention Gated DeltaNet in %d of %d layers (attention in "
        "%s%s): %d q/k heads of %d, %d value heads of %d (%s), convolution "
        "%d wide; state per sequence and layer: %d f32 values\n",
        c.n_layers - static_cast<int64_t>(attention.size()), c.n_layers,
        attention.empty() ? "none" : absl::StrJoin(attention, ", "),
        c.attention_gate ? ", gated" : "", c.ssm_k_heads, c.ssm_k_dim,
        c.ssm_v_heads, c.ssm_v_dim, c.ssm_v_tiled ? "tiled" : "grouped",
        c.ssm_conv_width, c.SsmStateValues());
  }
  if (c.rope_local_theta > 0) {
    absl::StrAppend(&out, "rope_theta local ", c.rope_local_theta,
                    " (the sliding-window layers, unscaled)\n");
  }
  if (c.post_norms || c.ffn_activation == FfnActivation::kGeluTanh ||
      c.embedding_scale != 1.0f) {
    absl::StrAppendFormat(
        &out, "gemma            embeddings x %g, FFN %s%s\n", c.embedding_scale,
        c.ffn_activation == FfnActivation::kGeluTanh ? "GeGLU (tanh GELU)"
                                                     : "SwiGLU",
        c.post_norms ? ", post-attention and post-FFN norms" : "");
  }
  if (c.attention_sinks || c.output_bias || c.expert_biases ||
      c.ffn_activation == FfnActivation::kSwigluOai) {
    absl::StrAppend(&out, "gpt-oss          ",
                    c.attention_sinks ? "attention sinks, " : "",
                    c.output_bias ? "attention output bias, " : "",
                    c.expert_biases ? "router and expert biases, " : "",
                    c.ffn_activation == FfnActivation::kSwigluOai
                        ? "clamped SwiGLU (limit 7, alpha 1.702)\n"
                        : "SwiGLU\n");
  }
  if (c.attn_softcap > 0 || c.final_softcap > 0) {
    absl::StrAppendFormat(&out,
                          "soft-capping     attention scores %g, logits %g "
                          "(0: none)\n",
                          c.attn_softcap, c.final_softcap);
  }
  if (!c.is_moe()) return out;
  if (c.expert_gating == ExpertGating::kSigmoid || c.expert_score_bias ||
      c.expert_groups > 1 || c.expert_weights_scale != 1.0f) {
    absl::StrAppendFormat(
        &out, "routing          %s%s, groups %d of %d, weights x %g\n",
        c.expert_gating == ExpertGating::kSigmoid ? "sigmoid" : "softmax",
        c.expert_score_bias ? " + choice bias" : "", c.expert_groups_used,
        c.expert_groups, c.expert_weights_scale);
  }
  if (c.n_shared_experts > 0) {
    absl::StrAppend(&out, "shared experts   ", c.n_shared_experts, " (FFN ",
                    c.SharedFfn(),
                    c.shared_expert_gate ? ", gated per token" : "", ")\n");
  }
  if (c.n_dense_layers > 0) {
    absl::StrAppend(&out, "dense layers     0-", c.n_dense_layers - 1, " (FFN ",
                    c.ffn_hidden, ")\n");
  }
  return out;
}

}  // namespace

absl::Status ModelConfig::Validate() const {
  static constexpr std::string_view kArchitectures[] = {
      "llama",     "mistral",    "qwen2",           "qwen3",
      "qwen3moe",  "qwen3_moe",  "mixtral",         "glm4moe",
      "glm4_moe",  "deepseek2",  "deepseek_v3",     "deepseek_v2",
      "gemma2",    "gemma3",     "gemma3_text",     "gpt-oss",
      "gpt_oss",   "qwen35",     "qwen3_5_text",    "qwen35moe",
      "qwen3next", "qwen3_next", "qwen3_5_moe_text"};
  if (std::find(std::begin(kArchitectures), std::end(kArchitectures),
                architecture) == std::end(kArchitectures)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "model config: architecture '", architecture,
        "' is not supported (llama, mistral, qwen2, qwen3, qwen3moe, "
        "mixtral, glm4moe, deepseek2 (DeepSeek V2/V3, Kimi K2), gemma2, "
        "gemma3, gpt-oss, qwen35 and qwen35moe (Qwen3.5) and qwen3next are; "
        "llama with experts is Mixtral)"));
  }
  if (is_hybrid()) {
    if (static_cast<int64_t>(linear_layers.size()) != n_layers) {
      return absl::InvalidArgumentError(
          absl::StrCat("model config: linear_layers has ", linear_layers.size(),
                       " entries for ", n_layers, " layers"));
    }
    for (auto [field, v, lo, hi] :
         {std::tuple<const char*, int64_t, int64_t, int64_t>{
              "ssm_conv_width", ssm_conv_width, 1, 64},
          {"ssm_k_heads", ssm_k_heads, 1, 1024},
          {"ssm_k_dim", ssm_k_dim, 1, 1024},
          {"ssm_v_heads", ssm_v_heads, 1, 1024},
          {"ssm_v_dim", ssm_v_dim, 1, 1024}}) {
      if (auto s = CheckRange(field, v, lo, hi); !s.ok()) return s;
    }
    if (ssm_v_heads % ssm_k_heads != 0) {
      return absl::InvalidArgumentError(absl::StrCat(
          "model config: ssm_v_heads (", ssm_v_heads,
          ") is not a multiple of ssm_k_heads (", ssm_k_heads, ")"));
    }
  }
  if (n_experts != 0 || n_experts_used != 0 || expert_ffn_hidden != 0) {
    for (auto [field, v, lo, hi] :
         {std::tuple<const char*, int64_t, int64_t, int64_t>{
              "n_experts", n_experts, 1, 1024},
          {"n_experts_used", n_experts_used, 1, 1024},
          {"expert_ffn_hidden", expert_ffn_hidden, 1, 1 << 19}}) {
      if (auto s = CheckRange(field, v, lo, hi); !s.ok()) return s;
    }
    if (n_experts_used > n_experts) {
      return absl::InvalidArgumentError(
          absl::StrCat("model config: n_experts_used (top-k) ", n_experts_used,
                       " exceeds n_experts ", n_experts));
    }
    if (expert_groups < 1 || n_experts % expert_groups != 0 ||
        expert_groups_used < 1 || expert_groups_used > expert_groups ||
        n_experts_used > expert_groups_used * (n_experts / expert_groups)) {
      return absl::InvalidArgumentError(absl::StrCat(
          "model config: ", expert_groups_used, " of ", expert_groups,
          " expert groups (n_group, topk_group) over ", n_experts,
          " experts cannot hold the top ", n_experts_used));
    }
    if (!(expert_weights_scale > 0) || !std::isfinite(expert_weights_scale)) {
      return absl::InvalidArgumentError(
          absl::StrCat("model config: expert_weights_scale ",
                       expert_weights_scale, " must be positive and finite"));
    }
    for (auto [field, v, lo, hi] :
         {std::tuple<const char*, int64_t, int64_t, int64_t>{
              "n_shared_experts", n_shared_experts, 0, 64},
          {"n_dense_layers", n_dense_layers, 0, n_layers}}) {
      if (auto s = CheckRange(field, v, lo, hi); !s.ok()) return s;
    }
  } else if (n_shared_experts != 0 || n_dense_layers != 0 ||
             expert_gating != ExpertGating::kSoftmax || expert_score_bias) {
    return absl::InvalidArgumentError(
        "model config: shared experts, dense layers or expert gating set "
        "for a model without experts");
  }
  if (kv_lora_rank != 0 || q_lora_rank != 0 || v_head_dim != 0) {
    for (auto [field, v, lo, hi] :
         {std::tuple<const char*, int64_t, int64_t, int64_t>{
              "kv_lora_rank", kv_lora_rank, 1, 1 << 14},
          {"q_lora_rank", q_lora_rank, 0, 1 << 16},
          {"v_head_dim", v_head_dim, 1, 1024}}) {
      if (auto s = CheckRange(field, v, lo, hi); !s.ok()) return s;
    }
    if (rope_dims == 0 || rope_dims >= head_dim || n_kv_heads != n_heads) {
      return absl::InvalidArgumentError(absl::StrCat(
          "model config: latent attention needs a RoPE part (rope_dims ",
          rope_dims, ") narrower than the head (", head_dim,
          ") and n_kv_heads = n_heads (", n_kv_heads, " vs ", n_heads, ")"));
    }
  }
  for (auto [field, v] : {std::pair{"attn_scale_factor", attn_scale_factor},
                          std::pair{"embedding_scale", embedding_scale}}) {
    if (!(v > 0) || !std::isfinite(v)) {
      return absl::InvalidArgumentError(absl::StrCat(
          "model config: ", field, " ", v, " must be positive and finite"));
    }
  }
  for (auto [field, v] : {std::pair{"attn_softcap", attn_softcap},
                          std::pair{"final_softcap", final_softcap}}) {
    if (!(v >= 0) || !std::isfinite(v)) {
      return absl::InvalidArgumentError(absl::StrCat(
          "model config: ", field, " ", v, " must be finite and >= 0"));
    }
  }
  if (!(rope_local_theta >= 0) || rope_local_theta > 1e12f) {
    return absl::InvalidArgumentError(
        absl::StrCat("model config: rope_local_theta ", rope_local_theta,
                     " is outside [0, 1e12]"));
  }
  if (!std::isfinite(norm_weight_offset)) {
    return absl::InvalidArgumentError(
        "model config: norm_weight_offset is "
        "not finite");
  }
  if (rope_dims != 0 &&
      (rope_dims < 2 || rope_dims > head_dim || rope_dims % 2 != 0)) {
    return absl::InvalidArgumentError(
        absl::StrCat("model config: rope_dims ", rope_dims,
                     " must be even and in [2, head_dim ", head_dim, "]"));
  }
  // Bounds are generous (beyond any released Llama) but stop absurd values
  // from turning into huge allocations.
  for (auto [field, v, lo, hi] :
       {std::tuple<const char*, int64_t, int64_t, int64_t>{"n_layers", n_layers,
                                                           1, 1024},
        {"hidden", hidden, 1, 1 << 17},
        {"ffn_hidden", ffn_hidden, 1, 1 << 19},
        {"n_heads", n_heads, 1, 1024},
        {"n_kv_heads", n_kv_heads, 1, 1024},
        {"head_dim", head_dim, 2, 1024},
        {"vocab_size", vocab_size, 1, 1 << 22},
        {"context_length", context_length, 1, 1 << 24}}) {
    if (auto s = CheckRange(field, v, lo, hi); !s.ok()) return s;
  }
  if (n_heads % n_kv_heads != 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("model config: n_heads (", n_heads,
                     ") is not a multiple of n_kv_heads (", n_kv_heads, ")"));
  }
  if (head_dim % 2 != 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("model config: head_dim ", head_dim, " must be even"));
  }
  if (!(rope_theta > 0) || !(rms_norm_eps > 0) || !std::isfinite(rope_theta) ||
      !std::isfinite(rms_norm_eps)) {
    return absl::InvalidArgumentError(
        "model config: rope_theta and rms_norm_eps must be positive and "
        "finite");
  }
  if (sliding_window < 0 || sliding_window > (int64_t{1} << 24)) {
    return absl::InvalidArgumentError(
        absl::StrCat("model config: sliding_window ", sliding_window,
                     " is outside [0, 2^24]"));
  }
  if (!window_layers.empty()) {
    if (static_cast<int64_t>(window_layers.size()) != n_layers) {
      return absl::InvalidArgumentError(
          absl::StrCat("model config: window_layers has ", window_layers.size(),
                       " entries for ", n_layers, " layers"));
    }
    if (sliding_window == 0 ||
        std::find(window_layers.begin(), window_layers.end(), true) ==
            window_layers.end()) {
      return absl::InvalidArgumentError(
          "model config: window_layers is set but no layer has a window");
    }
  }
  if (absl::Status s = ValidateRopeScaling(rope_scaling, RotaryDims());
      !s.ok()) {
    return absl::InvalidArgumentError(
        absl::StrCat("model config: ", s.message()));
  }
  return absl::OkStatus();
}

int64_t ModelConfig::AttentionLayers(int64_t begin, int64_t end) const {
  int64_t n = 0;
  for (int64_t l = begin; l < end; ++l) n += !LayerIsLinear(l);
  return n;
}

std::string ModelConfig::DebugString() const {
  return absl::StrFormat(
      "architecture     %s\nname             %s\nlayers           %d\n"
      "hidden           %d\nffn_hidden       %d\nheads            %d (kv %d, "
      "head_dim %d)\nvocab            %d\ncontext          %d\n"
      "rope_theta       %g (%s)\nrope_scaling     %s\nrms_norm_eps     %g\n"
      "tied_embeddings  %s\nattention_bias   %s\nqk_norm          %s\n"
      "sliding_window   %s\nexperts          %s\nbos/eos          %d / %d\n"
      "%s",
      architecture, name, n_layers, hidden, ffn_hidden, n_heads, n_kv_heads,
      head_dim, vocab_size, context_length, rope_theta,
      rope_style == RopeStyle::kAdjacentPairs ? "adjacent pairs"
                                              : "rotate half",
      RopeScalingString(rope_scaling), rms_norm_eps,
      tied_embeddings ? "yes" : "no", attention_bias ? "q, k, v" : "none",
      qk_norm ? "per head (q, k)" : "none", WindowString(*this),
      is_moe()
          ? absl::StrFormat(
                "%d, top %d%s, expert FFN %d", n_experts, n_experts_used,
                expert_weights_norm ? " (renormalized)" : "", expert_ffn_hidden)
          : std::string("none (dense FFN)"),
      bos_id, eos_id, ExtrasString(*this));
}

}  // namespace shardlm
