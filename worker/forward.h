// The Llama forward pass of one shard, written once for every backend.
//
// ForwardShard runs a step's layers (embedding or PP receive, then per
// layer: norm, Q/K/V, RoPE, KV write, paged attention, o-proj + residual
// with the TP all-reduce, norm, gate/up, SwiGLU, down + residual; then PP
// send) and ShardLogits the final norm and LM head of the rows that are
// sampled, with the TP gather. They call ForwardOps, which a backend
// implements over its kernels (CPU: kernels/<op>/<op>.h; CUDA:
// kernels/cuda_ops.h), as ggml's backend interface does: a new backend adds
// ops, not a forward pass, and the TP/PP logic exists here only.
//
// The runners (ModelRunner on the CPU, CudaModelRunner on a GPU) own what
// differs: memory and buffers, the KV cache, uploading the step, CUDA
// graphs, sampling. Buffer dtypes are the backend's choice: GEMM inputs
// (xn, attn, h) are f32 on the CPU and bf16 on a GPU.
#ifndef SHARDLM_WORKER_FORWARD_H_
#define SHARDLM_WORKER_FORWARD_H_

#include <cstdint>
#include <functional>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "collectives/communicator.h"
#include "core/tensor.h"
#include "kernels/ssm/gated_delta_net.h"
#include "model/model_config.h"
#include "worker/llama_weights.h"
#include "worker/shard_runner.h"

namespace shardlm {

struct KvLayer;

// How one layer's attention runs.
struct LayerAttention {
  float scale = 1.0f;  // Of every score q.k.
  // > 0: each query sees only its last `window` positions
  // (ModelConfig::LayerWindow).
  int64_t window = 0;
  // > 0: every scaled score s becomes softcap * tanh(s / softcap) before
  // the mask and softmax (Gemma 2's attn_logit_softcapping).
  float softcap = 0.0f;
  // Host f32 [heads held], or empty: gpt-oss's attention sinks, one logit
  // per query head in its softmax's denominator.
  Tensor sinks;
};

// One Gated DeltaNet layer's weights that its sequence mixing reads
// (LlamaLayerWeights::ssm_*, this rank's value heads) and its state (one
// slot per sequence: KvPool's conv and recurrent states of the layer).
struct DeltaNetLayer {
  const Tensor& conv;  // [q/k channels + value channels held, W] f32.
  const Tensor& dt;    // [value heads held] f32.
  const Tensor& a;     // [value heads held] f32 (-exp(A_log)).
  const Tensor& norm;  // [v_dim] f32: the gated RMS norm's weight.
  float eps = 1e-6f;
  GatedDeltaNetShape shape;  // Its v_heads: those held.
  Tensor& conv_state;        // [slots, W - 1, channels held].
  Tensor& recurrent_state;   // [slots, value heads held, k_dim, v_dim].
};

// The ops of the forward pass on one backend, bound to one step (its
// tokens, positions, attention metadata and logit rows) by the runner.
// Tensors are the backend's; errors are InvalidArgument naming the op.
class ForwardOps {
 public:
  virtual ~ForwardOps() = default;
  // x = rows of `table` ([rows held, hidden]) for the step's token ids,
  // which are offset by vocab_begin; ids outside the table embed to zero.
  virtual absl::Status Embed(const Tensor& table, int64_t vocab_begin,
                             Tensor& x) = 0;
  virtual absl::Status RmsNorm(const Tensor& x, const Tensor& weight, float eps,
                               Tensor& out) = 0;
  // y = x w^T, or y += x w^T when `accumulate` (only where
  // fuses_residual()).
  virtual absl::Status Linear(const Tensor& x, const Tensor& w, Tensor& y,
                              bool accumulate) = 0;
  // In place, at the step's positions. x: [n, heads, head_dim].
  virtual absl::Status Rope(Tensor& x, const RopeTable& rope) = 0;
  // Writes the step's K and V ([n, kv_heads, head_dim]) into one layer's
  // cache at the step's slots.
  virtual absl::Status WriteKv(const Tensor& k, const Tensor& v,
                               const KvLayer& cache) = 0;
  // Causal attention of the step's queries over one layer's cache, as
  // `layer` says.
  virtual absl::Status Attention(const Tensor& q, const KvLayer& cache,
                                 const LayerAttention& layer, Tensor& out) = 0;
  // Context parallel: Attention over only the keys of the blocks this CP
  // rank holds, with each row's log-sum-exp (lse: [n, heads]); and the
  // exact merge of every CP rank's parts (outs [cp, n, heads, head_dim],
  // lses [cp, n, heads]) into out. See kernels/attention/paged_attention.h.
  virtual absl::Status AttentionPartial(const Tensor& q, const KvLayer& cache,
                                        const LayerAttention& layer,
                                        Tensor& out, Tensor& lse) {
    return absl::UnimplementedError(
        "context parallel attention on this "
        "backend");
  }
  // `sinks`: LayerAttention::sinks (empty: none), added by the merge.
  virtual absl::Status MergeAttention(const Tensor& outs, const Tensor& lses,
                                      const Tensor& sinks, Tensor& out) {
    return absl::UnimplementedError(
        "context parallel attention on this "
        "backend");
  }
  virtual absl::Status SwiGlu(const Tensor& gate, const Tensor& up,
                              Tensor& out) = 0;
  // gpt-oss's clamped SwiGLU (FfnActivation::kSwigluOai): g = min(gate,
  // 7), out = g sigmoid(1.702 g) (clamp(up, -7, 7) + 1).
  virtual absl::Status SwiGluOai(const Tensor& gate, const Tensor& up,
                                 Tensor& out) {
    return absl::UnimplementedError("SwiGluOai on this backend");
  }
  // out = gelu_tanh(gate) * up (Gemma's GeGLU; kernels/swiglu/swiglu.h).
  virtual absl::Status GeGlu(const Tensor& gate, const Tensor& up,
                             Tensor& out) {
    return absl::UnimplementedError("GeGlu on this backend");
  }
  // x += y.
  virtual absl::Status Add(Tensor& x, const Tensor& y) = 0;
  // x *= factor (Gemma's embedding scale).
  virtual absl::Status Scale(Tensor& x, float factor) {
    return absl::UnimplementedError("Scale on this backend");
  }
  // x = cap * tanh(x / cap), in place (Gemma 2's final logits).
  virtual absl::Status SoftCap(Tensor& x, float cap) {
    return absl::UnimplementedError("SoftCap on this backend");
  }
  // x[i, :] += bias for every row (x: [n, c], bias: [c], f32).
  virtual absl::Status AddBias(Tensor& x, const Tensor& bias) = 0;
  // Fused projections (backends whose weights are fused: wqkv,
  // w_gate_up). q, k, v = the column blocks of qkv ([n, q + 2 kv]); out =
  // silu(gate) * up of gate_up's two halves ([n, 2 f] -> [n, f]).
  virtual absl::Status SplitQkv(const Tensor& qkv, Tensor& q, Tensor& k,
                                Tensor& v) {
    return absl::UnimplementedError("SplitQkv on this backend");
  }
  // SplitQkv, Rope of q and k (q: [n, heads, head_dim], k and v: [n,
  // kv_heads, head_dim]) and WriteKv of k and v into `cache`, which a
  // backend may fuse into one kernel; k and v hold unspecified values
  // afterwards (a fused kernel writes the cache only).
  virtual absl::Status QkvRopeKv(const Tensor& qkv, const RopeTable& rope,
                                 Tensor& q, Tensor& k, Tensor& v,
                                 const KvLayer& cache);
  virtual absl::Status SwiGluFused(const Tensor& gate_up, Tensor& out) {
    return absl::UnimplementedError("SwiGluFused on this backend");
  }
  // x ([n, c]) at columns [offset, offset + c) of a zero [n, width]
  // tensor that stays valid until the next call: the input of a weight
  // slice that holds whole blocks around its columns
  // (LlamaLayerWeights::wo_offset). Backends whose weights never hold any
  // (GPUs cut them at upload) need not implement it.
  virtual absl::StatusOr<Tensor> PadColumns(const Tensor& x, int64_t offset,
                                            int64_t width) {
    return absl::UnimplementedError("PadColumns on this backend");
  }
  // Multi-head latent attention (ModelConfig::is_mla). x: [n, heads, dx],
  // y: [n, heads, dy], w: [heads * o, i] with head h's matrix in rows [h o,
  // (h + 1) o): y[:, h, y_offset + [0, o)] = x[:, h, x_offset + [0, i)]
  // w_h^T for every head.
  virtual absl::Status HeadLinear(const Tensor& x, int64_t x_offset,
                                  const Tensor& w, Tensor& y,
                                  int64_t y_offset) {
    return absl::UnimplementedError("HeadLinear on this backend");
  }
  // y[:, h, y_offset + [0, width)] = x[:, h, x_offset + [0, width)].
  virtual absl::Status CopyHeadColumns(const Tensor& x, int64_t x_offset,
                                       int64_t width, Tensor& y,
                                       int64_t y_offset) {
    return absl::UnimplementedError("CopyHeadColumns on this backend");
  }
  // Writes each token's latent entry [first | second] ([n, a], [n, b])
  // into one layer's cache (KvLayer::k; kernels/attention/
  // latent_attention.h).
  virtual absl::Status WriteLatent(const Tensor& first, const Tensor& second,
                                   const KvLayer& cache) {
    return absl::UnimplementedError("WriteLatent on this backend");
  }
  // Every head's causal attention over the latent entries: q [n, heads,
  // d] absorbed, out [n, heads, dv] the softmax-weighted sum of the
  // entries' values [value_offset, value_offset + dv).
  virtual absl::Status LatentAttention(const Tensor& q, const KvLayer& cache,
                                       float scale, int64_t window,
                                       int64_t value_offset, Tensor& out) {
    return absl::UnimplementedError("LatentAttention on this backend");
  }
  // Mixtures of experts. out[i, :] = x[rows[i], :] (out: [rows.size(), c]).
  virtual absl::Status GatherRows(const Tensor& x,
                                  absl::Span<const int32_t> rows, Tensor& out) {
    return absl::UnimplementedError("GatherRows on this backend");
  }
  // out[rows[i], :] += weights[i] * y[i, :] (y: [rows.size(), c]; rows
  // distinct, as one expert's tokens are).
  virtual absl::Status ScatterAddRows(const Tensor& y,
                                      absl::Span<const int32_t> rows,
                                      absl::Span<const float> weights,
                                      Tensor& out) {
    return absl::UnimplementedError("ScatterAddRows on this backend");
  }
  // Gated DeltaNet's sequence mixing (kernels/ssm/gated_delta_net.h) of
  // the step's tokens, each sequence through its state slot
  // (StepInput::state_slots; zeroed first when its tokens start at
  // position 0): the convolution of [qk | v] and SiLU, the gates beta =
  // sigmoid(beta_in) and g = a softplus(alpha_in + dt), the delta rule,
  // and the gated RMS norm by z. qk: [n, 2 k_heads k_dim], v and z: [n,
  // value heads held * v_dim], beta_in and alpha_in: [n, value heads
  // held], out: [n, value heads held * v_dim] (the input of ssm_out).
  // A sequence's tokens must be contiguous in the step, in position order.
  virtual absl::Status GatedDeltaNet(const Tensor& qk, const Tensor& v,
                                     const Tensor& z, const Tensor& beta_in,
                                     const Tensor& alpha_in,
                                     const DeltaNetLayer& layer, Tensor& out) {
    return absl::UnimplementedError("GatedDeltaNet on this backend");
  }
  // x *= sigmoid(gate) (Qwen3.5's gated attention output, its MoE's
  // shared expert): x [n, c], gate [n, c], or [n, 1] for one per row.
  virtual absl::Status SigmoidGate(Tensor& x, const Tensor& gate) {
    return absl::UnimplementedError("SigmoidGate on this backend");
  }
  // x = 0.
  virtual absl::Status Zero(Tensor& x) {
    return absl::UnimplementedError("Zero on this backend");
  }
  // out = the rows of x ([n, hidden]) whose logits the step wants; a row
  // of -1 gives zeros (sequence parallel: a row another CP rank holds).
  virtual absl::Status GatherLogitRows(const Tensor& x, Tensor& out) = 0;
  // Sequence parallel: x ([counts.size() * slot, c]) holds part i in rows
  // [i * slot, i * slot + counts[i]); moves the parts, in place, to follow
  // one another from row 0.
  virtual absl::Status CompactRows(Tensor& x, int64_t slot,
                                   absl::Span<const int64_t> counts) {
    return absl::UnimplementedError("CompactRows on this backend");
  }
  // `t` readable on the host once this returns (itself when it is there).
  virtual absl::StatusOr<Tensor> ToHost(const Tensor& t) = 0;
  // Whether Linear can add into the f32 residual stream itself (the GEMM's
  // beta = 1), saving the partial buffer and an add when there is no TP
  // all-reduce in between.
  virtual bool fuses_residual() const = 0;
};

// Activations of one step: views of n rows (m logit rows for the last
// three), allocated by the runner on its backend.
struct ForwardBuffers {
  Tensor x;         // [n, hidden] f32: the residual stream.
  Tensor xn;        // [n, hidden] normed x (GEMM input).
  Tensor q, k, v;   // [n, (kv_)heads held * head_dim] f32.
  Tensor attn;      // [n, heads held * head_dim] attention output
                    // (GEMM input).
  Tensor partial;   // [n, hidden] f32: TP partial sums (may be empty
                    // when the ops fuse the residual and tp = 1).
  Tensor gate, up;  // [n, ffn held] f32.
  Tensor qkv;       // [n, (heads + 2 kv_heads) held * head_dim] f32,
                    // when the weights are fused.
  Tensor gate_up;   // [n, 2 ffn held] f32, when they are fused.
  Tensor h;         // [n, ffn held] SwiGLU output (GEMM input; may
                    // alias gate).
  // Mixtures of experts: the router's logits [n, n_experts] and one
  // expert's gathered rows: its input [n, hidden] (GEMM input), gate and up
  // [n, f held] f32, SwiGLU [n, f held] (GEMM input; may alias moe_gate)
  // and output [n, hidden] f32 (views of the first rows that go to it).
  Tensor router_logits;
  Tensor moe_x, moe_gate, moe_up, moe_h, moe_out;
  // The shared experts' gate and up [n, shared columns held] f32 and
  // SwiGLU (GEMM input; may alias shared_gate), their output in moe_out.
  Tensor shared_gate, shared_up, shared_h;
  // Qwen3.5-MoE: the shared expert's gate logit per token [n, 1] f32.
  Tensor shared_gate_logit;
  // Multi-head latent attention (q, k and v unused; q [n, heads held *
  // head_dim] and attn [n, heads held * v_head_dim]): the q LoRA's
  // compressed query [n, q_lora_rank], the shared roped key part [n,
  // rope_dims] and normed latent [n, kv_lora_rank] of each token, the
  // absorbed queries [n, heads held, rope_dims + kv_lora_rank] and the
  // heads' attention over the latent [n, heads held, kv_lora_rank].
  Tensor q_a, kv_rope, kv_latent, q_absorbed, attn_latent;
  // Gated DeltaNet layers (hybrid models; nv: value heads held): the
  // projections [n, 2 k_heads k_dim] (ssm_qk), [n, nv v_dim] (ssm_v,
  // ssm_z), [n, nv] (ssm_beta, ssm_alpha) and the gated output [n, nv
  // v_dim] (GEMM input). Gated attention (ModelConfig::attention_gate):
  // each head's query then gate [n, heads held * 2 head_dim] and the gates
  // [n, heads held * head_dim].
  Tensor ssm_qk, ssm_v, ssm_z, ssm_beta, ssm_alpha, ssm_out;
  Tensor q_gate, attn_gate;
  Tensor last, last_n;  // [m, hidden]: gathered rows, normed (may alias).
  Tensor local_logits;  // [m, vocab_padded] f32: this rank's vocab slice.
  Tensor gathered;      // [tp, m, vocab_padded] f32 when tp > 1.
  // Context parallel (cp > 1): this rank's attention log-sum-exps [n,
  // heads held] and every CP rank's partial outputs and lses, gathered:
  // [cp, n, heads held * head_dim] and [cp, n, heads held], f32.
  Tensor lse, cp_out, cp_lse;
  // Sequence parallel (ShardForward::seq set): x, xn, partial, q, k, v,
  // gate, up, h and the expert buffers hold this rank's s tokens, not n;
  // q, k and v are the first s rows of q_slot, k_slot, v_slot ([rows,
  // (kv_)heads held * head_dim], what each rank sends), gathered over the
  // CP group into q_all, k_all, v_all ([cp * rows, ...], the step's n
  // tokens in the first n rows once compacted); attn, lse, cp_out and
  // cp_lse keep n rows (attention runs every query).
  Tensor q_slot, k_slot, v_slot, q_all, k_all, v_all;
};

// Sequence parallel under CP: the step's n tokens split into contiguous
// slices, CP rank c running tokens [begin[c], begin[c + 1]) through the
// token-wise work (embedding, norms, projections, RoPE, o-proj, MLP) and
// all of them through attention. Used when n >= C (see ModelRunner).
struct SequenceParallel {
  // Bound to this rank's slice of the step: its tokens and positions, and
  // its logit rows (-1 for a row another rank holds).
  ForwardOps& ops;
  std::vector<int64_t> begin;  // [C + 1], begin[C] = n.
  int64_t rows = 0;            // The longest slice: ceil(n / C).
  int rank = 0;                // This CP rank.
  int64_t slice_begin() const { return begin[rank]; }
  int64_t slice_end() const { return begin[rank + 1]; }
  std::vector<int64_t> counts() const;
};

// One layer's KV cache as its backend keeps it: k and v (on the CPU both
// tiers in one allocation each; on a GPU the device pool) and, on a GPU
// with a host tier, that tier in pinned host memory the kernels read and
// write in place (k_host, v_host; null without one). Block ids past the
// device pool's address the host tier.
struct KvLayer {
  Tensor& k;
  Tensor& v;
  Tensor* k_host = nullptr;
  Tensor* v_host = nullptr;
};

// The KV caches of the shard's attending layers (index 0 = its first).
struct KvLayers {
  std::vector<Tensor>* k = nullptr;
  std::vector<Tensor>* v = nullptr;
  std::vector<Tensor>* k_host = nullptr;  // GPU host tier, or null.
  std::vector<Tensor>* v_host = nullptr;
  // Hybrid models: the linear layers' states (KvPool::conv_states,
  // recurrent_states), indexed by linear layer held; k and v by
  // attending layer held.
  std::vector<Tensor>* conv_state = nullptr;
  std::vector<Tensor>* recurrent_state = nullptr;

  KvLayer at(int64_t l) const {
    const bool host = k_host != nullptr && !k_host->empty();
    return {.k = (*k)[l],
            .v = (*v)[l],
            .k_host = host ? &(*k_host)[l] : nullptr,
            .v_host = host ? &(*v_host)[l] : nullptr};
  }
};

// Runs `call` (a communicator call), so that the runner can time it.
using CommCall =
    std::function<absl::Status(const std::function<absl::Status()>& call)>;

struct ShardForward {
  const LlamaWeights& weights;
  ShardComms comms;
  ForwardOps& ops;
  CommCall comm;  // Null: call directly.
  // Mixtures: tokens routed to each expert this shard holds, added to over
  // the step's layers ([experts held]); null: not counted.
  std::vector<int64_t>* expert_tokens = nullptr;
  // Null, or (CP only) this rank's slice of the step's tokens: see
  // SequenceParallel.
  const SequenceParallel* seq = nullptr;

  // The step's layers on this shard; x holds the last layer's output (on a
  // last stage) or has been sent to the next stage. Under CP (comms.cp)
  // each rank attends over the blocks it holds and the parts are merged
  // after an all-gather over the CP group. Without `seq` every CP rank
  // runs the same tokens through the same weights; with it, each runs its
  // slice, all-gathers the slices' Q, K and V before attention and keeps
  // its slice's rows of the merged output (x holds the slice's rows).
  absl::Status Layers(ForwardBuffers& b, KvLayers kv) const;
  // y = xn w^T (+ bias when there is one).
  absl::Status Projection(const Tensor& xn, const Tensor& w, const Tensor& bias,
                          Tensor& y) const;
  // The logits of the step's m logit rows, [m, vocab], gathered over the TP
  // group into a host tensor (b.local_logits itself when tp = 1) on TP rank
  // 0; an empty tensor on the other TP ranks. Last stage only.
  absl::StatusOr<Tensor> Logits(ForwardBuffers& b) const;

 private:
  absl::Status Comm(const std::function<absl::Status()>& call) const {
    return comm ? comm(call) : call();
  }
  // x += the layer's multi-head latent attention of b.xn, its cache
  // written (worker/forward.cc).
  absl::Status LatentLayer(const LlamaLayerWeights& w, int64_t layer,
                           const RopeTable& rope, const KvLayer& cache,
                           ForwardBuffers& b) const;
  // x += the layer's Gated DeltaNet of b.xn, its state advanced.
  absl::Status LinearLayer(const LlamaLayerWeights& w, Tensor& conv_state,
                           Tensor& recurrent_state, ForwardBuffers& b) const;
  // x += the layer's mixture of experts of b.xn, summed over the TP group
  // (each rank adds its experts' share, or its columns of every expert).
  absl::Status Experts(const LlamaLayerWeights& w, ForwardBuffers& b) const;
  // x += in w^T, summed over the TP group (then normed by post_norm when
  // it is not empty); w's columns for `in` begin at `offset` (nonzero, or w
  // wider than in, for a slice of whole blocks).
  // `bias` (gpt-oss's attn_output.bias), when not empty, is added once to
  // the reduced sum, before post_norm.
  absl::Status Residual(const Tensor& in, const Tensor& w, int64_t offset,
                        const Tensor& post_norm, ForwardBuffers& b,
                        const Tensor& bias = Tensor()) const;
  // x += partial, RMS-normed first by post_norm unless it is empty (Gemma).
  absl::Status AddNormed(const Tensor& post_norm, ForwardBuffers& b) const;
  // out = act(gate) * up, the model's gated FFN activation.
  absl::Status Activation(const Tensor& gate, const Tensor& up,
                          Tensor& out) const;
  // out = attention of q over one layer's cache, over this rank's blocks
  // and merged over the CP group when there is one.
  absl::Status Attention(const Tensor& q, const KvLayer& cache,
                         const LayerAttention& layer, Tensor& out,
                         ForwardBuffers& b) const;
  // Sequence parallel: all = every CP rank's `slot`, gathered and
  // compacted to the step's n rows.
  absl::Status GatherSlices(const Tensor& slot, Tensor& all) const;
};

}  // namespace shardlm

#endif  // SHARDLM_WORKER_FORWARD_H_
