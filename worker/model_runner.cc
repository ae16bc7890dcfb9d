#include "worker/model_runner.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <numeric>

#include "absl/cleanup/cleanup.h"
#include "absl/strings/str_cat.h"
#include "core/status.h"
#include "kernels/add/add.h"
#include "kernels/attention/paged_attention.h"
#include "kernels/embedding/embedding.h"
#include "kernels/linear/linear.h"
#include "kernels/rmsnorm/rmsnorm.h"
#include "kernels/rope/rope.h"
#include "kernels/swiglu/swiglu.h"

namespace shardlm {

absl::Status ModelRunner::Validate(const StepInput& step) const {
  const ModelConfig& c = config();
  const size_t n = step.tokens.size();
  if (n == 0 && step.copies.empty()) {
    return absl::InvalidArgumentError("step has no tokens and no copies");
  }
  if (step.positions.size() != n || step.token_seq.size() != n) {
    return absl::InvalidArgumentError(
        absl::StrCat("step has ", n, " tokens but ", step.positions.size(),
                     " positions and ", step.token_seq.size(), " seq ids"));
  }
  const int64_t bs = kv_->config().block_size;
  for (size_t i = 0; i < n; ++i) {
    if (step.tokens[i] < 0 || step.tokens[i] >= c.vocab_size) {
      return absl::InvalidArgumentError(
          absl::StrCat("token id ", step.tokens[i],
                       " is outside the vocabulary of ", c.vocab_size));
    }
    if (step.positions[i] < 0 || step.positions[i] >= c.context_length) {
      return absl::InvalidArgumentError(
          absl::StrCat("position ", step.positions[i],
                       " is outside the context of ", c.context_length));
    }
    const int32_t s = step.token_seq[i];
    if (s < 0 || static_cast<size_t>(s) >= step.block_tables.size() ||
        static_cast<int64_t>(step.block_tables[s].size()) <=
            step.positions[i] / bs) {
      return absl::InvalidArgumentError(
          absl::StrCat("token ", i, " of sequence ", s,
                       " has no KV block for position ", step.positions[i]));
    }
  }
  for (const auto& table : step.block_tables) {
    for (int32_t b : table) {
      if (b < 0 || b >= kv_->config().total_blocks()) {
        return absl::InvalidArgumentError(
            absl::StrCat("KV block ", b, " is outside the pool of ",
                         kv_->config().total_blocks()));
      }
    }
  }
  for (int32_t r : step.logit_rows) {
    if (r < 0 || static_cast<size_t>(r) >= n) {
      return absl::InvalidArgumentError(
          absl::StrCat("logit row ", r, " of a step of ", n, " tokens"));
    }
  }
  return absl::OkStatus();
}

TokenLogprobs Logprobs(absl::Span<const float> logits, int32_t sampled,
                       int32_t top_n) {
  const int64_t vocab = static_cast<int64_t>(logits.size());
  double max = -INFINITY;
  for (float l : logits) max = std::max<double>(max, l);
  double sum = 0;
  for (float l : logits) sum += std::exp(static_cast<double>(l) - max);
  const double log_z = max + std::log(sum);
  const auto logprob = [&](int32_t t) {
    return static_cast<float>(static_cast<double>(logits[t]) - log_z);
  };
  TokenLogprobs out;
  out.sampled = logprob(sampled);
  std::vector<int32_t> ids(vocab);
  std::iota(ids.begin(), ids.end(), 0);
  const int64_t n = std::min<int64_t>(top_n, vocab);
  std::partial_sort(
      ids.begin(), ids.begin() + n, ids.end(), [&](int32_t a, int32_t b) {
        return logits[a] > logits[b] || (logits[a] == logits[b] && a < b);
      });
  for (int64_t i = 0; i < n; ++i) out.top.push_back({ids[i], logprob(ids[i])});
  return out;
}

absl::StatusOr<StepOutput> SampleStep(const StepInput& step, Tensor logits) {
  const size_t rows = step.logit_rows.size();
  if (step.sampling.size() != rows || step.sample_index.size() != rows) {
    return absl::InvalidArgumentError(
        absl::StrCat("step has ", rows, " logit rows but ",
                     step.sampling.size(), " sampling parameters and ",
                     step.sample_index.size(), " sample indices"));
  }
  if (!step.logprobs.empty() && step.logprobs.size() != rows) {
    return absl::InvalidArgumentError(
        absl::StrCat("step has ", rows, " logit rows but ",
                     step.logprobs.size(), " logprobs counts"));
  }
  for (int32_t n : step.logprobs) {
    if (n < 0 || n > kMaxLogprobs) {
      return absl::InvalidArgumentError(
          absl::StrCat("logprobs must be in [0, ", kMaxLogprobs, "], got ", n));
    }
  }
  StepOutput out;
  if (rows == 0) return out;
  const int64_t vocab = logits.dim(1);
  const bool any_logprobs =
      std::any_of(step.logprobs.begin(), step.logprobs.end(),
                  [](int32_t n) { return n > 0; });
  if (any_logprobs) out.logprobs.resize(rows);
  for (size_t r = 0; r < rows; ++r) {
    const absl::Span<const float> row(logits.f32().data() + r * vocab, vocab);
    out.tokens.push_back(
        SampleToken(row, step.sampling[r], step.sample_index[r]));
    if (any_logprobs && step.logprobs[r] > 0) {
      out.logprobs[r] = Logprobs(row, out.tokens.back(), step.logprobs[r]);
    }
  }
  if (step.return_logits) out.logits = std::move(logits);
  return out;
}

absl::Status ModelRunner::AddReduced(Tensor& x, Tensor& y) {
  if (comms_.tp != nullptr) {
    RETURN_IF_ERROR(
        Comm([&] { return comms_.tp->AllReduce(y, y, ReduceOp::kSum); }));
  }
  return AddInPlace(x, y);
}

absl::StatusOr<Tensor> ModelRunner::Forward(const StepInput& step) {
  const auto start = std::chrono::steady_clock::now();
  absl::Cleanup account = [&] {
    stats_.forward_seconds +=
        std::chrono::duration<double>(std::chrono::steady_clock::now() - start)
            .count();
    ++stats_.steps;
  };
  RETURN_IF_ERROR(Validate(step));
  if (!step.copies.empty()) {
    const auto copy_start = std::chrono::steady_clock::now();
    RETURN_IF_ERROR(kv_->CopyBlocks(step.copies));
    stats_.copy_seconds += std::chrono::duration<double>(
                               std::chrono::steady_clock::now() - copy_start)
                               .count();
    stats_.copied_blocks += static_cast<int64_t>(step.copies.size());
  }
  if (step.tokens.empty()) return Tensor();  // Copies only.
  const ModelConfig& c = config();
  const ShardSpec& spec = weights_.spec;
  const int64_t n = static_cast<int64_t>(step.tokens.size());
  const int64_t heads = spec.n_heads(), kv_heads = spec.n_kv_heads();
  const int64_t ffn = spec.ffn_end - spec.ffn_begin;
  const int64_t q_dim = heads * c.head_dim, kv_dim = kv_heads * c.head_dim;
  const float scale = 1.0f / std::sqrt(static_cast<float>(c.head_dim));

  AttentionBatch batch{.positions = step.positions,
                       .token_seq = step.token_seq};
  for (const auto& table : step.block_tables) {
    batch.block_tables.push_back(table);
  }

  // Activations, reused across layers.
  ASSIGN_OR_RETURN(Tensor x, Tensor::Host(DType::kF32, {n, c.hidden}));
  ASSIGN_OR_RETURN(Tensor xn, Tensor::Host(DType::kF32, {n, c.hidden}));
  ASSIGN_OR_RETURN(Tensor partial, Tensor::Host(DType::kF32, {n, c.hidden}));
  ASSIGN_OR_RETURN(Tensor q, Tensor::Host(DType::kF32, {n, q_dim}));
  ASSIGN_OR_RETURN(Tensor k, Tensor::Host(DType::kF32, {n, kv_dim}));
  ASSIGN_OR_RETURN(Tensor v, Tensor::Host(DType::kF32, {n, kv_dim}));
  ASSIGN_OR_RETURN(Tensor attn, Tensor::Host(DType::kF32, {n, q_dim}));
  ASSIGN_OR_RETURN(Tensor gate, Tensor::Host(DType::kF32, {n, ffn}));
  ASSIGN_OR_RETURN(Tensor up, Tensor::Host(DType::kF32, {n, ffn}));
  // Per-head views of the same memory: [n, heads, head_dim].
  ASSIGN_OR_RETURN(Tensor q3, q.Reshaped({n, heads, c.head_dim}));
  ASSIGN_OR_RETURN(Tensor k3, k.Reshaped({n, kv_heads, c.head_dim}));
  ASSIGN_OR_RETURN(Tensor v3, v.Reshaped({n, kv_heads, c.head_dim}));
  ASSIGN_OR_RETURN(Tensor attn3, attn.Reshaped({n, heads, c.head_dim}));

  if (spec.first_stage()) {
    // Vocab-parallel: rows outside this rank's slice embed to zero, so the
    // sum over the TP group is the full embedding.
    RETURN_IF_ERROR(
        Embedding(weights_.token_embd, step.tokens, spec.vocab_begin, x));
    if (comms_.tp != nullptr) {
      RETURN_IF_ERROR(
          Comm([&] { return comms_.tp->AllReduce(x, x, ReduceOp::kSum); }));
    }
  } else {
    RETURN_IF_ERROR(Comm([&] { return comms_.pp->Recv(x, spec.pp_rank - 1); }));
  }
  for (int64_t l = 0; l < spec.n_layers(); ++l) {
    const LlamaLayerWeights& w = weights_.layers[l];
    // Attention: x += wo * attention(rope(wq xn), rope(wk xn), wv xn), each
    // rank over its own heads, partial sums of wo reduced over TP.
    RETURN_IF_ERROR(RmsNorm(x, w.attn_norm, c.rms_norm_eps, xn));
    RETURN_IF_ERROR(Linear(xn, w.wq, q));
    RETURN_IF_ERROR(Linear(xn, w.wk, k));
    RETURN_IF_ERROR(Linear(xn, w.wv, v));
    RETURN_IF_ERROR(Rope(q3, step.positions, c.rope_theta, c.rope_style));
    RETURN_IF_ERROR(Rope(k3, step.positions, c.rope_theta, c.rope_style));
    RETURN_IF_ERROR(WriteKv(k3, v3, batch, kv_->k(l), kv_->v(l)));
    RETURN_IF_ERROR(
        PagedAttention(q3, kv_->k(l), kv_->v(l), batch, scale, attn3));
    RETURN_IF_ERROR(Linear(attn, w.wo, partial));
    RETURN_IF_ERROR(AddReduced(x, partial));
    // FFN: x += w_down (silu(w_gate xn) * w_up xn) over this rank's columns.
    RETURN_IF_ERROR(RmsNorm(x, w.ffn_norm, c.rms_norm_eps, xn));
    RETURN_IF_ERROR(Linear(xn, w.w_gate, gate));
    RETURN_IF_ERROR(Linear(xn, w.w_up, up));
    RETURN_IF_ERROR(SwiGlu(gate, up, gate));
    RETURN_IF_ERROR(Linear(gate, w.w_down, partial));
    RETURN_IF_ERROR(AddReduced(x, partial));
  }
  if (!spec.last_stage()) {
    RETURN_IF_ERROR(Comm([&] { return comms_.pp->Send(x, spec.pp_rank + 1); }));
    return Tensor();
  }
  return Logits(x, step);
}

absl::StatusOr<Tensor> ModelRunner::Logits(const Tensor& x,
                                           const StepInput& step) {
  const ModelConfig& c = config();
  const ShardSpec& spec = weights_.spec;
  // Final norm and LM head, only for the rows whose logits are wanted.
  const int64_t m = static_cast<int64_t>(step.logit_rows.size());
  if (m == 0) return Tensor();  // A prefill chunk that samples nothing.
  ASSIGN_OR_RETURN(Tensor last, Tensor::Host(DType::kF32, {m, c.hidden}));
  for (int64_t r = 0; r < m; ++r) {
    std::copy_n(x.f32().data() + step.logit_rows[r] * c.hidden, c.hidden,
                last.f32().data() + r * c.hidden);
  }
  RETURN_IF_ERROR(RmsNorm(last, weights_.output_norm, c.rms_norm_eps, last));
  // This rank's vocabulary rows, padded to vocab_padded.
  ASSIGN_OR_RETURN(Tensor local,
                   Tensor::Host(DType::kF32, {m, spec.vocab_padded}));
  RETURN_IF_ERROR(Linear(last, weights_.lm_head, local));
  if (comms_.tp == nullptr) return local;

  const int tp = spec.tp_size;
  ASSIGN_OR_RETURN(Tensor gathered,
                   Tensor::Host(DType::kF32, {tp, m, spec.vocab_padded}));
  RETURN_IF_ERROR(Comm([&] { return comms_.tp->AllGather(local, gathered); }));
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
