// Tool calls in a model's output text, split off the text as the model
// streams it: the Hermes format (Qwen2.5, Qwen3) that ChatTemplate
// renders, <tool_call>\n{"name": ..., "arguments": {...}}\n</tool_call>,
// and Llama 3.1's JSON calls, the whole output {"name": ..., "parameters":
// {...}}; and gpt-oss's harmony channels, reasoning apart from content.
#ifndef SHARDLM_MODEL_TOOL_CALLS_H_
#define SHARDLM_MODEL_TOOL_CALLS_H_

#include <string>
#include <string_view>
#include <vector>

#include "model/chat_template.h"

namespace shardlm {

// What a piece of output text turned into: text for the client's content,
// reasoning (harmony's analysis channel) for its reasoning_content, and
// whole calls (id left empty: the API names them).
struct ToolCallEvents {
  std::string content;
  std::string reasoning;
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
// a malformed call never fails the request.
//
// kLlamaJson: an output whose first non-space text is "{" (or Llama's
// <|python_tag|>) is held to the end, then parsed as calls
// {"name": NAME, "parameters": {...}} ("arguments" is taken too, as
// vLLM's llama3_json parser does), several separated by ";"; anything
// else, or a parse that fails, is content, as it came. Any other output
// passes through at once.
//
// kHarmony (gpt-oss): the output is messages, each a header
// ([<|start|>ROLE[ to=RECIPIENT]]<|channel|>NAME[ to=RECIPIENT]
// [ TYPE|<|constrain|>TYPE]; the first may open with " to=RECIPIENT", the
// prompt having written <|start|>assistant) then <|message|>, its text,
// and <|end|>, <|call|>, <|return|> or the end of the output. A message to
// functions.NAME, NAME among `names`, is a call: its text, held whole, is
// the arguments (re-written as Python's json.dumps writes them); text that
// is not a JSON object is content, as it came. The analysis channel's
// text is reasoning, every other message's content; the markup is
// dropped. Text streams as it comes (a suffix that may begin a tag is held
// back). An output that does not open with a header, or a header that is
// not one, is content as it came, from there on.
//
// ReasoningFormat::kThink (Qwen3, GLM-4.5), before any of the above: an
// output that opens with <think> (after newlines, which GLM writes first)
// has its text up to </think> as reasoning, then the
// answer, split as Qwen3's template splits a turn (the reasoning without
// its leading and trailing newlines, the answer without its leading
// ones); reasoning left open at the end is reasoning. kThinkOpen (DeepSeek
// R1, whose prompt opened the block): the same from the output's first
// byte, as if it had opened with <think>. kThinkIfEnabled is read as kNone:
// resolve it per request first (RequestReasoningFormat). Not thread-safe.
class ToolCallStream {
 public:
  explicit ToolCallStream(std::vector<std::string> names,
                          ToolCallFormat format = ToolCallFormat::kHermes,
                          ReasoningFormat reasoning = ReasoningFormat::kNone)
      : names_(std::move(names)),
        format_(format),
        think_(reasoning == ReasoningFormat::kThink       ? Think::kStart
               : reasoning == ReasoningFormat::kThinkOpen ? Think::kLead
                                                          : Think::kDone) {}

  ToolCallEvents Push(std::string_view text);
  // The end of the output: what is held back, as content.
  ToolCallEvents Finish();

  // Calls returned so far.
  int calls() const { return calls_; }

 private:
  // kThink: the reasoning block, until the answer begins.
  void DrainThink(ToolCallEvents& events, bool finish);
  void Drain(ToolCallEvents& events);
  void DrainLlama(ToolCallEvents& events);
  // Harmony; `finish`: the output ended (nothing more is held back).
  void DrainHarmony(ToolCallEvents& events, bool finish);
  // Harmony: the call to call_ whose arguments are `text` ends.
  void EndHarmonyCall(std::string_view text, ToolCallEvents& events);
  // Llama: the held output as calls; false (and none) when it is not.
  bool ParseLlamaCalls(std::vector<ChatToolCall>& calls) const;
  bool Named(const std::string& name) const;

  // kThink's stages: whether <think> opens the output, its text (past
  // leading newlines), the newlines after </think>, then the answer.
  enum class Think { kStart, kLead, kIn, kTrail, kDone };

  std::vector<std::string> names_;
  ToolCallFormat format_;
  Think think_;
  std::string held_;
  bool in_calls_ = false;     // Past the first <tool_call> (Llama: "{").
  bool passthrough_ = false;  // After a malformed call: all is content.
  bool in_message_ = false;   // Harmony: inside a message's text.
  bool reasoning_ = false;    // Harmony: that message is analysis.
  bool opened_ = false;       // Harmony: a message has begun.
  std::string call_;          // Harmony: that message calls this tool.
  int calls_ = 0;
};

}  // namespace shardlm

#endif  // SHARDLM_MODEL_TOOL_CALLS_H_
