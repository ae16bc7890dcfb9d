// Chat prompts in the format a model was trained on, chosen from the
// model's own Jinja chat template (GGUF tokenizer.chat_template,
// tokenizer_config.json chat_template) by what its string literals write,
// and rendered exactly as Hugging Face's apply_chat_template renders that
// template (tests/reference/check_chat_template.py compares the two with
// jinja2): plain conversations (system, user and assistant messages) in
// every format below, and tools, tool calls and tool results in Qwen2.5's
// and Qwen3's (Hermes-style <tool_call> JSON; ToolCallFormat::kHermes),
// Llama 3.1's and 3.2's (JSON calls; ToolCallFormat::kLlamaJson) and
// gpt-oss's (harmony; ToolCallFormat::kHarmony).
#ifndef SHARDLM_MODEL_CHAT_TEMPLATE_H_
#define SHARDLM_MODEL_CHAT_TEMPLATE_H_

#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "absl/types/span.h"
#include "model/tokenizer.h"

namespace shardlm {

// A function call an assistant made, as OpenAI writes it.
struct ChatToolCall {
  std::string id;
  std::string name;
  std::string arguments;  // A JSON object, as JSON text.
};

struct ChatMessage {
  std::string role;  // "system", "user", "assistant" or "tool".
  std::string content;
  // An assistant's calls (with a tool-capable template only).
  std::vector<ChatToolCall> tool_calls = {};
  std::string tool_call_id = {};  // A tool result's call (not rendered).
};

// A function the model may call. Rendered as the JSON object
// {"type": "function", "function": {"name", "description", "parameters"}}
// (description and parameters only when given), with Python's json.dumps
// layout, as transformers' tojson writes it.
struct ChatTool {
  std::string name;
  std::string description;  // Empty: not given.
  std::string parameters;   // A JSON Schema as JSON text; empty: not given.
};

// How a template's model writes tool calls.
enum class ToolCallFormat {
  kNone,  // The template renders no tools (shardlm knows of).
  // Qwen2.5 (Hermes): each call is
  // <tool_call>\n{"name": NAME, "arguments": {...}}\n</tool_call>.
  kHermes,
  // Llama 3.1 and 3.2 (JSON tool calls): a call is the assistant's whole
  // turn, {"name": NAME, "parameters": {...}}; results are ipython turns.
  kLlamaJson,
  // gpt-oss's harmony: the answer in channels, <|channel|>analysis
  // <|message|>...<|end|> (reasoning) then <|start|>assistant<|channel|>
  // final<|message|>... (content); a call is a commentary message to
  // functions.NAME whose text is the arguments, ended by <|call|>.
  kHarmony,
};

// How a template's model writes its reasoning.
enum class ReasoningFormat {
  kNone,  // Not apart from its answer (as far as shardlm knows).
  // Qwen3: <think>\nREASONING\n</think>\n\n in front of the answer.
  kThink,
  // DeepSeek R1: the prompt opens the block (its generation prompt ends
  // with <think>\n), so the output is REASONING</think> then the answer.
  kThinkOpen,
  // DeepSeek V3.1: kThinkOpen for a request that sets enable_thinking
  // (its prompt then ends with <think>), kNone otherwise (</think>).
  kThinkIfEnabled,
};

// "think", "think_open", "think_if_enabled", or "" for kNone (the gRPC
// API's ModelInfo); read back by ReasoningFormatFromName (kNone for
// another name).
const char* ReasoningFormatName(ReasoningFormat format);
ReasoningFormat ReasoningFormatFromName(std::string_view name);
// How one request's output is to be read: kThinkIfEnabled resolved by the
// request's enable_thinking (unset: off, as V3.1's template defaults);
// other formats as they are.
ReasoningFormat RequestReasoningFormat(ReasoningFormat format,
                                       std::optional<bool> enable_thinking);

// "hermes", "llama_json", or "" for kNone (the gRPC API's ModelInfo);
// ToolCallFormatFromName reads them back (kNone for another name).
const char* ToolCallFormatName(ToolCallFormat format);
ToolCallFormat ToolCallFormatFromName(std::string_view name);

// Variables a request sets for the template (vLLM's chat_template_kwargs);
// a template that does not read one ignores it, as jinja2 does.
struct ChatTemplateVars {
  // Harmony's: "low", "medium" or "high" (InvalidArgument otherwise);
  // empty: the template's default (medium).
  std::string reasoning_effort;
  // Qwen3's: false writes an empty <think> block after the generation
  // prompt, so that the model answers without reasoning; unset: it thinks.
  // DeepSeek V3.1's: true opens a <think> block; unset: it does not.
  std::optional<bool> enable_thinking;
};

class ChatTemplate {
 public:
  enum class Format {
    // <|im_start|>role\ncontent<|im_end|>\n per message (SmolLM2, Qwen2,
    // Qwen2.5), after the template's default system prompt when the
    // conversation does not open with one.
    kChatMl,
    // <|begin_of_text|>, then <|start_header_id|>role<|end_header_id|>\n\n
    // trimmed content <|eot_id|> per message (Llama 3). Llama 3.1 and later
    // always open with a system block that states the knowledge cutoff and
    // the date.
    kLlama3,
    // <s>[INST] user [/INST]assistant</s>... (Mistral v0.1/v0.2, the
    // templates that take user and assistant turns only, alternating from
    // a user's; the assistant's answer follows "[/INST]" directly).
    kMistralInst,
    // Llama 2 chat: <s>[INST] user [/INST] assistant </s> per turn, each
    // turn stripped, a leading system message in <<SYS>>\n...\n<</SYS>>\n\n
    // at the front of the first user turn.
    kLlama2,
    // Mistral v0.3: <s>[INST] user[/INST] assistant</s>...; a leading
    // system message goes in front of the last user turn (and is dropped
    // when the conversation does not end with one), as its template does.
    kMistralV3,
    // Gemma 3: <bos><start_of_turn>user\ncontent<end_of_turn>\n...,
    // the assistant's role written "model", every turn trimmed, a leading
    // system message in front of the first turn's content (followed by a
    // blank line); roles alternate user, assistant, ... after it. Gemma
    // 2's template is the same but refuses a system message.
    kGemma,
    // gpt-oss (harmony): a system block (model identity, knowledge cutoff,
    // today's date, the reasoning effort, by default medium, the valid
    // channels); a
    // leading system or developer message as the developer block's
    // instructions; <|start|>user<|message|>...<|end|> and an assistant's
    // answer as <|start|>assistant<|channel|>final<|message|>...<|end|>;
    // system and developer messages after the first dropped, as the
    // template drops them. With tools (tool_format() kHarmony when the
    // template writes them): each function as a TypeScript type in the
    // developer block's `functions` namespace, an assistant's call as
    // <|start|>assistant to=functions.NAME<|channel|>commentary json
    // <|message|>ARGS<|call|> (its text, until an answer follows, as
    // analysis), a result as <|start|>functions.NAME to=assistant
    // <|channel|>commentary<|message|>"JSON string"<|end|>.
    kHarmony,
    // DeepSeek V3, R1 and V3.1: BOS, the system messages joined (or the
    // last one, in R1's first distilled models' template), then
    // <｜User｜>content and <｜Assistant｜>answer<｜end▁of▁sentence｜> per
    // turn (the answer past its last </think>); the generation prompt
    // <｜Assistant｜>, followed by <think>\n in R1's. V3.1's writes
    // <｜Assistant｜></think> (or <think> with enable_thinking) after a
    // user's turn only, and an answer past its first </think>. Tools are
    // refused (their format is not rendered yet).
    kDeepSeek,
    // GLM-4.5 and 4.6: [gMASK]<sop>, then <|system|>\ncontent,
    // <|user|>content (with /nothink when enable_thinking is false) and
    // <|assistant|>\n<think>REASONING</think>\nanswer per turn (the
    // reasoning kept after the last user turn only, else an empty block),
    // then <|assistant|> (and an empty block when enable_thinking is
    // false). Tools are refused (their XML format is not rendered yet).
    kGlm,
  };

  // The format of `tokenizer`'s chat template. A model with no template
  // gets plain ChatML when its vocabulary has <|im_start|>. Any other
  // template is Unimplemented, naming what it found: rendering it in the
  // wrong format would give plausible but wrong answers. `now` dates the
  // Llama 3.2 system block (its template asks for today's date).
  // `source`, when not empty, is used instead of the model's template.
  static absl::StatusOr<ChatTemplate> ForModel(const Tokenizer& tokenizer,
                                               absl::Time now = absl::Now(),
                                               std::string_view source = {});
  // The same from a template's source; `bos` and `eos` are the BOS and
  // EOS tokens' texts.
  static absl::StatusOr<ChatTemplate> FromSource(std::string_view source,
                                                 std::string bos,
                                                 std::string eos,
                                                 bool vocab_has_chatml,
                                                 absl::Time now);

  // `messages` followed by the opening of the assistant's turn
  // (add_generation_prompt). InvalidArgument for another role.
  absl::StatusOr<std::string> Render(
      absl::Span<const ChatMessage> messages) const;
  // The same with `tools` in the system block. InvalidArgument when the
  // template renders no tools (tool_format() kNone) and `tools`, a tool
  // message or an assistant's tool call is given, naming the field; and for
  // an assistant's call whose arguments are not a JSON object.
  // `vars` as ChatTemplateVars says.
  absl::StatusOr<std::string> Render(absl::Span<const ChatMessage> messages,
                                     absl::Span<const ChatTool> tools,
                                     const ChatTemplateVars& vars = {}) const;

  Format format() const { return format_; }
  // How the template renders tools (kNone: it renders none).
  ToolCallFormat tool_format() const { return tool_format_; }
  // How the model's output is to be read: tool_format(), except that any
  // harmony template's answers come in channels (kHarmony).
  ToolCallFormat output_format() const {
    return format_ == Format::kHarmony ? ToolCallFormat::kHarmony
                                       : tool_format_;
  }
  // How the model writes its reasoning (harmony's is a channel, read by
  // output_format()).
  ReasoningFormat reasoning_format() const;
  // One line for logs and `shardlm inspect`.
  std::string Describe() const;

 private:
  absl::StatusOr<std::string> RenderInst(
      absl::Span<const ChatMessage> messages) const;
  // In chat_harmony.cc.
  absl::StatusOr<std::string> RenderHarmony(
      absl::Span<const ChatMessage> messages, absl::Span<const ChatTool> tools,
      std::string_view reasoning_effort) const;
  // In chat_deepseek.cc. The template when `source` is one of DeepSeek's
  // (by its literals), Unimplemented for a variant not rendered; nullopt
  // when it is not DeepSeek's.
  static std::optional<absl::StatusOr<ChatTemplate>> DeepSeekFromSource(
      std::string_view source, const std::vector<std::string>& literals,
      const std::string& bos);
  absl::StatusOr<std::string> RenderDeepSeek(
      absl::Span<const ChatMessage> messages,
      std::optional<bool> enable_thinking) const;
  absl::StatusOr<std::string> RenderGlm(
      absl::Span<const ChatMessage> messages,
      std::optional<bool> enable_thinking) const;
  absl::StatusOr<std::string> RenderHermes(
      absl::Span<const ChatMessage> messages,
      absl::Span<const ChatTool> tools) const;
  // `think`: false writes the empty <think> block (enable_thinking).
  absl::StatusOr<std::string> RenderQwen3(
      absl::Span<const ChatMessage> messages, absl::Span<const ChatTool> tools,
      bool think = true) const;
  absl::StatusOr<std::string> RenderLlamaJson(
      absl::Span<const ChatMessage> messages,
      absl::Span<const ChatTool> tools) const;

  Format format_ = Format::kChatMl;
  ToolCallFormat tool_format_ = ToolCallFormat::kNone;
  bool from_template_ = false;    // False: the ChatML fallback.
  std::string bos_;               // Llama 3, Mistral: written first.
  std::string eos_;               // Mistral: ends an assistant turn
  bool space_after_eos_ = false;  // Mistral v0.1: "</s> " then.
  std::string default_system_;    // ChatML: when no system message leads.
  bool qwen3_ = false;            // Hermes tools, Qwen3's template.
  bool dated_system_ = false;     // Llama 3.1+.
  bool refuses_system_ = false;   // Gemma 2: no system role.
  std::string date_;              // "26 Jul 2024".
  // DeepSeek: the system messages' separator (none: the last one alone),
  // whether an answer loses its reasoning (up to its last </think>), what
  // the generation prompt writes after <｜Assistant｜>, and V3.1's layout.
  std::optional<std::string> system_join_;
  bool split_think_ = false;
  std::string prompt_suffix_;
  bool deepseek_v31_ = false;
};

// The string literals inside a Jinja template's {{ }} and {% %} tags, with
// their escapes (\n, \t, \', \", \\) decoded, in order.
std::vector<std::string> JinjaStringLiterals(std::string_view source);

}  // namespace shardlm

#endif  // SHARDLM_MODEL_CHAT_TEMPLATE_H_
