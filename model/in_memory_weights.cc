#include "model/in_memory_weights.h"

#include <cmath>
#include <cstring>
#include <random>

#include "absl/strings/str_cat.h"
#include "core/quant_blocks.h"

namespace shardlm {

void InMemoryWeights::AddF32(std::string name, Shape shape,
                             std::vector<float> values) {
  std::vector<uint8_t> bytes(values.size() * sizeof(float));
  std::memcpy(bytes.data(), values.data(), bytes.size());
  tensors_.push_back(TensorInfo{.name = std::move(name),
                                .dtype = DType::kF32,
                                .shape = std::move(shape),
                                .file = static_cast<int>(data_.size()),
                                .offset = 0,
                                .bytes = bytes.size()});
  data_.push_back(std::move(bytes));
}

void InMemoryWeights::AddRaw(std::string name, DType dtype, Shape shape,
                             std::vector<uint8_t> bytes) {
  tensors_.push_back(TensorInfo{.name = std::move(name),
                                .dtype = dtype,
                                .shape = std::move(shape),
                                .file = static_cast<int>(data_.size()),
                                .offset = 0,
                                .bytes = bytes.size()});
  data_.push_back(std::move(bytes));
}

absl::Span<const uint8_t> InMemoryWeights::Data(const TensorInfo& info) const {
  return data_[info.file];
}

ModelConfig SmallTestConfig() {
  ModelConfig c;
  c.n_layers = 4;
  c.hidden = 64;
  c.ffn_hidden = 128;
  c.n_heads = 4;
  c.n_kv_heads = 2;
  c.head_dim = 16;
  c.vocab_size = 97;
  c.context_length = 64;
  c.rope_theta = 10000.0f;
  return c;
}

std::unique_ptr<InMemoryWeights> RandomLlamaWeights(const ModelConfig& c,
                                                    uint32_t seed) {
  return RandomLlamaWeights(c, seed, DType::kF32);
}

std::unique_ptr<InMemoryWeights> RandomLlamaWeights(const ModelConfig& c,
                                                    uint32_t seed,
                                                    DType matrices) {
  auto w = std::make_unique<InMemoryWeights>(c);
  std::mt19937 rng(seed);
  const auto add = [&](std::string name, Shape shape, float mean,
                       float stddev) {
    std::normal_distribution<float> dist(mean, stddev);
    std::vector<float> v(NumElements(shape));
    for (float& x : v) x = dist(rng);
    w->AddF32(std::move(name), std::move(shape), std::move(v));
  };
  const auto matrix = [&](std::string name, int64_t out, int64_t in) {
    if (matrices == DType::kF32) {
      add(std::move(name), {out, in}, 0.0f, 1.0f / std::sqrt(float(in)));
      return;
    }
    // Random codes span about 30 levels times d: 1 / (30 sqrt(in)) keeps
    // the values near the f32 model's scale.
    std::vector<uint8_t> bytes(BytesFor(matrices, out * in).value());
    quant::FillRandomBlocks(matrices, bytes.data(),
                            out * in / BlockElems(matrices),
                            1.0f / (30 * std::sqrt(float(in))), rng);
    w->AddRaw(std::move(name), matrices, {out, in}, std::move(bytes));
  };
  const int64_t q_dim = c.n_heads * c.head_dim;
  const int64_t kv_dim = c.n_kv_heads * c.head_dim;
  add("token_embd.weight", {c.vocab_size, c.hidden}, 0.0f, 1.0f);
  add("output_norm.weight", {c.hidden}, 1.0f, 0.1f);
  if (!c.tied_embeddings) matrix("output.weight", c.vocab_size, c.hidden);
  for (int64_t i = 0; i < c.n_layers; ++i) {
    const std::string p = absl::StrCat("blk.", i, ".");
    add(p + "attn_norm.weight", {c.hidden}, 1.0f, 0.1f);
    if (c.LayerIsLinear(i)) {
      // A Gated DeltaNet layer as llama.cpp names it: decays of a few
      // tenths to a few units (ssm_a = -exp(A_log) < 0), betas about 1/2.
      const int64_t qk = 2 * c.ssm_k_heads * c.ssm_k_dim;
      const int64_t values = c.ssm_v_heads * c.ssm_v_dim;
      matrix(p + "attn_qkv.weight", qk + values, c.hidden);
      matrix(p + "attn_gate.weight", values, c.hidden);
      matrix(p + "ssm_beta.weight", c.ssm_v_heads, c.hidden);
      matrix(p + "ssm_alpha.weight", c.ssm_v_heads, c.hidden);
      add(p + "ssm_dt.bias", {c.ssm_v_heads}, 0.0f, 0.5f);
      std::normal_distribution<float> log_a(-0.5f, 0.5f);
      std::vector<float> a(c.ssm_v_heads);
      for (float& x : a) x = -std::exp(log_a(rng));
      w->AddF32(p + "ssm_a", {c.ssm_v_heads}, std::move(a));
      add(p + "ssm_conv1d.weight", {qk + values, c.ssm_conv_width}, 0.0f,
          1.0f / std::sqrt(float(c.ssm_conv_width)));
      add(p + "ssm_norm.weight", {c.ssm_v_dim}, 1.0f, 0.1f);
      matrix(p + "ssm_out.weight", c.hidden, values);
    } else {
      // Gated attention: each head's query, then its gate.
      matrix(p + "attn_q.weight", (c.attention_gate ? 2 : 1) * q_dim, c.hidden);
      matrix(p + "attn_k.weight", kv_dim, c.hidden);
      matrix(p + "attn_v.weight", kv_dim, c.hidden);
      matrix(p + "attn_output.weight", c.hidden, q_dim);
    }
    if (c.qk_norm && !c.LayerIsLinear(i)) {
      add(p + "attn_q_norm.weight", {c.head_dim}, 1.0f, 0.1f);
      add(p + "attn_k_norm.weight", {c.head_dim}, 1.0f, 0.1f);
    }
    add(p + "ffn_norm.weight", {c.hidden}, 1.0f, 0.1f);
    if (c.is_moe()) {
      // A decisive router (logits of a few units) and one tensor per
      // expert, as Hugging Face folders name them.
      add(p + "ffn_gate_inp.weight", {c.n_experts, c.hidden}, 0.0f,
          4.0f / std::sqrt(float(c.hidden)));
      for (int64_t e = 0; e < c.n_experts; ++e) {
        const std::string x = absl::StrCat(".", e, ".weight");
        matrix(p + "ffn_gate" + x, c.expert_ffn_hidden, c.hidden);
        matrix(p + "ffn_up" + x, c.expert_ffn_hidden, c.hidden);
        matrix(p + "ffn_down" + x, c.hidden, c.expert_ffn_hidden);
      }
      continue;
    }
    matrix(p + "ffn_gate.weight", c.ffn_hidden, c.hidden);
    matrix(p + "ffn_up.weight", c.ffn_hidden, c.hidden);
    matrix(p + "ffn_down.weight", c.hidden, c.ffn_hidden);
  }
  return w;
}

}  // namespace shardlm
