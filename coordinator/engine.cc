#include "coordinator/engine.h"

#include <algorithm>
#include <chrono>

#include "absl/cleanup/cleanup.h"
#include "absl/strings/str_cat.h"
#include "core/status.h"
#include "kernels/threading.h"

namespace shardlm {
namespace {

using Clock = std::chrono::steady_clock;

double Seconds(Clock::time_point a, Clock::time_point b) {
  return std::chrono::duration<double>(b - a).count();
}

// A request being served.
struct Sequence {
  size_t request = 0;
  int64_t id = 0;
  std::vector<int32_t> tokens;  // Prompt, then generated tokens.
  int64_t computed = 0;         // Tokens whose KV is in the cache.
  bool admitted = false;
  bool done = false;
  Clock::time_point first_token;
  GenerateResult result;
};

}  // namespace

const char* FinishReasonName(FinishReason r) {
  switch (r) {
    case FinishReason::kLength:
      return "length";
    case FinishReason::kStop:
      return "stop";
    case FinishReason::kCancelled:
      return "cancelled";
  }
  return "?";
}

absl::StatusOr<std::unique_ptr<Engine>> Engine::Create(
    const WeightSource& source, const EngineOptions& options) {
  if (options.block_size <= 0 || options.max_batched_tokens <= 0 ||
      options.kv_cache_bytes < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("engine options: block_size (", options.block_size,
                     ") and max_batched_tokens (", options.max_batched_tokens,
                     ") must be positive, kv_cache_bytes (",
                     options.kv_cache_bytes, ") not negative"));
  }
  SetCpuThreads(options.threads);
  // Ranks on threads share the cores.
  const int ranks = std::max(1, options.tp * options.pp);
  ASSIGN_OR_RETURN(
      std::unique_ptr<StepExecutor> executor,
      CreateInProcessExecutor(
          source, {.tp = options.tp,
                   .pp = options.pp,
                   .block_size = options.block_size,
                   .kv_cache_bytes = options.kv_cache_bytes,
                   .threads_per_rank = std::max(1, CpuThreads() / ranks)}));
  return Create(std::move(executor), options);
}

absl::StatusOr<std::unique_ptr<Engine>> Engine::Create(
    std::unique_ptr<StepExecutor> executor, const EngineOptions& options) {
  if (options.block_size <= 0 || options.max_batched_tokens <= 0) {
    return absl::InvalidArgumentError(
        "engine options: block_size and max_batched_tokens must be positive");
  }
  const int64_t blocks = executor->num_kv_blocks();
  return std::unique_ptr<Engine>(new Engine(
      std::move(executor),
      BlockManager(static_cast<int32_t>(blocks), options.block_size), options));
}

absl::Status Engine::Validate(
    const std::vector<GenerateRequest>& requests) const {
  const ModelConfig& c = config();
  for (size_t r = 0; r < requests.size(); ++r) {
    const GenerateRequest& req = requests[r];
    const auto fail = [&](auto&&... parts) {
      return absl::InvalidArgumentError(
          absl::StrCat("request ", r, ": ", parts...));
    };
    if (req.prompt.empty()) return fail("the prompt is empty");
    if (req.max_tokens < 1) {
      return fail("max_tokens must be >= 1, got ", req.max_tokens);
    }
    for (int32_t t : req.prompt) {
      if (t < 0 || t >= c.vocab_size) {
        return fail("prompt token ", t, " is outside the vocabulary of ",
                    c.vocab_size);
      }
    }
    const int64_t total =
        static_cast<int64_t>(req.prompt.size()) + req.max_tokens;
    if (total > c.context_length) {
      return fail("prompt (", req.prompt.size(), " tokens) + max_tokens (",
                  req.max_tokens, ") = ", total,
                  " exceeds the context window of ", c.context_length);
    }
    if (blocks_.BlocksFor(total) > blocks_.num_blocks()) {
      return fail(total, " tokens need ", blocks_.BlocksFor(total),
                  " KV blocks but the cache has ", blocks_.num_blocks(), " (",
                  blocks_.block_size(), " tokens each)");
    }
    if (absl::Status s = ValidateSamplingParams(req.sampling); !s.ok()) {
      return fail(s.message());
    }
  }
  return absl::OkStatus();
}

absl::StatusOr<std::vector<GenerateResult>> Engine::GenerateBatch(
    const std::vector<GenerateRequest>& requests,
    const TokenCallback& on_token) {
  RETURN_IF_ERROR(Validate(requests));
  const Clock::time_point start = Clock::now();
  std::vector<Sequence> seqs(requests.size());
  for (size_t r = 0; r < requests.size(); ++r) {
    seqs[r].request = r;
    seqs[r].id = next_seq_id_++;
    seqs[r].tokens = requests[r].prompt;
  }
  // Every block goes back, whichever way this returns.
  absl::Cleanup free_all = [&] {
    for (const Sequence& s : seqs) {
      if (!s.done) executor_->Release(s.id);
      blocks_.Free(s.id);
    }
  };

  const auto finish = [&](Sequence& s, FinishReason reason) {
    s.done = true;
    s.result.finish_reason = reason;
    blocks_.Free(s.id);
    executor_->Release(s.id);
  };

  while (std::any_of(seqs.begin(), seqs.end(),
                     [](const Sequence& s) { return !s.done; })) {
    // Admission: a sequence enters once the blocks for its whole length
    // (prompt + max_tokens) are reserved, so admitted sequences never run
    // out mid-way. Each fits alone (Validate), so progress is guaranteed.
    for (Sequence& s : seqs) {
      if (s.done || s.admitted) continue;
      const GenerateRequest& req = requests[s.request];
      s.admitted = blocks_
                       .Reserve(s.id, static_cast<int64_t>(req.prompt.size()) +
                                          req.max_tokens)
                       .ok();
    }

    // Decoding sequences first (one token each), then prefill chunks, up
    // to the step's token budget.
    StepInput step;
    std::vector<Sequence*> in_step;
    int64_t budget = options_.max_batched_tokens;
    for (int pass = 0; pass < 2; ++pass) {
      for (Sequence& s : seqs) {
        if (s.done || !s.admitted || budget == 0) continue;
        const int64_t remaining =
            static_cast<int64_t>(s.tokens.size()) - s.computed;
        if (remaining == 0) continue;  // Scheduled in the first pass.
        const bool decoding = remaining == 1 && s.computed > 0;
        if (decoding != (pass == 0)) continue;
        const int64_t chunk = std::min(remaining, budget);
        budget -= chunk;
        const int32_t seq_index =
            static_cast<int32_t>(step.block_tables.size());
        step.block_tables.push_back(blocks_.Table(s.id));
        step.seq_ids.push_back(s.id);
        for (int64_t i = 0; i < chunk; ++i) {
          step.tokens.push_back(s.tokens[s.computed + i]);
          step.positions.push_back(static_cast<int32_t>(s.computed + i));
          step.token_seq.push_back(seq_index);
        }
        s.computed += chunk;
        // Logits only where a token is sampled: the end of the known tokens.
        if (s.computed == static_cast<int64_t>(s.tokens.size())) {
          const GenerateRequest& req = requests[s.request];
          const uint64_t generated = s.tokens.size() - req.prompt.size();
          step.logit_rows.push_back(static_cast<int32_t>(step.tokens.size()) -
                                    1);
          step.sampling.push_back(req.sampling);
          step.sample_index.push_back(generated);
          step.return_logits |= generated == 0 && req.return_prompt_logits;
          in_step.push_back(&s);
        }
      }
    }
    if (step.tokens.empty()) {
      return absl::InternalError("scheduler made no progress");
    }

    ASSIGN_OR_RETURN(StepOutput out, executor_->Forward(step));
    if (out.tokens.size() != in_step.size()) {
      return absl::InternalError(absl::StrCat("step returned ",
                                              out.tokens.size(), " tokens for ",
                                              in_step.size(), " rows"));
    }
    const int64_t vocab = config().vocab_size;
    for (size_t row = 0; row < in_step.size(); ++row) {
      Sequence& s = *in_step[row];
      const GenerateRequest& req = requests[s.request];
      const int64_t generated =
          static_cast<int64_t>(s.tokens.size() - req.prompt.size());
      if (generated == 0 && req.return_prompt_logits) {
        const float* l = out.logits.f32().data() + row * vocab;
        s.result.prompt_logits.assign(l, l + vocab);
      }
      const int32_t token = out.tokens[row];
      s.tokens.push_back(token);
      s.result.tokens.push_back(token);
      const Clock::time_point now = Clock::now();
      if (generated == 0) {
        s.first_token = now;
        s.result.prefill_seconds = Seconds(start, now);
      }
      s.result.decode_seconds = Seconds(s.first_token, now);
      if (on_token && !on_token(s.request, token)) {
        finish(s, FinishReason::kCancelled);
      } else if (std::find(req.stop_token_ids.begin(), req.stop_token_ids.end(),
                           token) != req.stop_token_ids.end()) {
        finish(s, FinishReason::kStop);
      } else if (generated + 1 >= req.max_tokens) {
        finish(s, FinishReason::kLength);
      }
    }
  }

  std::vector<GenerateResult> results;
  results.reserve(seqs.size());
  for (Sequence& s : seqs) results.push_back(std::move(s.result));
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
