// The weights one worker holds, as f32 host tensors.
#ifndef SHARDLM_WORKER_LLAMA_WEIGHTS_H_
#define SHARDLM_WORKER_LLAMA_WEIGHTS_H_

#include <cstdint>
#include <vector>

#include "absl/status/statusor.h"
#include "core/tensor.h"
#include "model/model_config.h"
#include "model/weight_source.h"

namespace shardlm {

struct LlamaLayerWeights {
  Tensor attn_norm;  // [hidden]
  Tensor wq;         // [heads * head_dim, hidden]
  Tensor wk;         // [kv_heads * head_dim, hidden]
  Tensor wv;         // [kv_heads * head_dim, hidden]
  Tensor wo;         // [hidden, heads * head_dim]
  Tensor ffn_norm;   // [hidden]
  Tensor w_gate;     // [ffn_hidden, hidden]
  Tensor w_up;       // [ffn_hidden, hidden]
  Tensor w_down;     // [hidden, ffn_hidden]
};

struct LlamaWeights {
  ModelConfig config;
  Tensor token_embd;  // [vocab, hidden]
  std::vector<LlamaLayerWeights> layers;
  Tensor output_norm;  // [hidden]
  Tensor lm_head;      // [vocab, hidden]; shares token_embd when tied.

  // Bytes of f32 weights read by one forward step (each matrix once).
  int64_t bytes() const;
};

// Reads and dequantizes every tensor, checking each shape against the
// config. Errors name the tensor.
absl::StatusOr<LlamaWeights> LoadLlamaWeights(const WeightSource& source);

}  // namespace shardlm

#endif  // SHARDLM_WORKER_LLAMA_WEIGHTS_H_
