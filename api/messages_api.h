// Anthropic's Messages API (POST /v1/messages, docs/api.md): a request is
// translated into the equivalent /v1/chat/completions body and runs the
// chat path (the same validation, limits, template, tool-call and
// reasoning parsers, metrics and API key); its output is rendered as
// Anthropic's message, or as its stream of typed events. One builder of
// content blocks serves both, so a stream's events assemble into exactly
// the message the same generation returns whole.
#ifndef SHARDLM_API_MESSAGES_API_H_
#define SHARDLM_API_MESSAGES_API_H_

#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "model/tool_calls.h"
#include "nlohmann/json.hpp"

namespace shardlm {

// The Messages request `body` as an OpenAI chat request body (keys in the
// client's order, for the tools' schemas): system, messages with text,
// tool_use and tool_result blocks, tools and tool_choice, max_tokens,
// stop_sequences, temperature, top_p, top_k, stream, thinking (as
// chat_template_kwargs.enable_thinking), and shardlm's grammar extension.
// InvalidArgument naming the field for anything else, or for what the chat path
// cannot carry (images, documents, server tools).
absl::StatusOr<std::string> MessagesToChatBody(absl::string_view body);

// Anthropic's error body for `status`: {"type": "error", "error": {"type":
// ..., "message": ...}}.
std::string MessagesErrorJson(const absl::Status& status);

// Anthropic's stop_reason: tool_use when the message holds a call,
// max_tokens for "length", stop_sequence when a stop string ended it,
// else end_turn.
std::string MessagesStopReason(const std::string& finish_reason,
                               const std::string& stop_sequence, bool tool_use);

// The content blocks of one message, built from the parsed pieces of its
// generation in order: thinking, text and tool_use blocks, a new one each
// time the kind changes, each call a block of its own. Each call returns
// the stream events ({"event", data} pairs) that the pieces make.
class MessageBlocks {
 public:
  using Events = std::vector<std::pair<std::string, nlohmann::json>>;
  // Tool-use ids are id_prefix followed by the call's number.
  explicit MessageBlocks(std::string id_prefix)
      : id_prefix_(std::move(id_prefix)) {}

  Events Push(const ToolCallEvents& pieces);
  // The end: closes the open block (an empty text block when the message
  // has none, as Anthropic's API never returns a message without content).
  Events Finish();

  const nlohmann::json& content() const { return content_; }
  bool tool_use() const { return calls_ > 0; }

 private:
  void Close(Events& events);
  void Open(const nlohmann::json& block, Events& events);

  std::string id_prefix_;
  nlohmann::json content_ = nlohmann::json::array();
  std::string open_;  // The open block's type; "" when none is.
  int calls_ = 0;
};

}  // namespace shardlm

#endif  // SHARDLM_API_MESSAGES_API_H_
