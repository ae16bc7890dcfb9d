#include "cluster/remote_executor.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "core/status.h"
#include "model/shard_plan.h"

namespace shardlm {

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
  RETURN_IF_ERROR(Submit(step));
  return Collect();
}

absl::Status RemoteExecutor::Submit(const StepInput& step) {
  absl::Status refused;
  {
    absl::MutexLock lock(&mu_);
    if (reforming_) {
      refused = failed_;
    } else if (!failed_.ok()) {
      refused = absl::UnavailableError(
          absl::StrCat("the cluster failed earlier: ", failed_.message()));
    }
    // Re-formed: the workers start with empty block tables (deltas_ is the
    // engine loop's, so it is reset here, on that thread).
    if (refused.ok() && reformed_) deltas_ = BlockTableDeltas();
    if (refused.ok()) reformed_ = false;
  }
  InFlight f{
      .step_id = next_step_id_++,
      .rows = step.logit_rows.size(),
      .return_logits = step.return_logits,
      .want_logprobs = std::any_of(step.logprobs.begin(), step.logprobs.end(),
                                   [](int32_t n) { return n > 0; })};
  // A refused or unsent step still takes its place in the queue: Collect
  // returns its error in order.
  if (refused.ok()) {
    v1::StepPlan plan;
    int64_t blocks_sent = 0;
    refused = EncodeStepPlan(step, f.step_id, deltas_, &plan, &blocks_sent);
    if (refused.ok()) refused = service_.SendStep(plan);
    absl::MutexLock lock(&mu_);
    ++stats_.steps;
    stats_.blocks_sent += blocks_sent;
    stats_.plan_bytes += static_cast<int64_t>(plan.ByteSizeLong());
    if (!refused.ok() && failed_.ok()) failed_ = refused;
  }
  f.error = refused;
  in_flight_.push_back(f);
  return absl::OkStatus();
}

absl::StatusOr<StepOutput> RemoteExecutor::Collect() {
  if (in_flight_.empty()) {
    return absl::FailedPreconditionError("Collect with no step in flight");
  }
  const InFlight step = in_flight_.front();
  in_flight_.pop_front();
  if (!step.error.ok()) return step.error;
  absl::StatusOr<std::vector<v1::StepResult>> results =
      service_.WaitStep(step.step_id);
  absl::MutexLock lock(&mu_);
  if (!results.ok()) {
    // A KV block that failed its checksum fails the step, not the
    // cluster: the scheduler recomputes its sequences.
    if (!absl::IsDataLoss(results.status())) failed_ = results.status();
    return results.status();
  }
  const ClusterOptions& o = service_.options();
  // The sampling shard's result (worker ranks count from 1).
  const int sampler = SamplingShard(o.tp, o.pp, cp()) + 1;
  v1::StepResult& r = (*results)[sampler - 1];
  const size_t rows = step.rows;
  absl::Status bad;
  if (static_cast<size_t>(r.tokens_size()) != rows) {
    bad = absl::InternalError(
        absl::StrCat("worker rank ", sampler, " returned ", r.tokens_size(),
                     " tokens for ", rows, " logit rows"));
  } else if (step.return_logits &&
             static_cast<int64_t>(r.logits_size()) !=
                 static_cast<int64_t>(rows) * config_.vocab_size) {
    bad = absl::InternalError(
        absl::StrCat("worker rank ", sampler, " returned ", r.logits_size(),
                     " logits for ", rows, " rows of ", config_.vocab_size));
  }
  const bool want_logprobs = step.want_logprobs;
  if (bad.ok() && want_logprobs &&
      static_cast<size_t>(r.logprobs_size()) != rows) {
    bad = absl::InternalError(
        absl::StrCat("worker rank ", sampler, " returned ", r.logprobs_size(),
                     " log-probability rows for ", rows, " logit rows"));
  }
  // Token ids index the vocabulary all the way to the client: a worker's
  // bug (or a stranger on the control plane) must not reach the tokenizer.
  const auto outside_vocab = [&](int32_t t) {
    return t < 0 || t >= config_.vocab_size;
  };
  for (int i = 0; bad.ok() && i < r.tokens_size(); ++i) {
    if (outside_vocab(r.tokens(i))) {
      bad = absl::InternalError(
          absl::StrCat("worker rank ", sampler, " returned token ", r.tokens(i),
                       ", outside the vocabulary of ", config_.vocab_size));
    }
  }
  for (const v1::RowLogprobs& row : r.logprobs()) {
    if (bad.ok() && (row.top_tokens_size() != row.top_logprobs_size() ||
                     row.top_tokens_size() > kMaxLogprobs)) {
      bad = absl::InternalError(absl::StrCat(
          "worker rank ", sampler, " returned ", row.top_tokens_size(),
          " top tokens with ", row.top_logprobs_size(), " log-probabilities"));
    }
    for (int k = 0; bad.ok() && k < row.top_tokens_size(); ++k) {
      if (outside_vocab(row.top_tokens(k))) {
        bad = absl::InternalError(absl::StrCat(
            "worker rank ", sampler, " returned top token ", row.top_tokens(k),
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
    if (reforming_) return failed_;
    if (!failed_.ok()) {
      return absl::UnavailableError(
          absl::StrCat("the cluster failed: ", failed_.message()));
    }
  }
  return service_.Health();
}

std::vector<RankReport> RemoteExecutor::RankReports() const {
  return service_.Reports();
}

void RemoteExecutor::BeginReform(absl::Status why) {
  absl::MutexLock lock(&mu_);
  failed_ = std::move(why);
  reforming_ = true;
}

absl::Status RemoteExecutor::EndReform() {
  const int64_t device = service_.min_kv_blocks();
  const int64_t host = service_.min_host_kv_blocks();
  if (device != kv_blocks_ || host != host_kv_blocks_) {
    return absl::FailedPreconditionError(absl::StrCat(
        "the re-formed workers hold ", device, " device and ", host,
        " host KV blocks, but the engine was built for ", kv_blocks_, " and ",
        host_kv_blocks_, " (restart the coordinator)"));
  }
  absl::MutexLock lock(&mu_);
  reformed_ = true;
  reforming_ = false;
  failed_ = absl::OkStatus();
  return absl::OkStatus();
}

void RemoteExecutor::Shutdown(const std::string& reason) {
  service_.Shutdown(reason);
}

RemoteExecutorStats RemoteExecutor::stats() const {
  absl::MutexLock lock(&mu_);
  return stats_;
}

}  // namespace shardlm
