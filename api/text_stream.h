// The text side of one Generate call: the engine's tokens as the client's
// responses (detokenized, text that could start a stop string held back
// until it is resolved, log-probabilities attached), written on the RPC's
// thread; and the tool calls parsed from that text. InferenceService
// (api/inference_service.h) runs one TextStream per sequence.
#ifndef SHARDLM_API_TEXT_STREAM_H_
#define SHARDLM_API_TEXT_STREAM_H_

#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "engine/request.h"
#include "engine/stop_strings.h"
#include "model/tokenizer.h"
#include "model/tool_calls.h"
#include "shardlm/v1/inference.pb.h"

namespace shardlm {

// One request's stream. The scheduler's loop thread turns each token into
// its response (text, stop strings, log-probabilities: it must know at once
// whether a stop string ended the request); the RPC's thread writes them
// (WriteResponses). Shared: the loop may still hold its callbacks when the
// RPC returns.
class TextStream {
 public:
  // `tokenizer` is not owned and must outlive the stream. `request` is the
  // engine request about to be submitted (its limits, stop tokens and, when
  // prompt logprobs are asked for, prompt are copied); `stop_strings` are
  // the client's, matched here.
  TextStream(const Tokenizer* tokenizer, const GenerateRequest& request,
             std::vector<std::string> stop_strings);

  // A resumed stream: whoever generated `resumed` sent their text, up to
  // what the stop strings held back, which is a function of the text: the
  // same pass over them leaves this stream where that one was.
  // InvalidArgument when they hold a stop string. Before submitting.
  absl::Status Resume(const std::vector<int32_t>& resumed);

  // The engine's callbacks for the request; they hold `stream`.
  static RequestCallbacks Callbacks(std::shared_ptr<TextStream> stream);

  // On the RPC's thread, once the request is submitted: hands each
  // response to `write` until the request ends, polling `cancelled` (then,
  // or when a write fails, calls `cancel` once and waits for the end, when
  // the request's blocks are free). The last response carries the finish
  // reason and usage. OK once it was written; Cancelled when the client
  // went away; otherwise the request's error.
  absl::Status WriteResponses(
      const std::function<bool()>& cancelled,
      const std::function<void()>& cancel,
      const std::function<bool(const v1::GenerateResponse&)>& write);

 private:
  // The callbacks' work, on the loop's thread.
  TokenAction OnToken(int32_t id, const TokenLogprobs* logprobs);
  void OnPromptLogprobs(const std::vector<TokenLogprobs>& logprobs);
  void OnDone(absl::StatusOr<GenerateResult> result);
  // Sets `r`'s finish_reason and usage (prompt and completion tokens).
  void Finish(v1::GenerateResponse& r, const char* reason,
              int32_t generated) const;
  // The final response when no token's carried the finish (the request
  // ended otherwise): what the detokenizer and stop strings still hold.
  // Only once on_done has run (the loop no longer touches the stream).
  v1::GenerateResponse EndResponse(const GenerateResult& result);

  const Tokenizer* const tokenizer_;  // Not owned.
  const int32_t max_tokens_;
  const int32_t prompt_tokens_;
  const std::vector<int32_t> stop_ids_;
  // The prompt when prompt logprobs are asked for; empty otherwise.
  const std::vector<int32_t> prompt_;

  absl::Mutex mu_;
  std::deque<v1::GenerateResponse> responses_ ABSL_GUARDED_BY(mu_);
  std::optional<absl::StatusOr<GenerateResult>> done_ ABSL_GUARDED_BY(mu_);
  // Used by on_token, then (once done_ is set) by the RPC's thread.
  StreamingDetokenizer detok_;
  StopStringFilter stops_;
  int32_t generated_ = 0;
  // Prompt logprobs, from on_prompt_logprobs until the first response.
  std::vector<v1::TokenLogprobs> prompt_logprobs_;
};

// Tool calls: the text streams as the model wrote it; the last response
// (the one with a finish_reason) carries the calls parsed from it, named
// `call_id_prefix` and their index, and finish_reason "tool_calls" instead
// of "stop" when there are any. With no `names`, responses pass unchanged.
// Not thread-safe (one sequence's responses, in order).
class ToolCallWriter {
 public:
  // `write` is not owned and must outlive the writer.
  ToolCallWriter(std::vector<std::string> names, ToolCallFormat format,
                 ReasoningFormat reasoning, std::string call_id_prefix,
                 const std::function<bool(const v1::GenerateResponse&)>& write);

  // `write`'s answer (false: the client is gone).
  bool Write(const v1::GenerateResponse& response);

 private:
  std::optional<ToolCallStream> parser_;  // Unset: no tools to parse.
  std::vector<ChatToolCall> calls_;
  const std::string call_id_prefix_;
  const std::function<bool(const v1::GenerateResponse&)>& write_;
};

}  // namespace shardlm

#endif  // SHARDLM_API_TEXT_STREAM_H_
