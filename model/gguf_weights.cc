// ModelConfig and WeightSource on top of a parsed GGUF file.
#include "absl/strings/str_cat.h"
#include "core/status.h"
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

}  // namespace

absl::StatusOr<ModelConfig> ModelConfigFromGguf(const GgufFile& g) {
  ModelConfig c;
  ASSIGN_OR_RETURN(std::string_view arch, g.GetString("general.architecture"));
  c.architecture = std::string(arch);
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
  if (c.n_heads <= 0 || c.hidden % c.n_heads != 0) {
    return absl::InvalidArgumentError(
        absl::StrCat(g.name(), ": embedding_length ", c.hidden,
                     " is not a multiple of head_count ", c.n_heads));
  }
  c.head_dim = c.hidden / c.n_heads;
  ASSIGN_OR_RETURN(int64_t rope_dims,
                   IntOr(g, p + "rope.dimension_count", c.head_dim));
  if (rope_dims != c.head_dim) {
    return absl::UnimplementedError(
        absl::StrCat(g.name(), ": partial RoPE (", rope_dims, " of ",
                     c.head_dim, " dimensions) is not supported"));
  }

  // The vocabulary size: explicit key, else the embedding's row count.
  int64_t vocab = 0;
  for (const TensorInfo& t : g.tensors()) {
    if (t.name == "token_embd.weight" && t.shape.size() == 2) {
      vocab = t.shape[0];
    }
  }
  ASSIGN_OR_RETURN(c.vocab_size, IntOr(g, p + "vocab_size", vocab));
  c.tied_embeddings = true;
  for (const TensorInfo& t : g.tensors()) {
    if (t.name == "output.weight") c.tied_embeddings = false;
  }
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
  // llama.cpp's converter permutes Q/K rows so that RoPE pairs adjacent
  // dimensions.
  c.rope_style = RopeStyle::kAdjacentPairs;
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
