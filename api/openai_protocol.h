// The OpenAI API's wire codec (api/openai_api.h serves it): an OpenAI
// request body as a shardlm.v1 request, and the JSON pieces of its
// responses (usage, log-probabilities, errors). Also read by the
// endpoints translated into chat requests (messages_api.cc,
// responses_api.cc). Include only from api/*.cc.
#ifndef SHARDLM_API_OPENAI_PROTOCOL_H_
#define SHARDLM_API_OPENAI_PROTOCOL_H_

#include <cstdint>
#include <limits>
#include <string>
#include <type_traits>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "model/tool_calls.h"
#include "nlohmann/json.hpp"
#include "shardlm/v1/inference.pb.h"

namespace shardlm::openai_wire {

using Json = nlohmann::json;

// Serializes `j`; invalid UTF-8 in its strings (a client's path or model
// name echoed in an error, a token's bytes in logprobs) becomes U+FFFD
// instead of an exception.
std::string Dump(const Json& j);

// A client's string as an error message echoes it: at most 256 bytes of it
// (a 1 MB model name must not come back whole).
std::string Echo(absl::string_view client_text);

absl::Status Invalid(auto&&... parts) {
  return absl::InvalidArgumentError(absl::StrCat(parts...));
}

// What a parsed body costs at most per JSON value: a value is 16 bytes, an
// array slot up to twice that while the vector grows, an object member a
// map node with its key (~80 bytes); the strings' bytes are charged
// separately (at most the body's size).
constexpr int64_t kDomBytesPerValue = 96;

// OpenAI's error body for `status`.
std::string ErrorJson(const absl::Status& status);

// Reads an optional field of type T; InvalidArgument naming it when the
// type is wrong.
template <typename T>
absl::Status Get(const Json& body, const char* name, T* out) {
  auto it = body.find(name);
  if (it == body.end() || it->is_null()) return absl::OkStatus();
  bool ok;
  if constexpr (std::is_same_v<T, bool>) {
    ok = it->is_boolean();
  } else if constexpr (std::is_integral_v<T>) {
    // Unsigned JSON numbers above INT64_MAX would wrap in get<int64_t>.
    ok = it->is_number_integer() &&
         (!it->is_number_unsigned() ||
          it->template get<uint64_t>() <=
              static_cast<uint64_t>(std::numeric_limits<int64_t>::max())) &&
         it->template get<int64_t>() >= std::numeric_limits<T>::min() &&
         it->template get<int64_t>() <= std::numeric_limits<T>::max();
  } else if constexpr (std::is_floating_point_v<T>) {
    ok = it->is_number();
  } else {
    ok = it->is_string();
  }
  if (!ok) return Invalid("'", name, "' has the wrong type or range");
  *out = it->template get<T>();
  return absl::OkStatus();
}

// What the HTTP response shows beside the service's text, as the request
// body asked.
struct ResponseShape {
  int top_n = -1;         // Alternatives reported per token (-1: no logprobs).
  bool echo = false;      // The prompt leads each choice (completions).
  std::string echo_text;  // What echo prepends to each choice's text.
  // vLLM's prompt_logprobs: alternatives per prompt token (-1: not asked).
  int prompt_top_n = -1;
};

// The OpenAI request as a shardlm.v1 request, and what its response shows.
absl::StatusOr<v1::GenerateRequest> ToProto(const Json& body,
                                            absl::string_view raw_body,
                                            bool chat,
                                            const std::string& model_name,
                                            int64_t context_length,
                                            ResponseShape* shape);

// OpenAI's usage object, with the prompt tokens the prefix cache held.
Json UsageJson(const v1::Usage& u);

// The prompt's tokens and log-probabilities (`r.prompt_logprobs`) in the
// completions format, from text offset 0; the first token's logprob and
// alternatives are null, as OpenAI's.
Json PromptLogprobsJson(const v1::GenerateResponse& r, int top_n);

// vLLM's prompt_logprobs from the service's (`r.prompt_logprobs`, one per
// prompt token): null for the first token (nothing precedes it), then per
// token an object of token id (decimal) to {logprob, rank, decoded_token}
// holding the prompt token and the `k` most likely tokens there. A rank is
// the position among the most likely (from 1, lower id first on ties); the
// prompt token's is null when it is not among the alternatives returned.
Json VllmPromptLogprobsJson(const v1::GenerateResponse& r, int k);

// Log-probabilities of the tokens of one response, in the completions
// ("tokens", "token_logprobs", ...) or chat ("content": [...]) format.
// `offset` is the running text offset of completions.
void AppendLogprobs(const v1::GenerateResponse& r, bool chat, int top_n,
                    Json& out, int64_t* offset);

Json EmptyLogprobs(bool chat);

// One response's text through a chat output's parser (tool calls,
// reasoning); on the last response (a finish_reason), what the parser held
// back too.
ToolCallEvents ParsePiece(ToolCallStream& parser,
                          const v1::GenerateResponse& r);

}  // namespace shardlm::openai_wire

#endif  // SHARDLM_API_OPENAI_PROTOCOL_H_
