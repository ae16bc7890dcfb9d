#include "engine/engine.h"

#include <algorithm>
#include <condition_variable>
#include <mutex>
#include <optional>
#include <utility>

#include "absl/strings/str_cat.h"
#include "core/status.h"
#include "kernels/batch_invariance.h"

namespace shardlm {
namespace {

// What speculative decoding cannot do yet, refused by name.
absl::Status CheckSpeculation(const StepExecutor& executor,
                              const EngineOptions& options) {
  const SpeculationOptions& spec = options.speculation;
  if (options.batch_invariant && options.device != DeviceKind::kCpu) {
    return absl::UnimplementedError(
        "--batch-invariant on CUDA: the GPU kernels are not batch-invariant "
        "yet; use --device cpu");
  }
  if (!spec.enabled()) return absl::OkStatus();
  RETURN_IF_ERROR(spec.Validate());
  const char* method = SpeculationMethodName(spec.method);
  if (options.device != DeviceKind::kCpu) {
    return absl::UnimplementedError(absl::StrCat(
        "--speculative ", method,
        " on CUDA: the GPU kernels are not batch-invariant yet, so a "
        "verified token's logits could differ from its decode's; use "
        "--device cpu, or no --speculative"));
  }
  if (options.cp > 1) {
    return absl::UnimplementedError(absl::StrCat(
        "--speculative ", method, " with --cp ", options.cp,
        ": a verification's rows run sequence parallel over the CP ranks "
        "where a lone decode runs whole, so its tokens could differ; use "
        "--cp 1 (TP and PP work)"));
  }
  if (const ModelConfig& c = executor.config(); c.is_hybrid()) {
    return absl::UnimplementedError(absl::StrCat(
        "--speculative ", method, " with ", c.architecture,
        ": a rejected draft would have advanced the linear-attention "
        "layers' recurrent state, which is not rolled back yet"));
  }
  return absl::OkStatus();
}

}  // namespace

absl::Status EngineOptions::Validate() const {
  RETURN_IF_ERROR(kv.Validate());
  RETURN_IF_ERROR(limits.Validate());
  for (const auto& [flag, degree] :
       {std::pair{"--tp", tp}, {"--pp", pp}, {"--cp", cp}}) {
    if (degree < 1) {
      return absl::InvalidArgumentError(
          absl::StrCat(flag, " must be >= 1, got ", degree));
    }
  }
  if (threads < 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--threads must be >= 0 (0: one per core), got ", threads));
  }
  return absl::OkStatus();
}

absl::StatusOr<std::unique_ptr<Engine>> Engine::Create(
    std::unique_ptr<StepExecutor> executor, const EngineOptions& options) {
  RETURN_IF_ERROR(options.Validate());
  const BatchLimits& limits = options.limits;
  RETURN_IF_ERROR(CheckSpeculation(*executor, options));
  if (options.precision == Precision::kFast &&
      options.device != DeviceKind::kCpu) {
    return absl::UnimplementedError(
        "--precision fast on CUDA: the GPU path runs bf16 activations in "
        "either mode (its matrix products are cuBLAS bf16 GEMMs); use "
        "--device cpu, or --precision exact");
  }
  // Every rank of this process; remote workers set it from their
  // assignment (WorkerAssignment::precision).
  SetPrecision(options.precision);
  if (options.speculation.enabled() || options.batch_invariant) {
    // Every rank of this process; remote workers set it from their
    // assignment (WorkerAssignment::batch_invariant).
    SetBatchInvariant(true);
  }
  const int64_t blocks = executor->num_kv_blocks();
  const int64_t host_blocks = executor->num_host_kv_blocks();
  BlockManager manager(static_cast<int32_t>(blocks), options.kv.block_size,
                       static_cast<int32_t>(host_blocks),
                       options.kv.prefix_caching);
  manager.set_interleave(options.cp);
  if (const ModelConfig& c = executor->config(); c.is_hybrid()) {
    // A linear-attention layer's state is one per sequence, in the slots
    // every rank sized from the same max_seqs (worker/kv_pool.h).
    if (options.cp > 1) {
      return absl::UnimplementedError(absl::StrCat(
          "--cp ", options.cp, " with ", c.architecture,
          ": a Gated DeltaNet layer's recurrence runs a sequence's tokens in "
          "order, so its prompt cannot be split over CP ranks; use --cp 1 "
          "(TP and PP work)"));
    }
    // A host tier holds a slot for each, and prefix caching as many
    // snapshots (worker/kv_pool.h).
    manager.set_state_slots(limits.max_seqs,
                            host_blocks > 0 ? limits.max_seqs : 0,
                            options.kv.prefix_caching ? limits.max_seqs : 0);
  }
  return std::unique_ptr<Engine>(
      new Engine(std::move(executor), std::move(manager), options));
}

absl::Status Engine::ValidateOne(const GenerateRequest& req) const {
  const ModelConfig& c = config();
  const auto fail = [&](auto&&... parts) {
    return absl::InvalidArgumentError(absl::StrCat(parts...));
  };
  if (req.prompt.empty()) return fail("the prompt is empty");
  if (req.max_tokens < 1) {
    return fail("max_tokens must be >= 1, got ", req.max_tokens);
  }
  if (req.logprobs < 0 || req.logprobs > kMaxLogprobs) {
    return fail("logprobs must be in [0, ", kMaxLogprobs, "], got ",
                req.logprobs);
  }
  if (req.prompt_logprobs < 0 || req.prompt_logprobs > kMaxLogprobs) {
    return fail("prompt_logprobs must be in [0, ", kMaxLogprobs, "], got ",
                req.prompt_logprobs);
  }
  for (int32_t t : req.prompt) {
    if (t < 0 || t >= c.vocab_size) {
      return fail("prompt token ", t, " is outside the vocabulary of ",
                  c.vocab_size);
    }
  }
  if (static_cast<int64_t>(req.resumed.size()) >= req.max_tokens) {
    return fail(req.resumed.size(),
                " resumed tokens leave none of max_tokens = ", req.max_tokens);
  }
  for (size_t i = 0; i < req.resumed.size(); ++i) {
    const int32_t t = req.resumed[i];
    if (t < 0 || t >= c.vocab_size) {
      return fail("resumed token ", t, " is outside the vocabulary of ",
                  c.vocab_size);
    }
    if (std::find(req.stop_token_ids.begin(), req.stop_token_ids.end(), t) !=
        req.stop_token_ids.end()) {
      return fail("resumed token ", i, " (", t,
                  ") is a stop token: the stream had ended");
    }
  }
  const int64_t total =
      static_cast<int64_t>(req.prompt.size()) + req.max_tokens;
  if (total > c.context_length) {
    return fail("prompt (", req.prompt.size(), " tokens) + max_tokens (",
                req.max_tokens, ") = ", total,
                " exceeds the context window of ", c.context_length);
  }
  const int64_t capacity =
      int64_t{blocks_.num_blocks()} + blocks_.num_host_blocks();
  if (blocks_.BlocksFor(total) > capacity) {
    return fail(
        "prompt + max_tokens = ", total, " tokens need ",
        blocks_.BlocksFor(total), " KV blocks of ", blocks_.block_size(),
        " tokens but the cache holds ", capacity, " (", blocks_.num_blocks(),
        " device + ", blocks_.num_host_blocks(), " host",
        blocks_.interleave() > 1
            ? absl::StrCat(" over ", blocks_.interleave(), " CP ranks, ",
                           capacity / blocks_.interleave(), " each")
            : "",
        ")");
  }
  if (req.min_tokens < 0 || req.min_tokens > req.max_tokens) {
    return fail("min_tokens must be in [0, max_tokens = ", req.max_tokens,
                "], got ", req.min_tokens);
  }
  RETURN_IF_ERROR(ValidateSamplingParams(req.sampling));
  for (const LogitBias& b : req.sampling.logit_bias) {
    if (b.token >= c.vocab_size) {
      return fail("logit_bias token ", b.token,
                  " is outside the vocabulary of ", c.vocab_size);
    }
  }
  return absl::OkStatus();
}

absl::Status Engine::Validate(
    const std::vector<GenerateRequest>& requests) const {
  for (size_t r = 0; r < requests.size(); ++r) {
    if (absl::Status s = ValidateOne(requests[r]); !s.ok()) {
      return absl::InvalidArgumentError(
          absl::StrCat("request ", r, ": ", s.message()));
    }
  }
  return absl::OkStatus();
}

absl::StatusOr<RequestId> Engine::Submit(GenerateRequest request,
                                         RequestCallbacks callbacks) {
  if (absl::Status s = Validate({request}); !s.ok()) {
    scheduler_->metrics().Refused(request.api, Refusal::kInvalid);
    return s;
  }
  return scheduler_->Submit(std::move(request), std::move(callbacks));
}

std::vector<absl::StatusOr<RequestId>> Engine::SubmitGroup(
    std::vector<Scheduler::GroupMember> members) {
  std::vector<absl::StatusOr<RequestId>> ids(members.size());
  std::vector<Scheduler::GroupMember> valid;
  std::vector<size_t> at;  // valid[i] is members[at[i]].
  for (size_t i = 0; i < members.size(); ++i) {
    if (absl::Status s = Validate({members[i].request}); !s.ok()) {
      scheduler_->metrics().Refused(members[i].request.api, Refusal::kInvalid);
      ids[i] = s;
      continue;
    }
    valid.push_back(std::move(members[i]));
    at.push_back(i);
  }
  std::vector<absl::StatusOr<RequestId>> queued =
      scheduler_->SubmitGroup(std::move(valid));
  for (size_t i = 0; i < queued.size(); ++i) ids[at[i]] = std::move(queued[i]);
  return ids;
}

absl::StatusOr<std::vector<GenerateResult>> Engine::GenerateBatch(
    const std::vector<GenerateRequest>& requests,
    const TokenCallback& on_token) {
  if (absl::Status s = Validate(requests); !s.ok()) {
    for (const GenerateRequest& r : requests) {
      scheduler_->metrics().Refused(r.api, Refusal::kInvalid);
    }
    return s;
  }
  // The batch's requests go to the scheduler together (past max_queued: the
  // caller waits for them anyway) and this waits for every on_done, so no
  // callback outlives this frame.
  std::mutex mu;
  std::condition_variable cv;
  std::vector<std::optional<absl::StatusOr<GenerateResult>>> done(
      requests.size());
  size_t remaining = requests.size();
  absl::Status first_error;  // Guarded by mu.
  std::vector<RequestId> ids;
  for (size_t r = 0; r < requests.size(); ++r) {
    RequestCallbacks cb;
    if (on_token) {
      cb.on_token = [&, r](int32_t t, const TokenLogprobs*) {
        return on_token(r, t) ? TokenAction::kContinue : TokenAction::kCancel;
      };
    }
    cb.on_done = [&, r](absl::StatusOr<GenerateResult> result) {
      std::lock_guard<std::mutex> lock(mu);
      if (!result.ok() && first_error.ok()) first_error = result.status();
      done[r] = std::move(result);
      --remaining;
      cv.notify_all();
    };
    absl::StatusOr<RequestId> id =
        scheduler_->Submit(requests[r], std::move(cb),
                           /*ignore_queue_limit=*/true);
    if (!id.ok()) {  // Shutting down.
      std::lock_guard<std::mutex> lock(mu);
      first_error = id.status();
      remaining -= requests.size() - r;
      break;
    }
    ids.push_back(*id);
  }
  std::unique_lock<std::mutex> lock(mu);
  bool cancelled_rest = false;
  while (remaining > 0) {
    if (!first_error.ok() && !cancelled_rest) {
      // The first error ends the batch: the rest stop within one step.
      cancelled_rest = true;
      lock.unlock();
      for (RequestId id : ids) scheduler_->Cancel(id);
      lock.lock();
      continue;
    }
    cv.wait(lock);
  }
  RETURN_IF_ERROR(first_error);
  std::vector<GenerateResult> results;
  results.reserve(done.size());
  for (auto& r : done) results.push_back(std::move(**r));
  return results;
}

absl::StatusOr<GenerateResult> Engine::Generate(
    const GenerateRequest& request,
    const std::function<bool(int32_t)>& on_token) {
  TokenCallback cb;
  if (on_token) cb = [&](size_t, int32_t t) { return on_token(t); };
  ASSIGN_OR_RETURN(std::vector<GenerateResult> results,
                   GenerateBatch({request}, cb));
  return std::move(results[0]);
}

}  // namespace shardlm
