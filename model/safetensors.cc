// safetensors + config.json reader.
//
// A safetensors file is: u64 little-endian header length N, N bytes of JSON
// {name: {dtype, shape, data_offsets: [begin, end]}, "__metadata__": {...}},
// then the data region; data_offsets are relative to the data region.
// Everything read from the files is treated as hostile: sizes are checked
// before they are used, and nothing is allocated from an unchecked count.
#include "model/safetensors.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <limits>
#include <map>
#include <optional>
#include <string_view>
#include <utility>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "core/check.h"
#include "core/status.h"
#include "model/mapped_file.h"
#include "nlohmann/json.hpp"

namespace shardlm {
namespace {

using Json = nlohmann::json;

// Real headers are a few MB at most; the reference implementation caps at
// 100 MB too.
constexpr uint64_t kMaxHeaderBytes = uint64_t{100} << 20;
constexpr uint64_t kMaxConfigBytes = uint64_t{16} << 20;
constexpr size_t kMaxRank = 8;
constexpr int64_t kMaxDim = int64_t{1} << 40;
constexpr int64_t kMaxElements = int64_t{1} << 48;
constexpr size_t kMaxFiles = 4096;

// ---------------------------------------------------------------- JSON ---

// Parses `text`; InvalidArgument with the parser's message (which names the
// byte position) on malformed input. `duplicate_key` receives the first
// top-level key that occurs twice (nlohmann would silently keep the last).
absl::StatusOr<Json> ParseJson(std::string_view text, std::string_view what,
                               std::string* duplicate_key) {
  auto callback = [duplicate_key, seen = std::map<std::string, int>()](
                      int depth, Json::parse_event_t event,
                      Json& parsed) mutable {
    if (duplicate_key != nullptr && depth == 1 &&
        event == Json::parse_event_t::key && parsed.is_string()) {
      const std::string& key = parsed.get_ref<const std::string&>();
      if (++seen[key] == 2 && duplicate_key->empty()) *duplicate_key = key;
    }
    return true;
  };
  try {
    return Json::parse(text.begin(), text.end(), callback,
                       /*allow_exceptions=*/true, /*ignore_comments=*/false);
  } catch (const Json::exception& e) {
    // The parser quotes the bytes it read last, which may be binary.
    std::string message = e.what();
    for (char& ch : message) {
      if (static_cast<unsigned char>(ch) < 0x20 ||
          static_cast<unsigned char>(ch) >= 0x7f) {
        ch = '?';
      }
    }
    return absl::InvalidArgumentError(
        absl::StrCat(Sv(what), " is not valid JSON: ", message));
  }
}

const char* JsonTypeName(const Json& j) { return j.type_name(); }

// A JSON value for an error message, cut short: it may be hostile and huge.
std::string Brief(const Json& j) {
  std::string s;
  try {
    s = j.dump();
  } catch (const Json::exception&) {
    return "(unprintable)";
  }
  if (s.size() > 64) s = absl::StrCat(s.substr(0, 64), "...");
  return s;
}

// A non-negative integer that fits in int64.
std::optional<int64_t> AsNonNegative(const Json& j) {
  if (j.is_number_unsigned()) {
    const uint64_t v = j.get<uint64_t>();
    if (v > static_cast<uint64_t>(std::numeric_limits<int64_t>::max())) {
      return std::nullopt;
    }
    return static_cast<int64_t>(v);
  }
  if (j.is_number_integer()) {
    const int64_t v = j.get<int64_t>();
    if (v < 0) return std::nullopt;
    return v;
  }
  return std::nullopt;
}

// ------------------------------------------------------------ config.json ---

// Reads typed fields of config.json, naming the file and field on error.
class ConfigReader {
 public:
  ConfigReader(const Json& j, std::string path)
      : j_(j), path_(std::move(path)) {}

  const std::string& path() const { return path_; }

  bool Has(std::string_view key) const {
    auto it = j_.find(key);
    return it != j_.end() && !it->is_null();
  }

  absl::StatusOr<int64_t> Int(std::string_view key) const {
    auto it = j_.find(key);
    if (it == j_.end() || it->is_null()) {
      return Error(key, "is missing");
    }
    return ToInt(key, *it);
  }
  absl::StatusOr<int64_t> Int(std::string_view key, int64_t dflt) const {
    if (!Has(key)) return dflt;
    return Int(key);
  }

  absl::StatusOr<double> Float(std::string_view key) const {
    auto it = j_.find(key);
    if (it == j_.end() || it->is_null()) return Error(key, "is missing");
    if (!it->is_number()) {
      return Error(
          key, absl::StrCat("is a ", JsonTypeName(*it), ", expected a number"));
    }
    const double v = it->get<double>();
    if (!std::isfinite(v)) return Error(key, "is not finite");
    return v;
  }
  absl::StatusOr<double> Float(std::string_view key, double dflt) const {
    if (!Has(key)) return dflt;
    return Float(key);
  }

  absl::StatusOr<bool> Bool(std::string_view key, bool dflt) const {
    if (!Has(key)) return dflt;
    const Json& v = j_.at(std::string(key));
    if (!v.is_boolean()) {
      return Error(key, absl::StrCat("is a ", JsonTypeName(v),
                                     ", expected true or false"));
    }
    return v.get<bool>();
  }

  absl::StatusOr<std::string> String(std::string_view key,
                                     std::string dflt) const {
    if (!Has(key)) return dflt;
    const Json& v = j_.at(std::string(key));
    if (!v.is_string()) {
      return Error(
          key, absl::StrCat("is a ", JsonTypeName(v), ", expected a string"));
    }
    return v.get<std::string>();
  }

  // A token id: an integer, or a list whose first element is used (Llama 3
  // lists several EOS ids). -1 when absent, null or an empty list.
  absl::StatusOr<int32_t> TokenId(std::string_view key) const {
    if (!Has(key)) return -1;
    const Json* v = &j_.at(std::string(key));
    if (v->is_array()) {
      if (v->empty()) return -1;
      v = &(*v)[0];
    }
    ASSIGN_OR_RETURN(const int64_t id, ToInt(key, *v));
    if (id > std::numeric_limits<int32_t>::max()) {
      return Error(key, absl::StrCat("= ", id, " is not a valid token id"));
    }
    return static_cast<int32_t>(id);
  }

  absl::Status Error(std::string_view key, std::string_view problem) const {
    return absl::InvalidArgumentError(
        absl::StrCat(path_, ": field '", Sv(key), "' ", Sv(problem)));
  }

 private:
  absl::StatusOr<int64_t> ToInt(std::string_view key, const Json& v) const {
    if (!v.is_number_integer()) {
      return Error(key, absl::StrCat("is a ", JsonTypeName(v),
                                     ", expected a non-negative integer"));
    }
    std::optional<int64_t> n = AsNonNegative(v);
    if (!n.has_value()) {
      return Error(key, absl::StrCat("= ", Brief(v),
                                     " is not a non-negative 64-bit integer"));
    }
    return *n;
  }

  const Json& j_;
  std::string path_;
};

// config.json's rope_scaling object (transformers' names: rope_type, or
// the older type; factor; original_max_position_embeddings; ...).
// DeepSeek's YaRN (deepseek: mscale and mscale_all_dim allowed, read by
// ReadDeepseek).
absl::StatusOr<RopeScaling> ReadRopeScaling(const Json& j,
                                            const std::string& path,
                                            int64_t max_position,
                                            bool deepseek = false) {
  if (!j.is_object()) {
    return absl::InvalidArgumentError(
        absl::StrCat(path, ": field 'rope_scaling' is a ", JsonTypeName(j),
                     ", expected an object"));
  }
  const ConfigReader r(j, absl::StrCat(path, " rope_scaling"));
  ASSIGN_OR_RETURN(std::string name, r.String("type", "default"));
  ASSIGN_OR_RETURN(name, r.String("rope_type", name));
  absl::StatusOr<RopeScalingType> type = ParseRopeScalingType(name);
  if (!type.ok()) {
    return r.Error("rope_type", std::string(type.status().message()));
  }
  RopeScaling s{.type = *type};
  if (s.type == RopeScalingType::kNone) return s;
  ASSIGN_OR_RETURN(s.factor, r.Float("factor"));
  if (s.type == RopeScalingType::kDynamic) {
    // transformers scales against max_position_embeddings (the training
    // context); the served context becomes factor times that (as vLLM
    // serves it), set by the caller.
    s.original_context = max_position;
  }
  if (s.type == RopeScalingType::kLlama3) {
    ASSIGN_OR_RETURN(s.original_context,
                     r.Int("original_max_position_embeddings"));
    ASSIGN_OR_RETURN(s.low_freq_factor, r.Float("low_freq_factor"));
    ASSIGN_OR_RETURN(s.high_freq_factor, r.Float("high_freq_factor"));
  }
  if (s.type == RopeScalingType::kYarn) {
    ASSIGN_OR_RETURN(s.original_context,
                     r.Int("original_max_position_embeddings", max_position));
    ASSIGN_OR_RETURN(s.beta_fast, r.Float("beta_fast", 32.0));
    ASSIGN_OR_RETURN(s.beta_slow, r.Float("beta_slow", 1.0));
    ASSIGN_OR_RETURN(s.attention_factor, r.Float("attention_factor", 0.0));
    // DeepSeek's variant changes the math.
    for (const char* key : {"mscale", "mscale_all_dim"}) {
      if (r.Has(key) && !deepseek) {
        return r.Error(key, "is set; it is not supported");
      }
    }
    ASSIGN_OR_RETURN(s.truncate, r.Bool("truncate", true));
  }
  return s;
}

// transformers' layer_types: for each of layers.size() layers, whether it
// is "sliding_attention" (else "full_attention"; another name, or a list
// of another length, is refused).
absl::Status ReadLayerTypes(const Json& j, const ConfigReader& r,
                            std::vector<bool>& layers) {
  const Json& types = j.at("layer_types");
  if (!types.is_array() || types.size() != layers.size()) {
    return r.Error("layer_types",
                   absl::StrCat("must list one type for each of the ",
                                layers.size(), " layers"));
  }
  for (size_t l = 0; l < layers.size(); ++l) {
    const Json& t = types[l];
    if (t != "sliding_attention" && t != "full_attention") {
      return r.Error("layer_types", absl::StrCat("[", l, "] = ", Brief(t),
                                                 " is not full_attention or "
                                                 "sliding_attention"));
    }
    layers[l] = t == "sliding_attention";
  }
  return absl::OkStatus();
}

// quantization_config: FP8 weights in square blocks, each F8_E4M3 weight
// with a weight_scale_inv of one scale per block (DeepSeek V3's and Kimi
// K2's "fp8", e4m3, weight_block_size [128, 128]); dequantized at load.
// gpt-oss's "mxfp4" (its experts' _blocks and _scales, read in their
// blocks). Other methods (GPTQ, AWQ, bitsandbytes, ...) are refused by
// name.
absl::Status ReadFp8Config(const Json& j, const ConfigReader& r,
                           ModelConfig& c) {
  const Json& q = j.at("quantization_config");
  if (!q.is_object()) {
    return r.Error("quantization_config", "is not an object");
  }
  const ConfigReader qr(q, absl::StrCat(r.path(), " quantization_config"));
  ASSIGN_OR_RETURN(const std::string method, qr.String("quant_method", ""));
  if (method == "mxfp4" && c.architecture == "gpt_oss") {
    return absl::OkStatus();
  }
  if (method != "fp8") {
    return qr.Error("quant_method",
                    absl::StrCat("= '", method,
                                 "'; only 'fp8' checkpoints (and gpt-oss's "
                                 "'mxfp4') are read (convert others to GGUF "
                                 "or to bf16)"));
  }
  ASSIGN_OR_RETURN(const std::string fmt, qr.String("fmt", "e4m3"));
  if (fmt != "e4m3") {
    return qr.Error("fmt", absl::StrCat("= '", fmt, "'; only e4m3 is read"));
  }
  const Json* block =
      q.contains("weight_block_size") ? &q.at("weight_block_size") : nullptr;
  if (block == nullptr || !block->is_array() || block->size() != 2 ||
      !(*block)[0].is_number_integer() || (*block)[0] != (*block)[1] ||
      (*block)[0].get<int64_t>() < 1 || (*block)[0].get<int64_t>() > 4096) {
    return qr.Error("weight_block_size",
                    "must be two equal sizes in [1, 4096] (per-tensor and "
                    "per-channel FP8 scales are not read)");
  }
  c.fp8_block = (*block)[0].get<int64_t>();
  return absl::OkStatus();
}

// Gemma 2's soft-capping of final logits and attention scores
// (final_logit_softcapping, default 30; attn_logit_softcapping, default
// 50; null for none); refused for Gemma 3.
absl::Status ReadGemmaSoftcaps(const Json& j, const ConfigReader& r,
                               bool gemma2, ModelConfig& c) {
  for (auto [key, dflt, cap] :
       {std::tuple{"final_logit_softcapping", 30.0, &c.final_softcap},
        std::tuple{"attn_logit_softcapping", 50.0, &c.attn_softcap}}) {
    if (!gemma2) {
      if (r.Has(key)) {
        return r.Error(key, "is set; soft-capping is Gemma 2's, not Gemma 3's");
      }
      continue;
    }
    // Absent: the default; null: none.
    double v = j.contains(key) ? 0.0 : dflt;
    if (r.Has(key)) {
      ASSIGN_OR_RETURN(v, r.Float(key));
    }
    if (!(v >= 0) || v > 1e6) {
      return r.Error(key, absl::StrCat("= ", v, " is outside [0, 1e6]"));
    }
    *cap = static_cast<float>(v);
  }
  return absl::OkStatus();
}

// Gemma 2's one RoPE for every layer: rope_theta and rope_scaling as for
// other models, or transformers 5's rope_parameters.
absl::Status ReadGemma2Rope(const Json& j, const ConfigReader& r,
                            ModelConfig& c) {
  if (!r.Has("rope_parameters")) return absl::OkStatus();
  const Json& rp = j.at("rope_parameters");
  if (!rp.is_object()) {
    return r.Error("rope_parameters", "is not an object");
  }
  const std::string where = absl::StrCat(r.path(), " rope_parameters");
  ASSIGN_OR_RETURN(c.rope_scaling,
                   ReadRopeScaling(rp, where, c.context_length));
  ASSIGN_OR_RETURN(const double theta,
                   ConfigReader(rp, where).Float("rope_theta", c.rope_theta));
  if (!(theta > 0) || theta > 1e12) {
    return r.Error("rope_parameters",
                   absl::StrCat("rope_theta ", theta, " is outside (0, 1e12]"));
  }
  c.rope_theta = static_cast<float>(theta);
  return absl::OkStatus();
}

// Gemma 3's RoPE as transformers 5 assembles it: rope_parameters per layer
// type, a top-level rope_scaling applied over its full_attention entry,
// bases from rope_theta (1e6) and rope_local_base_freq (1e4) where an
// entry has none; a missing entry is the default (unscaled) RoPE.
absl::Status ReadGemma3Rope(const Json& j, const ConfigReader& r,
                            ModelConfig& c) {
  ASSIGN_OR_RETURN(double global_theta, r.Float("rope_theta", 1e6));
  ASSIGN_OR_RETURN(double local_theta, r.Float("rope_local_base_freq", 1e4));
  Json full = Json::object(), sliding = Json::object();
  if (r.Has("rope_parameters")) {
    const Json& rp = j.at("rope_parameters");
    if (!rp.is_object()) return r.Error("rope_parameters", "is not an object");
    for (auto [name, entry] : {std::pair{"full_attention", &full},
                               std::pair{"sliding_attention", &sliding}}) {
      if (!rp.contains(name) || rp.at(name).is_null()) continue;
      if (!rp.at(name).is_object()) {
        return r.Error("rope_parameters",
                       absl::StrCat("'", name, "' is not an object"));
      }
      *entry = rp.at(name);
    }
  }
  if (r.Has("rope_scaling")) {
    if (!j.at("rope_scaling").is_object()) {
      return r.Error("rope_scaling", "is not an object");
    }
    full.update(j.at("rope_scaling"));
  }
  const std::string where = absl::StrCat(r.path(), " rope_parameters.");
  ASSIGN_OR_RETURN(
      c.rope_scaling,
      ReadRopeScaling(full, where + "full_attention", c.context_length));
  ASSIGN_OR_RETURN(
      const RopeScaling local,
      ReadRopeScaling(sliding, where + "sliding_attention", c.context_length));
  if (local.type != RopeScalingType::kNone) {
    return r.Error("rope_parameters",
                   "scales the sliding layers' RoPE (sliding_attention); "
                   "only their base is supported");
  }
  const ConfigReader full_reader(full, where + "full_attention");
  const ConfigReader sliding_reader(sliding, where + "sliding_attention");
  ASSIGN_OR_RETURN(global_theta, full_reader.Float("rope_theta", global_theta));
  ASSIGN_OR_RETURN(local_theta,
                   sliding_reader.Float("rope_theta", local_theta));
  for (auto [key, theta] :
       {std::pair{"rope_theta (full attention)", global_theta},
        std::pair{"rope_local_base_freq (sliding attention)", local_theta}}) {
    if (!(theta > 0) || theta > 1e12) {
      return r.Error(key, absl::StrCat("= ", theta, " is outside (0, 1e12]"));
    }
  }
  c.rope_theta = static_cast<float>(global_theta);
  c.rope_local_theta = static_cast<float>(local_theta);
  return absl::OkStatus();
}

// Gemma 2 and Gemma 3's text model (transformers' Gemma2Config and
// Gemma3TextConfig, and their defaults): GeGLU, post-attention and
// post-FFN norms, norms multiplying by 1 + w, embeddings times
// sqrt(hidden), the softmax scale 1/sqrt(query_pre_attn_scalar). The
// layers layer_types names "sliding_attention" (by default all but every
// sliding_window_pattern-th: 6 for Gemma 3, 2 for Gemma 2) see the last
// sliding_window positions. Gemma 3: QK norms; the sliding layers' own
// unscaled RoPE base: rope_local_base_freq, or in transformers 5's
// rope_parameters the "sliding_attention" entry's rope_theta
// ("full_attention" holds the others' base and scaling); soft-capping
// refused. Gemma 2: one RoPE (rope_theta, default 10000); attention scores
// and final logits soft-capped by attn_logit_softcapping (default 50) and
// final_logit_softcapping (default 30), null for none. The bidirectional
// variant is refused.
absl::Status ReadGemmaWindow(const Json& j, const ConfigReader& r,
                             int64_t period, ModelConfig& c);

absl::Status ReadGemma(const Json& j, const ConfigReader& r, ModelConfig& c) {
  const bool gemma2 = c.architecture == "gemma2";
  ASSIGN_OR_RETURN(const std::string act,
                   r.String("hidden_activation", "gelu_pytorch_tanh"));
  if (act != "gelu_pytorch_tanh") {
    return r.Error(
        "hidden_activation",
        absl::StrCat("= '", act, "'; only 'gelu_pytorch_tanh' is supported"));
  }
  RETURN_IF_ERROR(ReadGemmaSoftcaps(j, r, gemma2, c));
  ASSIGN_OR_RETURN(const bool bidirectional,
                   r.Bool("use_bidirectional_attention", false));
  if (bidirectional) {
    return r.Error("use_bidirectional_attention",
                   "is true; only causal attention is supported");
  }
  ASSIGN_OR_RETURN(c.tied_embeddings, r.Bool("tie_word_embeddings", true));
  ASSIGN_OR_RETURN(const double scalar, r.Float("query_pre_attn_scalar", 256));
  if (!(scalar > 0) || scalar > 1e9) {
    return r.Error("query_pre_attn_scalar",
                   absl::StrCat("= ", scalar, " is outside (0, 1e9]"));
  }
  c.attn_scale_factor =
      static_cast<float>(std::sqrt(static_cast<double>(c.head_dim) / scalar));
  c.qk_norm = !gemma2;
  c.post_norms = true;
  c.ffn_activation = FfnActivation::kGeluTanh;
  c.norm_weight_offset = 1.0f;
  c.embedding_scale = std::sqrt(static_cast<float>(c.hidden));
  if (gemma2) {
    RETURN_IF_ERROR(ReadGemma2Rope(j, r, c));
    return ReadGemmaWindow(j, r, 2, c);
  }
  RETURN_IF_ERROR(ReadGemma3Rope(j, r, c));
  return ReadGemmaWindow(j, r, 6, c);
}

// The window (sliding_window, default 4096) and the layers it applies to:
// layer_types, else all but every sliding_window_pattern-th layer
// (default `period`).
absl::Status ReadGemmaWindow(const Json& j, const ConfigReader& r,
                             int64_t period, ModelConfig& c) {
  if (c.n_layers < 1 || c.n_layers > 1024) return absl::OkStatus();
  ASSIGN_OR_RETURN(const int64_t window, r.Int("sliding_window", 4096));
  ASSIGN_OR_RETURN(const int64_t pattern,
                   r.Int("sliding_window_pattern", period));
  if (pattern < 1) return r.Error("sliding_window_pattern", "is below 1");
  std::vector<bool> layers(c.n_layers);
  for (int64_t l = 0; l < c.n_layers; ++l) layers[l] = (l + 1) % pattern != 0;
  if (r.Has("layer_types")) RETURN_IF_ERROR(ReadLayerTypes(j, r, layers));
  if (std::find(layers.begin(), layers.end(), true) == layers.end()) {
    return absl::OkStatus();  // No layer slides.
  }
  if (window < 1) return r.Error("sliding_window", "is below 1");
  c.sliding_window = window;
  if (std::find(layers.begin(), layers.end(), false) != layers.end()) {
    c.window_layers = std::move(layers);
  }
  return absl::OkStatus();
}

// gpt-oss (transformers' GptOssConfig): experts of intermediate_size
// columns with biases and the clamped SwiGLU (swiglu_limit 7 only), routed
// by top-k over the router's logits (with a bias), then a softmax over the
// chosen; Q/K/V and output biases; a sink per head; layer_types (default:
// even layers sliding) over sliding_window (default 128).
absl::Status ReadGptOss(const Json& j, const ConfigReader& r, ModelConfig& c) {
  ASSIGN_OR_RETURN(c.n_experts, r.Int("num_local_experts", 128));
  const char* used_key = r.Has("num_experts_per_tok") ? "num_experts_per_tok"
                                                      : "experts_per_token";
  ASSIGN_OR_RETURN(c.n_experts_used, r.Int(used_key, 4));
  c.expert_ffn_hidden = c.ffn_hidden;
  c.expert_gating = ExpertGating::kSoftmax;
  c.expert_weights_norm = true;
  ASSIGN_OR_RETURN(const double limit, r.Float("swiglu_limit", 7.0));
  if (limit != 7.0) {
    return r.Error("swiglu_limit", absl::StrCat("= ", limit,
                                                "; only gpt-oss's 7 is "
                                                "supported"));
  }
  ASSIGN_OR_RETURN(const bool bias, r.Bool("attention_bias", true));
  if (!bias) {
    return r.Error("attention_bias", "is false; gpt-oss has biases");
  }
  c.attention_bias = true;
  c.output_bias = true;
  c.attention_sinks = true;
  c.expert_biases = true;
  c.ffn_activation = FfnActivation::kSwigluOai;
  if (c.n_layers < 1 || c.n_layers > 1024) return absl::OkStatus();
  std::vector<bool> layers(c.n_layers);
  for (int64_t l = 0; l < c.n_layers; ++l) layers[l] = l % 2 == 0;
  if (r.Has("layer_types")) RETURN_IF_ERROR(ReadLayerTypes(j, r, layers));
  ASSIGN_OR_RETURN(const int64_t window, r.Int("sliding_window", 128));
  if (std::find(layers.begin(), layers.end(), true) == layers.end()) {
    return absl::OkStatus();
  }
  if (window < 1) return r.Error("sliding_window", "is below 1");
  c.sliding_window = window;
  if (std::find(layers.begin(), layers.end(), false) != layers.end()) {
    c.window_layers = std::move(layers);
  }
  return absl::OkStatus();
}

// Qwen2's window as transformers' Qwen2Config defines it: it exists only
// with use_sliding_window (then sliding_window, default 4096), and applies
// to the layers layer_types names "sliding_attention", by default those
// from max_window_layers (default 28) on. A layer type of another name, or
// a sliding layer with no window (which transformers cannot mask), is
// refused. No sliding layer leaves the config without a window.
// GLM-4.5 (transformers' Glm4MoeConfig): sigmoid routing with a choice
// bias, groups and a scale; shared experts; the first layers dense;
// partial RoPE; optional per-head q/k norms.
absl::Status ReadGlm4Moe(const ConfigReader& r, ModelConfig& c) {
  ASSIGN_OR_RETURN(c.n_experts, r.Int("n_routed_experts"));
  ASSIGN_OR_RETURN(c.n_experts_used, r.Int("num_experts_per_tok"));
  ASSIGN_OR_RETURN(c.expert_ffn_hidden, r.Int("moe_intermediate_size"));
  ASSIGN_OR_RETURN(c.expert_weights_norm, r.Bool("norm_topk_prob", true));
  ASSIGN_OR_RETURN(c.n_shared_experts, r.Int("n_shared_experts", 1));
  ASSIGN_OR_RETURN(c.n_dense_layers, r.Int("first_k_dense_replace", 1));
  ASSIGN_OR_RETURN(c.expert_groups, r.Int("n_group", 1));
  ASSIGN_OR_RETURN(c.expert_groups_used, r.Int("topk_group", 1));
  ASSIGN_OR_RETURN(const double scale, r.Float("routed_scaling_factor", 1.0));
  c.expert_weights_scale = static_cast<float>(scale);
  c.expert_gating = ExpertGating::kSigmoid;
  c.expert_score_bias = true;  // Glm4MoeTopkRouter always has one.
  ASSIGN_OR_RETURN(c.qk_norm, r.Bool("use_qk_norm", false));
  ASSIGN_OR_RETURN(const double partial, r.Float("partial_rotary_factor", 0.5));
  if (!(partial > 0 && partial <= 1)) {
    return r.Error("partial_rotary_factor",
                   absl::StrCat("= ", partial, " is outside (0, 1]"));
  }
  c.rope_dims = static_cast<int64_t>(c.head_dim * partial);
  return absl::OkStatus();
}

// DeepSeek V2 / V3 and Kimi K2 (transformers' DeepseekV3Config and
// DeepseekV2Config, their defaults): multi-head latent attention, the
// RoPE part of each head last and its pairs adjacent (rope_interleave, or
// V2's complex RoPE: the same pairs); V3's routing as GLM-4.5's, V2's a
// softmax top-k (greedy only) times routed_scaling_factor, never
// renormalized. YaRN as DeepseekV3Attention scales it.
absl::Status ReadDeepseek(const Json& j, const ConfigReader& r,
                          ModelConfig& c) {
  const bool v3 = c.architecture == "deepseek_v3";
  ASSIGN_OR_RETURN(const int64_t nope, r.Int("qk_nope_head_dim", 128));
  ASSIGN_OR_RETURN(c.rope_dims, r.Int("qk_rope_head_dim", 64));
  c.head_dim = nope + c.rope_dims;
  c.n_kv_heads = c.n_heads;
  // null (DeepSeek V2-Lite): no q LoRA; absent: the config's default.
  if (!j.contains("q_lora_rank")) {
    c.q_lora_rank = v3 ? 1536 : 0;
  } else if (!j.at("q_lora_rank").is_null()) {
    ASSIGN_OR_RETURN(c.q_lora_rank, r.Int("q_lora_rank"));
  }
  ASSIGN_OR_RETURN(c.kv_lora_rank, r.Int("kv_lora_rank", 512));
  ASSIGN_OR_RETURN(c.v_head_dim, r.Int("v_head_dim", 128));
  c.latent_norm_eps = 1e-6f;  // DeepseekV3RMSNorm(rank)'s default.
  ASSIGN_OR_RETURN(const bool interleave, r.Bool("rope_interleave", true));
  c.rope_style =
      !v3 || interleave ? RopeStyle::kAdjacentPairs : RopeStyle::kRotateHalf;
  if (c.rope_scaling.type == RopeScalingType::kYarn) {
    // transformers' _compute_yarn_parameters: the factor is
    // max_position_embeddings over original_max_position_embeddings when
    // that is given; cos and sin times attention_factor, by default
    // mscale(f, mscale) / mscale(f, mscale_all_dim) when both are set,
    // else mscale(f); V3's softmax scale times mscale(factor,
    // mscale_all_dim)^2 when mscale_all_dim is set.
    const Json& rs = j.at("rope_scaling");
    const ConfigReader y(rs, "rope_scaling");
    ASSIGN_OR_RETURN(const double factor, y.Float("factor"));
    ASSIGN_OR_RETURN(const double ms, y.Float("mscale", 0.0));
    ASSIGN_OR_RETURN(const double mad, y.Float("mscale_all_dim", 0.0));
    const auto mscale = [](double f, double m) {
      return f <= 1 ? 1.0 : 0.1 * m * std::log(f) + 1.0;
    };
    RopeScaling& s = c.rope_scaling;
    if (y.Has("original_max_position_embeddings")) {
      s.factor = static_cast<double>(c.context_length) /
                 static_cast<double>(s.original_context);
    }
    if (!y.Has("attention_factor")) {
      s.attention_factor = ms != 0 && mad != 0
                               ? mscale(s.factor, ms) / mscale(s.factor, mad)
                               : mscale(s.factor, 1.0);
    }
    if (v3 && mad != 0) {
      const double m = mscale(factor, mad);
      c.attn_scale_factor = static_cast<float>(m * m);
    }
  }
  ASSIGN_OR_RETURN(c.n_experts, r.Int("n_routed_experts", v3 ? 256 : 64));
  ASSIGN_OR_RETURN(c.n_experts_used, r.Int("num_experts_per_tok", 8));
  ASSIGN_OR_RETURN(c.expert_ffn_hidden,
                   r.Int("moe_intermediate_size", v3 ? 2048 : 1407));
  ASSIGN_OR_RETURN(c.n_dense_layers,
                   r.Int("first_k_dense_replace", v3 ? 3 : 0));
  ASSIGN_OR_RETURN(c.n_shared_experts, r.Int("n_shared_experts", v3 ? 1 : 2));
  ASSIGN_OR_RETURN(const double scale,
                   r.Float("routed_scaling_factor", v3 ? 2.5 : 1.0));
  c.expert_weights_scale = static_cast<float>(scale);
  if (v3) {
    c.expert_gating = ExpertGating::kSigmoid;
    c.expert_score_bias = true;  // DeepseekV3TopkRouter always has one.
    ASSIGN_OR_RETURN(c.expert_weights_norm, r.Bool("norm_topk_prob", true));
    ASSIGN_OR_RETURN(c.expert_groups, r.Int("n_group", 8));
    ASSIGN_OR_RETURN(c.expert_groups_used, r.Int("topk_group", 4));
  } else {
    ASSIGN_OR_RETURN(const std::string method,
                     r.String("topk_method", "greedy"));
    if (method != "greedy") {
      return r.Error("topk_method",
                     absl::StrCat("= '", method,
                                  "'; DeepSeek V2 runs with 'greedy' only"));
    }
    c.expert_weights_norm = false;
  }
  return absl::OkStatus();
}

// Qwen3.5 (transformers' Qwen3_5TextConfig, its defaults): Gated
// DeltaNet layers as layer_types says (or all but every
// full_attention_interval-th), their value heads in Hugging Face's grouped
// order; gated attention with QK norms; RoPE (rope_parameters' theta)
// over partial_rotary_factor of each head, NeoX style (interleaved M-RoPE
// gives text one RoPE); norms that multiply by 1 + w, but the gated one.
absl::Status ReadQwen35(const Json& j, const ConfigReader& r, ModelConfig& c) {
  if (c.n_layers < 1 || c.n_layers > 1024) return absl::OkStatus();
  double theta = c.rope_theta, partial = 0.25;
  if (r.Has("rope_parameters")) {
    const Json& rp = j.at("rope_parameters");
    if (!rp.is_object()) return r.Error("rope_parameters", "is not an object");
    const ConfigReader p(rp, absl::StrCat(r.path(), " rope_parameters"));
    ASSIGN_OR_RETURN(theta, p.Float("rope_theta", 1e7));
    ASSIGN_OR_RETURN(partial, p.Float("partial_rotary_factor", 0.25));
    ASSIGN_OR_RETURN(const std::string type, p.String("rope_type", "default"));
    if (type != "default") {
      return r.Error("rope_parameters",
                     absl::StrCat("rope_type '", type,
                                  "' is not supported for qwen3_5 (default "
                                  "is)"));
    }
  }
  ASSIGN_OR_RETURN(partial, r.Float("partial_rotary_factor", partial));
  if (!(partial > 0 && partial <= 1) || !(theta > 0) || theta > 1e12) {
    return r.Error(
        "rope_parameters",
        absl::StrCat("partial_rotary_factor ", partial, " and rope_theta ",
                     theta, " must be in (0, 1] and (0, 1e12]"));
  }
  c.rope_theta = static_cast<float>(theta);
  c.rope_dims = static_cast<int64_t>(c.head_dim * partial);
  c.linear_layers.assign(c.n_layers, false);
  if (r.Has("layer_types")) {
    const Json& types = j.at("layer_types");
    if (!types.is_array() || static_cast<int64_t>(types.size()) != c.n_layers) {
      return r.Error("layer_types", absl::StrCat("must be an array of ",
                                                 c.n_layers, " layer types"));
    }
    for (int64_t l = 0; l < c.n_layers; ++l) {
      const Json& t = types[l];
      if (t != "linear_attention" && t != "full_attention") {
        return r.Error("layer_types",
                       absl::StrCat("[", l,
                                    "] is not 'linear_attention' or "
                                    "'full_attention'"));
      }
      c.linear_layers[l] = t == "linear_attention";
    }
  } else {
    ASSIGN_OR_RETURN(const int64_t interval,
                     r.Int("full_attention_interval", 4));
    if (interval < 1) {
      return r.Error("full_attention_interval", "must be at least 1");
    }
    for (int64_t l = 0; l < c.n_layers; ++l) {
      c.linear_layers[l] = (l + 1) % interval != 0;
    }
  }
  ASSIGN_OR_RETURN(c.ssm_conv_width, r.Int("linear_conv_kernel_dim", 4));
  ASSIGN_OR_RETURN(c.ssm_k_heads, r.Int("linear_num_key_heads", 16));
  ASSIGN_OR_RETURN(c.ssm_v_heads, r.Int("linear_num_value_heads", 32));
  ASSIGN_OR_RETURN(c.ssm_k_dim, r.Int("linear_key_head_dim", 128));
  ASSIGN_OR_RETURN(c.ssm_v_dim, r.Int("linear_value_head_dim", 128));
  c.ssm_v_tiled = false;
  c.attention_gate = true;
  c.qk_norm = true;
  c.norm_weight_offset = 1.0f;
  return absl::OkStatus();
}

absl::Status ReadQwen2Window(const Json& j, const ConfigReader& r,
                             ModelConfig& c) {
  // An absurd layer count is Validate's to report.
  if (c.n_layers < 1 || c.n_layers > 1024) return absl::OkStatus();
  ASSIGN_OR_RETURN(const bool use, r.Bool("use_sliding_window", false));
  // 0: none (sliding_window null: transformers' None; 4096 when absent).
  int64_t window = 0;
  if (use && !j.contains("sliding_window")) window = 4096;
  if (use && r.Has("sliding_window")) {
    ASSIGN_OR_RETURN(window, r.Int("sliding_window"));
    if (window == 0) return r.Error("sliding_window", "= 0 is no window");
  }
  std::vector<bool> layers(c.n_layers, false);
  if (r.Has("layer_types")) {
    RETURN_IF_ERROR(ReadLayerTypes(j, r, layers));
    const auto first = std::find(layers.begin(), layers.end(), true);
    if (first != layers.end() && window == 0) {
      return r.Error("layer_types",
                     absl::StrCat("[", first - layers.begin(),
                                  "] is sliding_attention but there is no "
                                  "window (use_sliding_window is false)"));
    }
  } else if (window > 0) {
    ASSIGN_OR_RETURN(const int64_t first, r.Int("max_window_layers", 28));
    for (int64_t l = first; l < c.n_layers; ++l) layers[l] = true;
  }
  if (std::find(layers.begin(), layers.end(), true) == layers.end()) {
    return absl::OkStatus();  // No layer slides.
  }
  c.sliding_window = window;
  if (std::find(layers.begin(), layers.end(), false) != layers.end()) {
    c.window_layers = std::move(layers);
  }
  return absl::OkStatus();
}

// The JSON object `path` holds (a config.json, at most kMaxConfigBytes).
absl::StatusOr<Json> ParseConfigFile(const std::string& path) {
  ASSIGN_OR_RETURN(std::unique_ptr<MappedFile> file, MappedFile::Open(path));
  if (file->size() > kMaxConfigBytes) {
    return absl::InvalidArgumentError(
        absl::StrCat(path, " is ", file->size(), " bytes, more than the ",
                     kMaxConfigBytes, " a config can be"));
  }
  const auto bytes = file->bytes();
  const std::string_view text(reinterpret_cast<const char*>(bytes.data()),
                              bytes.size());
  ASSIGN_OR_RETURN(Json top, ParseJson(text, path, nullptr));
  if (!top.is_object()) {
    return absl::InvalidArgumentError(absl::StrCat(
        path, " is a JSON ", JsonTypeName(top), ", not an object"));
  }
  return top;
}

// The language model's config within config.json's `top`: `top` itself,
// or (Qwen3.5) its text_config.
absl::StatusOr<const Json*> LanguageModelConfig(const Json& top,
                                                const std::string& path) {
  // Qwen3.5 ships as Qwen3_5ForConditionalGeneration (text and vision):
  // the language model's config is its text_config (the vision tower is
  // not read).
  if (const auto it = top.find("model_type");
      it != top.end() && (*it == "qwen3_5" || *it == "qwen3_5_moe")) {
    const auto tc = top.find("text_config");
    if (tc == top.end() || !tc->is_object()) {
      return absl::InvalidArgumentError(
          absl::StrCat(path, ": model_type '", it->get<std::string>(),
                       "' without a text_config object"));
    }
    return &*tc;
  }
  return &top;
}

// The architecture comes from model_type; architectures[] only when that
// is missing (both are written by transformers).
absl::StatusOr<std::string> ReadModelType(const Json& j,
                                          const ConfigReader& r) {
  ASSIGN_OR_RETURN(std::string model_type, r.String("model_type", ""));
  if (model_type.empty() && r.Has("architectures")) {
    const Json& a = j.at("architectures");
    if (a.is_array() && !a.empty() && a[0].is_string()) {
      const std::string& arch = a[0].get_ref<const std::string&>();
      if (arch == "LlamaForCausalLM") model_type = "llama";
      if (arch == "MistralForCausalLM") model_type = "mistral";
      if (arch == "Qwen2ForCausalLM") model_type = "qwen2";
      if (arch == "Qwen3ForCausalLM") model_type = "qwen3";
      if (arch == "Qwen3MoeForCausalLM") model_type = "qwen3_moe";
      if (arch == "MixtralForCausalLM") model_type = "mixtral";
      if (arch == "Glm4MoeForCausalLM") model_type = "glm4_moe";
      if (arch == "DeepseekV3ForCausalLM") model_type = "deepseek_v3";
      if (arch == "DeepseekV2ForCausalLM") model_type = "deepseek_v2";
      if (arch == "Gemma2ForCausalLM") model_type = "gemma2";
      if (arch == "Gemma3ForCausalLM") model_type = "gemma3_text";
      if (arch == "GptOssForCausalLM") model_type = "gpt_oss";
      if (arch == "Qwen3_5ForCausalLM") model_type = "qwen3_5_text";
      if (arch == "Qwen3NextForCausalLM") model_type = "qwen3_next";
      if (arch == "Qwen3_5MoeForCausalLM") model_type = "qwen3_5_moe_text";
      if (model_type.empty()) model_type = arch;
    }
  }
  if (model_type.empty()) {
    return r.Error("model_type", "is missing (and no usable 'architectures')");
  }
  if (model_type == "gemma3") {
    return r.Error("model_type",
                   "= 'gemma3' is Gemma3ForConditionalGeneration (text and "
                   "vision); its text-only form (Gemma3ForCausalLM, "
                   "model_type 'gemma3_text') is supported");
  }
  return model_type;
}

// The sizes every model has: widths, layers, heads, vocabulary, context.
absl::Status ReadDimensions(const ConfigReader& r, ModelConfig& c) {
  ASSIGN_OR_RETURN(c.hidden, r.Int("hidden_size"));
  ASSIGN_OR_RETURN(c.ffn_hidden, r.Int("intermediate_size"));
  ASSIGN_OR_RETURN(c.n_layers, r.Int("num_hidden_layers"));
  ASSIGN_OR_RETURN(c.n_heads, r.Int("num_attention_heads"));
  ASSIGN_OR_RETURN(c.n_kv_heads, r.Int("num_key_value_heads", c.n_heads));
  if (r.Has("head_dim")) {
    ASSIGN_OR_RETURN(c.head_dim, r.Int("head_dim"));
  } else {
    if (c.n_heads <= 0 || c.hidden % c.n_heads != 0) {
      return r.Error("num_attention_heads",
                     absl::StrCat("= ", c.n_heads,
                                  " does not divide hidden_size = ", c.hidden,
                                  " (and there is no head_dim)"));
    }
    c.head_dim = c.hidden / c.n_heads;
  }
  ASSIGN_OR_RETURN(c.vocab_size, r.Int("vocab_size"));
  ASSIGN_OR_RETURN(c.context_length, r.Int("max_position_embeddings"));
  return absl::OkStatus();
}

// rope_theta (default 10000) and rms_norm_eps, in their ranges.
absl::Status ReadRopeThetaAndNormEps(const ConfigReader& r, ModelConfig& c) {
  ASSIGN_OR_RETURN(const double theta, r.Float("rope_theta", 10000.0));
  ASSIGN_OR_RETURN(const double eps, r.Float("rms_norm_eps"));
  if (!(theta > 0) || theta > 1e12) {
    return r.Error("rope_theta",
                   absl::StrCat("= ", theta, " is outside (0, 1e12]"));
  }
  if (!(eps > 0) || eps > 1) {
    return r.Error("rms_norm_eps",
                   absl::StrCat("= ", eps, " is outside (0, 1]"));
  }
  c.rope_theta = static_cast<float>(theta);
  c.rms_norm_eps = static_cast<float>(eps);
  return absl::OkStatus();
}

// The top-level rope_scaling; dynamic NTK serves factor times the
// context (`path`: config.json's, for errors).
absl::Status ReadTopRopeScaling(const Json& j, const ConfigReader& r,
                                const std::string& path, ModelConfig& c) {
  ASSIGN_OR_RETURN(
      c.rope_scaling,
      ReadRopeScaling(j.at("rope_scaling"), path, c.context_length,
                      /*deepseek=*/c.architecture.starts_with("deepseek_v")));
  if (c.rope_scaling.type == RopeScalingType::kDynamic) {
    const double served = std::floor(c.rope_scaling.factor * c.context_length);
    if (!(served <= static_cast<double>(int64_t{1} << 24))) {
      return r.Error(
          "rope_scaling",
          absl::StrCat("dynamic factor ", c.rope_scaling.factor,
                       " x max_position_embeddings ", c.context_length,
                       " is a context beyond 2^24"));
    }
    c.context_length = static_cast<int64_t>(served);
  }
  return absl::OkStatus();
}

// Mistral's sliding_window applies when set; Qwen2's as transformers'
// Qwen2Config reads it (ReadQwen2Window), Gemma's as Gemma2Config and
// Gemma3TextConfig do (ReadGemma, with the rest of Gemma), gpt-oss's as
// ReadGptOss does (with the rest of gpt-oss).
absl::Status ReadWindowAndFamily(const Json& j, const ConfigReader& r,
                                 bool gemma, ModelConfig& c) {
  if (c.architecture == "qwen2") {
    RETURN_IF_ERROR(ReadQwen2Window(j, r, c));
  } else if (gemma) {
    RETURN_IF_ERROR(ReadGemma(j, r, c));
  } else if (c.architecture == "gpt_oss") {
    RETURN_IF_ERROR(ReadGptOss(j, r, c));
  } else if (r.Has("sliding_window")) {
    ASSIGN_OR_RETURN(c.sliding_window, r.Int("sliding_window"));
  }
  return absl::OkStatus();
}

// Qwen3-MoE's experts have moe_intermediate_size and norm_topk_prob, and
// may keep dense MLPs in some layers (refused).
absl::Status ReadQwen3Moe(const Json& j, const ConfigReader& r,
                          ModelConfig& c) {
  ASSIGN_OR_RETURN(c.n_experts, r.Int("num_experts"));
  ASSIGN_OR_RETURN(c.n_experts_used, r.Int("num_experts_per_tok"));
  ASSIGN_OR_RETURN(c.expert_ffn_hidden, r.Int("moe_intermediate_size"));
  ASSIGN_OR_RETURN(c.expert_weights_norm, r.Bool("norm_topk_prob", false));
  ASSIGN_OR_RETURN(const int64_t sparse_step, r.Int("decoder_sparse_step", 1));
  if (sparse_step != 1) {
    return r.Error("decoder_sparse_step",
                   absl::StrCat("= ", sparse_step,
                                "; only every layer a mixture (1) is "
                                "supported"));
  }
  if (r.Has("mlp_only_layers") && !(j.at("mlp_only_layers").is_array() &&
                                    j.at("mlp_only_layers").empty())) {
    return r.Error("mlp_only_layers",
                   "is not empty; dense layers among the mixture layers "
                   "are not supported");
  }
  return absl::OkStatus();
}

// Qwen3-Next and Qwen3.5-MoE: Qwen3.5's layers, a mixture in every layer
// and one shared expert gated per token (transformers'
// Qwen3NextSparseMoeBlock and Qwen3_5MoeSparseMoeBlock; their checkpoints
// hold the experts one tensor each).
absl::Status ReadQwen3Next(const Json& j, const ConfigReader& r,
                           ModelConfig& c) {
  RETURN_IF_ERROR(ReadQwen35(j, r, c));
  ASSIGN_OR_RETURN(c.n_experts, r.Int("num_experts"));
  ASSIGN_OR_RETURN(c.n_experts_used, r.Int("num_experts_per_tok"));
  ASSIGN_OR_RETURN(c.expert_ffn_hidden, r.Int("moe_intermediate_size"));
  ASSIGN_OR_RETURN(c.expert_weights_norm, r.Bool("norm_topk_prob", true));
  ASSIGN_OR_RETURN(c.shared_expert_ffn,
                   r.Int("shared_expert_intermediate_size", 0));
  c.n_shared_experts = c.shared_expert_ffn > 0 ? 1 : 0;
  c.shared_expert_gate = c.n_shared_experts > 0;
  ASSIGN_OR_RETURN(const int64_t sparse_step, r.Int("decoder_sparse_step", 1));
  if (sparse_step != 1 ||
      (r.Has("mlp_only_layers") && !(j.at("mlp_only_layers").is_array() &&
                                     j.at("mlp_only_layers").empty()))) {
    return r.Error("decoder_sparse_step",
                   "or mlp_only_layers leave dense layers among the "
                   "mixture layers; only every layer a mixture is "
                   "supported");
  }
  return absl::OkStatus();
}

// Mixtures of experts (and the rest of the families read with theirs):
// Mixtral's experts are as wide as intermediate_size and always
// renormalized; Qwen3-MoE's: ReadQwen3Moe.
absl::Status ReadExperts(const Json& j, const ConfigReader& r, ModelConfig& c) {
  if (c.architecture == "mixtral") {
    ASSIGN_OR_RETURN(c.n_experts, r.Int("num_local_experts"));
    ASSIGN_OR_RETURN(c.n_experts_used, r.Int("num_experts_per_tok"));
    c.expert_ffn_hidden = c.ffn_hidden;
    c.expert_weights_norm = true;
  } else if (c.architecture == "qwen3_moe") {
    RETURN_IF_ERROR(ReadQwen3Moe(j, r, c));
  } else if (c.architecture == "glm4_moe") {
    RETURN_IF_ERROR(ReadGlm4Moe(r, c));
  } else if (c.architecture == "deepseek_v3" ||
             c.architecture == "deepseek_v2") {
    RETURN_IF_ERROR(ReadDeepseek(j, r, c));
  } else if (c.architecture == "qwen3_5_text") {
    RETURN_IF_ERROR(ReadQwen35(j, r, c));
  } else if (c.architecture == "qwen3_next" ||
             c.architecture == "qwen3_5_moe_text") {
    RETURN_IF_ERROR(ReadQwen3Next(j, r, c));
  }
  return absl::OkStatus();
}

// Qwen2 always has Q/K/V biases; Llama has them with attention_bias
// (which would also give o_proj one); GLM-4.5 on Q, K and V with it.
// gpt-oss on all four and its experts (ReadGptOss).
absl::Status ReadBiases(const ConfigReader& r, ModelConfig& c) {
  const bool gpt_oss = c.architecture == "gpt_oss";
  if (!gpt_oss) c.attention_bias = c.architecture == "qwen2";
  if (c.architecture == "glm4_moe") {
    ASSIGN_OR_RETURN(c.attention_bias, r.Bool("attention_bias", false));
  }
  for (const char* bias : {"attention_bias", "mlp_bias"}) {
    if ((c.architecture == "glm4_moe" || gpt_oss) &&
        bias == std::string_view("attention_bias")) {
      continue;
    }
    ASSIGN_OR_RETURN(const bool has_bias, r.Bool(bias, false));
    if (has_bias) {
      return r.Error(bias,
                     "is true; biases are supported on Q, K and V "
                     "only (Qwen2)");
    }
  }
  return absl::OkStatus();
}

absl::StatusOr<ModelConfig> ReadConfigJson(const std::string& dir) {
  const std::string path =
      (std::filesystem::path(dir) / "config.json").string();
  ASSIGN_OR_RETURN(const Json top, ParseConfigFile(path));
  ASSIGN_OR_RETURN(const Json* const text_config,
                   LanguageModelConfig(top, path));
  const Json& j = *text_config;
  const ConfigReader r(
      j, text_config == &top ? path : absl::StrCat(path, " text_config"));

  ModelConfig c;
  ASSIGN_OR_RETURN(c.architecture, ReadModelType(j, r));
  ASSIGN_OR_RETURN(c.name, r.String("_name_or_path", ""));
  if (c.name.empty()) c.name = std::filesystem::path(dir).filename().string();

  RETURN_IF_ERROR(ReadDimensions(r, c));
  RETURN_IF_ERROR(ReadRopeThetaAndNormEps(r, c));
  ASSIGN_OR_RETURN(c.tied_embeddings, r.Bool("tie_word_embeddings", false));
  // DeepSeek V3's and GLM-4.5's multi-token-prediction layers follow the
  // model's in the checkpoint.
  ASSIGN_OR_RETURN(c.n_nextn_layers, r.Int("num_nextn_predict_layers", 0));
  c.rope_style = RopeStyle::kRotateHalf;
  if (r.Has("quantization_config")) RETURN_IF_ERROR(ReadFp8Config(j, r, c));
  ASSIGN_OR_RETURN(c.bos_id, r.TokenId("bos_token_id"));
  ASSIGN_OR_RETURN(c.eos_id, r.TokenId("eos_token_id"));

  // Features that would silently change the math if ignored.
  if (r.Has("rope_scaling")) {
    RETURN_IF_ERROR(ReadTopRopeScaling(j, r, path, c));
  }
  const bool gemma =
      c.architecture == "gemma3_text" || c.architecture == "gemma2";
  RETURN_IF_ERROR(ReadWindowAndFamily(j, r, gemma, c));
  ASSIGN_OR_RETURN(const std::string act, r.String("hidden_act", "silu"));
  if (act != "silu" && !gemma) {
    return r.Error("hidden_act",
                   absl::StrCat("= '", act, "'; only 'silu' is supported"));
  }
  // Qwen3: per-head q/k RMSNorm, always (Gemma 3's: ReadGemma).
  c.qk_norm =
      c.qk_norm || c.architecture == "qwen3" || c.architecture == "qwen3_moe";
  // (GLM-4.5's use_qk_norm: ReadGlm4Moe, from ReadExperts.)
  RETURN_IF_ERROR(ReadExperts(j, r, c));
  RETURN_IF_ERROR(ReadBiases(r, c));

  if (absl::Status s = c.Validate(); !s.ok()) {
    return absl::InvalidArgumentError(absl::StrCat(path, ": ", s.message()));
  }
  return c;
}

// ------------------------------------------------------------ tensor names ---

// Hugging Face names of the tensors outside the layers, and their
// canonical (GGUF) names.
constexpr std::pair<std::string_view, std::string_view> kGlobalNames[] = {
    {"model.embed_tokens.weight", "token_embd.weight"},
    {"model.norm.weight", "output_norm.weight"},
    {"lm_head.weight", "output.weight"},
};

// A layer's tensors: the name after "model.layers.N.", and the canonical
// name after "blk.N.".
constexpr std::pair<std::string_view, std::string_view> kLayerNames[] = {
    {"input_layernorm.weight", "attn_norm.weight"},
    {"post_attention_layernorm.weight", "ffn_norm.weight"},
    {"self_attn.q_proj.weight", "attn_q.weight"},
    {"self_attn.k_proj.weight", "attn_k.weight"},
    {"self_attn.v_proj.weight", "attn_v.weight"},
    {"self_attn.q_proj.bias", "attn_q.bias"},
    {"self_attn.k_proj.bias", "attn_k.bias"},
    {"self_attn.v_proj.bias", "attn_v.bias"},
    {"self_attn.o_proj.weight", "attn_output.weight"},
    {"mlp.gate_proj.weight", "ffn_gate.weight"},
    {"mlp.up_proj.weight", "ffn_up.weight"},
    {"mlp.down_proj.weight", "ffn_down.weight"},
    {"self_attn.q_norm.weight", "attn_q_norm.weight"},
    {"self_attn.k_norm.weight", "attn_k_norm.weight"},
    {"mlp.gate.weight", "ffn_gate_inp.weight"},               // Qwen3-MoE
    {"block_sparse_moe.gate.weight", "ffn_gate_inp.weight"},  // Mixtral
    // GLM-4.5: the router's choice bias and the shared experts.
    {"mlp.gate.e_score_correction_bias", "exp_probs_b.bias"},
    {"mlp.shared_experts.gate_proj.weight", "ffn_gate_shexp.weight"},
    {"mlp.shared_experts.up_proj.weight", "ffn_up_shexp.weight"},
    {"mlp.shared_experts.down_proj.weight", "ffn_down_shexp.weight"},
    // DeepSeek V2 / V3: multi-head latent attention.
    {"self_attn.q_a_proj.weight", "attn_q_a.weight"},
    {"self_attn.q_a_layernorm.weight", "attn_q_a_norm.weight"},
    {"self_attn.q_b_proj.weight", "attn_q_b.weight"},
    {"self_attn.kv_a_proj_with_mqa.weight", "attn_kv_a_mqa.weight"},
    {"self_attn.kv_a_layernorm.weight", "attn_kv_a_norm.weight"},
    {"self_attn.kv_b_proj.weight", "attn_kv_b.weight"},
    // gpt-oss: sinks, the output bias, the router, and the experts as
    // its folders ship them (MXFP4 _blocks and _scales, gate and up
    // interleaved by row; worker/llama_weights.cc reads them), or
    // dequantized ([experts, in, out]).
    {"self_attn.sinks", "attn_sinks.weight"},
    {"self_attn.o_proj.bias", "attn_output.bias"},
    {"mlp.router.weight", "ffn_gate_inp.weight"},
    {"mlp.router.bias", "ffn_gate_inp.bias"},
    {"mlp.experts.gate_up_proj_blocks", "ffn_gate_up_exps.blocks"},
    {"mlp.experts.gate_up_proj_scales", "ffn_gate_up_exps.scales"},
    {"mlp.experts.gate_up_proj_bias", "ffn_gate_up_exps.bias"},
    {"mlp.experts.down_proj_blocks", "ffn_down_exps.blocks"},
    {"mlp.experts.down_proj_scales", "ffn_down_exps.scales"},
    {"mlp.experts.down_proj_bias", "ffn_down_exps.bias"},
    {"mlp.experts.gate_up_proj", "ffn_gate_up_exps.weight_t"},
    {"mlp.experts.down_proj", "ffn_down_exps.weight_t"},
    // Qwen3.5's Gated DeltaNet layers (value heads grouped, not tiled
    // as llama.cpp writes them; A_log and conv1d [C, 1, W] as shipped:
    // worker/llama_weights.cc reads both forms).
    {"linear_attn.in_proj_qkv.weight", "attn_qkv.weight"},
    {"linear_attn.in_proj_z.weight", "attn_gate.weight"},
    {"linear_attn.in_proj_b.weight", "ssm_beta.weight"},
    {"linear_attn.in_proj_a.weight", "ssm_alpha.weight"},
    {"linear_attn.dt_bias", "ssm_dt.bias"},
    {"linear_attn.A_log", "ssm_a_log"},
    {"linear_attn.conv1d.weight", "ssm_conv1d.weight"},
    {"linear_attn.norm.weight", "ssm_norm.weight"},
    {"linear_attn.out_proj.weight", "ssm_out.weight"},
    // Qwen3-Next's: q, k, v, z and b, a fused per key head, as
    // llama.cpp's ssm_in and ssm_ba; its one shared expert and gate.
    {"linear_attn.in_proj_qkvz.weight", "ssm_in.weight"},
    {"linear_attn.in_proj_ba.weight", "ssm_ba.weight"},
    {"mlp.shared_expert.gate_proj.weight", "ffn_gate_shexp.weight"},
    {"mlp.shared_expert.up_proj.weight", "ffn_up_shexp.weight"},
    {"mlp.shared_expert.down_proj.weight", "ffn_down_shexp.weight"},
    {"mlp.shared_expert_gate.weight", "ffn_gate_inp_shexp.weight"},
};

// Gemma's layer norms (with post_norms), ahead of kLayerNames.
constexpr std::pair<std::string_view, std::string_view> kGemmaNames[] = {
    {"post_attention_layernorm.weight", "post_attention_norm.weight"},
    {"pre_feedforward_layernorm.weight", "ffn_norm.weight"},
    {"post_feedforward_layernorm.weight", "post_ffw_norm.weight"},
};

// Experts, one tensor each: blk.N.ffn_{gate,up,down}.E.weight (the
// per-expert names llama.cpp's older Mixtral files use).
constexpr std::string_view kExpertPrefixes[] = {"mlp.experts.",
                                                "block_sparse_moe.experts."};
constexpr std::pair<std::string_view, std::string_view> kExpertMatrixNames[] = {
    {"gate_proj.weight", "ffn_gate"}, {"up_proj.weight", "ffn_up"},
    {"down_proj.weight", "ffn_down"}, {"w1.weight", "ffn_gate"},
    {"w3.weight", "ffn_up"},          {"w2.weight", "ffn_down"}};

// The canonical name of an expert's matrix of layer `layer`, `suffix` the
// Hugging Face name after "model.layers.N.", or nullopt.
std::optional<std::string> ExpertTensorName(uint32_t layer,
                                            std::string_view suffix) {
  for (const std::string_view prefix : kExpertPrefixes) {
    if (!suffix.starts_with(prefix)) continue;
    const std::string_view e = suffix.substr(prefix.size());
    const size_t edot = e.find('.');
    uint32_t expert = 0;
    if (edot == std::string_view::npos || edot == 0 || edot > 5 ||
        !absl::SimpleAtoi(Sv(e.substr(0, edot)), &expert) ||
        absl::StrCat(expert) != e.substr(0, edot)) {
      return std::nullopt;
    }
    for (const auto& [from, to] : kExpertMatrixNames) {
      if (e.substr(edot + 1) == from) {
        return absl::StrCat("blk.", layer, ".", Sv(to), ".", expert, ".weight");
      }
    }
  }
  return std::nullopt;
}

// The canonical (GGUF) name of a Hugging Face Llama tensor, or nullopt when
// the name is not one we know. With post_norms (Gemma) the layer has norms
// after attention and the FFN, and post_attention_layernorm is the first
// of them, not the FFN's input norm (pre_feedforward_layernorm).
std::optional<std::string> CanonicalName(std::string_view hf, bool post_norms) {
  // Qwen3.5's ConditionalGeneration folders hold the text model under
  // model.language_model. (its vision tower, under model.visual., is
  // not read).
  std::string unnested;
  if (constexpr std::string_view kNested = "model.language_model.";
      hf.starts_with(kNested)) {
    unnested = absl::StrCat("model.", Sv(hf.substr(kNested.size())));
    hf = unnested;
  }
  for (const auto& [from, to] : kGlobalNames) {
    if (hf == from) return std::string(to);
  }
  constexpr std::string_view kPrefix = "model.layers.";
  if (!hf.starts_with(kPrefix)) return std::nullopt;
  std::string_view rest = hf.substr(kPrefix.size());
  const size_t dot = rest.find('.');
  if (dot == std::string_view::npos || dot == 0 || dot > 6) {
    return std::nullopt;
  }
  const std::string_view digits = rest.substr(0, dot);
  uint32_t layer = 0;
  if (!absl::SimpleAtoi(Sv(digits), &layer) || absl::StrCat(layer) != digits) {
    return std::nullopt;  // Not plain decimal (sign, leading zero, ...).
  }
  const std::string_view suffix = rest.substr(dot + 1);
  for (const auto& [from, to] : kGemmaNames) {
    if (post_norms && suffix == from) {
      return absl::StrCat("blk.", layer, ".", Sv(to));
    }
  }
  for (const auto& [from, to] : kLayerNames) {
    if (suffix == from) return absl::StrCat("blk.", layer, ".", Sv(to));
  }
  return ExpertTensorName(layer, suffix);
}

// Returns the layer index of a canonical "blk.N.*" name, or -1.
int64_t LayerOf(std::string_view canonical) {
  if (!canonical.starts_with("blk.")) return -1;
  canonical.remove_prefix(4);
  int64_t layer = -1;
  if (!absl::SimpleAtoi(Sv(canonical.substr(0, canonical.find('.'))), &layer)) {
    return -1;
  }
  return layer;
}

// ------------------------------------------------------- safetensors file ---

struct DTypeEntry {
  std::string_view name;
  int64_t size;
  std::optional<DType> dtype;  // nullopt: known to safetensors, unsupported.
};

const DTypeEntry* LookupDType(std::string_view name) {
  static const DTypeEntry kTable[] = {
      {"F32", 4, DType::kF32},      {"F16", 2, DType::kF16},
      {"BF16", 2, DType::kBF16},    {"F64", 8, std::nullopt},
      {"I64", 8, std::nullopt},     {"I32", 4, std::nullopt},
      {"I16", 2, std::nullopt},     {"I8", 1, std::nullopt},
      {"U64", 8, std::nullopt},     {"U32", 4, std::nullopt},
      {"U16", 2, std::nullopt},     {"U8", 1, std::nullopt},
      {"BOOL", 1, std::nullopt},    {"F8_E4M3", 1, DType::kF8E4M3},
      {"F8_E5M2", 1, std::nullopt},
  };
  for (const DTypeEntry& e : kTable) {
    if (e.name == name) return &e;
  }
  return nullptr;
}

struct FileEntry {
  std::string hf_name;
  TensorInfo info;
  bool keep = true;  // False for unknown tensors of an unsupported dtype.
};

// A safetensors file's parsed header, and where its data region lies.
struct SafetensorsHeader {
  Json json;
  uint64_t data_start = 0;  // After the 8-byte length and the header.
  uint64_t data_size = 0;
  uint64_t file_size = 0;
};

// Reads `file`'s header: its u64 length, checked against the limit and the
// file, then a JSON object that names no tensor twice.
absl::StatusOr<SafetensorsHeader> ReadSafetensorsHeader(
    const MappedFile& file) {
  const std::string& path = file.path();
  const absl::Span<const uint8_t> bytes = file.bytes();
  auto error = [&path](auto&&... parts) {
    return absl::InvalidArgumentError(absl::StrCat(path, ": ", parts...));
  };
  if (bytes.size() < 8) {
    return error("file is ", bytes.size(),
                 " bytes, too short for the 8-byte header length");
  }
  uint64_t header_len = 0;
  for (int i = 7; i >= 0; --i) header_len = (header_len << 8) | bytes[i];
  const uint64_t available = bytes.size() - 8;
  if (header_len > kMaxHeaderBytes) {
    return error("header length ", header_len, " at offset 0 exceeds the ",
                 kMaxHeaderBytes, "-byte limit");
  }
  if (header_len > available) {
    return error("header length ", header_len, " at offset 0 runs past the ",
                 bytes.size(), "-byte file");
  }
  SafetensorsHeader header;
  header.data_start = 8 + header_len;
  header.data_size = bytes.size() - header.data_start;
  header.file_size = bytes.size();
  const std::string_view text(reinterpret_cast<const char*>(bytes.data() + 8),
                              header_len);
  std::string duplicate;
  ASSIGN_OR_RETURN(header.json,
                   ParseJson(text, absl::StrCat(path, ": header"), &duplicate));
  if (!header.json.is_object()) {
    return error("header is a JSON ", JsonTypeName(header.json),
                 ", not an object");
  }
  if (!duplicate.empty()) {
    return error("tensor '", duplicate, "' appears twice in the header");
  }
  return header;
}

// Errors about one tensor of a safetensors file, naming the file and the
// tensor.
struct TensorErrors {
  std::string_view path;
  std::string_view tensor;

  template <typename... Parts>
  absl::Status operator()(const Parts&... parts) const {
    return absl::InvalidArgumentError(
        absl::StrCat(Sv(path), ": tensor '", Sv(tensor), "': ", parts...));
  }
};

// A tensor's shape (into `shape`): at most kMaxRank dimensions, each at
// most kMaxDim. Returns its element count, at most kMaxElements.
absl::StatusOr<int64_t> ReadShape(const Json& t, const TensorErrors& terror,
                                  Shape& shape) {
  auto sh = t.find("shape");
  if (sh == t.end() || !sh->is_array()) {
    return terror("missing or non-array 'shape'");
  }
  if (sh->size() > kMaxRank) {
    return terror("shape has ", sh->size(), " dimensions, more than ",
                  kMaxRank);
  }
  int64_t numel = 1;
  for (const Json& d : *sh) {
    std::optional<int64_t> v = AsNonNegative(d);
    if (!v.has_value() || *v > kMaxDim) {
      return terror("shape dimension ", Brief(d), " is not an integer in [0, ",
                    kMaxDim, "]");
    }
    shape.push_back(*v);
    if (*v != 0 && numel > kMaxElements / *v) {
      return terror("shape ", Brief(*sh), " has more than ", kMaxElements,
                    " elements");
    }
    numel *= *v;
  }
  return numel;
}

// A tensor's data_offsets: a [begin, end] pair inside the data region,
// `nbytes` apart (what its dtype and shape need). Returns begin.
absl::StatusOr<int64_t> ReadDataOffsets(const Json& t,
                                        const SafetensorsHeader& header,
                                        const TensorErrors& terror,
                                        const std::string& dtype_name,
                                        const Shape& shape, int64_t nbytes) {
  auto off = t.find("data_offsets");
  if (off == t.end() || !off->is_array() || off->size() != 2) {
    return terror("missing 'data_offsets' or not a [begin, end] pair");
  }
  std::optional<int64_t> begin = AsNonNegative((*off)[0]);
  std::optional<int64_t> end = AsNonNegative((*off)[1]);
  if (!begin.has_value() || !end.has_value()) {
    return terror("data_offsets ", Brief(*off),
                  " are not non-negative 64-bit integers");
  }
  if (*end < *begin) {
    return terror("data_offsets ", Brief(*off), " end before they begin");
  }
  if (static_cast<uint64_t>(*end) > header.data_size) {
    return terror("data_offsets ", Brief(*off), " (absolute ",
                  header.data_start + *begin, "..", header.data_start + *end,
                  ") run past the end of the ", header.file_size, "-byte file");
  }
  if (*end - *begin != nbytes) {
    return terror("data_offsets ", Brief(*off), " hold ", *end - *begin,
                  " bytes but ", dtype_name, " ", ShapeString(shape), " needs ",
                  nbytes);
  }
  return *begin;
}

// Names entry `e` (its hf_name set) and gives it its dtype: a tensor we
// know takes its canonical name, one we do not keeps its own and is not
// loaded when its dtype is unsupported; a known tensor of an unsupported
// dtype or of a layer beyond the model's is refused.
absl::Status NameEntry(const DTypeEntry& dtype, const std::string& dtype_name,
                       const ModelConfig& config, const TensorErrors& terror,
                       FileEntry& e) {
  const std::string& name = e.hf_name;
  // An FP8 weight's block scales take its canonical name plus _scale_inv.
  constexpr std::string_view kScale = "_scale_inv";
  std::optional<std::string> canonical;
  if (name.ends_with(kScale)) {
    canonical = CanonicalName(
        std::string_view(name).substr(0, name.size() - kScale.size()),
        config.post_norms);
    if (canonical.has_value()) *canonical += kScale;
  } else {
    canonical = CanonicalName(name, config.post_norms);
  }
  // gpt-oss's MXFP4 experts: raw bytes, repacked by the loader.
  const bool mxfp4_part =
      canonical.has_value() && dtype_name == "U8" &&
      (canonical->ends_with(".blocks") || canonical->ends_with(".scales"));
  if (mxfp4_part) {
    e.info.dtype = DType::kI8;
  } else if (!dtype.dtype.has_value()) {
    if (canonical.has_value()) {
      return terror("dtype ", dtype_name,
                    " is not supported (F32, F16, BF16 and F8_E4M3 are)");
    }
    e.keep = false;  // An unknown extra tensor (e.g. int64 buffers).
  }
  if (canonical.has_value()) {
    const int64_t n_layers = config.n_layers;
    const int64_t layer = LayerOf(*canonical);
    if (layer >= n_layers && layer < n_layers + config.n_nextn_layers) {
      e.keep = false;  // A multi-token-prediction layer: not loaded.
    } else if (layer >= n_layers) {
      return terror("layer ", layer,
                    " is beyond num_hidden_layers = ", n_layers);
    }
  }
  e.info.name = canonical.has_value() ? *std::move(canonical) : name;
  if (!mxfp4_part) e.info.dtype = dtype.dtype.value_or(DType::kF32);
  return absl::OkStatus();
}

// Sorts `entries` by offset. No two tensors may share bytes (empty tensors
// share nothing).
absl::Status CheckNoOverlap(const std::string& path,
                            std::vector<FileEntry>& entries) {
  std::sort(entries.begin(), entries.end(),
            [](const FileEntry& a, const FileEntry& b) {
              return a.info.offset < b.info.offset;
            });
  const FileEntry* prev = nullptr;
  for (const FileEntry& e : entries) {
    if (e.info.bytes == 0) continue;
    if (prev != nullptr &&
        e.info.offset < prev->info.offset + prev->info.bytes) {
      return absl::InvalidArgumentError(absl::StrCat(
          path, ": tensor '", e.hf_name, "' at offset ", e.info.offset,
          " overlaps tensor '", prev->hf_name, "' at offset ",
          prev->info.offset, " (", prev->info.bytes, " bytes)"));
    }
    prev = &e;
  }
  return absl::OkStatus();
}

// Parses one safetensors file's header; offsets in the result are absolute.
absl::StatusOr<std::vector<FileEntry>> ParseSafetensorsHeader(
    const MappedFile& file, int file_index, const ModelConfig& config) {
  const std::string& path = file.path();
  ASSIGN_OR_RETURN(const SafetensorsHeader header, ReadSafetensorsHeader(file));

  std::vector<FileEntry> entries;
  // Bounded by the (checked) header size.
  entries.reserve(header.json.size());
  for (const auto& [name, t] : header.json.items()) {
    if (name == "__metadata__") {
      if (!t.is_object()) {
        return absl::InvalidArgumentError(
            absl::StrCat(path, ": __metadata__ is not an object"));
      }
      continue;
    }
    const TensorErrors terror{path, name};
    if (!t.is_object()) return terror("entry is not an object");

    // dtype
    auto dt = t.find("dtype");
    if (dt == t.end() || !dt->is_string()) {
      return terror("missing or non-string 'dtype'");
    }
    const std::string& dtype_name = dt->get_ref<const std::string&>();
    const DTypeEntry* dtype = LookupDType(dtype_name);
    if (dtype == nullptr) return terror("unknown dtype '", dtype_name, "'");

    Shape shape;
    ASSIGN_OR_RETURN(const int64_t numel, ReadShape(t, terror, shape));
    const int64_t nbytes = numel * dtype->size;  // numel <= 2^48: no overflow.
    ASSIGN_OR_RETURN(
        const int64_t begin,
        ReadDataOffsets(t, header, terror, dtype_name, shape, nbytes));

    FileEntry e;
    e.hf_name = name;
    RETURN_IF_ERROR(NameEntry(*dtype, dtype_name, config, terror, e));
    e.info.shape = std::move(shape);
    e.info.file = file_index;
    e.info.offset = header.data_start + static_cast<uint64_t>(begin);
    e.info.bytes = static_cast<uint64_t>(nbytes);
    entries.push_back(std::move(e));
  }
  RETURN_IF_ERROR(CheckNoOverlap(path, entries));
  return entries;
}

class SafetensorsWeights final : public WeightSource {
 public:
  SafetensorsWeights(ModelConfig config,
                     std::vector<std::unique_ptr<MappedFile>> files,
                     std::vector<TensorInfo> tensors)
      : config_(std::move(config)),
        files_(std::move(files)),
        tensors_(std::move(tensors)) {}

  const ModelConfig& config() const override { return config_; }
  const std::vector<TensorInfo>& tensors() const override { return tensors_; }

  absl::Span<const uint8_t> Data(const TensorInfo& info) const override {
    SHARDLM_CHECK(info.file >= 0 && info.file < static_cast<int>(files_.size()),
                  "tensor ", info.name, " has file index ", info.file);
    const absl::Span<const uint8_t> bytes = files_[info.file]->bytes();
    SHARDLM_CHECK(
        info.offset <= bytes.size() && info.bytes <= bytes.size() - info.offset,
        "tensor ", info.name, " is not inside its file");
    return bytes.subspan(info.offset, info.bytes);
  }

  std::string format() const override {
    return absl::StrCat("safetensors (", files_.size(),
                        files_.size() == 1 ? " file)" : " files)");
  }

 private:
  ModelConfig config_;
  std::vector<std::unique_ptr<MappedFile>> files_;
  std::vector<TensorInfo> tensors_;
};

}  // namespace

absl::StatusOr<ModelConfig> ReadHfConfig(const std::string& dir) {
  return ReadConfigJson(dir);
}

absl::StatusOr<std::unique_ptr<WeightSource>> OpenSafetensorsWeights(
    const std::string& dir) {
  ASSIGN_OR_RETURN(ModelConfig config, ReadConfigJson(dir));

  std::vector<std::string> paths;
  std::error_code ec;
  for (std::filesystem::directory_iterator it(dir, ec), end; !ec && it != end;
       it.increment(ec)) {
    const std::filesystem::path& p = it->path();
    if (p.extension() == ".safetensors" && it->is_regular_file(ec)) {
      paths.push_back(p.string());
      if (paths.size() > kMaxFiles) {
        return absl::InvalidArgumentError(absl::StrCat(
            dir, " holds more than ", kMaxFiles, " .safetensors files"));
      }
    }
  }
  if (ec) {
    return absl::InvalidArgumentError(
        absl::StrCat("cannot list ", dir, ": ", ec.message()));
  }
  if (paths.empty()) {
    return absl::NotFoundError(
        absl::StrCat(dir, " holds no .safetensors files"));
  }
  std::sort(paths.begin(), paths.end());

  std::vector<std::unique_ptr<MappedFile>> files;
  std::vector<TensorInfo> tensors;
  std::map<std::string, std::string, std::less<>> origin;  // name -> file.
  for (const std::string& path : paths) {
    ASSIGN_OR_RETURN(std::unique_ptr<MappedFile> file, MappedFile::Open(path));
    ASSIGN_OR_RETURN(
        std::vector<FileEntry> entries,
        ParseSafetensorsHeader(*file, static_cast<int>(files.size()), config));
    for (FileEntry& e : entries) {
      if (!e.keep) continue;
      auto [it, inserted] = origin.emplace(e.info.name, path);
      if (!inserted) {
        return absl::InvalidArgumentError(
            absl::StrCat(path, ": tensor '", e.hf_name, "' (", e.info.name,
                         ") is also defined in ", it->second));
      }
      tensors.push_back(std::move(e.info));
    }
    files.push_back(std::move(file));
  }
  return std::unique_ptr<WeightSource>(new SafetensorsWeights(
      std::move(config), std::move(files), std::move(tensors)));
}

}  // namespace shardlm
