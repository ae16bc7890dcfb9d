#include "worker/llama_weights.h"

#include "absl/strings/str_cat.h"
#include "core/status.h"
#include "model/dequantize.h"

namespace shardlm {
namespace {

absl::StatusOr<Tensor> Load(const WeightSource& source, const std::string& name,
                            const Shape& shape) {
  ASSIGN_OR_RETURN(const TensorInfo* info, source.Require(name, shape));
  return DequantizeTensor(source, *info);
}

}  // namespace

int64_t LlamaWeights::bytes() const {
  int64_t total = token_embd.bytes() + output_norm.bytes();
  if (lm_head.raw() != token_embd.raw()) total += lm_head.bytes();
  for (const LlamaLayerWeights& l : layers) {
    for (const Tensor* t : {&l.attn_norm, &l.wq, &l.wk, &l.wv, &l.wo,
                            &l.ffn_norm, &l.w_gate, &l.w_up, &l.w_down}) {
      total += t->bytes();
    }
  }
  return total;
}

absl::StatusOr<LlamaWeights> LoadLlamaWeights(const WeightSource& source) {
  LlamaWeights w;
  w.config = source.config();
  const ModelConfig& c = w.config;
  const int64_t q_dim = c.n_heads * c.head_dim;
  const int64_t kv_dim = c.n_kv_heads * c.head_dim;
  ASSIGN_OR_RETURN(w.token_embd,
                   Load(source, "token_embd.weight", {c.vocab_size, c.hidden}));
  ASSIGN_OR_RETURN(w.output_norm,
                   Load(source, "output_norm.weight", {c.hidden}));
  if (c.tied_embeddings) {
    w.lm_head = w.token_embd;
  } else {
    ASSIGN_OR_RETURN(w.lm_head,
                     Load(source, "output.weight", {c.vocab_size, c.hidden}));
  }
  for (int64_t i = 0; i < c.n_layers; ++i) {
    const std::string p = absl::StrCat("blk.", i, ".");
    LlamaLayerWeights l;
    ASSIGN_OR_RETURN(l.attn_norm,
                     Load(source, p + "attn_norm.weight", {c.hidden}));
    ASSIGN_OR_RETURN(l.wq,
                     Load(source, p + "attn_q.weight", {q_dim, c.hidden}));
    ASSIGN_OR_RETURN(l.wk,
                     Load(source, p + "attn_k.weight", {kv_dim, c.hidden}));
    ASSIGN_OR_RETURN(l.wv,
                     Load(source, p + "attn_v.weight", {kv_dim, c.hidden}));
    ASSIGN_OR_RETURN(l.wo,
                     Load(source, p + "attn_output.weight", {c.hidden, q_dim}));
    ASSIGN_OR_RETURN(l.ffn_norm,
                     Load(source, p + "ffn_norm.weight", {c.hidden}));
    ASSIGN_OR_RETURN(l.w_gate, Load(source, p + "ffn_gate.weight",
                                    {c.ffn_hidden, c.hidden}));
    ASSIGN_OR_RETURN(
        l.w_up, Load(source, p + "ffn_up.weight", {c.ffn_hidden, c.hidden}));
    ASSIGN_OR_RETURN(l.w_down, Load(source, p + "ffn_down.weight",
                                    {c.hidden, c.ffn_hidden}));
    w.layers.push_back(std::move(l));
  }
  return w;
}

}  // namespace shardlm
