#include "worker/model_runner.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <numeric>

#include "absl/strings/str_cat.h"
#include "core/status.h"
#include "kernels/attention/paged_attention.h"
#include "kernels/threading.h"
#include "worker/cpu_forward_ops.h"
#include "worker/sample_step.h"

namespace shardlm {

absl::Status ModelRunner::Validate(const StepInput& step) const {
  const ModelConfig& c = config();
  const size_t n = step.tokens.size();
  if (n == 0 && step.copies.empty() && step.state_copies.empty()) {
    return absl::InvalidArgumentError("step has no tokens and no copies");
  }
  if (step.positions.size() != n || step.token_seq.size() != n) {
    return absl::InvalidArgumentError(
        absl::StrCat("step has ", n, " tokens but ", step.positions.size(),
                     " positions and ", step.token_seq.size(), " seq ids"));
  }
  const int64_t bs = kv_->config().block_size;
  const int64_t cp = weights_.spec.cp_size;
  // Under CP the ids are the group's (see the class comment).
  const int64_t pool = kv_->config().total_blocks() * cp;
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
      if (b < 0 || b >= pool) {
        return absl::InvalidArgumentError(
            absl::StrCat("KV block ", b, " is outside the pool of ", pool));
      }
    }
  }
  for (const BlockCopy& copy : step.copies) {
    if (copy.src % cp != copy.dst % cp) {
      return absl::UnimplementedError(absl::StrCat(
          "KV block copy ", copy.src, " -> ", copy.dst, " crosses CP ranks ",
          copy.src % cp, " and ", copy.dst % cp,
          " (copies between CP ranks are not built)"));
    }
  }
  if (kv_->config().linear_layers > 0) {
    // Gated DeltaNet layers here: every sequence's state slot.
    if (step.state_slots.size() != step.block_tables.size()) {
      return absl::InvalidArgumentError(absl::StrCat(
          "step has ", step.state_slots.size(), " state slots for ",
          step.block_tables.size(), " sequences"));
    }
    const int64_t slots = kv_->config().total_state_slots();
    for (const BlockCopy& copy : step.state_copies) {
      if (copy.src < 0 || copy.src >= slots || copy.dst < 0 ||
          copy.dst >= slots || copy.src == copy.dst) {
        return absl::InvalidArgumentError(
            absl::StrCat("state slot copy ", copy.src, " -> ", copy.dst,
                         " in a pool of ", slots, " slots"));
      }
    }
    std::vector<int32_t> seen(step.state_slots);
    std::sort(seen.begin(), seen.end());
    for (size_t i = 0; i < seen.size(); ++i) {
      if (seen[i] < 0 || seen[i] >= kv_->config().state_slots ||
          (i > 0 && seen[i] == seen[i - 1])) {
        return absl::InvalidArgumentError(
            absl::StrCat("state slot ", seen[i], " is outside the ",
                         kv_->config().state_slots, " held or named twice"));
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

RunnerStats ModelRunner::stats() const {
  RunnerStats s = stats_;
  s.kv_dtype = kv_->stored_dtype();
  s.kv_bytes_per_token = kv_->StoredBytesPerToken();
  return s;
}

absl::StatusOr<Tensor> ModelRunner::Forward(const StepInput& step) {
  const StepTimer timer(stats_);
  RETURN_IF_ERROR(Validate(step));
  EnsureCpuThreads(cpu_threads_);
  stats_.cpu_threads = CpuThreads();
  const ShardSpec& spec = weights_.spec;
  const int cp = spec.cp_size;
  if (cp > 1 && comms_.cp == nullptr) {
    return absl::FailedPreconditionError(absl::StrCat(
        "CP rank ", spec.cp_rank, " of ", cp, " has no CP communicator"));
  }
  // This rank's slot of a group block id under CP, or -1: another rank's.
  const auto local = [&](int32_t g) {
    return g % cp == spec.cp_rank ? g / cp : -1;
  };
  std::vector<BlockCopy> copies;
  for (const BlockCopy& copy : step.copies) {
    if (local(copy.src) >= 0) {
      copies.push_back({local(copy.src), local(copy.dst)});
    }
  }
  if (!copies.empty()) {
    const auto copy_start = std::chrono::steady_clock::now();
    RETURN_IF_ERROR(kv_->CopyBlocks(copies));
    stats_.copy_seconds += std::chrono::duration<double>(
                               std::chrono::steady_clock::now() - copy_start)
                               .count();
    stats_.copied_blocks += static_cast<int64_t>(copies.size());
  }
  if (!step.state_copies.empty() && kv_->config().linear_layers > 0) {
    RETURN_IF_ERROR(kv_->CopyStates(step.state_copies));
  }
  if (step.tokens.empty()) {  // Copies only.
    RETURN_IF_ERROR(kv_->TakeChecksumFailures());
    return Tensor();
  }
  const ModelConfig& c = config();
  const int64_t n = static_cast<int64_t>(step.tokens.size());
  const int64_t m = static_cast<int64_t>(step.logit_rows.size());
  const int64_t ffn = spec.ffn_end - spec.ffn_begin;
  const int64_t q_dim = spec.n_heads() * c.head_dim;
  const int64_t kv_dim = spec.n_kv_heads() * c.head_dim;

  AttentionBatch batch{.positions = step.positions,
                       .token_seq = step.token_seq};
  std::vector<std::vector<int32_t>> local_tables;  // Under CP.
  if (cp > 1) {
    for (const auto& table : step.block_tables) {
      std::vector<int32_t>& t = local_tables.emplace_back(table.size());
      std::transform(table.begin(), table.end(), t.begin(), local);
    }
    batch.remote_blocks = true;
  }
  for (const auto& table : cp > 1 ? local_tables : step.block_tables) {
    batch.block_tables.push_back(table);
  }

  // Sequence parallel (SequenceParallel in worker/forward.h): a step of at
  // least C tokens is split into C contiguous slices, CP rank c running
  // tokens [c n / C, (c + 1) n / C) through the token-wise work; a shorter
  // one (a lone sequence's decode) runs whole on every CP rank.
  const bool seq_parallel = cp > 1 && n >= cp;
  int64_t s = n;          // Tokens this rank runs through the projections.
  int64_t slot_rows = n;  // The longest slice (what each rank sends).
  StepInput slice_step;   // This rank's slice (tokens, positions, logit rows).
  std::vector<int64_t> slice_begin;
  if (seq_parallel) {
    for (int64_t r = 0; r <= cp; ++r) slice_begin.push_back(r * n / cp);
    const int64_t b0 = slice_begin[spec.cp_rank];
    const int64_t b1 = slice_begin[spec.cp_rank + 1];
    s = b1 - b0;
    slot_rows = (n + cp - 1) / cp;
    slice_step.tokens.assign(step.tokens.begin() + b0,
                             step.tokens.begin() + b1);
    slice_step.positions.assign(step.positions.begin() + b0,
                                step.positions.begin() + b1);
    slice_step.token_seq.assign(step.token_seq.begin() + b0,
                                step.token_seq.begin() + b1);
    for (int32_t r : step.logit_rows) {
      slice_step.logit_rows.push_back(r >= b0 && r < b1 ? r - b0 : -1);
    }
  }
  stats_.token_rows += s;

  // Activations, f32 throughout; SwiGLU and the final norm work in place.
  // Token-wise buffers have s rows, attention's n.
  ForwardBuffers b;
  const auto host = [](Shape shape) {
    return Tensor::Host(DType::kF32, std::move(shape));
  };
  ASSIGN_OR_RETURN(b.x, host({s, c.hidden}));
  ASSIGN_OR_RETURN(b.xn, host({s, c.hidden}));
  ASSIGN_OR_RETURN(b.partial, host({s, c.hidden}));
  if (seq_parallel) {
    ASSIGN_OR_RETURN(b.q_slot, host({slot_rows, q_dim}));
    ASSIGN_OR_RETURN(b.k_slot, host({slot_rows, kv_dim}));
    ASSIGN_OR_RETURN(b.v_slot, host({slot_rows, kv_dim}));
    ASSIGN_OR_RETURN(b.q, b.q_slot.Rows(0, s));
    ASSIGN_OR_RETURN(b.k, b.k_slot.Rows(0, s));
    ASSIGN_OR_RETURN(b.v, b.v_slot.Rows(0, s));
    ASSIGN_OR_RETURN(b.q_all, host({cp * slot_rows, q_dim}));
    ASSIGN_OR_RETURN(b.k_all, host({cp * slot_rows, kv_dim}));
    ASSIGN_OR_RETURN(b.v_all, host({cp * slot_rows, kv_dim}));
  } else if (c.is_mla()) {
    // Multi-head latent attention: no per-head K and V (ForwardBuffers).
    const int64_t heads = spec.n_heads(), r = c.RotaryDims();
    ASSIGN_OR_RETURN(b.q, host({n, q_dim}));
    if (c.q_lora_rank > 0) {
      ASSIGN_OR_RETURN(b.q_a, host({n, c.q_lora_rank}));
    }
    ASSIGN_OR_RETURN(b.kv_rope, host({n, r}));
    ASSIGN_OR_RETURN(b.kv_latent, host({n, c.kv_lora_rank}));
    ASSIGN_OR_RETURN(b.q_absorbed, host({n, heads, r + c.kv_lora_rank}));
    ASSIGN_OR_RETURN(b.attn_latent, host({n, heads, c.kv_lora_rank}));
  } else {
    ASSIGN_OR_RETURN(b.q, host({n, q_dim}));
    ASSIGN_OR_RETURN(b.k, host({n, kv_dim}));
    ASSIGN_OR_RETURN(b.v, host({n, kv_dim}));
  }
  ASSIGN_OR_RETURN(
      b.attn, host({n, c.is_mla() ? spec.n_heads() * c.v_head_dim : q_dim}));
  if (c.attention_gate) {
    ASSIGN_OR_RETURN(b.q_gate, host({n, 2 * q_dim}));
    ASSIGN_OR_RETURN(b.attn_gate, host({n, q_dim}));
  }
  if (c.is_hybrid()) {
    const auto [v0, v1] = SsmValueHeads(c, spec);
    const int64_t values = (v1 - v0) * c.ssm_v_dim;
    ASSIGN_OR_RETURN(b.ssm_qk, host({n, 2 * c.ssm_k_heads * c.ssm_k_dim}));
    ASSIGN_OR_RETURN(b.ssm_v, host({n, values}));
    ASSIGN_OR_RETURN(b.ssm_z, host({n, values}));
    ASSIGN_OR_RETURN(b.ssm_out, host({n, values}));
    ASSIGN_OR_RETURN(b.ssm_beta, host({n, v1 - v0}));
    ASSIGN_OR_RETURN(b.ssm_alpha, host({n, v1 - v0}));
  }
  if (comms_.cp != nullptr) {
    ASSIGN_OR_RETURN(b.lse, host({n, spec.n_heads()}));
    ASSIGN_OR_RETURN(b.cp_out, host({cp, n, q_dim}));
    ASSIGN_OR_RETURN(b.cp_lse, host({cp, n, spec.n_heads()}));
  }
  if (c.is_moe()) {
    ASSIGN_OR_RETURN(b.router_logits, host({s, c.n_experts}));
    ASSIGN_OR_RETURN(b.moe_x, host({s, c.hidden}));
    ASSIGN_OR_RETURN(b.moe_gate, host({s, ffn}));
    ASSIGN_OR_RETURN(b.moe_up, host({s, ffn}));
    ASSIGN_OR_RETURN(b.moe_out, host({s, c.hidden}));
    b.moe_h = b.moe_gate;
    if (const int64_t shared = spec.shared_ffn_end - spec.shared_ffn_begin;
        shared > 0) {
      ASSIGN_OR_RETURN(b.shared_gate, host({s, shared}));
      ASSIGN_OR_RETURN(b.shared_up, host({s, shared}));
      b.shared_h = b.shared_gate;
      if (c.shared_expert_gate) {
        ASSIGN_OR_RETURN(b.shared_gate_logit, host({s, 1}));
      }
    }
  }
  if (c.HasDenseLayers()) {
    const auto [f0, f1] = DenseFfnColumns(c, spec);
    ASSIGN_OR_RETURN(b.gate, host({s, f1 - f0}));
    ASSIGN_OR_RETURN(b.up, host({s, f1 - f0}));
    b.h = b.gate;
  }
  if (spec.last_stage() && m > 0) {
    ASSIGN_OR_RETURN(b.last, host({m, c.hidden}));
    b.last_n = b.last;
    ASSIGN_OR_RETURN(b.local_logits, host({m, spec.vocab_padded}));
    if (comms_.tp != nullptr) {
      ASSIGN_OR_RETURN(b.gathered, host({spec.tp_size, m, spec.vocab_padded}));
    }
  }

  CpuForwardOps ops(step, batch, c.hidden);
  CpuForwardOps slice_ops(slice_step, batch, c.hidden);
  const SequenceParallel seq{.ops = slice_ops,
                             .begin = slice_begin,
                             .rows = slot_rows,
                             .rank = spec.cp_rank};
  if (stats_.expert_tokens.size() != static_cast<size_t>(spec.n_experts())) {
    stats_.expert_begin = spec.expert_begin;
    stats_.expert_tokens.assign(spec.n_experts(), 0);
  }
  const ShardForward forward{
      .weights = weights_,
      .comms = comms_,
      .ops = ops,
      .comm =
          [this](const std::function<absl::Status()>& call) {
            return Comm(call);
          },
      .expert_tokens = &stats_.expert_tokens,
      .seq = seq_parallel ? &seq : nullptr};
  const int64_t cp_bytes_before =
      comms_.cp != nullptr ? comms_.cp->bytes_sent().total() : 0;
  RETURN_IF_ERROR(
      forward.Layers(b, {.k = &kv_->k_layers(),
                         .v = &kv_->v_layers(),
                         .conv_state = &kv_->conv_states(),
                         .recurrent_state = &kv_->recurrent_states()}));
  absl::StatusOr<Tensor> logits =
      spec.last_stage() ? forward.Logits(b) : Tensor();
  if (comms_.cp != nullptr) {
    const int64_t sent = comms_.cp->bytes_sent().total() - cp_bytes_before;
    (seq_parallel ? stats_.cp_split_steps : stats_.cp_whole_steps) += 1;
    (seq_parallel ? stats_.cp_split_bytes : stats_.cp_whole_bytes) += sent;
  }
  // Only now: the step ran in full, so that its peers' collectives with
  // this rank completed; its tokens are not to be used.
  RETURN_IF_ERROR(kv_->TakeChecksumFailures());
  return logits;
}

}  // namespace shardlm
