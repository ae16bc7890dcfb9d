// Hyper-parameters of a Llama-family model, read from GGUF metadata or from
// a Hugging Face config.json.
#ifndef SHARDLM_MODEL_MODEL_CONFIG_H_
#define SHARDLM_MODEL_MODEL_CONFIG_H_

#include <cstdint>
#include <string>

#include "absl/status/status.h"

namespace shardlm {

// How RoPE pairs the dimensions of a head. llama.cpp's converter permutes
// the Q/K rows of Llama weights, so GGUF files rotate adjacent pairs
// (x[2i], x[2i+1]); Hugging Face weights rotate halves (x[i], x[i+d/2]).
// Using the wrong one gives plausible but wrong text.
enum class RopeStyle : uint8_t { kAdjacentPairs, kRotateHalf };

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
  int32_t bos_id = -1;
  int32_t eos_id = -1;

  // InvalidArgument naming the field when a value is missing, absurd, or
  // inconsistent (e.g. n_heads not a multiple of n_kv_heads).
  absl::Status Validate() const;
  std::string DebugString() const;
};

}  // namespace shardlm

#endif  // SHARDLM_MODEL_MODEL_CONFIG_H_
