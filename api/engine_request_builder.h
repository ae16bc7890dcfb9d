// The gRPC API's protocol side: a shardlm.v1.GenerateRequest as the
// engine's GenerateRequest (tokenized, defaults applied, stop tokens and
// constraints added), with every check the engine cannot make itself.
// InferenceService (api/inference_service.h) serves the result.
#ifndef SHARDLM_API_ENGINE_REQUEST_BUILDER_H_
#define SHARDLM_API_ENGINE_REQUEST_BUILDER_H_

#include <cstddef>
#include <cstdint>
#include <memory>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "engine/request.h"

namespace shardlm {

namespace v1 {
class GenerateRequest;
}  // namespace v1

class ChatTemplate;
class GrammarCache;
class Tokenizer;
struct ModelConfig;

// Limits on GenerateRequest.stop (as OpenAI's 4, with room).
inline constexpr int kMaxStopStrings = 8;
inline constexpr size_t kMaxStopStringBytes = 256;
// Limits on the repeated fields of a request: far more than any real
// request, small enough that checking them costs nothing.
inline constexpr int kMaxStopTokenIds = 256;
inline constexpr int kMaxChatMessages = 256;
inline constexpr int kMaxPromptTokenIds = 1 << 18;
// OpenAI's limit on tools.
inline constexpr int kMaxTools = 128;

// Thread-safe (its grammar cache is). Every pointer is not owned and must
// outlive the builder; `tokenizer` may be null (then no constraint
// compiles), as may `chat_template`'s value be an error (then chat requests
// are refused with it).
class EngineRequestBuilder {
 public:
  EngineRequestBuilder(const ModelConfig* config, const Tokenizer* tokenizer,
                       const absl::StatusOr<ChatTemplate>* chat_template,
                       int32_t default_max_tokens, size_t max_prompt_bytes);
  ~EngineRequestBuilder();

  // The engine request for `request` (tokenized, cut to its last
  // truncate_prompt_tokens, defaults applied, stop tokens added), or
  // InvalidArgument naming the field. Checks what the engine cannot see
  // (sampling fields, token ranges, stop strings, which the service
  // matches itself); the engine checks context and KV capacity.
  absl::StatusOr<GenerateRequest> Build(
      const v1::GenerateRequest& request) const;

 private:
  // The steps of Build, in its order (each error is the first one a client
  // sees, so the order is part of the API). max_tokens, min_tokens and the
  // sampling and logprob fields.
  absl::Status SetSampling(const v1::GenerateRequest& request,
                           GenerateRequest& req) const;
  // The counts and sizes of stop strings, prompt, token ids, messages and
  // tools, checked before anything costs more than the request's bytes.
  absl::Status CheckStopStrings(const v1::GenerateRequest& request) const;
  absl::Status CheckSizes(const v1::GenerateRequest& request) const;
  // Checks request.tools and tool_choice.
  absl::Status CheckTools(const v1::GenerateRequest& request) const;
  // req.prompt from the messages, the token ids or the text, cut to the
  // last truncate_prompt_tokens.
  absl::Status SetPrompt(const v1::GenerateRequest& request,
                         GenerateRequest& req) const;
  // The messages (and tools) through the chat template, tokenized.
  absl::StatusOr<std::vector<int32_t>> ChatPrompt(
      const v1::GenerateRequest& request) const;
  // req.stop_token_ids (the request's, then the model's unless ignore_eos)
  // and req.resumed.
  absl::Status SetStopTokens(const v1::GenerateRequest& request,
                             GenerateRequest& req) const;
  absl::Status SetResumed(const v1::GenerateRequest& request,
                          GenerateRequest& req) const;
  // Compiles request.constraint (cached) into req.constraint, after
  // req.stop_token_ids are known; InvalidArgument naming the keyword.
  absl::Status AddConstraint(const v1::GenerateRequest& request,
                             GenerateRequest& req) const;
  // With tool_choice "required" or a function, compiles the tool-call
  // grammar into req.constraint (after req.stop_token_ids are known).
  absl::Status AddToolConstraint(const v1::GenerateRequest& request,
                                 GenerateRequest& req) const;
  // A resumed constrained stream: its grammar state follows the tokens
  // already sent, which must be a prefix of a sentence.
  static absl::Status AcceptResumed(GenerateRequest& req);

  const ModelConfig* config_;
  const Tokenizer* tokenizer_;
  const absl::StatusOr<ChatTemplate>* chat_template_;
  int32_t default_max_tokens_;
  size_t max_prompt_bytes_;
  // Structured outputs' compiled grammars (thread-safe; null without a
  // tokenizer). Compiling is part of validating a request.
  std::unique_ptr<GrammarCache> grammars_;
};

}  // namespace shardlm

#endif  // SHARDLM_API_ENGINE_REQUEST_BUILDER_H_
