// The weights one worker holds (its shard): host tensors as loaded
// (matrices in GGUF block formats stay in their blocks, read in place by
// the CPU kernels; everything else is f32), or their device copy
// (UploadLlamaWeights: bf16 matrices, f32 norms).
#ifndef SHARDLM_WORKER_LLAMA_WEIGHTS_H_
#define SHARDLM_WORKER_LLAMA_WEIGHTS_H_

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "core/tensor.h"
#include "model/model_config.h"
#include "model/shard_plan.h"
#include "model/weight_source.h"

namespace shardlm {

// Shapes are those of the shard: h = heads held, kv = KV heads held,
// f = FFN columns held, d = head_dim.
struct LlamaLayerWeights {
  Tensor attn_norm;       // [hidden]
  Tensor wq;              // [h * d, hidden]      column-parallel
  Tensor wk;              // [kv * d, hidden]     column-parallel
  Tensor wv;              // [kv * d, hidden]     column-parallel
  Tensor bq, bk, bv;      // [h * d], [kv * d], [kv * d] f32 when the model has
                          // attention biases (Qwen2), else empty.
  Tensor wo;              // [hidden, h * d]      row-parallel (partial sums;
                          // h * vd under MLA)
  Tensor ffn_norm;        // [hidden]
  Tensor w_gate;          // [f, hidden]          column-parallel
  Tensor w_up;            // [f, hidden]          column-parallel
  Tensor w_down;          // [hidden, f]          row-parallel (partial sums)
  Tensor q_norm, k_norm;  // [d] f32: Qwen3's per-head RMSNorm weights, or
                          // empty.
  // Gemma (ModelConfig::post_norms): the RMSNorms of attention's and the
  // FFN's outputs, [hidden] f32, or empty.
  Tensor post_attn_norm, post_ffn_norm;
  // A mixture of experts (ModelConfig::LayerIsMoe(); w_gate, w_up and
  // w_down are empty then; a mixture's dense layers have only those), e =
  // experts held (ShardSpec::expert_begin..end), f = their FFN columns held:
  // expert i of the held ones is rows [i f, (i + 1) f) of exp_gate and exp_up
  // and rows [i hidden, (i + 1) hidden) of exp_down, each in its stored format.
  Tensor router;            // [n_experts, hidden] replicated, f32 or stored.
  Tensor exp_gate, exp_up;  // [e * f, hidden]
  Tensor exp_down;          // [e * hidden, f (+ padding: exp_down_offset)]
  int64_t exp_down_offset = 0;
  // The router's choice bias ([n_experts] f32, replicated; ModelConfig::
  // expert_score_bias) and the shared experts' SwiGLU FFN (s = its columns
  // held, ShardSpec::shared_ffn_begin..end), or empty.
  Tensor router_bias;
  // gpt-oss (ModelConfig::attention_sinks, output_bias, expert_biases), f32,
  // or empty: the sinks of the heads held [h]; the attention output's bias
  // [hidden] (replicated, added once after the TP reduction); the router
  // logits' bias [n_experts]; the held experts' biases, gate and up [e, f]
  // (their columns held) and down [e, hidden], which only the rank holding
  // an expert's first columns adds (ShardSpec::ffn_begin 0).
  Tensor sinks, bo, router_logit_bias;
  Tensor exp_gate_b, exp_up_b, exp_down_b;
  Tensor shared_gate, shared_up;  // [s, hidden]    column-parallel
  Tensor shared_down;             // [hidden, s (+ padding)] row-parallel
  int64_t shared_down_offset = 0;
  Tensor shared_gate_inp;  // [hidden] f32 (ModelConfig::shared_expert_gate)
  // The row-parallel matrices of a TP rank whose columns cut a block of
  // their format (heads of 64 or 128 values inside 256-value K-quant
  // super-blocks) hold the whole blocks around their columns: wo is then
  // [hidden, >= h * d], this rank's attention output multiplying its
  // columns [wo_offset, wo_offset + h * d) and zeros the rest (the forward
  // pass pads it); likewise w_down. 0 and the exact width otherwise (and
  // always on GPUs, whose upload cuts the padding off).
  int64_t wo_offset = 0;
  int64_t w_down_offset = 0;
  // Multi-head latent attention (ModelConfig::is_mla; wk, wv empty), r =
  // rope_dims, R = kv_lora_rank, d = head_dim (qk_nope + r, the rope part
  // last), vd = v_head_dim; wq is [h * d, hidden] without a q LoRA.
  Tensor wq_a;       // [q_lora_rank, hidden] replicated (q LoRA), or empty
  Tensor q_a_norm;   // [q_lora_rank] f32
  Tensor wq_b;       // [h * d, q_lora_rank]   column-parallel
  Tensor wkv_a;      // [R + r, hidden] replicated: the latent's rows, then
                     // the shared k_pe's
  Tensor kv_a_norm;  // [R] f32
  Tensor wk_b;       // [h * R, d - r] f32: head i's rows [i R, (i + 1) R)
                     // take its q_nope into the latent (absorbed)
  Tensor wv_b;       // [h * vd, R] f32: head i's values from the latent
  // A Gated DeltaNet layer (ModelConfig::LayerIsLinear; the attention's
  // tensors empty), nv = the value heads held (SsmValueHeads), k = every
  // q/k head's values (2 ssm_k_heads ssm_k_dim, replicated: the value
  // heads of one key head are not contiguous in llama.cpp's tiled order),
  // dv = ssm_v_dim, W = ssm_conv_width:
  Tensor ssm_qk;               // [k, hidden] replicated
  Tensor ssm_v;                // [nv dv, hidden]        column-parallel
  Tensor ssm_z;                // [nv dv, hidden]        column-parallel
  Tensor ssm_beta, ssm_alpha;  // [nv, hidden]           column-parallel
  Tensor ssm_dt, ssm_a;        // [nv] f32 (ssm_a = -exp(A_log))
  Tensor ssm_conv;             // [k + nv dv, W] f32: q/k channels, then v
  Tensor ssm_norm;             // [dv] f32 (the gated norm, no offset)
  Tensor ssm_out;  // [hidden, nv dv (+ padding: ssm_out_offset)] row-parallel
  int64_t ssm_out_offset = 0;
  // Fused on GPUs (UploadLlamaWeights), one GEMM each instead of three and
  // two; wq, wk, wv (bq, bk, bv) and w_gate, w_up are empty then.
  Tensor wqkv;       // [(h + 2 kv) * d, hidden]: wq's rows, wk's, wv's.
  Tensor bqkv;       // [(h + 2 kv) * d] f32, or empty (no biases).
  Tensor w_gate_up;  // [2 f, hidden]: w_gate's rows, then w_up's.
};

struct LlamaWeights {
  ModelConfig config;  // The whole model's.
  ShardSpec spec;
  Tensor token_embd;  // First stage: [vocab rows held, hidden].
  std::vector<LlamaLayerWeights> layers;  // spec.layer_begin.. layer_end.
  Tensor output_norm;                     // Last stage: [hidden].
  Tensor lm_head;  // Last stage: [vocab_padded, hidden], zero padding.

  // Bytes of weights read by one forward step (each matrix once; the
  // embedding too when it is not the LM head).
  int64_t bytes() const;
  // The same without the embedding, of which a step reads only the rows
  // of its tokens (the decode roofline).
  int64_t bytes_per_step() const;
};

// Columns [offset, offset + width) of a loaded matrix (a slice of whole
// blocks, LlamaLayerWeights::wo_offset) as f32 [rows, width]: for
// backends that upload exact slices.
absl::StatusOr<Tensor> ExactColumns(const Tensor& w, int64_t offset,
                                    int64_t width);

// The spec of a single rank holding the whole model.
ShardSpec WholeModelSpec(const ModelConfig& config);

// Reads and dequantizes this shard's slice of every tensor, checking each
// shape against the config; only the slices' bytes are read. Errors name
// the tensor.
absl::StatusOr<LlamaWeights> LoadLlamaWeights(const WeightSource& source,
                                              const ShardSpec& spec);
absl::StatusOr<LlamaWeights> LoadLlamaWeights(const WeightSource& source);

// Called after the embeddings and after each layer: the bytes of weights
// loaded so far, and the shard's layers done out of its total.
using LoadProgress =
    std::function<void(int64_t bytes, int layers_done, int layers_total)>;
absl::StatusOr<LlamaWeights> LoadLlamaWeights(const WeightSource& source,
                                              const ShardSpec& spec,
                                              const LoadProgress& progress);

// Unimplemented, naming them, for a model whose layers the CUDA runner
// does not run yet (Gated DeltaNet: ModelConfig::is_hybrid, CPU only),
// before its weights are read; LoadLlamaWeights itself loads them.
absl::Status RefuseUnbuiltLayers(const ModelConfig& config);

// A LoadProgress that says on stderr how far `who` ("worker rank 3") has
// got, every `every` once the load has taken that long, and when it is
// done if it said anything before: a 100 GB load is not silent, a small
// one prints nothing.
LoadProgress LogLoadProgress(std::string who,
                             absl::Duration every = absl::Seconds(5));

}  // namespace shardlm

#endif  // SHARDLM_WORKER_LLAMA_WEIGHTS_H_
