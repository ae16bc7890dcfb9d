#include "api/text_stream.h"

#include <algorithm>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/time/time.h"

namespace shardlm {
namespace {

// The text of one token alone, as valid UTF-8.
std::string TokenText(const Tokenizer& tokenizer, int32_t id) {
  StreamingDetokenizer d(&tokenizer);
  std::string text = d.Push(id);
  return text + d.Finish();
}

void AddLogprobs(const Tokenizer& tokenizer, int32_t id,
                 const TokenLogprobs& lp, v1::GenerateResponse& response) {
  v1::TokenLogprobs& out = *response.add_logprobs();
  const auto set = [&](v1::TokenLogprob& t, int32_t token, float logprob) {
    t.set_token_id(token);
    t.set_text(TokenText(tokenizer, token));
    t.set_logprob(logprob);
  };
  set(*out.mutable_token(), id, lp.sampled);
  for (const TokenLogprob& t : lp.top) set(*out.add_top(), t.token, t.logprob);
}

}  // namespace

TextStream::TextStream(const Tokenizer* tokenizer,
                       const GenerateRequest& request,
                       std::vector<std::string> stop_strings)
    : tokenizer_(tokenizer),
      max_tokens_(request.max_tokens),
      prompt_tokens_(static_cast<int32_t>(request.prompt.size())),
      stop_ids_(request.stop_token_ids),
      prompt_(request.prompt_logprobs > 0 ? request.prompt
                                          : std::vector<int32_t>{}),
      detok_(tokenizer),
      stops_(std::move(stop_strings)) {}

absl::Status TextStream::Resume(const std::vector<int32_t>& resumed) {
  for (int32_t id : resumed) (void)stops_.Push(detok_.Push(id));
  if (stops_.stopped()) {
    return absl::InvalidArgumentError(
        "resume_token_ids contain a stop string: the stream had ended");
  }
  generated_ = static_cast<int32_t>(resumed.size());
  return absl::OkStatus();
}

RequestCallbacks TextStream::Callbacks(std::shared_ptr<TextStream> stream) {
  return RequestCallbacks{
      .on_token =
          [stream](int32_t id, const TokenLogprobs* logprobs) {
            return stream->OnToken(id, logprobs);
          },
      .on_prompt_logprobs =
          [stream](const std::vector<TokenLogprobs>& logprobs) {
            stream->OnPromptLogprobs(logprobs);
          },
      .on_done =
          [stream](absl::StatusOr<GenerateResult> result) {
            stream->OnDone(std::move(result));
          }};
}

void TextStream::Finish(v1::GenerateResponse& r, const char* reason,
                        int32_t generated) const {
  r.set_finish_reason(reason);
  r.mutable_usage()->set_prompt_tokens(prompt_tokens_);
  r.mutable_usage()->set_completion_tokens(generated);
}

TokenAction TextStream::OnToken(int32_t id, const TokenLogprobs* logprobs) {
  // Only this thread uses the stream until done.
  const int32_t generated = ++generated_;
  v1::GenerateResponse response;
  for (v1::TokenLogprobs& lp : prompt_logprobs_) {
    *response.add_prompt_logprobs() = std::move(lp);
  }
  prompt_logprobs_.clear();
  response.add_token_ids(id);
  if (logprobs != nullptr) AddLogprobs(*tokenizer_, id, *logprobs, response);
  // Stop tokens are reported by id but not printed.
  const bool stop_token =
      std::find(stop_ids_.begin(), stop_ids_.end(), id) != stop_ids_.end();
  std::string text = stop_token ? "" : stops_.Push(detok_.Push(id));
  // The scheduler ends a request at a stop token or max_tokens, and at a
  // stop string when told below; the last token's response carries the
  // finish (when this is ever wrong, EndResponse makes a separate final
  // one).
  if (!stops_.stopped() && (stop_token || generated >= max_tokens_)) {
    text += stops_.Push(detok_.Finish());
    text += stops_.Finish();
  }
  const bool stop = stop_token || stops_.stopped();
  response.set_text(std::move(text));
  if (stop || generated >= max_tokens_) {
    Finish(response, stop ? "stop" : "length", generated);
    response.set_stop_sequence(stops_.matched());
  }
  absl::MutexLock lock(&mu_);  // The RPC's Await sees it.
  responses_.push_back(std::move(response));
  return stops_.stopped() ? TokenAction::kStop : TokenAction::kContinue;
}

void TextStream::OnPromptLogprobs(const std::vector<TokenLogprobs>& logprobs) {
  // The first prompt token has no logprob; the others' follow.
  std::vector<v1::TokenLogprobs>& out = prompt_logprobs_;
  v1::TokenLogprob& first = *out.emplace_back().mutable_token();
  first.set_token_id(prompt_[0]);
  first.set_text(TokenText(*tokenizer_, prompt_[0]));
  for (size_t i = 0; i < logprobs.size() && i + 1 < prompt_.size(); ++i) {
    v1::GenerateResponse one;
    AddLogprobs(*tokenizer_, prompt_[i + 1], logprobs[i], one);
    out.push_back(std::move(*one.mutable_logprobs(0)));
  }
}

void TextStream::OnDone(absl::StatusOr<GenerateResult> result) {
  absl::MutexLock lock(&mu_);
  done_ = std::move(result);
}

absl::Status TextStream::WriteResponses(
    const std::function<bool()>& cancelled, const std::function<void()>& cancel,
    const std::function<bool(const v1::GenerateResponse&)>& write) {
  bool sent_final = false;
  std::optional<v1::GenerateResponse> final_response;
  bool client_gone = false;
  absl::StatusOr<GenerateResult> result;
  const auto ready = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    return !responses_.empty() || done_.has_value();
  };
  mu_.Lock();
  while (true) {
    // Woken by the loop's callbacks; every 50 ms anyway, to see a cancel.
    mu_.AwaitWithTimeout(absl::Condition(&ready), absl::Milliseconds(50));
    std::deque<v1::GenerateResponse> responses;
    responses.swap(responses_);
    const bool finished = done_.has_value();
    if (finished) result = std::move(*done_);
    mu_.Unlock();
    if (!client_gone && cancelled()) {
      client_gone = true;
      cancel();
    }
    for (v1::GenerateResponse& response : responses) {
      if (client_gone) break;
      if (!response.finish_reason().empty()) {
        // Its usage takes the cached prompt tokens from the result, which
        // on_done brings right after the last token.
        sent_final = true;
        final_response = std::move(response);
        break;
      }
      if (!write(response)) {
        client_gone = true;
        cancel();
      }
    }
    if (finished && final_response && !client_gone) {
      if (result.ok()) {
        final_response->mutable_usage()->set_cached_tokens(
            static_cast<int32_t>(result->cached_prompt_tokens));
      }
      if (!write(*final_response)) client_gone = true;
    }
    // After a cancel, wait for the end too: its blocks are free by then.
    if (finished) break;
    mu_.Lock();
  }

  if (!result.ok()) return result.status();
  if (client_gone || result->finish_reason == FinishReason::kCancelled) {
    return absl::CancelledError("the client cancelled the request");
  }
  if (!sent_final) write(EndResponse(*result));
  return absl::OkStatus();
}

v1::GenerateResponse TextStream::EndResponse(const GenerateResult& result) {
  v1::GenerateResponse response;
  std::string text = stops_.Push(detok_.Finish());
  response.set_text(text + stops_.Finish());
  Finish(response, FinishReasonName(result.finish_reason), generated_);
  response.set_stop_sequence(stops_.matched());
  response.mutable_usage()->set_cached_tokens(
      static_cast<int32_t>(result.cached_prompt_tokens));
  return response;
}

ToolCallWriter::ToolCallWriter(
    std::vector<std::string> names, ToolCallFormat format,
    ReasoningFormat reasoning, std::string call_id_prefix,
    const std::function<bool(const v1::GenerateResponse&)>& write)
    : call_id_prefix_(std::move(call_id_prefix)), write_(write) {
  if (!names.empty()) parser_.emplace(std::move(names), format, reasoning);
}

bool ToolCallWriter::Write(const v1::GenerateResponse& response) {
  if (!parser_) return write_(response);
  for (ChatToolCall& c : parser_->Push(response.text()).calls) {
    calls_.push_back(std::move(c));
  }
  if (response.finish_reason().empty()) return write_(response);
  for (ChatToolCall& c : parser_->Finish().calls) {
    calls_.push_back(std::move(c));
  }
  v1::GenerateResponse last = response;
  for (size_t i = 0; i < calls_.size(); ++i) {
    v1::ToolCall& c = *last.add_tool_calls();
    c.set_id(absl::StrCat(call_id_prefix_, i));
    c.set_name(calls_[i].name);
    c.set_arguments(calls_[i].arguments);
  }
  if (!calls_.empty() && last.finish_reason() == "stop") {
    last.set_finish_reason("tool_calls");
  }
  return write_(last);
}

}  // namespace shardlm
