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

// The checks of ModelConfig::Validate, in the order it runs them; each
// returns the first problem in its group of fields.

absl::Status CheckArchitecture(const ModelConfig& c) {
  static constexpr std::string_view kArchitectures[] = {
      "llama",     "mistral",    "qwen2",           "qwen3",
      "qwen3moe",  "qwen3_moe",  "mixtral",         "glm4moe",
      "glm4_moe",  "deepseek2",  "deepseek_v3",     "deepseek_v2",
      "gemma2",    "gemma3",     "gemma3_text",     "gpt-oss",
      "gpt_oss",   "qwen35",     "qwen3_5_text",    "qwen35moe",
      "qwen3next", "qwen3_next", "qwen3_5_moe_text"};
  if (std::find(std::begin(kArchitectures), std::end(kArchitectures),
                c.architecture) == std::end(kArchitectures)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "model config: architecture '", c.architecture,
        "' is not supported (llama, mistral, qwen2, qwen3, qwen3moe, "
        "mixtral, glm4moe, deepseek2 (DeepSeek V2/V3, Kimi K2), gemma2, "
        "gemma3, gpt-oss, qwen35 and qwen35moe (Qwen3.5) and qwen3next are; "
        "llama with experts is Mixtral)"));
  }
  return absl::OkStatus();
}

// The Gated DeltaNet layers of a hybrid (Qwen3.5, Qwen3-Next).
absl::Status CheckLinearAttention(const ModelConfig& c) {
  if (!c.is_hybrid()) return absl::OkStatus();
  if (static_cast<int64_t>(c.linear_layers.size()) != c.n_layers) {
    return absl::InvalidArgumentError(
        absl::StrCat("model config: linear_layers has ", c.linear_layers.size(),
                     " entries for ", c.n_layers, " layers"));
  }
  for (auto [field, v, lo, hi] :
       {std::tuple<const char*, int64_t, int64_t, int64_t>{
            "ssm_conv_width", c.ssm_conv_width, 1, 64},
        {"ssm_k_heads", c.ssm_k_heads, 1, 1024},
        {"ssm_k_dim", c.ssm_k_dim, 1, 1024},
        {"ssm_v_heads", c.ssm_v_heads, 1, 1024},
        {"ssm_v_dim", c.ssm_v_dim, 1, 1024}}) {
    if (auto s = CheckRange(field, v, lo, hi); !s.ok()) return s;
  }
  if (c.ssm_v_heads % c.ssm_k_heads != 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "model config: ssm_v_heads (", c.ssm_v_heads,
        ") is not a multiple of ssm_k_heads (", c.ssm_k_heads, ")"));
  }
  return absl::OkStatus();
}

// Mixtures of experts: counts, groups, routing; none of it without experts.
absl::Status CheckExperts(const ModelConfig& c) {
  if (c.n_experts != 0 || c.n_experts_used != 0 || c.expert_ffn_hidden != 0) {
    for (auto [field, v, lo, hi] :
         {std::tuple<const char*, int64_t, int64_t, int64_t>{
              "n_experts", c.n_experts, 1, 1024},
          {"n_experts_used", c.n_experts_used, 1, 1024},
          {"expert_ffn_hidden", c.expert_ffn_hidden, 1, 1 << 19}}) {
      if (auto s = CheckRange(field, v, lo, hi); !s.ok()) return s;
    }
    if (c.n_experts_used > c.n_experts) {
      return absl::InvalidArgumentError(
          absl::StrCat("model config: n_experts_used (top-k) ",
                       c.n_experts_used, " exceeds n_experts ", c.n_experts));
    }
    if (c.expert_groups < 1 || c.n_experts % c.expert_groups != 0 ||
        c.expert_groups_used < 1 || c.expert_groups_used > c.expert_groups ||
        c.n_experts_used >
            c.expert_groups_used * (c.n_experts / c.expert_groups)) {
      return absl::InvalidArgumentError(absl::StrCat(
          "model config: ", c.expert_groups_used, " of ", c.expert_groups,
          " expert groups (n_group, topk_group) over ", c.n_experts,
          " experts cannot hold the top ", c.n_experts_used));
    }
    if (!(c.expert_weights_scale > 0) ||
        !std::isfinite(c.expert_weights_scale)) {
      return absl::InvalidArgumentError(
          absl::StrCat("model config: expert_weights_scale ",
                       c.expert_weights_scale, " must be positive and finite"));
    }
    for (auto [field, v, lo, hi] :
         {std::tuple<const char*, int64_t, int64_t, int64_t>{
              "n_shared_experts", c.n_shared_experts, 0, 64},
          {"n_dense_layers", c.n_dense_layers, 0, c.n_layers}}) {
      if (auto s = CheckRange(field, v, lo, hi); !s.ok()) return s;
    }
  } else if (c.n_shared_experts != 0 || c.n_dense_layers != 0 ||
             c.expert_gating != ExpertGating::kSoftmax || c.expert_score_bias) {
    return absl::InvalidArgumentError(
        "model config: shared experts, dense layers or expert gating set "
        "for a model without experts");
  }
  return absl::OkStatus();
}

// Multi-head latent attention (DeepSeek V2 / V3, Kimi K2).
absl::Status CheckLatentAttention(const ModelConfig& c) {
  if (c.kv_lora_rank == 0 && c.q_lora_rank == 0 && c.v_head_dim == 0) {
    return absl::OkStatus();
  }
  for (auto [field, v, lo, hi] :
       {std::tuple<const char*, int64_t, int64_t, int64_t>{
            "kv_lora_rank", c.kv_lora_rank, 1, 1 << 14},
        {"q_lora_rank", c.q_lora_rank, 0, 1 << 16},
        {"v_head_dim", c.v_head_dim, 1, 1024}}) {
    if (auto s = CheckRange(field, v, lo, hi); !s.ok()) return s;
  }
  if (c.rope_dims == 0 || c.rope_dims >= c.head_dim ||
      c.n_kv_heads != c.n_heads) {
    return absl::InvalidArgumentError(absl::StrCat(
        "model config: latent attention needs a RoPE part (rope_dims ",
        c.rope_dims, ") narrower than the head (", c.head_dim,
        ") and n_kv_heads = n_heads (", c.n_kv_heads, " vs ", c.n_heads, ")"));
  }
  return absl::OkStatus();
}

// The float factors some families set (scales, soft-caps, the local RoPE
// base, the norm offset) and partial RoPE's width.
absl::Status CheckFactors(const ModelConfig& c) {
  for (auto [field, v] : {std::pair{"attn_scale_factor", c.attn_scale_factor},
                          std::pair{"embedding_scale", c.embedding_scale}}) {
    if (!(v > 0) || !std::isfinite(v)) {
      return absl::InvalidArgumentError(absl::StrCat(
          "model config: ", field, " ", v, " must be positive and finite"));
    }
  }
  for (auto [field, v] : {std::pair{"attn_softcap", c.attn_softcap},
                          std::pair{"final_softcap", c.final_softcap}}) {
    if (!(v >= 0) || !std::isfinite(v)) {
      return absl::InvalidArgumentError(absl::StrCat(
          "model config: ", field, " ", v, " must be finite and >= 0"));
    }
  }
  if (!(c.rope_local_theta >= 0) || c.rope_local_theta > 1e12f) {
    return absl::InvalidArgumentError(
        absl::StrCat("model config: rope_local_theta ", c.rope_local_theta,
                     " is outside [0, 1e12]"));
  }
  if (!std::isfinite(c.norm_weight_offset)) {
    return absl::InvalidArgumentError(
        "model config: norm_weight_offset is "
        "not finite");
  }
  if (c.rope_dims != 0 &&
      (c.rope_dims < 2 || c.rope_dims > c.head_dim || c.rope_dims % 2 != 0)) {
    return absl::InvalidArgumentError(
        absl::StrCat("model config: rope_dims ", c.rope_dims,
                     " must be even and in [2, head_dim ", c.head_dim, "]"));
  }
  return absl::OkStatus();
}

// The sizes every model has, and the RoPE base and norm epsilon.
absl::Status CheckDimensions(const ModelConfig& c) {
  // Bounds are generous (beyond any released Llama) but stop absurd values
  // from turning into huge allocations.
  for (auto [field, v, lo, hi] :
       {std::tuple<const char*, int64_t, int64_t, int64_t>{"n_layers",
                                                           c.n_layers, 1, 1024},
        {"hidden", c.hidden, 1, 1 << 17},
        {"ffn_hidden", c.ffn_hidden, 1, 1 << 19},
        {"n_heads", c.n_heads, 1, 1024},
        {"n_kv_heads", c.n_kv_heads, 1, 1024},
        {"head_dim", c.head_dim, 2, 1024},
        {"vocab_size", c.vocab_size, 1, 1 << 22},
        {"context_length", c.context_length, 1, 1 << 24}}) {
    if (auto s = CheckRange(field, v, lo, hi); !s.ok()) return s;
  }
  if (c.n_heads % c.n_kv_heads != 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("model config: n_heads (", c.n_heads,
                     ") is not a multiple of n_kv_heads (", c.n_kv_heads, ")"));
  }
  if (c.head_dim % 2 != 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("model config: head_dim ", c.head_dim, " must be even"));
  }
  if (!(c.rope_theta > 0) || !(c.rms_norm_eps > 0) ||
      !std::isfinite(c.rope_theta) || !std::isfinite(c.rms_norm_eps)) {
    return absl::InvalidArgumentError(
        "model config: rope_theta and rms_norm_eps must be positive and "
        "finite");
  }
  return absl::OkStatus();
}

// The sliding window and the layers it applies to.
absl::Status CheckWindow(const ModelConfig& c) {
  if (c.sliding_window < 0 || c.sliding_window > (int64_t{1} << 24)) {
    return absl::InvalidArgumentError(
        absl::StrCat("model config: sliding_window ", c.sliding_window,
                     " is outside [0, 2^24]"));
  }
  if (!c.window_layers.empty()) {
    if (static_cast<int64_t>(c.window_layers.size()) != c.n_layers) {
      return absl::InvalidArgumentError(absl::StrCat(
          "model config: window_layers has ", c.window_layers.size(),
          " entries for ", c.n_layers, " layers"));
    }
    if (c.sliding_window == 0 ||
        std::find(c.window_layers.begin(), c.window_layers.end(), true) ==
            c.window_layers.end()) {
      return absl::InvalidArgumentError(
          "model config: window_layers is set but no layer has a window");
    }
  }
  return absl::OkStatus();
}

}  // namespace

absl::Status ModelConfig::Validate() const {
  RETURN_IF_ERROR(CheckArchitecture(*this));
  RETURN_IF_ERROR(CheckLinearAttention(*this));
  RETURN_IF_ERROR(CheckExperts(*this));
  RETURN_IF_ERROR(CheckLatentAttention(*this));
  RETURN_IF_ERROR(CheckFactors(*this));
  RETURN_IF_ERROR(CheckDimensions(*this));
  RETURN_IF_ERROR(CheckWindow(*this));
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
