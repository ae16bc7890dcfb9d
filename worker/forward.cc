#include "worker/forward.h"

#include <algorithm>
#include <cmath>

#include "absl/strings/str_cat.h"
#include "core/status.h"
#include "kernels/moe/routing.h"
#include "model/shard_plan.h"

namespace shardlm {

absl::Status ShardForward::Residual(const Tensor& in_cols, const Tensor& w,
                                    int64_t offset, const Tensor& post_norm,
                                    ForwardBuffers& b,
                                    const Tensor& bias) const {
  Tensor padded;
  if (offset != 0 || w.dim(1) != in_cols.dim(1)) {
    ASSIGN_OR_RETURN(padded, ops.PadColumns(in_cols, offset, w.dim(1)));
  }
  const Tensor& in = padded.empty() ? in_cols : padded;
  if (comms.tp == nullptr && ops.fuses_residual() && post_norm.empty()) {
    RETURN_IF_ERROR(ops.Linear(in, w, b.x, /*accumulate=*/true));
    return bias.empty() ? absl::OkStatus() : ops.AddBias(b.x, bias);
  }
  RETURN_IF_ERROR(ops.Linear(in, w, b.partial, false));
  if (comms.tp != nullptr) {
    RETURN_IF_ERROR(Comm([&] {
      return comms.tp->AllReduce(b.partial, b.partial, ReduceOp::kSum);
    }));
  }
  if (!bias.empty()) RETURN_IF_ERROR(ops.AddBias(b.partial, bias));
  return AddNormed(post_norm, b);
}

absl::Status ShardForward::AddNormed(const Tensor& post_norm,
                                     ForwardBuffers& b) const {
  if (!post_norm.empty()) {
    RETURN_IF_ERROR(ops.RmsNorm(b.partial, post_norm,
                                weights.config.rms_norm_eps, b.partial));
  }
  return ops.Add(b.x, b.partial);
}

absl::Status ShardForward::Activation(const Tensor& gate, const Tensor& up,
                                      Tensor& out) const {
  switch (weights.config.ffn_activation) {
    case FfnActivation::kGeluTanh:
      return ops.GeGlu(gate, up, out);
    case FfnActivation::kSwigluOai:
      return ops.SwiGluOai(gate, up, out);
    default:
      return ops.SwiGlu(gate, up, out);
  }
}

absl::Status ShardForward::Experts(const LlamaLayerWeights& w,
                                   ForwardBuffers& b) const {
  const ModelConfig& c = weights.config;
  const ShardSpec& spec = weights.spec;
  const int64_t n = b.xn.dim(0), f = spec.ffn_end - spec.ffn_begin;
  // The router is replicated: every rank routes every token the same way.
  RETURN_IF_ERROR(ops.Linear(b.xn, w.router, b.router_logits, false));
  if (!w.router_logit_bias.empty()) {  // gpt-oss.
    RETURN_IF_ERROR(ops.AddBias(b.router_logits, w.router_logit_bias));
  }
  ASSIGN_OR_RETURN(const Tensor logits, ops.ToHost(b.router_logits));
  const RouterSpec router{.experts = c.n_experts,
                          .top_k = c.n_experts_used,
                          .gating = c.expert_gating,
                          .score_bias = w.router_bias.empty()
                                            ? absl::Span<const float>()
                                            : w.router_bias.f32(),
                          .groups = c.expert_groups,
                          .groups_used = c.expert_groups_used,
                          .renormalize = c.expert_weights_norm,
                          .scale = c.expert_weights_scale};
  ASSIGN_OR_RETURN(const Routing routing,
                   RouteTokens(logits.f32().data(), n, router));
  RETURN_IF_ERROR(ops.Zero(b.partial));
  // This rank's experts, each over the rows routed to it (experts in
  // index order, so a token's sum has the same order in any step).
  for (int64_t e = spec.expert_begin; e < spec.expert_end; ++e) {
    const std::vector<int32_t>& rows = routing.tokens[e];
    if (rows.empty()) continue;
    const int64_t m = static_cast<int64_t>(rows.size());
    const int64_t i = e - spec.expert_begin;
    ASSIGN_OR_RETURN(const Tensor gate, w.exp_gate.Rows(i * f, (i + 1) * f));
    ASSIGN_OR_RETURN(const Tensor up, w.exp_up.Rows(i * f, (i + 1) * f));
    ASSIGN_OR_RETURN(const Tensor down,
                     w.exp_down.Rows(i * c.hidden, (i + 1) * c.hidden));
    ASSIGN_OR_RETURN(Tensor x, b.moe_x.Rows(0, m));
    ASSIGN_OR_RETURN(Tensor g, b.moe_gate.Rows(0, m));
    ASSIGN_OR_RETURN(Tensor u, b.moe_up.Rows(0, m));
    ASSIGN_OR_RETURN(Tensor h, b.moe_h.Rows(0, m));
    ASSIGN_OR_RETURN(Tensor y, b.moe_out.Rows(0, m));
    RETURN_IF_ERROR(ops.GatherRows(b.xn, rows, x));
    RETURN_IF_ERROR(ops.Linear(x, gate, g, false));
    RETURN_IF_ERROR(ops.Linear(x, up, u, false));
    // gpt-oss's expert biases: row i of the held experts' (the down one
    // on one rank of an expert's TP group only).
    const auto expert_bias = [&](const Tensor& all, Tensor& t) {
      if (all.empty()) return absl::OkStatus();
      ASSIGN_OR_RETURN(const Tensor row, all.Rows(i, i + 1));
      ASSIGN_OR_RETURN(const Tensor bias, row.Reshaped({row.dim(1)}));
      return ops.AddBias(t, bias);
    };
    RETURN_IF_ERROR(expert_bias(w.exp_gate_b, g));
    RETURN_IF_ERROR(expert_bias(w.exp_up_b, u));
    RETURN_IF_ERROR(Activation(g, u, h));
    Tensor padded;
    if (w.exp_down_offset != 0 || down.dim(1) != f) {
      ASSIGN_OR_RETURN(padded,
                       ops.PadColumns(h, w.exp_down_offset, down.dim(1)));
    }
    RETURN_IF_ERROR(ops.Linear(padded.empty() ? h : padded, down, y, false));
    RETURN_IF_ERROR(expert_bias(w.exp_down_b, y));
    RETURN_IF_ERROR(ops.ScatterAddRows(y, rows, routing.weights[e], b.partial));
    if (expert_tokens != nullptr) (*expert_tokens)[i] += m;
  }
  if (!w.shared_gate.empty()) {
    // The shared experts, every token, this rank's columns: partial sums
    // reduced with the routed experts' below.
    RETURN_IF_ERROR(ops.Linear(b.xn, w.shared_gate, b.shared_gate, false));
    RETURN_IF_ERROR(ops.Linear(b.xn, w.shared_up, b.shared_up, false));
    RETURN_IF_ERROR(Activation(b.shared_gate, b.shared_up, b.shared_h));
    Tensor padded;
    if (w.shared_down_offset != 0 ||
        w.shared_down.dim(1) != b.shared_h.dim(1)) {
      ASSIGN_OR_RETURN(padded, ops.PadColumns(b.shared_h, w.shared_down_offset,
                                              w.shared_down.dim(1)));
    }
    ASSIGN_OR_RETURN(Tensor y, b.moe_out.Rows(0, n));
    RETURN_IF_ERROR(ops.Linear(padded.empty() ? b.shared_h : padded,
                               w.shared_down, y, false));
    if (!w.shared_gate_inp.empty()) {
      // Qwen3.5-MoE: times sigmoid(w . xn) per token, each rank's partial
      // sums alike (the gate is linear in them).
      ASSIGN_OR_RETURN(const Tensor gate_w, w.shared_gate_inp.Reshaped(
                                                {1, w.shared_gate_inp.dim(0)}));
      ASSIGN_OR_RETURN(Tensor gate, b.shared_gate_logit.Rows(0, n));
      RETURN_IF_ERROR(ops.Linear(b.xn, gate_w, gate, false));
      RETURN_IF_ERROR(ops.SigmoidGate(y, gate));
    }
    RETURN_IF_ERROR(ops.Add(b.partial, y));
  }
  if (comms.tp != nullptr) {
    RETURN_IF_ERROR(Comm([&] {
      return comms.tp->AllReduce(b.partial, b.partial, ReduceOp::kSum);
    }));
  }
  return AddNormed(w.post_ffn_norm, b);
}

absl::Status ShardForward::LatentLayer(const LlamaLayerWeights& w,
                                       int64_t layer, const RopeTable& rope,
                                       const KvLayer& cache,
                                       ForwardBuffers& b) const {
  const ModelConfig& c = weights.config;
  const int64_t n = b.xn.dim(0), heads = weights.spec.n_heads();
  const int64_t d = c.head_dim, r = c.RotaryDims(), R = c.kv_lora_rank,
                nope = d - r, vd = c.v_head_dim;
  const float eps = c.LatentNormEps();
  // This rank's query heads, [q_nope | q_pe] each: wq_b rmsnorm(wq_a xn)
  // (the compressed query is every rank's), or wq xn.
  if (!w.wq_a.empty()) {
    RETURN_IF_ERROR(ops.Linear(b.xn, w.wq_a, b.q_a, false));
    RETURN_IF_ERROR(ops.RmsNorm(b.q_a, w.q_a_norm, eps, b.q_a));
    RETURN_IF_ERROR(ops.Linear(b.q_a, w.wq_b, b.q, false));
  } else {
    RETURN_IF_ERROR(ops.Linear(b.xn, w.wq, b.q, false));
  }
  // The token's cache entry, shared by every head (and every TP rank, each
  // computing it): [k_pe | c_kv], k_pe = rope(wkv_a's last r rows xn),
  // c_kv = rmsnorm(its first R rows xn).
  ASSIGN_OR_RETURN(const Tensor w_latent, w.wkv_a.Rows(0, R));
  ASSIGN_OR_RETURN(const Tensor w_rope, w.wkv_a.Rows(R, R + r));
  RETURN_IF_ERROR(ops.Linear(b.xn, w_latent, b.kv_latent, false));
  RETURN_IF_ERROR(ops.RmsNorm(b.kv_latent, w.kv_a_norm, eps, b.kv_latent));
  RETURN_IF_ERROR(ops.Linear(b.xn, w_rope, b.kv_rope, false));
  ASSIGN_OR_RETURN(Tensor k_pe, b.kv_rope.Reshaped({n, 1, r}));
  RETURN_IF_ERROR(ops.Rope(k_pe, rope));
  RETURN_IF_ERROR(ops.WriteLatent(b.kv_rope, b.kv_latent, cache));
  // Absorbed queries [rope(q_pe) | W_kb,h^T q_nope], so that a head's
  // score is one dot product with the entry: q_nope . (W_kb,h c_kv) =
  // (W_kb,h^T q_nope) . c_kv. The rope table turns the first r columns.
  ASSIGN_OR_RETURN(const Tensor q3, b.q.Reshaped({n, heads, d}));
  RETURN_IF_ERROR(ops.CopyHeadColumns(q3, nope, r, b.q_absorbed, 0));
  RETURN_IF_ERROR(ops.Rope(b.q_absorbed, rope));
  RETURN_IF_ERROR(ops.HeadLinear(q3, 0, w.wk_b, b.q_absorbed, r));
  // Softmax over the entries (DeepSeek's scale: the q/k head's, times
  // YaRN's mscale^2), then each head's values from its latent sum.
  const float scale = c.attn_scale_factor / std::sqrt(static_cast<float>(d));
  RETURN_IF_ERROR(ops.LatentAttention(b.q_absorbed, cache, scale,
                                      c.LayerWindow(layer), r, b.attn_latent));
  ASSIGN_OR_RETURN(Tensor attn3, b.attn.Reshaped({n, heads, vd}));
  RETURN_IF_ERROR(ops.HeadLinear(b.attn_latent, 0, w.wv_b, attn3, 0));
  return Residual(b.attn, w.wo, w.wo_offset, w.post_attn_norm, b);
}

absl::Status ShardForward::LinearLayer(const LlamaLayerWeights& w,
                                       Tensor& conv_state,
                                       Tensor& recurrent_state,
                                       ForwardBuffers& b) const {
  const ModelConfig& c = weights.config;
  // This rank's value heads (and every q/k head): their projections, the
  // sequence mixing through each sequence's state, then wo's partial sums.
  RETURN_IF_ERROR(ops.Linear(b.xn, w.ssm_qk, b.ssm_qk, false));
  RETURN_IF_ERROR(ops.Linear(b.xn, w.ssm_v, b.ssm_v, false));
  RETURN_IF_ERROR(ops.Linear(b.xn, w.ssm_z, b.ssm_z, false));
  RETURN_IF_ERROR(ops.Linear(b.xn, w.ssm_beta, b.ssm_beta, false));
  RETURN_IF_ERROR(ops.Linear(b.xn, w.ssm_alpha, b.ssm_alpha, false));
  const DeltaNetLayer layer{
      .conv = w.ssm_conv,
      .dt = w.ssm_dt,
      .a = w.ssm_a,
      .norm = w.ssm_norm,
      .eps = c.rms_norm_eps,
      .shape = {.k_heads = c.ssm_k_heads,
                .v_heads = w.ssm_dt.dim(0),
                .k_dim = c.ssm_k_dim,
                .v_dim = c.ssm_v_dim,
                .v_tiled = c.ssm_v_tiled,
                .v_head_begin = SsmValueHeads(c, weights.spec).first,
                .v_heads_total = c.ssm_v_heads},
      .conv_state = conv_state,
      .recurrent_state = recurrent_state};
  RETURN_IF_ERROR(ops.GatedDeltaNet(b.ssm_qk, b.ssm_v, b.ssm_z, b.ssm_beta,
                                    b.ssm_alpha, layer, b.ssm_out));
  return Residual(b.ssm_out, w.ssm_out, w.ssm_out_offset, w.post_attn_norm, b);
}

absl::Status ShardForward::Projection(const Tensor& xn, const Tensor& w,
                                      const Tensor& bias, Tensor& y) const {
  RETURN_IF_ERROR(ops.Linear(xn, w, y, false));
  return bias.empty() ? absl::OkStatus() : ops.AddBias(y, bias);
}

absl::Status ShardForward::Attention(const Tensor& q, const KvLayer& cache,
                                     const LayerAttention& layer, Tensor& out,
                                     ForwardBuffers& b) const {
  if (comms.cp == nullptr) return ops.Attention(q, cache, layer, out);
  // Each CP rank's softmax over its keys, then the exact merge by the
  // parts' log-sum-exps (every rank merges, so all hold the same output).
  const int64_t n = q.dim(0), heads = q.dim(1), d = q.dim(2);
  RETURN_IF_ERROR(ops.AttentionPartial(q, cache, layer, out, b.lse));
  RETURN_IF_ERROR(Comm([&] { return comms.cp->AllGather(out, b.cp_out); }));
  RETURN_IF_ERROR(Comm([&] { return comms.cp->AllGather(b.lse, b.cp_lse); }));
  ASSIGN_OR_RETURN(const Tensor outs,
                   b.cp_out.Reshaped({comms.cp->size(), n, heads, d}));
  return ops.MergeAttention(outs, b.cp_lse, layer.sinks, out);
}

std::vector<int64_t> SequenceParallel::counts() const {
  std::vector<int64_t> c;
  for (size_t i = 0; i + 1 < begin.size(); ++i) {
    c.push_back(begin[i + 1] - begin[i]);
  }
  return c;
}

absl::Status ShardForward::GatherSlices(const Tensor& slot, Tensor& all) const {
  RETURN_IF_ERROR(Comm([&] { return comms.cp->AllGather(slot, all); }));
  return ops.CompactRows(all, seq->rows, seq->counts());
}

absl::Status ForwardOps::QkvRopeKv(const Tensor& qkv, const RopeTable& rope,
                                   Tensor& q, Tensor& k, Tensor& v,
                                   const KvLayer& cache) {
  if (q.rank() != 3 || k.rank() != 3 || v.rank() != 3) {
    return absl::InvalidArgumentError(
        "QkvRopeKv: q, k and v must be [n, heads, head_dim]");
  }
  // SplitQkv's [n, heads * head_dim] views of the same memory.
  const auto flat = [](const Tensor& t) {
    return t.Reshaped({t.dim(0), t.dim(1) * t.dim(2)});
  };
  ASSIGN_OR_RETURN(Tensor q2, flat(q));
  ASSIGN_OR_RETURN(Tensor k2, flat(k));
  ASSIGN_OR_RETURN(Tensor v2, flat(v));
  RETURN_IF_ERROR(SplitQkv(qkv, q2, k2, v2));
  RETURN_IF_ERROR(Rope(q, rope));
  RETURN_IF_ERROR(Rope(k, rope));
  return WriteKv(k, v, cache);
}

absl::Status ShardForward::Layers(ForwardBuffers& b, KvLayers kv) const {
  const ModelConfig& c = weights.config;
  const ShardSpec& spec = weights.spec;
  const float scale =
      c.attn_scale_factor / std::sqrt(static_cast<float>(c.head_dim));
  // The full layers' RoPE and, when they differ (Gemma 3), the
  // sliding-window layers'.
  const RopeTable global_rope = c.Rope();
  const RopeTable local_rope =
      c.rope_local_theta > 0 ? c.LocalRope() : RopeTable();
  // s: the tokens this rank runs through the token-wise work (n, or its
  // slice under sequence parallel); n: those attention runs.
  const int64_t s = b.x.dim(0), n = b.attn.dim(0), d = c.head_dim;
  if (seq != nullptr && comms.cp == nullptr) {
    return absl::FailedPreconditionError("sequence parallel without CP");
  }
  // The ops that read the step's tokens, positions or logit rows (Embed,
  // Rope): bound to this rank's slice under sequence parallel.
  ForwardOps& tok = seq != nullptr ? seq->ops : ops;
  if (c.is_mla() && (comms.cp != nullptr || seq != nullptr)) {
    return absl::UnimplementedError(
        "multi-head latent attention under context parallel");
  }
  if (c.is_hybrid() && (comms.cp != nullptr || seq != nullptr)) {
    return absl::UnimplementedError(
        "Gated DeltaNet layers under context parallel");
  }
  // Per-head views of the same memory: [s, heads, head_dim] (MLA has its
  // own: LatentLayer).
  Tensor q3, k3, v3, attn3;
  if (!c.is_mla()) {
    ASSIGN_OR_RETURN(q3, b.q.Reshaped({s, spec.n_heads(), d}));
    ASSIGN_OR_RETURN(k3, b.k.Reshaped({s, spec.n_kv_heads(), d}));
    ASSIGN_OR_RETURN(v3, b.v.Reshaped({s, spec.n_kv_heads(), d}));
    ASSIGN_OR_RETURN(attn3, b.attn.Reshaped({n, spec.n_heads(), d}));
  }
  // What attention reads ([n, heads, head_dim]): the gathered slices under
  // sequence parallel, else the step's own.
  Tensor qa3 = q3, ka3 = k3, va3 = v3, attn_rows = b.attn;
  if (seq != nullptr) {
    ASSIGN_OR_RETURN(const Tensor qa, b.q_all.Rows(0, n));
    ASSIGN_OR_RETURN(const Tensor ka, b.k_all.Rows(0, n));
    ASSIGN_OR_RETURN(const Tensor va, b.v_all.Rows(0, n));
    ASSIGN_OR_RETURN(qa3, qa.Reshaped({n, spec.n_heads(), d}));
    ASSIGN_OR_RETURN(ka3, ka.Reshaped({n, spec.n_kv_heads(), d}));
    ASSIGN_OR_RETURN(va3, va.Reshaped({n, spec.n_kv_heads(), d}));
    // The o-proj's input: this rank's rows of the merged output.
    ASSIGN_OR_RETURN(attn_rows,
                     b.attn.Rows(seq->slice_begin(), seq->slice_end()));
  }

  if (spec.first_stage()) {
    // Vocab-parallel: rows outside this rank's slice embed to zero, so the
    // sum over the TP group is the full embedding.
    RETURN_IF_ERROR(tok.Embed(weights.token_embd, spec.vocab_begin, b.x));
    if (comms.tp != nullptr) {
      RETURN_IF_ERROR(
          Comm([&] { return comms.tp->AllReduce(b.x, b.x, ReduceOp::kSum); }));
    }
    if (c.embedding_scale != 1.0f) {
      RETURN_IF_ERROR(ops.Scale(b.x, c.embedding_scale));
    }
  } else {
    // Under sequence parallel the previous stage's rank of the same CP
    // index ran the same slice.
    RETURN_IF_ERROR(
        Comm([&] { return comms.pp->Recv(b.x, spec.pp_rank - 1); }));
  }
  // A hybrid model's layers index the KV caches by attending layer and
  // the states by linear layer.
  int64_t attending = 0, linear = 0;
  for (int64_t l = 0; l < spec.n_layers(); ++l) {
    const LlamaLayerWeights& w = weights.layers[l];
    const int64_t layer = spec.layer_begin + l;
    const RopeTable& rope =
        c.LayerRopeIsLocal(layer) ? local_rope : global_rope;
    // Attention: x += wo * attention(rope(wq xn + bq), rope(wk xn + bk),
    // wv xn + bv), each rank over its own heads, partial sums of wo reduced
    // over TP. (The biases are Qwen2's; other models have none.)
    RETURN_IF_ERROR(ops.RmsNorm(b.x, w.attn_norm, c.rms_norm_eps, b.xn));
    if (c.LayerIsLinear(layer)) {
      if (kv.conv_state == nullptr ||
          linear >= static_cast<int64_t>(kv.conv_state->size())) {
        return absl::FailedPreconditionError(absl::StrCat(
            "layer ", layer, " is a Gated DeltaNet layer with no state"));
      }
      RETURN_IF_ERROR(LinearLayer(w, (*kv.conv_state)[linear],
                                  (*kv.recurrent_state)[linear], b));
      ++linear;
    } else if (const KvLayer cache = kv.at(attending++); c.is_mla()) {
      RETURN_IF_ERROR(LatentLayer(w, layer, rope, cache, b));
    } else {
      // One GEMM, then its column blocks split, turned and cached by one op
      // (one kernel on GPUs), unless Qwen3's per-head norms come between or
      // sequence parallel gathers the slices first.
      const bool fused_qkv = !w.wqkv.empty() && w.q_norm.empty() &&
                             seq == nullptr && !c.attention_gate;
      if (c.attention_gate) {
        // Qwen3.5: each head's query, then its output gate.
        RETURN_IF_ERROR(Projection(b.xn, w.wq, w.bq, b.q_gate));
        ASSIGN_OR_RETURN(const Tensor qg3,
                         b.q_gate.Reshaped({s, spec.n_heads(), 2 * d}));
        ASSIGN_OR_RETURN(Tensor gate3,
                         b.attn_gate.Reshaped({s, spec.n_heads(), d}));
        RETURN_IF_ERROR(ops.CopyHeadColumns(qg3, 0, d, q3, 0));
        RETURN_IF_ERROR(ops.CopyHeadColumns(qg3, d, d, gate3, 0));
        RETURN_IF_ERROR(Projection(b.xn, w.wk, w.bk, b.k));
        RETURN_IF_ERROR(Projection(b.xn, w.wv, w.bv, b.v));
      } else if (fused_qkv) {
        RETURN_IF_ERROR(Projection(b.xn, w.wqkv, w.bqkv, b.qkv));
        RETURN_IF_ERROR(ops.QkvRopeKv(b.qkv, rope, q3, k3, v3, cache));
      } else if (!w.wqkv.empty()) {  // One GEMM, then its three column blocks.
        RETURN_IF_ERROR(Projection(b.xn, w.wqkv, w.bqkv, b.qkv));
        RETURN_IF_ERROR(ops.SplitQkv(b.qkv, b.q, b.k, b.v));
      } else {
        RETURN_IF_ERROR(Projection(b.xn, w.wq, w.bq, b.q));
        RETURN_IF_ERROR(Projection(b.xn, w.wk, w.bk, b.k));
        RETURN_IF_ERROR(Projection(b.xn, w.wv, w.bv, b.v));
      }
      if (!w.q_norm.empty()) {  // Qwen3: RMSNorm of each head, then RoPE.
        ASSIGN_OR_RETURN(Tensor qh, b.q.Reshaped({s * spec.n_heads(), d}));
        ASSIGN_OR_RETURN(Tensor kh, b.k.Reshaped({s * spec.n_kv_heads(), d}));
        RETURN_IF_ERROR(ops.RmsNorm(qh, w.q_norm, c.rms_norm_eps, qh));
        RETURN_IF_ERROR(ops.RmsNorm(kh, w.k_norm, c.rms_norm_eps, kh));
      }
      if (!fused_qkv) {
        RETURN_IF_ERROR(tok.Rope(q3, rope));
        RETURN_IF_ERROR(tok.Rope(k3, rope));
        if (seq != nullptr) {  // Every rank's slice of Q, K and V.
          RETURN_IF_ERROR(GatherSlices(b.q_slot, b.q_all));
          RETURN_IF_ERROR(GatherSlices(b.k_slot, b.k_all));
          RETURN_IF_ERROR(GatherSlices(b.v_slot, b.v_all));
        }
        RETURN_IF_ERROR(ops.WriteKv(ka3, va3, cache));
      }
      const LayerAttention how{.scale = scale,
                               .window = c.LayerWindow(layer),
                               .softcap = c.attn_softcap,
                               .sinks = w.sinks};
      RETURN_IF_ERROR(Attention(qa3, cache, how, attn3, b));
      if (c.attention_gate) {
        RETURN_IF_ERROR(ops.SigmoidGate(b.attn, b.attn_gate));
      }
      RETURN_IF_ERROR(
          Residual(attn_rows, w.wo, w.wo_offset, w.post_attn_norm, b, w.bo));
    }
    // FFN: x += w_down (silu(w_gate xn) * w_up xn) over this rank's columns
    // (GELU for Gemma, whose sum is normed before the add).
    RETURN_IF_ERROR(ops.RmsNorm(b.x, w.ffn_norm, c.rms_norm_eps, b.xn));
    if (c.LayerIsMoe(layer)) {
      RETURN_IF_ERROR(Experts(w, b));
      continue;
    }
    if (!w.w_gate_up.empty() && c.ffn_activation == FfnActivation::kSilu) {
      RETURN_IF_ERROR(ops.Linear(b.xn, w.w_gate_up, b.gate_up, false));
      RETURN_IF_ERROR(ops.SwiGluFused(b.gate_up, b.h));
    } else if (!w.w_gate_up.empty()) {
      return absl::UnimplementedError("GeGLU over fused gate/up weights");
    } else {
      RETURN_IF_ERROR(ops.Linear(b.xn, w.w_gate, b.gate, false));
      RETURN_IF_ERROR(ops.Linear(b.xn, w.w_up, b.up, false));
      RETURN_IF_ERROR(Activation(b.gate, b.up, b.h));
    }
    RETURN_IF_ERROR(
        Residual(b.h, w.w_down, w.w_down_offset, w.post_ffn_norm, b));
  }
  if (!spec.last_stage()) {
    return Comm([&] { return comms.pp->Send(b.x, spec.pp_rank + 1); });
  }
  return absl::OkStatus();
}

absl::StatusOr<Tensor> ShardForward::Logits(ForwardBuffers& b) const {
  const ModelConfig& c = weights.config;
  const ShardSpec& spec = weights.spec;
  const int64_t m = b.last.empty() ? 0 : b.last.dim(0);
  if (m == 0) return Tensor();  // A prefill chunk that samples nothing.
  // Final norm and LM head, only for the rows whose logits are wanted.
  if (seq == nullptr) {
    RETURN_IF_ERROR(ops.GatherLogitRows(b.x, b.last));
  } else {
    // Each CP rank has the rows of its slice and zeros for the others'.
    RETURN_IF_ERROR(seq->ops.GatherLogitRows(b.x, b.last));
    RETURN_IF_ERROR(Comm(
        [&] { return comms.cp->AllReduce(b.last, b.last, ReduceOp::kSum); }));
  }
  RETURN_IF_ERROR(
      ops.RmsNorm(b.last, weights.output_norm, c.rms_norm_eps, b.last_n));
  // This rank's vocabulary rows, padded to vocab_padded.
  RETURN_IF_ERROR(ops.Linear(b.last_n, weights.lm_head, b.local_logits, false));
  if (c.final_softcap > 0) {  // Gemma 2.
    RETURN_IF_ERROR(ops.SoftCap(b.local_logits, c.final_softcap));
  }
  if (comms.tp == nullptr) return b.local_logits;

  // Gathered where the logits are (NCCL needs device memory), reordered on
  // the host.
  const int tp = spec.tp_size;
  RETURN_IF_ERROR(
      Comm([&] { return comms.tp->AllGather(b.local_logits, b.gathered); }));
  // Only TP rank 0's logits are sampled (and returned); the others took
  // part in the gather.
  if (spec.tp_rank != 0) return Tensor();
  ASSIGN_OR_RETURN(Tensor gathered, ops.ToHost(b.gathered));
  ASSIGN_OR_RETURN(Tensor logits, Tensor::Host(DType::kF32, {m, c.vocab_size}));
  for (int t = 0; t < tp; ++t) {
    const auto [v0, v1] = EvenSplit(c.vocab_size, tp, t);
    for (int64_t r = 0; r < m; ++r) {
      std::copy_n(gathered.f32().data() + (t * m + r) * spec.vocab_padded,
                  v1 - v0, logits.f32().data() + r * c.vocab_size + v0);
    }
  }
  return logits;
}

}  // namespace shardlm
