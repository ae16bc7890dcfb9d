#include "step/step_codec.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "core/status.h"
#include "step/late_masks.h"

namespace shardlm {

void BlockTableDeltas::Delta(int64_t seq_id, const std::vector<int32_t>& table,
                             std::vector<int32_t>* delta, int32_t* keep) {
  std::vector<int32_t>& sent = sent_[seq_id];
  const size_t same = static_cast<size_t>(
      std::mismatch(sent.begin(), sent.end(), table.begin(), table.end())
          .first -
      sent.begin());
  *keep = same == sent.size() ? -1 : static_cast<int32_t>(same);
  delta->assign(table.begin() + same, table.end());
  sent = table;
}

void BlockTableDeltas::Release(int64_t seq_id) {
  if (sent_.erase(seq_id) > 0) released_.push_back(seq_id);
}

std::vector<int64_t> BlockTableDeltas::TakeReleased() {
  std::vector<int64_t> out;
  out.swap(released_);
  return out;
}

absl::Status EncodeStepPlan(const StepInput& step, int64_t step_id,
                            BlockTableDeltas& sent, v1::StepPlan* plan,
                            int64_t* blocks_sent) {
  if (step.seq_ids.size() != step.block_tables.size()) {
    return absl::InvalidArgumentError(
        absl::StrCat("step has ", step.seq_ids.size(), " sequence ids for ",
                     step.block_tables.size(), " block tables"));
  }
  if (!step.state_slots.empty() &&
      step.state_slots.size() != step.seq_ids.size()) {
    return absl::InvalidArgumentError(
        absl::StrCat("step has ", step.state_slots.size(), " state slots for ",
                     step.seq_ids.size(), " sequences"));
  }
  plan->Clear();
  plan->set_step_id(step_id);
  plan->mutable_tokens()->Add(step.tokens.begin(), step.tokens.end());
  plan->mutable_positions()->Add(step.positions.begin(), step.positions.end());
  plan->mutable_token_seq()->Add(step.token_seq.begin(), step.token_seq.end());
  plan->mutable_seq_ids()->Add(step.seq_ids.begin(), step.seq_ids.end());
  plan->mutable_state_slots()->Add(step.state_slots.begin(),
                                   step.state_slots.end());
  int64_t blocks = 0;
  std::vector<int32_t> delta;
  for (size_t i = 0; i < step.seq_ids.size(); ++i) {
    int32_t keep = -1;
    sent.Delta(step.seq_ids[i], step.block_tables[i], &delta, &keep);
    if (delta.empty() && keep < 0) continue;
    v1::BlockTableDelta& d = *plan->add_deltas();
    d.set_seq_id(step.seq_ids[i]);
    if (keep >= 0) d.set_keep(keep);
    d.mutable_new_blocks()->Add(delta.begin(), delta.end());
    blocks += static_cast<int64_t>(delta.size());
  }
  for (int64_t id : sent.TakeReleased()) plan->add_released(id);
  plan->mutable_logit_rows()->Add(step.logit_rows.begin(),
                                  step.logit_rows.end());
  for (const SamplingParams& p : step.sampling) {
    v1::SamplingParams& s = *plan->add_sampling();
    s.set_temperature(p.temperature);
    s.set_top_k(p.top_k);
    s.set_top_p(p.top_p);
    s.set_seed(p.seed);
    s.set_presence_penalty(p.presence_penalty);
    s.set_frequency_penalty(p.frequency_penalty);
    s.set_repetition_penalty(p.repetition_penalty);
    for (const LogitBias& b : p.logit_bias) {
      (*s.mutable_logit_bias())[b.token] = b.bias;
    }
  }
  // A plan leaves the process with its masks (waited for, if late).
  for (const SampleHistory& h : ResolvedHistory(step)) {
    v1::SampleHistory& out = *plan->add_history();
    out.mutable_tokens()->Add(h.tokens.begin(), h.tokens.end());
    out.mutable_counts()->Add(h.counts.begin(), h.counts.end());
    out.mutable_masked()->Add(h.masked.begin(), h.masked.end());
    out.mutable_allowed()->Add(h.allowed.begin(), h.allowed.end());
  }
  plan->mutable_sample_index()->Add(step.sample_index.begin(),
                                    step.sample_index.end());
  plan->set_return_logits(step.return_logits);
  for (const BlockCopy& c : step.copies) {
    v1::BlockCopy& out = *plan->add_copies();
    out.set_src(c.src);
    out.set_dst(c.dst);
  }
  for (const BlockCopy& c : step.state_copies) {
    v1::BlockCopy& out = *plan->add_state_copies();
    out.set_src(c.src);
    out.set_dst(c.dst);
  }
  plan->mutable_logprobs()->Add(step.logprobs.begin(), step.logprobs.end());
  plan->mutable_score_tokens()->Add(step.score_tokens.begin(),
                                    step.score_tokens.end());
  if (blocks_sent != nullptr) *blocks_sent = blocks;
  return absl::OkStatus();
}

StepInput DecodeStepPlan(const v1::StepPlan& plan, BlockTableMirror& tables) {
  // Released first: a sequence may be released and resent in one plan.
  for (int64_t id : plan.released()) tables.erase(id);
  for (const v1::BlockTableDelta& d : plan.deltas()) {
    std::vector<int32_t>& t = tables[d.seq_id()];
    if (d.has_keep() && d.keep() >= 0 &&
        static_cast<size_t>(d.keep()) < t.size()) {
      t.resize(d.keep());
    }
    t.insert(t.end(), d.new_blocks().begin(), d.new_blocks().end());
  }
  StepInput step;
  step.tokens.assign(plan.tokens().begin(), plan.tokens().end());
  step.positions.assign(plan.positions().begin(), plan.positions().end());
  step.token_seq.assign(plan.token_seq().begin(), plan.token_seq().end());
  step.seq_ids.assign(plan.seq_ids().begin(), plan.seq_ids().end());
  step.state_slots.assign(plan.state_slots().begin(), plan.state_slots().end());
  for (int64_t id : plan.seq_ids()) {
    auto it = tables.find(id);
    step.block_tables.push_back(it == tables.end() ? std::vector<int32_t>{}
                                                   : it->second);
  }
  step.logit_rows.assign(plan.logit_rows().begin(), plan.logit_rows().end());
  for (const v1::SamplingParams& s : plan.sampling()) {
    SamplingParams& p = step.sampling.emplace_back(SamplingParams{
        .temperature = s.temperature(),
        .top_k = s.top_k(),
        .top_p = s.top_p() == 0.0f ? 1.0f : s.top_p(),
        .seed = s.seed(),
        .presence_penalty = s.presence_penalty(),
        .frequency_penalty = s.frequency_penalty(),
        .repetition_penalty =
            s.repetition_penalty() == 0.0f ? 1.0f : s.repetition_penalty()});
    // A map's order on the wire is unspecified; the contract's is by id.
    for (const auto& entry : s.logit_bias()) {
      p.logit_bias.push_back({.token = entry.first, .bias = entry.second});
    }
    std::sort(p.logit_bias.begin(), p.logit_bias.end(),
              [](const LogitBias& a, const LogitBias& b) {
                return a.token < b.token;
              });
  }
  for (const v1::SampleHistory& h : plan.history()) {
    step.history.push_back(
        {.tokens = {h.tokens().begin(), h.tokens().end()},
         .counts = {h.counts().begin(), h.counts().end()},
         .masked = {h.masked().begin(), h.masked().end()},
         .allowed = {h.allowed().begin(), h.allowed().end()}});
  }
  step.sample_index.assign(plan.sample_index().begin(),
                           plan.sample_index().end());
  step.return_logits = plan.return_logits();
  for (const v1::BlockCopy& c : plan.copies()) {
    step.copies.push_back({.src = c.src(), .dst = c.dst()});
  }
  for (const v1::BlockCopy& c : plan.state_copies()) {
    step.state_copies.push_back({.src = c.src(), .dst = c.dst()});
  }
  step.logprobs.assign(plan.logprobs().begin(), plan.logprobs().end());
  step.score_tokens.assign(plan.score_tokens().begin(),
                           plan.score_tokens().end());
  return step;
}

void EncodeKvCacheOptions(const KvCacheOptions& kv, v1::KvCacheOptions* out) {
  out->set_block_size(kv.block_size);
  out->set_kv_cache_bytes(kv.kv_cache_bytes);
  out->set_cpu_offload_bytes(kv.cpu_offload_bytes);
  out->set_dtype(KvCacheDTypeName(kv.DTypeOnCpu()));
  out->set_gpu_memory_utilization(kv.gpu_memory_utilization);
  out->set_prefix_caching(kv.prefix_caching);
  out->set_checksum(kv.checksum);
}

absl::StatusOr<KvCacheOptions> DecodeKvCacheOptions(
    const v1::KvCacheOptions& in) {
  KvCacheOptions kv{.block_size = in.block_size(),
                    .kv_cache_bytes = in.kv_cache_bytes(),
                    .cpu_offload_bytes = in.cpu_offload_bytes(),
                    .gpu_memory_utilization = in.gpu_memory_utilization(),
                    .prefix_caching = in.prefix_caching(),
                    .checksum = in.checksum()};
  ASSIGN_OR_RETURN(kv.dtype, ParseKvCacheDType(in.dtype()));
  RETURN_IF_ERROR(kv.Validate());
  return kv;
}

void EncodeBatchLimits(const BatchLimits& limits, v1::BatchLimits* out) {
  out->set_max_batched_tokens(limits.max_batched_tokens);
  out->set_max_seqs(limits.max_seqs);
  out->set_max_queued(limits.max_queued);
}

absl::StatusOr<BatchLimits> DecodeBatchLimits(const v1::BatchLimits& in) {
  const BatchLimits limits{.max_batched_tokens = in.max_batched_tokens(),
                           .max_seqs = in.max_seqs(),
                           .max_queued = in.max_queued()};
  RETURN_IF_ERROR(limits.Validate());
  return limits;
}

}  // namespace shardlm
