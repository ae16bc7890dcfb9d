#include "coordinator/remote_executor.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "core/status.h"

namespace shardlm {

void BlockTableDeltas::Delta(int64_t seq_id, const std::vector<int32_t>& table,
                             std::vector<int32_t>* delta) {
  delta->clear();
  std::vector<int32_t>& sent = sent_[seq_id];
  if (sent.size() > table.size() ||
      !std::equal(sent.begin(), sent.end(), table.begin())) {
    released_.push_back(seq_id);
    sent.clear();
  }
  delta->assign(table.begin() + sent.size(), table.end());
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

absl::StatusOr<std::unique_ptr<RemoteExecutor>> RemoteExecutor::WaitForWorkers(
    ControlService& service, const ModelConfig& config, absl::Duration timeout,
    int64_t weight_bytes) {
  if (absl::Status s = service.WaitUntilReady(timeout); !s.ok()) {
    service.Shutdown(absl::StrCat("startup failed: ", s.message()));
    return s;
  }
  const int64_t blocks = service.min_kv_blocks();
  if (blocks <= 0) {
    service.Shutdown("workers hold no KV blocks");
    return absl::FailedPreconditionError(
        "the workers reported no KV blocks (KV cache budget too small?)");
  }
  return std::unique_ptr<RemoteExecutor>(new RemoteExecutor(
      service, config, blocks, service.min_host_kv_blocks(), weight_bytes));
}

absl::StatusOr<StepOutput> RemoteExecutor::Forward(const StepInput& step) {
  {
    absl::MutexLock lock(&mu_);
    if (!failed_.ok()) {
      return absl::UnavailableError(
          absl::StrCat("the cluster failed earlier: ", failed_.message()));
    }
  }
  v1::StepPlan plan;
  plan.set_step_id(next_step_id_++);
  plan.mutable_tokens()->Add(step.tokens.begin(), step.tokens.end());
  plan.mutable_positions()->Add(step.positions.begin(), step.positions.end());
  plan.mutable_token_seq()->Add(step.token_seq.begin(), step.token_seq.end());
  plan.mutable_seq_ids()->Add(step.seq_ids.begin(), step.seq_ids.end());
  if (step.seq_ids.size() != step.block_tables.size()) {
    return absl::InvalidArgumentError(
        absl::StrCat("step has ", step.seq_ids.size(), " sequence ids for ",
                     step.block_tables.size(), " block tables"));
  }
  int64_t blocks_sent = 0;
  std::vector<int32_t> delta;
  for (size_t i = 0; i < step.seq_ids.size(); ++i) {
    deltas_.Delta(step.seq_ids[i], step.block_tables[i], &delta);
    if (delta.empty()) continue;
    v1::BlockTableDelta& d = *plan.add_deltas();
    d.set_seq_id(step.seq_ids[i]);
    d.mutable_new_blocks()->Add(delta.begin(), delta.end());
    blocks_sent += static_cast<int64_t>(delta.size());
  }
  for (int64_t id : deltas_.TakeReleased()) plan.add_released(id);
  plan.mutable_logit_rows()->Add(step.logit_rows.begin(),
                                 step.logit_rows.end());
  for (const SamplingParams& p : step.sampling) {
    v1::SamplingParams& s = *plan.add_sampling();
    s.set_temperature(p.temperature);
    s.set_top_k(p.top_k);
    s.set_top_p(p.top_p);
    s.set_seed(p.seed);
  }
  plan.mutable_sample_index()->Add(step.sample_index.begin(),
                                   step.sample_index.end());
  plan.set_return_logits(step.return_logits);
  for (const BlockCopy& c : step.copies) {
    v1::BlockCopy& out = *plan.add_copies();
    out.set_src(c.src);
    out.set_dst(c.dst);
  }
  plan.mutable_logprobs()->Add(step.logprobs.begin(), step.logprobs.end());

  absl::StatusOr<std::vector<v1::StepResult>> results = service_.RunStep(plan);
  absl::MutexLock lock(&mu_);
  ++stats_.steps;
  stats_.blocks_sent += blocks_sent;
  stats_.plan_bytes += static_cast<int64_t>(plan.ByteSizeLong());
  if (!results.ok()) {
    failed_ = results.status();
    return results.status();
  }
  // The last stage's TP rank 0 samples: rank (pp - 1) * tp + 1.
  const ClusterOptions& o = service_.options();
  v1::StepResult& r = (*results)[(o.pp - 1) * o.tp];
  const size_t rows = step.logit_rows.size();
  absl::Status bad;
  if (static_cast<size_t>(r.tokens_size()) != rows) {
    bad = absl::InternalError(
        absl::StrCat("worker rank ", (o.pp - 1) * o.tp + 1, " returned ",
                     r.tokens_size(), " tokens for ", rows, " logit rows"));
  } else if (step.return_logits &&
             static_cast<int64_t>(r.logits_size()) !=
                 static_cast<int64_t>(rows) * config_.vocab_size) {
    bad = absl::InternalError(absl::StrCat(
        "worker rank ", (o.pp - 1) * o.tp + 1, " returned ", r.logits_size(),
        " logits for ", rows, " rows of ", config_.vocab_size));
  }
  const bool want_logprobs =
      std::any_of(step.logprobs.begin(), step.logprobs.end(),
                  [](int32_t n) { return n > 0; });
  if (bad.ok() && want_logprobs &&
      static_cast<size_t>(r.logprobs_size()) != rows) {
    bad = absl::InternalError(absl::StrCat(
        "worker rank ", (o.pp - 1) * o.tp + 1, " returned ", r.logprobs_size(),
        " log-probability rows for ", rows, " logit rows"));
  }
  // Token ids index the vocabulary all the way to the client: a worker's
  // bug (or a stranger on the control plane) must not reach the tokenizer.
  const auto outside_vocab = [&](int32_t t) {
    return t < 0 || t >= config_.vocab_size;
  };
  for (int i = 0; bad.ok() && i < r.tokens_size(); ++i) {
    if (outside_vocab(r.tokens(i))) {
      bad = absl::InternalError(absl::StrCat(
          "worker rank ", (o.pp - 1) * o.tp + 1, " returned token ",
          r.tokens(i), ", outside the vocabulary of ", config_.vocab_size));
    }
  }
  for (const v1::RowLogprobs& row : r.logprobs()) {
    if (bad.ok() && (row.top_tokens_size() != row.top_logprobs_size() ||
                     row.top_tokens_size() > kMaxLogprobs)) {
      bad = absl::InternalError(
          absl::StrCat("worker rank ", (o.pp - 1) * o.tp + 1, " returned ",
                       row.top_tokens_size(), " top tokens with ",
                       row.top_logprobs_size(), " log-probabilities"));
    }
    for (int k = 0; bad.ok() && k < row.top_tokens_size(); ++k) {
      if (outside_vocab(row.top_tokens(k))) {
        bad = absl::InternalError(
            absl::StrCat("worker rank ", (o.pp - 1) * o.tp + 1,
                         " returned top token ", row.top_tokens(k),
                         ", outside the vocabulary of ", config_.vocab_size));
      }
    }
  }
  if (!bad.ok()) {
    failed_ = bad;
    return bad;
  }
  StepOutput out;
  out.tokens.assign(r.tokens().begin(), r.tokens().end());
  for (const v1::RowLogprobs& row : r.logprobs()) {
    TokenLogprobs& lp = out.logprobs.emplace_back();
    lp.sampled = row.sampled();
    for (int k = 0; k < row.top_tokens_size(); ++k) {
      lp.top.push_back({row.top_tokens(k), row.top_logprobs(k)});
    }
  }
  if (step.return_logits) {
    ASSIGN_OR_RETURN(out.logits, Tensor::HostUninitialized(
                                     DType::kF32, {static_cast<int64_t>(rows),
                                                   config_.vocab_size}));
    std::copy(r.logits().begin(), r.logits().end(), out.logits.f32().begin());
  }
  return out;
}

void RemoteExecutor::Release(int64_t seq_id) { deltas_.Release(seq_id); }

absl::Status RemoteExecutor::Health() const {
  {
    absl::MutexLock lock(&mu_);
    if (!failed_.ok()) {
      return absl::UnavailableError(
          absl::StrCat("the cluster failed: ", failed_.message()));
    }
  }
  return service_.Health();
}

void RemoteExecutor::Shutdown(const std::string& reason) {
  service_.Shutdown(reason);
}

RemoteExecutorStats RemoteExecutor::stats() const {
  absl::MutexLock lock(&mu_);
  return stats_;
}

}  // namespace shardlm
