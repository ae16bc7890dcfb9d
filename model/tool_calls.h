// Tool calls in a model's output text: the Hermes format (Qwen2.5) that
// ChatTemplate renders, <tool_call>\n{"name": ..., "arguments": {...}}\n
// </tool_call>, split off the text as the model streams it.
#ifndef SHARDLM_MODEL_TOOL_CALLS_H_
#define SHARDLM_MODEL_TOOL_CALLS_H_

#include <string>
#include <string_view>
#include <vector>

#include "model/chat_template.h"

namespace shardlm {

// What a piece of output text turned into: text for the client's content,
// and whole calls (id left empty: the API names them).
struct ToolCallEvents {
  std::string content;
  std::vector<ChatToolCall> calls;
};

// Splits a streamed output into content and tool calls. Content before the
// first <tool_call> passes through at once (a suffix that may begin the
// tag is held back until it is known not to). From the tag on, text is
// held until each call's </tool_call>; a call whose JSON is an object with
// a "name" among `names` and an object "arguments" becomes a ChatToolCall
// (arguments as Python's json.dumps writes them, as vLLM returns them);
// whitespace between calls is dropped. Anything else (malformed JSON, an
// unknown name, other text between or after calls, a call left open at the
// end) is given back as content, as it came, and so is all text after it:
// a malformed call never fails the request. Not thread-safe.
class ToolCallStream {
 public:
  explicit ToolCallStream(std::vector<std::string> names)
      : names_(std::move(names)) {}

  ToolCallEvents Push(std::string_view text);
  // The end of the output: what is held back, as content.
  ToolCallEvents Finish();

  // Calls returned so far.
  int calls() const { return calls_; }

 private:
  void Drain(ToolCallEvents& events);

  std::vector<std::string> names_;
  std::string held_;
  bool in_calls_ = false;     // Past the first <tool_call>.
  bool passthrough_ = false;  // After a malformed call: all is content.
  int calls_ = 0;
};

}  // namespace shardlm

#endif  // SHARDLM_MODEL_TOOL_CALLS_H_
