// ModelConfig and WeightSource on top of a parsed GGUF file.
#include <algorithm>
#include <cmath>
#include <variant>

#include "absl/strings/str_cat.h"
#include "core/status.h"
#include "model/dequantize.h"
#include "model/gguf.h"

namespace shardlm {
namespace {

// Reads an optional integer key: `fallback` when absent, an error when it
// has the wrong type.
absl::StatusOr<int64_t> IntOr(const GgufFile& g, const std::string& key,
                              int64_t fallback) {
  if (g.Find(key) == nullptr) return fallback;
  return g.GetInt(key);
}

absl::StatusOr<double> FloatOr(const GgufFile& g, const std::string& key,
                               double fallback) {
  if (g.Find(key) == nullptr) return fallback;
  return g.GetFloat(key);
}

const TensorInfo* FindTensor(const GgufFile& g, std::string_view name) {
  for (const TensorInfo& t : g.tensors()) {
    if (t.name == name) return &t;
  }
  return nullptr;
}

// RoPE scaling from `{arch}.rope.scaling.*` and the per-pair frequency
// factors of rope_freqs.weight (llama.cpp's converter writes Llama 3.1's
// llama3 scaling that way, with no scaling type).
absl::Status ReadRopeScaling(const GgufFile& g, const std::string& p,
                             ModelConfig& c) {
  RopeScaling& s = c.rope_scaling;
  if (g.Find(p + "rope.scaling.type") != nullptr) {
    ASSIGN_OR_RETURN(std::string_view type,
                     g.GetString(p + "rope.scaling.type"));
    // llama.cpp's types are none, linear, yarn and longrope: it has no
    // dynamic NTK to write, and it writes llama3 as rope_freqs.weight.
    absl::StatusOr<RopeScalingType> t = ParseRopeScalingType(type);
    if (!t.ok() || *t == RopeScalingType::kLlama3 ||
        *t == RopeScalingType::kDynamic) {
      return absl::UnimplementedError(absl::StrCat(
          g.name(), ": ", p, "rope.scaling.type '", Sv(type),
          "' is not supported (none, linear and yarn are; llama3 comes as "
          "rope_freqs.weight)"));
    }
    s.type = *t;
  }
  if (s.type != RopeScalingType::kNone) {
    ASSIGN_OR_RETURN(s.factor, FloatOr(g, p + "rope.scaling.factor", 0.0));
  }
  if (s.type == RopeScalingType::kYarn) {
    ASSIGN_OR_RETURN(s.original_context,
                     IntOr(g, p + "rope.scaling.original_context_length", 0));
    ASSIGN_OR_RETURN(s.beta_fast,
                     FloatOr(g, p + "rope.scaling.yarn_beta_fast", 32.0));
    ASSIGN_OR_RETURN(s.beta_slow,
                     FloatOr(g, p + "rope.scaling.yarn_beta_slow", 1.0));
    // llama.cpp scales its YaRN blend and magnitude by these; anything
    // but their neutral values (ext_factor < 0 means 1) changes the math.
    for (auto [key, neutral] : {std::pair{"yarn_ext_factor", -1.0},
                                {"yarn_attn_factor", 1.0},
                                {"attn_factor", 1.0}}) {
      ASSIGN_OR_RETURN(double v,
                       FloatOr(g, p + "rope.scaling." + key, neutral));
      if (v != 1.0 && !(neutral < 0 && v < 0)) {
        return absl::UnimplementedError(
            absl::StrCat(g.name(), ": ", p, "rope.scaling.", key, " = ", v,
                         " is not supported (only its default)"));
      }
    }
  }
  if (const TensorInfo* f = FindTensor(g, "rope_freqs.weight"); f != nullptr) {
    if (f->shape.size() != 1 || f->shape[0] != c.RotaryDims() / 2) {
      return absl::InvalidArgumentError(absl::StrCat(
          g.name(), ": rope_freqs.weight has shape ", ShapeString(f->shape),
          "; expected [", c.RotaryDims() / 2, "]"));
    }
    ASSIGN_OR_RETURN(
        Tensor t,
        DequantizeRows(*f, g.bytes().subspan(f->offset, f->bytes), 0, 1));
    s.freq_factors.assign(t.f32().begin(), t.f32().end());
  }
  return absl::OkStatus();
}

class GgufWeightSource : public WeightSource {
 public:
  GgufWeightSource(std::unique_ptr<GgufFile> gguf, ModelConfig config)
      : gguf_(std::move(gguf)), config_(std::move(config)) {}

  const ModelConfig& config() const override { return config_; }
  const std::vector<TensorInfo>& tensors() const override {
    return gguf_->tensors();
  }
  absl::Span<const uint8_t> Data(const TensorInfo& info) const override {
    return gguf_->bytes().subspan(info.offset, info.bytes);
  }
  std::string format() const override {
    return absl::StrCat("GGUF v", gguf_->version());
  }

 private:
  std::unique_ptr<GgufFile> gguf_;
  ModelConfig config_;
};

// Gemma 2 and 3 as llama.cpp runs their GGUFs. Gemma 3: the layers slide
// over the file's window but every sixth (attention.sliding_window_pattern,
// which the converter does not write: a period, 0 for all sliding, or per
// layer whether it slides), with their own RoPE base (rope.freq_base_swa,
// default 10000) unscaled; no window: every layer full. Gemma 2: every
// other layer slides, from the first (the window 4096 when the file has
// none), all with one RoPE; attention scores and final logits soft-capped
// (attn_logit_softcapping, default 50; final_logit_softcapping, default
// 30). Both: embeddings times sqrt(hidden); post-attention and post-FFN
// norms (their weights stored as 1 + w), GeGLU; the softmax scale
// 1/sqrt(head_dim), except the 27B models' 1/sqrt(hidden / heads) (their
// query_pre_attn_scalar, which the file does not record).
absl::Status ReadGemma(const GgufFile& g, const std::string& p,
                       ModelConfig& c) {
  const bool gemma2 = c.architecture == "gemma2";
  int64_t period = 6, big_layers = 62;
  if (gemma2) {
    period = 2;
    big_layers = 46;
    if (g.Find(p + "attention.sliding_window") == nullptr) {
      c.sliding_window = 4096;
    }
    ASSIGN_OR_RETURN(const double attn_cap,
                     FloatOr(g, p + "attn_logit_softcapping", 50.0));
    ASSIGN_OR_RETURN(const double final_cap,
                     FloatOr(g, p + "final_logit_softcapping", 30.0));
    c.attn_softcap = static_cast<float>(attn_cap);
    c.final_softcap = static_cast<float>(final_cap);
  } else {
    // llama.cpp's gemma3 soft-caps final logits for Rnj-1; not run here.
    for (const char* key :
         {"final_logit_softcapping", "attn_logit_softcapping"}) {
      ASSIGN_OR_RETURN(const double cap, FloatOr(g, p + key, 0.0));
      if (cap != 0) {
        return absl::UnimplementedError(
            absl::StrCat(g.name(), ": ", p, key, " ", cap,
                         ": soft-capping is not supported for gemma3"));
      }
    }
  }
  const std::string pattern_key = p + "attention.sliding_window_pattern";
  if (c.sliding_window > 0 && c.n_layers >= 1 && c.n_layers <= 1024) {
    std::vector<bool> layers(c.n_layers);
    const GgufValue* v = gemma2 ? nullptr : g.Find(pattern_key);
    if (v != nullptr && v->type == GgufType::kArray) {
      if (static_cast<int64_t>(v->array.size()) != c.n_layers) {
        return absl::InvalidArgumentError(
            absl::StrCat(g.name(), ": ", pattern_key, " has ", v->array.size(),
                         " entries for ", c.n_layers, " layers"));
      }
      for (int64_t l = 0; l < c.n_layers; ++l) {
        const bool* slides = std::get_if<bool>(&v->array[l]);
        if (slides == nullptr) {
          return absl::InvalidArgumentError(absl::StrCat(
              g.name(), ": ", pattern_key, " is not an array of booleans"));
        }
        layers[l] = *slides;
      }
    } else {
      if (!gemma2) {
        ASSIGN_OR_RETURN(period, IntOr(g, pattern_key, 6));
      }
      if (period < 0) {
        return absl::InvalidArgumentError(absl::StrCat(
            g.name(), ": ", pattern_key, " ", period, " is negative"));
      }
      for (int64_t l = 0; l < c.n_layers; ++l) {
        layers[l] = period == 0 || (l + 1) % period != 0;
      }
    }
    if (std::find(layers.begin(), layers.end(), true) == layers.end()) {
      c.sliding_window = 0;  // No layer slides.
    } else if (std::find(layers.begin(), layers.end(), false) != layers.end()) {
      c.window_layers = std::move(layers);
    }
  }
  if (!gemma2) {
    ASSIGN_OR_RETURN(const double local_theta,
                     FloatOr(g, p + "rope.freq_base_swa", 10000.0));
    c.rope_local_theta = static_cast<float>(local_theta);
  }
  c.embedding_scale = std::sqrt(static_cast<float>(c.hidden));
  c.post_norms = true;
  c.ffn_activation = FfnActivation::kGeluTanh;
  if (c.n_layers == big_layers && c.n_heads > 0) {  // The 27B models.
    const double scalar = static_cast<double>(c.hidden / c.n_heads);
    c.attn_scale_factor =
        static_cast<float>(std::sqrt(static_cast<double>(c.head_dim) / scalar));
  }
  return absl::OkStatus();
}

// gpt-oss as llama.cpp runs its GGUF (openai-moe): every other layer, from
// the first, slides over attention.sliding_window (required); attention
// sinks, Q/K/V and output biases; a mixture whose router and experts have
// biases, softmax over the k chosen logits (the renormalized top-k of the
// softmax), and the clamped SwiGLU.
absl::Status ReadGptOss(const GgufFile& g, const std::string& p,
                        ModelConfig& c) {
  if (c.sliding_window <= 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        g.name(), ": gpt-oss needs ", p, "attention.sliding_window"));
  }
  if (!c.is_moe()) {
    return absl::InvalidArgumentError(
        absl::StrCat(g.name(), ": gpt-oss needs ", p, "expert_count"));
  }
  if (c.n_layers > 1 && c.n_layers <= 1024) {
    c.window_layers.resize(c.n_layers);
    for (int64_t l = 0; l < c.n_layers; ++l) c.window_layers[l] = l % 2 == 0;
  }
  c.attention_sinks = true;
  c.output_bias = true;
  c.expert_biases = true;
  c.ffn_activation = FfnActivation::kSwigluOai;
  c.expert_gating = ExpertGating::kSoftmax;
  c.expert_weights_norm = true;
  return absl::OkStatus();
}

// llama.cpp's qwen35 (Qwen3.5's dense models; qwen35moe and qwen3next
// read the same keys): Gated DeltaNet layers but
// every full_attention_interval-th (attention.recurrent_layers, when the
// file has it, says which), gated attention, and the ssm.* keys as its
// converter writes them: state_size the k (and v) head, group_count the k
// heads, time_step_rank the v heads, inner_size all v values; the v heads
// tiled. Its RoPE is interleaved M-RoPE, which for text (one position in
// every section) is NeoX RoPE over rope.dimension_count dims.
absl::Status ReadQwen35(const GgufFile& g, const std::string& p,
                        ModelConfig& c) {
  if (c.n_layers < 1 || c.n_layers > 1024) {
    return absl::InvalidArgumentError(
        absl::StrCat(g.name(), ": ", p, "block_count ", c.n_layers));
  }
  c.linear_layers.assign(c.n_layers, false);
  if (const GgufValue* v = g.Find(p + "attention.recurrent_layers")) {
    if (v->type != GgufType::kArray ||
        static_cast<int64_t>(v->array.size()) < c.n_layers) {
      return absl::InvalidArgumentError(
          absl::StrCat(g.name(), ": ", p,
                       "attention.recurrent_layers must be an array of a "
                       "flag per block"));
    }
    for (int64_t l = 0; l < c.n_layers; ++l) {
      const GgufScalar& e = v->array[l];
      const bool* b = std::get_if<bool>(&e);
      const uint64_t* u = std::get_if<uint64_t>(&e);
      const int64_t* i = std::get_if<int64_t>(&e);
      if (b == nullptr && u == nullptr && i == nullptr) {
        return absl::InvalidArgumentError(absl::StrCat(
            g.name(), ": ", p, "attention.recurrent_layers holds a non-flag"));
      }
      c.linear_layers[l] = b != nullptr ? *b : u != nullptr ? *u != 0 : *i != 0;
    }
  } else {
    ASSIGN_OR_RETURN(const int64_t interval,
                     IntOr(g, p + "full_attention_interval", 4));
    if (interval < 1) {
      return absl::InvalidArgumentError(absl::StrCat(
          g.name(), ": ", p, "full_attention_interval ", interval));
    }
    for (int64_t l = 0; l < c.n_layers; ++l) {
      c.linear_layers[l] = (l + 1) % interval != 0;
    }
  }
  ASSIGN_OR_RETURN(c.ssm_conv_width, g.GetInt(p + "ssm.conv_kernel"));
  ASSIGN_OR_RETURN(c.ssm_k_dim, g.GetInt(p + "ssm.state_size"));
  ASSIGN_OR_RETURN(c.ssm_k_heads, g.GetInt(p + "ssm.group_count"));
  ASSIGN_OR_RETURN(c.ssm_v_heads, g.GetInt(p + "ssm.time_step_rank"));
  ASSIGN_OR_RETURN(const int64_t inner, g.GetInt(p + "ssm.inner_size"));
  c.ssm_v_dim = c.ssm_k_dim;
  if (inner != c.ssm_v_heads * c.ssm_v_dim) {
    return absl::InvalidArgumentError(
        absl::StrCat(g.name(), ": ", p, "ssm.inner_size ", inner,
                     " is not time_step_rank x state_size (", c.ssm_v_heads,
                     " x ", c.ssm_v_dim, ")"));
  }
  c.ssm_v_tiled = true;
  c.attention_gate = true;
  return absl::OkStatus();
}

// The first layer that attends: where a file's per-layer attention
// tensors (biases, QK norms) show, even when a hybrid's layer 0 is linear.
int64_t FirstAttentionLayer(const ModelConfig& c) {
  for (int64_t l = 0; l < c.n_layers; ++l) {
    if (!c.LayerIsLinear(l)) return l;
  }
  return 0;
}

// The heads' widths: key_length (else hidden / head_count) and
// value_length, which must match but for DeepSeek's latent attention.
absl::Status ReadHeadDims(const GgufFile& g, const std::string& p,
                          ModelConfig& c) {
  if (c.n_heads <= 0 || (g.Find(p + "attention.key_length") == nullptr &&
                         c.hidden % c.n_heads != 0)) {
    return absl::InvalidArgumentError(
        absl::StrCat(g.name(), ": embedding_length ", c.hidden,
                     " is not a multiple of head_count ", c.n_heads));
  }
  ASSIGN_OR_RETURN(c.head_dim,
                   IntOr(g, p + "attention.key_length", c.hidden / c.n_heads));
  ASSIGN_OR_RETURN(int64_t value_dim,
                   IntOr(g, p + "attention.value_length", c.head_dim));
  if (c.architecture == "deepseek2") {
    // Latent attention, in either of llama.cpp's layouts: today's (MLA as
    // MQA over the latent: head_count_kv 1, key_length kv_lora_rank +
    // rope, the heads' widths in key_length_mla / value_length_mla) or
    // older files' (no *_mla keys: key_length / value_length the heads').
    ASSIGN_OR_RETURN(c.kv_lora_rank, g.GetInt(p + "attention.kv_lora_rank"));
    ASSIGN_OR_RETURN(c.q_lora_rank, IntOr(g, p + "attention.q_lora_rank", 0));
    ASSIGN_OR_RETURN(c.head_dim,
                     IntOr(g, p + "attention.key_length_mla", c.head_dim));
    ASSIGN_OR_RETURN(c.v_head_dim,
                     IntOr(g, p + "attention.value_length_mla", value_dim));
    c.n_kv_heads = c.n_heads;  // Every head reads the one latent.
    value_dim = c.head_dim;
  }
  if (value_dim != c.head_dim) {
    return absl::UnimplementedError(
        absl::StrCat(g.name(), ": attention.value_length ", value_dim,
                     " differs from key_length ", c.head_dim));
  }
  return absl::OkStatus();
}

// rope.dimension_count: all of the head (the default), or a part of it.
absl::Status ReadRopeDims(const GgufFile& g, const std::string& p,
                          ModelConfig& c) {
  ASSIGN_OR_RETURN(int64_t rope_dims,
                   IntOr(g, p + "rope.dimension_count", c.head_dim));
  if (rope_dims != c.head_dim) {
    // GLM-4.5's partial RoPE: the first rope_dims of each head rotate.
    if (rope_dims < 2 || rope_dims > c.head_dim || rope_dims % 2 != 0) {
      return absl::InvalidArgumentError(
          absl::StrCat(g.name(), ": ", p, "rope.dimension_count ", rope_dims,
                       " must be even and at most key_length ", c.head_dim));
    }
    c.rope_dims = rope_dims;
  }
  return absl::OkStatus();
}

// Multi-token-prediction layers (GLM-4.5's nextn) are the file's last
// blocks; a forward pass runs the others (as llama.cpp does).
absl::Status ReadNextnLayers(const GgufFile& g, const std::string& p,
                             ModelConfig& c) {
  ASSIGN_OR_RETURN(const int64_t nextn,
                   IntOr(g, p + "nextn_predict_layers", 0));
  if (nextn < 0 || nextn >= c.n_layers) {
    return absl::InvalidArgumentError(
        absl::StrCat(g.name(), ": ", p, "nextn_predict_layers ", nextn, " of ",
                     c.n_layers, " blocks"));
  }
  c.n_layers -= nextn;
  c.n_nextn_layers = nextn;
  return absl::OkStatus();
}

// Mixtures of experts: qwen3moe, and llama with expert_count (Mixtral).
absl::Status ReadExperts(const GgufFile& g, const std::string& p,
                         ModelConfig& c) {
  ASSIGN_OR_RETURN(c.n_experts, IntOr(g, p + "expert_count", 0));
  if (c.n_experts <= 0) return absl::OkStatus();
  ASSIGN_OR_RETURN(c.n_experts_used, g.GetInt(p + "expert_used_count"));
  ASSIGN_OR_RETURN(c.expert_ffn_hidden,
                   IntOr(g, p + "expert_feed_forward_length", c.ffn_hidden));
  ASSIGN_OR_RETURN(c.n_shared_experts, IntOr(g, p + "expert_shared_count", 0));
  ASSIGN_OR_RETURN(c.n_dense_layers,
                   IntOr(g, p + "leading_dense_block_count", 0));
  // llama.cpp's LLAMA_EXPERT_GATING_FUNC: 1 softmax, 2 sigmoid (absent:
  // softmax, except for the families that only ever route by sigmoid).
  ASSIGN_OR_RETURN(
      const int64_t gating,
      IntOr(g, p + "expert_gating_func", c.architecture == "glm4moe" ? 2 : 1));
  // 3, llama.cpp's softmax over the chosen logits (gpt-oss's), is the
  // renormalized softmax (set below).
  if (gating != 1 && gating != 2 && gating != 3) {
    return absl::UnimplementedError(absl::StrCat(
        g.name(), ": ", p, "expert_gating_func ", gating,
        " is not supported (1 softmax, 2 sigmoid, 3 softmax of the chosen "
        "are)"));
  }
  c.expert_gating =
      gating == 2 ? ExpertGating::kSigmoid : ExpertGating::kSoftmax;
  ASSIGN_OR_RETURN(const double scale,
                   FloatOr(g, p + "expert_weights_scale", 1.0));
  c.expert_weights_scale = static_cast<float>(scale);
  ASSIGN_OR_RETURN(c.expert_groups, IntOr(g, p + "expert_group_count", 1));
  ASSIGN_OR_RETURN(c.expert_groups_used,
                   IntOr(g, p + "expert_group_used_count", 1));
  if (c.expert_groups == 0) c.expert_groups = c.expert_groups_used = 1;
  c.expert_score_bias =
      FindTensor(g, absl::StrCat("blk.", c.n_dense_layers,
                                 ".exp_probs_b.bias")) != nullptr;
  // qwen3moe and llama (Mixtral) renormalize the top-k weights unless the
  // file says otherwise (llama.cpp's norm_w); glm4moe only when it says
  // so (llama.cpp's default for it is off).
  c.expert_weights_norm =
      c.architecture != "glm4moe" && c.architecture != "deepseek2";
  if (g.Find(p + "expert_weights_norm") != nullptr) {
    ASSIGN_OR_RETURN(c.expert_weights_norm,
                     g.GetBool(p + "expert_weights_norm"));
  }
  if (gating == 3) c.expert_weights_norm = true;
  // Qwen3.5-MoE: one shared expert of its own width (no
  // expert_shared_count key), gated per token when the file has the
  // gate's vector.
  const std::string first_moe = absl::StrCat("blk.", c.n_dense_layers, ".");
  if (c.n_shared_experts == 0 &&
      FindTensor(g, first_moe + "ffn_gate_shexp.weight") != nullptr) {
    c.n_shared_experts = 1;
  }
  ASSIGN_OR_RETURN(c.shared_expert_ffn,
                   IntOr(g, p + "expert_shared_feed_forward_length", 0));
  c.shared_expert_gate =
      FindTensor(g, first_moe + "ffn_gate_inp_shexp.weight") != nullptr;
  return absl::OkStatus();
}

// tokenizer.ggml.bos_token_id and eos_token_id: -1 (none) when absent.
absl::Status ReadTokenIds(const GgufFile& g, ModelConfig& c) {
  ASSIGN_OR_RETURN(int64_t bos, IntOr(g, "tokenizer.ggml.bos_token_id", -1));
  ASSIGN_OR_RETURN(int64_t eos, IntOr(g, "tokenizer.ggml.eos_token_id", -1));
  for (auto [key, id] : {std::pair{"bos", bos}, std::pair{"eos", eos}}) {
    if (id < -1 || id >= c.vocab_size) {
      return absl::InvalidArgumentError(
          absl::StrCat(g.name(), ": tokenizer.ggml.", key, "_token_id ", id,
                       " is outside the vocabulary of ", c.vocab_size));
    }
  }
  c.bos_id = static_cast<int32_t>(bos);
  c.eos_id = static_cast<int32_t>(eos);
  return absl::OkStatus();
}

// llama.cpp's converter permutes Llama's Q/K rows so that RoPE pairs
// adjacent dimensions; Qwen2's and Qwen3's it leaves alone (llama.cpp's
// "NeoX" RoPE).
RopeStyle GgufRopeStyle(std::string_view arch) {
  return arch == "qwen2" || arch == "qwen3" || arch == "qwen3moe" ||
                 arch == "glm4moe" || arch == "gemma2" || arch == "gemma3" ||
                 arch == "gpt-oss" || arch == "qwen35" || arch == "qwen35moe" ||
                 arch == "qwen3next"
             ? RopeStyle::kRotateHalf
             : RopeStyle::kAdjacentPairs;
}

// DeepSeek's YaRN as llama.cpp runs it: the file's yarn_log_multiplier
// is 0.1 x HF's mscale_all_dim; with it, cos and sin stay unscaled and
// the softmax scale is times mscale(factor, mscale_all_dim)^2 (HF's
// DeepseekV3 with mscale = mscale_all_dim, as every DeepSeek config
// has); without, cos and sin times mscale(factor) and the softmax
// scale its square.
absl::Status ReadMlaYarn(const GgufFile& g, const std::string& p,
                         ModelConfig& c) {
  ASSIGN_OR_RETURN(const double multiplier,
                   FloatOr(g, p + "rope.scaling.yarn_log_multiplier", 0.0));
  const double f = c.rope_scaling.factor;
  const auto mscale = [f](double m) {
    return f <= 1 ? 1.0 : 0.1 * m * std::log(f) + 1.0;
  };
  const double all_dim = multiplier / static_cast<double>(0.1f);
  const double cos_sin = all_dim != 0 ? 1.0 : mscale(1.0);
  c.rope_scaling.attention_factor = cos_sin;
  const double m = cos_sin * mscale(all_dim);
  c.attn_scale_factor = static_cast<float>(m * m);
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<ModelConfig> ModelConfigFromGguf(const GgufFile& g) {
  ModelConfig c;
  ASSIGN_OR_RETURN(std::string_view arch, g.GetString("general.architecture"));
  c.architecture = std::string(arch);
  if (c.architecture == "gemma3_text") {  // transformers' name, not GGUF's.
    return absl::InvalidArgumentError(
        absl::StrCat(g.name(),
                     ": general.architecture 'gemma3_text' is not a "
                     "GGUF architecture (gemma3 is)"));
  }
  if (g.Find("general.name") != nullptr) {
    ASSIGN_OR_RETURN(std::string_view name, g.GetString("general.name"));
    c.name = std::string(name);
  }
  const std::string p = c.architecture + ".";
  ASSIGN_OR_RETURN(c.n_layers, g.GetInt(p + "block_count"));
  ASSIGN_OR_RETURN(c.hidden, g.GetInt(p + "embedding_length"));
  ASSIGN_OR_RETURN(c.ffn_hidden, g.GetInt(p + "feed_forward_length"));
  ASSIGN_OR_RETURN(c.n_heads, g.GetInt(p + "attention.head_count"));
  ASSIGN_OR_RETURN(c.n_kv_heads,
                   IntOr(g, p + "attention.head_count_kv", c.n_heads));
  ASSIGN_OR_RETURN(c.context_length, IntOr(g, p + "context_length", 2048));
  ASSIGN_OR_RETURN(double theta, FloatOr(g, p + "rope.freq_base", 10000.0));
  ASSIGN_OR_RETURN(double eps,
                   FloatOr(g, p + "attention.layer_norm_rms_epsilon", 1e-5));
  c.rope_theta = static_cast<float>(theta);
  c.rms_norm_eps = static_cast<float>(eps);
  RETURN_IF_ERROR(ReadHeadDims(g, p, c));
  ASSIGN_OR_RETURN(c.sliding_window,
                   IntOr(g, p + "attention.sliding_window", 0));
  RETURN_IF_ERROR(ReadRopeDims(g, p, c));
  RETURN_IF_ERROR(ReadNextnLayers(g, p, c));

  // The vocabulary size: explicit key, else the embedding's row count.
  int64_t vocab = 0;
  for (const TensorInfo& t : g.tensors()) {
    if (t.name == "token_embd.weight" && t.shape.size() == 2) {
      vocab = t.shape[0];
    }
  }
  ASSIGN_OR_RETURN(c.vocab_size, IntOr(g, p + "vocab_size", vocab));
  c.tied_embeddings = FindTensor(g, "output.weight") == nullptr;
  if (c.architecture == "qwen35" || c.architecture == "qwen35moe" ||
      c.architecture == "qwen3next") {
    RETURN_IF_ERROR(ReadQwen35(g, p, c));
    // Qwen3-Next's converter keeps transformers' grouped value heads.
    c.ssm_v_tiled = c.architecture != "qwen3next";
  }
  const std::string attention =
      absl::StrCat("blk.", FirstAttentionLayer(c), ".attn_q");
  c.attention_bias = FindTensor(g, attention + ".bias") != nullptr;
  c.qk_norm = FindTensor(g, attention + "_norm.weight") != nullptr;
  RETURN_IF_ERROR(ReadExperts(g, p, c));
  RETURN_IF_ERROR(ReadTokenIds(g, c));
  c.rope_style = GgufRopeStyle(c.architecture);
  RETURN_IF_ERROR(ReadRopeScaling(g, p, c));
  if (c.architecture == "gemma2" || c.architecture == "gemma3") {
    RETURN_IF_ERROR(ReadGemma(g, p, c));
  }
  if (c.architecture == "gpt-oss") RETURN_IF_ERROR(ReadGptOss(g, p, c));
  if (c.is_mla() && c.rope_scaling.type == RopeScalingType::kYarn) {
    RETURN_IF_ERROR(ReadMlaYarn(g, p, c));
  }
  if (absl::Status s = c.Validate(); !s.ok()) {
    return absl::InvalidArgumentError(
        absl::StrCat(g.name(), ": ", s.message()));
  }
  return c;
}

absl::StatusOr<std::unique_ptr<WeightSource>> OpenGgufWeights(
    const std::string& path) {
  ASSIGN_OR_RETURN(auto gguf, GgufFile::Open(path));
  ASSIGN_OR_RETURN(ModelConfig config, ModelConfigFromGguf(*gguf));
  return std::make_unique<GgufWeightSource>(std::move(gguf), std::move(config));
}

}  // namespace shardlm
