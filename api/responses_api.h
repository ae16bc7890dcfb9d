// OpenAI's Responses API (POST /v1/responses, docs/api.md), as the
// Messages API (messages_api.h): a request is translated into the
// equivalent chat request and runs the chat path; its output becomes the
// response's output items (reasoning, message, function_call), or their
// stream of typed events, from one builder, so the two agree. A response
// created with "store": true is kept (its conversation, in chat form) in a
// bounded in-memory store with a time to live, for a later request's
// previous_response_id.
#ifndef SHARDLM_API_RESPONSES_API_H_
#define SHARDLM_API_RESPONSES_API_H_

#include <cstdint>
#include <list>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "model/tool_calls.h"
#include "nlohmann/json.hpp"
#include "shardlm/v1/inference.pb.h"

namespace shardlm {

// Stored responses' conversations (chat messages, as JSON text), by
// response id: at most max_entries of them and max_bytes in all, each for
// ttl after it was stored; the least recently stored go first.
// Thread-safe.
class ResponseStore {
 public:
  struct Limits {
    int64_t max_entries = 1024;
    int64_t max_bytes = 64 << 20;
    absl::Duration ttl = absl::Hours(1);
  };
  ResponseStore() : ResponseStore(Limits{}) {}
  explicit ResponseStore(Limits limits) : limits_(limits) {}

  void Put(const std::string& id, std::string messages,
           absl::Time now = absl::Now());
  // The conversation, or nullopt: never stored, expired or evicted.
  std::optional<std::string> Get(const std::string& id,
                                 absl::Time now = absl::Now());
  int64_t size() const;

 private:
  struct Entry {
    std::string id, messages;
    absl::Time expires;
  };
  void DropExpired(absl::Time now) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  const Limits limits_;
  mutable absl::Mutex mu_;
  std::list<Entry> entries_ ABSL_GUARDED_BY(mu_);  // Oldest first.
  absl::flat_hash_map<std::string, std::list<Entry>::iterator> by_id_
      ABSL_GUARDED_BY(mu_);
  int64_t bytes_ ABSL_GUARDED_BY(mu_) = 0;
};

// A Responses request as a chat request.
struct ResponsesRequest {
  std::string chat_body;  // The chat request's body (JSON).
  nlohmann::json echo;    // The request's fields a response repeats.
  // The conversation so far in chat messages (previous response's, then
  // this input; no instructions), stored with the output when `store`.
  nlohmann::ordered_json conversation;
  bool store = false;
};

// Translates `body` (input as a string or items: messages with text
// content, function_call and function_call_output items, reasoning items
// (dropped); instructions; tools of type function; tool_choice;
// max_output_tokens; temperature; top_p; stream; text.format; reasoning
// effort; store; previous_response_id (looked up in `store`, NotFound
// when absent), metadata, parallel_tool_calls, truncation "disabled",
// user). InvalidArgument naming a field it cannot carry.
absl::StatusOr<ResponsesRequest> ResponsesToChatBody(absl::string_view body,
                                                     ResponseStore& store);

// What a response object says beside its output and usage.
struct ResponseHead {
  std::string id;
  int64_t created = 0;  // Unix seconds.
  std::string model;
  std::string status;  // in_progress, completed or incomplete.
  bool store = false;
  nlohmann::json echo;  // ResponsesRequest::echo.
};

// The response object: `head`, `output`, and `usage` (null when absent),
// with the request's fields it repeats (their defaults where not given).
nlohmann::json ResponseJson(const ResponseHead& head,
                            const nlohmann::json& output,
                            const v1::Usage* usage);

// The output items of one response, built from the parsed pieces of its
// generation in order (a new item each time the kind changes; each call
// an item of its own); each call returns the stream events it makes
// (without sequence numbers).
class ResponseItems {
 public:
  using Events = std::vector<nlohmann::json>;
  explicit ResponseItems(std::string id_suffix)
      : suffix_(std::move(id_suffix)) {}

  Events Push(const ToolCallEvents& pieces);
  Events Finish();  // Closes the open item.

  const nlohmann::json& output() const { return output_; }
  // The assistant's turn in chat form (its text and calls; reasoning is
  // not sent back), for the store.
  nlohmann::ordered_json ChatMessage() const;

 private:
  void Close(Events& events);
  nlohmann::json& Open(nlohmann::json item, Events& events);

  std::string suffix_;
  nlohmann::json output_ = nlohmann::json::array();
  std::string open_;  // The open item's type; "" when none is.
  int items_ = 0;
};

}  // namespace shardlm

#endif  // SHARDLM_API_RESPONSES_API_H_
