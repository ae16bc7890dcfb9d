#include "model/chat_template.h"

#include <algorithm>
#include <cstddef>
#include <optional>

#include "absl/strings/str_cat.h"
#include "absl/time/time.h"
#include "core/status.h"
#include "model/chat_json.h"
#include "model/pretokenizer.h"
#include "model/template_source.h"
#include "nlohmann/json.hpp"

namespace shardlm {
namespace {

constexpr std::string_view kChatMlSystem = "<|im_start|>system\n";
constexpr std::string_view kChatMlEnd = "<|im_end|>\n";

// What Qwen2.5's template writes around tools, tool calls and tool results
// (the Hermes format). A template is taken as Hermes only when it writes
// every one of these literals: a variant that words them otherwise (Qwen3
// opens a call without the newline) is not rendered as this one.
constexpr std::string_view kHermesToolsOpen =
    "\n\n# Tools\n\nYou may call one or more functions to assist with the "
    "user query.\n\nYou are provided with function signatures within "
    "<tools></tools> XML tags:\n<tools>";
constexpr std::string_view kHermesToolsClose =
    "\n</tools>\n\nFor each function call, return a json object with "
    "function name and arguments within <tool_call></tool_call> XML "
    "tags:\n<tool_call>\n{\"name\": <function-name>, \"arguments\": "
    "<args-json-object>}\n</tool_call><|im_end|>\n";
constexpr std::string_view kHermesCallOpen = "\n<tool_call>\n{\"name\": \"";
constexpr std::string_view kHermesCallArgs = "\", \"arguments\": ";
constexpr std::string_view kHermesCallClose = "}\n</tool_call>";
constexpr std::string_view kHermesResponseOpen = "\n<tool_response>\n";
constexpr std::string_view kHermesResponseClose = "\n</tool_response>";
// Qwen3's variant: the same calls and results, the tools block without the
// blank line in front (there is no default system prompt), a call opened
// without the newline (the template writes it between calls), and <think>
// blocks in the assistant's turns.
constexpr std::string_view kQwen3ToolsOpen = kHermesToolsOpen.substr(2);
constexpr std::string_view kQwen3CallOpen = kHermesCallOpen.substr(1);
constexpr std::string_view kQwen3ThinkOpen = "\n<think>\n";
constexpr std::string_view kQwen3ThinkClose = "\n</think>\n\n";

// What Llama 3.1's and 3.2's templates write around JSON tool calls (with
// tools_in_user_message, their default: the functions go in front of the
// first user message; a call is the assistant's whole turn; results come
// in `ipython` turns).
constexpr std::string_view kLlamaEnvironment = "Environment: ipython\n";
constexpr std::string_view kLlamaToolsLead1 =
    "Given the following functions, please respond with a JSON for a "
    "function call ";
constexpr std::string_view kLlamaToolsLead2 =
    "with its proper arguments that best answers the given prompt.\n\n";
constexpr std::string_view kLlamaToolsFormat =
    "Respond in the format {\"name\": function name, \"parameters\": "
    "dictionary of argument name and its value}.";
constexpr std::string_view kLlamaNoVariables = "Do not use variables.\n\n";
constexpr std::string_view kLlamaIpython =
    "<|start_header_id|>ipython<|end_header_id|>\n\n";

using OrderedJson = nlohmann::ordered_json;

// Python's str.isspace, which Jinja's trim (str.strip) uses.
bool IsPythonSpace(uint32_t c) {
  return (c >= 0x09 && c <= 0x0d) || (c >= 0x1c && c <= 0x20) || c == 0x85 ||
         c == 0xa0 || c == 0x1680 || (c >= 0x2000 && c <= 0x200a) ||
         c == 0x2028 || c == 0x2029 || c == 0x202f || c == 0x205f ||
         c == 0x3000;
}

// Jinja's `trim` filter.
std::string_view Trim(std::string_view s) {
  size_t begin = 0;
  while (begin < s.size()) {
    size_t next = begin;
    if (!IsPythonSpace(NextCodePoint(s, &next))) break;
    begin = next;
  }
  size_t end = s.size();
  while (end > begin) {
    size_t start = end - 1;  // Back to the first byte of the last character.
    while (start > begin && (static_cast<uint8_t>(s[start]) & 0xc0) == 0x80) {
      --start;
    }
    size_t next = start;
    if (!IsPythonSpace(NextCodePoint(s, &next)) || next != end) break;
    end = start;
  }
  return s.substr(begin, end - begin);
}

// Python's str.strip(chars), lstrip and rstrip for one character.
std::string_view LStrip(std::string_view s, char c) {
  while (!s.empty() && s.front() == c) s.remove_prefix(1);
  return s;
}
std::string_view RStrip(std::string_view s, char c) {
  while (!s.empty() && s.back() == c) s.remove_suffix(1);
  return s;
}

// The part of `s` after the last `sep` (all of it without one), and before
// the first: Python's s.split(sep)[-1] and s.split(sep)[0].
std::string_view AfterLast(std::string_view s, std::string_view sep) {
  const size_t at = s.rfind(sep);
  return at == std::string_view::npos ? s : s.substr(at + sep.size());
}
std::string_view BeforeFirst(std::string_view s, std::string_view sep) {
  return s.substr(0, std::min(s.size(), s.find(sep)));
}

// An assistant's turn as Qwen3's and GLM-4.5's templates split it:
// content.split('</think>')[0].rstrip('\n').split('<think>')[-1]
// .lstrip('\n') as the reasoning, content.split('</think>')[-1]
// .lstrip('\n') as the answer; without </think>, no reasoning.
struct ThinkSplit {
  std::string_view reasoning, content;
};
ThinkSplit SplitThink(std::string_view content) {
  if (content.find("</think>") == std::string_view::npos) return {{}, content};
  return {LStrip(AfterLast(RStrip(BeforeFirst(content, "</think>"), '\n'),
                           "<think>"),
                 '\n'),
          LStrip(AfterLast(content, "</think>"), '\n')};
}

// A tool as transformers passes it to a template: {"type": "function",
// "function": {"name", "description", "parameters"}} (the last two only
// when given).
absl::StatusOr<OrderedJson> ToolJson(const ChatTool& tool, size_t i) {
  OrderedJson function = {{"name", tool.name}};
  if (!tool.description.empty()) function["description"] = tool.description;
  if (!tool.parameters.empty()) {
    OrderedJson p = OrderedJson::parse(tool.parameters, nullptr,
                                       /*allow_exceptions=*/false);
    if (p.is_discarded()) {
      return absl::InvalidArgumentError(
          absl::StrCat("tools[", i, "].function.parameters is not JSON"));
    }
    function["parameters"] = std::move(p);
  }
  return OrderedJson{{"type", "function"}, {"function", std::move(function)}};
}

// "\n" then the JSON line of each tool, as the Hermes templates write them.
absl::Status AppendHermesTools(absl::Span<const ChatTool> tools,
                               std::string& out) {
  for (size_t i = 0; i < tools.size(); ++i) {
    ASSIGN_OR_RETURN(const OrderedJson tool, ToolJson(tools[i], i));
    out += "\n";
    AppendPythonJson(tool, out);
  }
  return absl::OkStatus();
}

absl::Status CheckToolRoles(absl::Span<const ChatMessage> messages) {
  for (size_t i = 0; i < messages.size(); ++i) {
    const std::string& role = messages[i].role;
    if (role != "system" && role != "user" && role != "assistant" &&
        role != "tool") {
      return absl::InvalidArgumentError(
          absl::StrCat("messages[", i, "].role '", role,
                       "' is not system, user, assistant or tool"));
    }
    if (role != "assistant" && !messages[i].tool_calls.empty()) {
      return absl::InvalidArgumentError(absl::StrCat(
          "messages[", i, "].tool_calls: only an assistant makes calls"));
    }
  }
  return absl::OkStatus();
}

}  // namespace

const char* ToolCallFormatName(ToolCallFormat format) {
  switch (format) {
    case ToolCallFormat::kHermes:
      return "hermes";
    case ToolCallFormat::kLlamaJson:
      return "llama_json";
    case ToolCallFormat::kHarmony:
      return "harmony";
    case ToolCallFormat::kNone:
      break;
  }
  return "";
}

const char* ReasoningFormatName(ReasoningFormat format) {
  switch (format) {
    case ReasoningFormat::kThink:
      return "think";
    case ReasoningFormat::kThinkOpen:
      return "think_open";
    case ReasoningFormat::kThinkIfEnabled:
      return "think_if_enabled";
    case ReasoningFormat::kNone:
      break;
  }
  return "";
}

ReasoningFormat ReasoningFormatFromName(std::string_view name) {
  for (ReasoningFormat f :
       {ReasoningFormat::kThink, ReasoningFormat::kThinkOpen,
        ReasoningFormat::kThinkIfEnabled}) {
    if (name == ReasoningFormatName(f)) return f;
  }
  return ReasoningFormat::kNone;
}

ReasoningFormat RequestReasoningFormat(ReasoningFormat format,
                                       std::optional<bool> enable_thinking) {
  if (format != ReasoningFormat::kThinkIfEnabled) return format;
  return enable_thinking.value_or(false) ? ReasoningFormat::kThinkOpen
                                         : ReasoningFormat::kNone;
}

ReasoningFormat ChatTemplate::reasoning_format() const {
  if (qwen3_ || format_ == Format::kGlm) return ReasoningFormat::kThink;
  if (format_ != Format::kDeepSeek) return ReasoningFormat::kNone;
  if (deepseek_v31_) return ReasoningFormat::kThinkIfEnabled;
  return prompt_suffix_.starts_with("<think>") ? ReasoningFormat::kThinkOpen
                                               : ReasoningFormat::kNone;
}

ToolCallFormat ToolCallFormatFromName(std::string_view name) {
  if (name == "hermes") return ToolCallFormat::kHermes;
  if (name == "llama_json") return ToolCallFormat::kLlamaJson;
  if (name == "harmony") return ToolCallFormat::kHarmony;
  return ToolCallFormat::kNone;
}

std::vector<std::string> JinjaStringLiterals(std::string_view source) {
  std::vector<std::string> out;
  size_t i = 0;
  while (i + 1 < source.size()) {
    const std::string_view open = source.substr(i, 2);
    if (open == "{#") {  // A comment: skipped whole.
      const size_t end = source.find("#}", i + 2);
      i = end == std::string_view::npos ? source.size() : end + 2;
      continue;
    }
    if (open != "{{" && open != "{%") {
      ++i;
      continue;
    }
    const std::string_view close = open == "{{" ? "}}" : "%}";
    i += 2;
    while (i < source.size() && source.substr(i, 2) != close) {
      if (source[i] == '\'' || source[i] == '"') {
        out.push_back(ReadTemplateLiteral(source, &i));
      } else {
        ++i;
      }
    }
    i += 2;
  }
  return out;
}

absl::StatusOr<ChatTemplate> ChatTemplate::ForModel(const Tokenizer& tokenizer,
                                                    absl::Time now,
                                                    std::string_view source) {
  std::string bos, eos;
  if (tokenizer.bos_id() >= 0) {
    bos = std::string(tokenizer.TokenBytes(tokenizer.bos_id()));
  }
  if (tokenizer.eos_id() >= 0) {
    eos = std::string(tokenizer.TokenBytes(tokenizer.eos_id()));
  }
  return FromSource(source.empty() ? tokenizer.chat_template() : source,
                    std::move(bos), std::move(eos),
                    tokenizer.TokenId("<|im_start|>").has_value() &&
                        tokenizer.TokenId("<|im_end|>").has_value(),
                    now);
}

absl::StatusOr<ChatTemplate> ChatTemplate::FromSource(std::string_view source,
                                                      std::string bos,
                                                      std::string eos,
                                                      bool vocab_has_chatml,
                                                      absl::Time now) {
  ChatTemplate t;
  if (source.empty()) {
    if (vocab_has_chatml) return t;
    return absl::UnimplementedError(
        "the model has no chat template and its vocabulary no ChatML "
        "tokens; use completions with a prompt in its own format");
  }
  t.from_template_ = true;
  const std::vector<std::string> literals = JinjaStringLiterals(source);
  const auto writes = [&](std::string_view what) {
    return LiteralWrites(literals, what);
  };
  const auto has = [&](std::string_view what) {
    return source.find(what) != std::string_view::npos;
  };
  const auto literal = [&](std::string_view what) {
    return HasLiteral(literals, what);
  };
  if (writes("<|start|>system<|message|>") &&
      writes("<|start|>user<|message|>") &&
      writes("<|start|>assistant<|channel|>final<|message|>")) {
    // gpt-oss's harmony template dates its system block (strftime_now).
    t.format_ = Format::kHarmony;
    t.date_ = absl::FormatTime("%Y-%m-%d", now, absl::UTCTimeZone());
    // Its tools: the functions namespace, calls on the commentary channel
    // and results from the function's own role.
    if (writes("} // namespace ") && writes("<|start|>assistant to=") &&
        writes("<|channel|>commentary ") && writes("<|call|>") &&
        writes(" to=assistant<|channel|>commentary<|message|>")) {
      t.tool_format_ = ToolCallFormat::kHarmony;
    }
    return t;
  }
  if (writes("<|start_header_id|>")) {
    t.format_ = Format::kLlama3;
    t.bos_ = std::move(bos);
    t.dated_system_ = writes("Cutting Knowledge Date:");
    if (t.dated_system_) {
      // Llama 3.2 asks for today (strftime_now, which transformers
      // defines); 3.1 has a fixed date_string.
      t.date_ = "26 Jul 2024";
      if (source.find("strftime_now") != std::string_view::npos) {
        t.date_ = absl::FormatTime("%d %b %Y", now, absl::UTCTimeZone());
      } else if (size_t at = source.find("set date_string =");
                 at != std::string_view::npos) {
        at = source.find_first_of("'\"", at);
        if (at != std::string_view::npos)
          t.date_ = ReadTemplateLiteral(source, &at);
      }
      // The JSON tool branch with its defaults: tools in the first user
      // message (tools_in_user_message = true), no builtin tools.
      if (literal(kLlamaEnvironment) && literal(kLlamaToolsLead1) &&
          literal(kLlamaToolsLead2) && literal(kLlamaToolsFormat) &&
          literal(kLlamaNoVariables) && literal(kLlamaIpython) &&
          literal("{\"name\": \"") && literal("\"parameters\": ") &&
          has("set tools_in_user_message = true")) {
        t.tool_format_ = ToolCallFormat::kLlamaJson;
      }
    }
    return t;
  }
  if (writes("<|im_start|>")) {
    // The default system prompt is a whole literal
    // "<|im_start|>system\n...<|im_end|>\n" (not one built around
    // messages[0]['content']).
    for (const std::string& l : literals) {
      if (l.size() > kChatMlSystem.size() + kChatMlEnd.size() &&
          l.starts_with(kChatMlSystem) && l.ends_with(kChatMlEnd)) {
        t.default_system_ =
            l.substr(kChatMlSystem.size(),
                     l.size() - kChatMlSystem.size() - kChatMlEnd.size());
      }
    }
    const bool hermes_calls =
        literal(kHermesToolsClose) && literal(kHermesCallArgs) &&
        literal(kHermesCallClose) && literal(kHermesResponseOpen) &&
        literal(kHermesResponseClose);
    if (hermes_calls && literal(kHermesToolsOpen) && literal(kHermesCallOpen)) {
      t.tool_format_ = ToolCallFormat::kHermes;
    } else if (hermes_calls && literal(kQwen3ToolsOpen) &&
               literal(kQwen3CallOpen) && literal(kQwen3ThinkOpen) &&
               literal(kQwen3ThinkClose) && literal("</think>") &&
               literal("<think>") && has("last_query_index")) {
      t.tool_format_ = ToolCallFormat::kHermes;
      t.qwen3_ = true;
    }
    return t;
  }
  // GLM-4.5's: its turn markers are template text, not literals.
  if (has("[gMASK]<sop>") && has("<|system|>") && has("<|user|>") &&
      has("<|assistant|>") && literal("\n<think></think>") &&
      literal("\n<think>") && literal("</think>") && literal("/nothink") &&
      has("ns.last_user_index") &&
      has("content.split('</think>')[0].rstrip('\\n').split('<think>')[-1]"
          ".lstrip('\\n')") &&
      has("content.split('</think>')[-1].lstrip('\\n')")) {
    t.format_ = Format::kGlm;
    return t;
  }
  if (std::optional<absl::StatusOr<ChatTemplate>> deepseek =
          DeepSeekFromSource(source, literals, bos)) {
    return *std::move(deepseek);
  }
  // Mistral v0.1/v0.2: user and assistant turns only. Llama 2's <<SYS>>
  // and the later Mistral templates (a system message folded into the last
  // user turn, tools) differ and are refused below.
  if (writes("[INST] ") && writes(" [/INST]") && !has("<<SYS>>") &&
      !has("system_message") && !has("tools")) {
    t.format_ = Format::kMistralInst;
    t.bos_ = std::move(bos);
    t.eos_ = std::move(eos);
    // "message['content'] + eos_token + ' '" (v0.1) or without the space.
    for (size_t at = source.find("eos_token"); at != std::string_view::npos;
         at = source.find("eos_token", at + 1)) {
      size_t next = source.find_first_not_of(" ", at + 9);
      if (next == std::string_view::npos || source[next] != '+') continue;
      next = source.find_first_not_of(" ", next + 1);
      if (next != std::string_view::npos &&
          (source.substr(next, 3) == "' '" ||
           source.substr(next, 3) == "\" \"")) {
        t.space_after_eos_ = true;
      }
    }
    return t;
  }
  // Llama 2 chat: the system message folded into the first user turn in
  // <<SYS>> markers, every turn stripped, BOS before every [INST].
  if (writes("<<SYS>>\n") && writes("\n<</SYS>>\n\n") && writes("[INST] ") &&
      writes(" [/INST]") && has("loop.index0 == 0 and system_message") &&
      has(".strip()")) {
    t.format_ = Format::kLlama2;
    t.bos_ = std::move(bos);
    t.eos_ = std::move(eos);
    return t;
  }
  // Mistral v0.3: "[/INST]" with no space before it, the system message in
  // front of the last user turn. Its tool calls are not rendered (the API
  // takes no tools), which is what the template does without them.
  if (writes("[INST] ") && !has("<<SYS>>") && literal("[/INST]") &&
      has("loop.last and system_message is defined")) {
    t.format_ = Format::kMistralV3;
    t.bos_ = std::move(bos);
    t.eos_ = std::move(eos);
    return t;
  }
  // Gemma 3: <start_of_turn> turns, the system message prefixed to the
  // first (its first_user_prefix); Gemma 2's, which refuses a system role
  // instead.
  if (writes("<start_of_turn>") && writes("<end_of_turn>\n") &&
      writes("<start_of_turn>model\n") &&
      (has("first_user_prefix") || has("System role not supported"))) {
    t.format_ = Format::kGemma;
    t.refuses_system_ = !has("first_user_prefix");
    t.bos_ = std::move(bos);
    return t;
  }
  const char* hint =
      has("[INST]") ? " (of the [INST] formats, Mistral v0.1-v0.3's and Llama "
                      "2's are)"
                    : "";
  return absl::UnimplementedError(absl::StrCat(
      "the model's chat template is not one shardlm renders (ChatML, "
      "Llama 3, Llama 2, Mistral [INST], Gemma, harmony, DeepSeek, GLM-4.5)",
      hint, "; use completions with a prompt in its own format"));
}

absl::StatusOr<std::string> ChatTemplate::Render(
    absl::Span<const ChatMessage> messages, absl::Span<const ChatTool> tools,
    const ChatTemplateVars& vars) const {
  const std::string_view reasoning_effort = vars.reasoning_effort;
  if (tool_format_ == ToolCallFormat::kHermes) {
    return qwen3_ ? RenderQwen3(messages, tools,
                                vars.enable_thinking.value_or(true))
                  : RenderHermes(messages, tools);
  }
  if (tool_format_ == ToolCallFormat::kLlamaJson) {
    return RenderLlamaJson(messages, tools);
  }
  if (tool_format_ == ToolCallFormat::kHarmony) {
    return RenderHarmony(messages, tools, reasoning_effort);
  }
  const std::string why = absl::StrCat(
      " needs a chat template that renders tools; this model's (", Describe(),
      ") does not (shardlm renders Qwen2.5's and Qwen3's Hermes <tool_call> "
      "format, Llama 3.1's JSON calls and gpt-oss's harmony functions)");
  if (!tools.empty())
    return absl::InvalidArgumentError(absl::StrCat("tools", why));
  for (size_t i = 0; i < messages.size(); ++i) {
    if (messages[i].role == "tool") {
      return absl::InvalidArgumentError(
          absl::StrCat("messages[", i, "].role 'tool'", why));
    }
    if (!messages[i].tool_calls.empty()) {
      return absl::InvalidArgumentError(
          absl::StrCat("messages[", i, "].tool_calls", why));
    }
  }
  if (format_ == Format::kHarmony) {
    return RenderHarmony(messages, {}, reasoning_effort);
  }
  if (format_ == Format::kDeepSeek) {
    return RenderDeepSeek(messages, vars.enable_thinking);
  }
  if (format_ == Format::kGlm) return RenderGlm(messages, vars.enable_thinking);
  return Render(messages);
}

// Qwen2.5's template: the tools go into the system block (the leading
// system message's content or the default one); an assistant's calls
// follow its content, each in <tool_call> tags with its arguments as
// tojson writes them; consecutive tool results share one user turn.
absl::StatusOr<std::string> ChatTemplate::RenderHermes(
    absl::Span<const ChatMessage> messages,
    absl::Span<const ChatTool> tools) const {
  RETURN_IF_ERROR(CheckToolRoles(messages));
  const bool system = !messages.empty() && messages[0].role == "system";
  std::string out;
  if (!tools.empty()) {
    absl::StrAppend(&out, Sv(kChatMlSystem),
                    system ? messages[0].content : default_system_,
                    Sv(kHermesToolsOpen));
    RETURN_IF_ERROR(AppendHermesTools(tools, out));
    absl::StrAppend(&out, Sv(kHermesToolsClose));
  } else if (system) {
    absl::StrAppend(&out, Sv(kChatMlSystem), messages[0].content,
                    Sv(kChatMlEnd));
  } else {
    absl::StrAppend(&out, Sv(kChatMlSystem), default_system_, Sv(kChatMlEnd));
  }
  for (size_t i = 0; i < messages.size(); ++i) {
    const ChatMessage& m = messages[i];
    if (m.role == "user" || (m.role == "system" && i > 0) ||
        (m.role == "assistant" && m.tool_calls.empty())) {
      absl::StrAppend(&out, "<|im_start|>", m.role, "\n", m.content,
                      Sv(kChatMlEnd));
    } else if (m.role == "assistant") {
      absl::StrAppend(&out, "<|im_start|>assistant");
      if (!m.content.empty()) absl::StrAppend(&out, "\n", m.content);
      for (size_t c = 0; c < m.tool_calls.size(); ++c) {
        ASSIGN_OR_RETURN(const OrderedJson args,
                         CallArguments(m.tool_calls[c], i, c));
        absl::StrAppend(&out, Sv(kHermesCallOpen), m.tool_calls[c].name,
                        Sv(kHermesCallArgs));
        AppendPythonJson(args, out);
        absl::StrAppend(&out, Sv(kHermesCallClose));
      }
      absl::StrAppend(&out, Sv(kChatMlEnd));
    } else if (m.role == "tool") {
      if (i == 0 || messages[i - 1].role != "tool") {
        absl::StrAppend(&out, "<|im_start|>user");
      }
      absl::StrAppend(&out, Sv(kHermesResponseOpen), m.content,
                      Sv(kHermesResponseClose));
      if (i + 1 == messages.size() || messages[i + 1].role != "tool") {
        absl::StrAppend(&out, Sv(kChatMlEnd));
      }
    }
  }
  absl::StrAppend(&out, "<|im_start|>assistant\n");
  return out;
}

// Qwen3's template: as Qwen2.5's, but no default system prompt, and the
// assistant's turns after the last user query (a user message that is not
// a <tool_response> block) keep their <think> block (the last turn always
// gets one), earlier ones lose it.
absl::StatusOr<std::string> ChatTemplate::RenderQwen3(
    absl::Span<const ChatMessage> messages, absl::Span<const ChatTool> tools,
    bool think) const {
  RETURN_IF_ERROR(CheckToolRoles(messages));
  const bool system = !messages.empty() && messages[0].role == "system";
  std::string out;
  if (!tools.empty()) {
    out = kChatMlSystem;
    if (system) absl::StrAppend(&out, messages[0].content, "\n\n");
    out += kQwen3ToolsOpen;
    RETURN_IF_ERROR(AppendHermesTools(tools, out));
    out += kHermesToolsClose;
  } else if (system) {
    absl::StrAppend(&out, Sv(kChatMlSystem), messages[0].content,
                    Sv(kChatMlEnd));
  }
  size_t last_query = messages.empty() ? 0 : messages.size() - 1;
  for (size_t i = messages.size(); i-- > 0;) {
    const std::string& c = messages[i].content;
    if (messages[i].role == "user" && !(c.starts_with("<tool_response>") &&
                                        c.ends_with("</tool_response>"))) {
      last_query = i;
      break;
    }
  }
  for (size_t i = 0; i < messages.size(); ++i) {
    const ChatMessage& m = messages[i];
    const bool last = i + 1 == messages.size();
    if (m.role == "user" || (m.role == "system" && i > 0)) {
      absl::StrAppend(&out, "<|im_start|>", m.role, "\n", m.content,
                      Sv(kChatMlEnd));
    } else if (m.role == "assistant") {
      const auto [reasoning, content] = SplitThink(m.content);
      if (i > last_query && (last || !reasoning.empty())) {
        absl::StrAppend(&out, "<|im_start|>assistant", Sv(kQwen3ThinkOpen),
                        Sv(LStrip(RStrip(reasoning, '\n'), '\n')),
                        Sv(kQwen3ThinkClose), Sv(LStrip(content, '\n')));
      } else {
        absl::StrAppend(&out, "<|im_start|>assistant\n", Sv(content));
      }
      for (size_t c = 0; c < m.tool_calls.size(); ++c) {
        ASSIGN_OR_RETURN(OrderedJson args,
                         CallArguments(m.tool_calls[c], i, c));
        if (c > 0 || !content.empty()) out += "\n";
        absl::StrAppend(&out, Sv(kQwen3CallOpen), m.tool_calls[c].name,
                        Sv(kHermesCallArgs));
        AppendPythonJson(args, out);
        out += kHermesCallClose;
      }
      out += kChatMlEnd;
    } else if (m.role == "tool") {
      if (i == 0 || messages[i - 1].role != "tool") out += "<|im_start|>user";
      absl::StrAppend(&out, Sv(kHermesResponseOpen), m.content,
                      Sv(kHermesResponseClose));
      if (last || messages[i + 1].role != "tool") out += kChatMlEnd;
    }
  }
  out += "<|im_start|>assistant\n";
  if (!think) out += "<think>\n\n</think>\n\n";
  return out;
}

// Llama 3.1's and 3.2's template with its defaults: the dated system
// block (with "Environment: ipython" when there are tools), the functions
// as indented JSON in front of the first message after the system one, an
// assistant's one call as {"name": ..., "parameters": ...} in place of its
// content, tool results in ipython turns as JSON strings (the template's
// tojson of a string).
absl::StatusOr<std::string> ChatTemplate::RenderLlamaJson(
    absl::Span<const ChatMessage> messages,
    absl::Span<const ChatTool> tools) const {
  RETURN_IF_ERROR(CheckToolRoles(messages));
  const bool system = !messages.empty() && messages[0].role == "system";
  std::string out = bos_;
  absl::StrAppend(&out, "<|start_header_id|>system<|end_header_id|>\n\n",
                  tools.empty() ? "" : Sv(kLlamaEnvironment),
                  "Cutting Knowledge Date: December 2023\n",
                  "Today Date: ", date_, "\n\n",
                  Sv(system ? Trim(messages[0].content) : ""), "<|eot_id|>");
  size_t i = system ? 1 : 0;
  if (!tools.empty()) {
    if (i == messages.size()) {
      return absl::InvalidArgumentError(
          "tools need a user message to go in front of (this model's chat "
          "template puts them in the first one)");
    }
    absl::StrAppend(&out, "<|start_header_id|>user<|end_header_id|>\n\n",
                    Sv(kLlamaToolsLead1), Sv(kLlamaToolsLead2),
                    Sv(kLlamaToolsFormat), Sv(kLlamaNoVariables));
    for (size_t t = 0; t < tools.size(); ++t) {
      ASSIGN_OR_RETURN(const OrderedJson tool, ToolJson(tools[t], t));
      AppendPythonJsonIndented(tool, 0, out);
      out += "\n\n";
    }
    absl::StrAppend(&out, Sv(Trim(messages[i].content)), "<|eot_id|>");
    ++i;
  }
  for (; i < messages.size(); ++i) {
    const ChatMessage& m = messages[i];
    if (m.role == "tool") {
      out += kLlamaIpython;
      AppendPythonJson(OrderedJson(m.content), out);
      out += "<|eot_id|>";
    } else if (!m.tool_calls.empty()) {
      if (m.tool_calls.size() != 1) {
        return absl::InvalidArgumentError(
            absl::StrCat("messages[", i,
                         "].tool_calls: this model's chat template takes "
                         "one call per assistant message"));
      }
      ASSIGN_OR_RETURN(const OrderedJson args,
                       CallArguments(m.tool_calls[0], i, 0));
      absl::StrAppend(&out,
                      "<|start_header_id|>assistant<|end_header_id|>\n\n"
                      "{\"name\": \"",
                      m.tool_calls[0].name, "\", \"parameters\": ");
      AppendPythonJson(args, out);
      out += "}<|eot_id|>";
    } else {
      absl::StrAppend(&out, "<|start_header_id|>", m.role,
                      "<|end_header_id|>\n\n", Sv(Trim(m.content)),
                      "<|eot_id|>");
    }
  }
  absl::StrAppend(&out, "<|start_header_id|>assistant<|end_header_id|>\n\n");
  return out;
}

absl::StatusOr<std::string> ChatTemplate::Render(
    absl::Span<const ChatMessage> messages) const {
  if (tool_format_ == ToolCallFormat::kHermes) {
    return qwen3_ ? RenderQwen3(messages, {}) : RenderHermes(messages, {});
  }
  if (tool_format_ == ToolCallFormat::kLlamaJson) {
    return RenderLlamaJson(messages, {});
  }
  if (format_ == Format::kHarmony) return RenderHarmony(messages, {}, {});
  if (format_ == Format::kDeepSeek) return RenderDeepSeek(messages, {});
  if (format_ == Format::kGlm) return RenderGlm(messages, {});
  for (size_t i = 0; i < messages.size(); ++i) {
    const std::string& role = messages[i].role;
    if (role != "system" && role != "user" && role != "assistant") {
      return absl::InvalidArgumentError(
          absl::StrCat("messages[", i, "].role '", role,
                       "' is not system, user or assistant"));
    }
  }
  std::string out;
  if (format_ == Format::kChatMl) {
    if (!default_system_.empty() &&
        (messages.empty() || messages[0].role != "system")) {
      absl::StrAppend(&out, Sv(kChatMlSystem), default_system_, Sv(kChatMlEnd));
    }
    for (const ChatMessage& m : messages) {
      absl::StrAppend(&out, "<|im_start|>", m.role, "\n", m.content,
                      Sv(kChatMlEnd));
    }
    absl::StrAppend(&out, "<|im_start|>assistant\n");
    return out;
  }
  if (format_ == Format::kGemma) {
    // Gemma 3's template: a leading system message becomes the first
    // turn's prefix; then user and assistant ("model") turns alternate.
    // Gemma 2's refuses the system message.
    if (refuses_system_ && !messages.empty() && messages[0].role == "system") {
      return absl::InvalidArgumentError(
          "this model's chat format (Gemma 2's) has no system role; put the "
          "instructions in the first user message");
    }
    out = bos_;
    std::string prefix;
    size_t first = 0;
    if (!messages.empty() && messages[0].role == "system") {
      prefix = absl::StrCat(messages[0].content, "\n\n");
      first = 1;
    }
    for (size_t i = first; i < messages.size(); ++i) {
      const ChatMessage& m = messages[i];
      if ((m.role == "user") != ((i - first) % 2 == 0)) {
        return absl::InvalidArgumentError(
            "this model's chat format needs roles alternating user, "
            "assistant, user, ... from a user's (after one leading system "
            "message)");
      }
      absl::StrAppend(&out, "<start_of_turn>",
                      m.role == "assistant" ? "model" : m.role, "\n",
                      i == first ? prefix : "", Sv(Trim(m.content)),
                      "<end_of_turn>\n");
    }
    absl::StrAppend(&out, "<start_of_turn>model\n");
    return out;
  }
  if (format_ == Format::kMistralInst) {
    out = bos_;
    for (size_t i = 0; i < messages.size(); ++i) {
      const ChatMessage& m = messages[i];
      if (m.role == "system") {
        return absl::InvalidArgumentError(
            "this model's chat format has no system role (user and "
            "assistant only)");
      }
      if ((m.role == "user") != (i % 2 == 0)) {
        return absl::InvalidArgumentError(
            "this model's chat format needs roles alternating user, "
            "assistant, user, ... from a user's");
      }
      if (m.role == "user") {
        absl::StrAppend(&out, "[INST] ", m.content, " [/INST]");
      } else {
        absl::StrAppend(&out, m.content, eos_, space_after_eos_ ? " " : "");
      }
    }
    return out;
  }
  if (format_ == Format::kLlama2 || format_ == Format::kMistralV3) {
    return RenderInst(messages);
  }
  const auto turn = [&](std::string_view role, std::string_view content) {
    absl::StrAppend(&out, "<|start_header_id|>", Sv(role),
                    "<|end_header_id|>\n\n", Sv(Trim(content)), "<|eot_id|>");
  };
  if (dated_system_) {
    out = bos_;
    const bool system = !messages.empty() && messages[0].role == "system";
    absl::StrAppend(&out, "<|start_header_id|>system<|end_header_id|>\n\n",
                    "Cutting Knowledge Date: December 2023\n",
                    "Today Date: ", date_, "\n\n",
                    Sv(system ? Trim(messages[0].content) : ""), "<|eot_id|>");
    for (size_t i = system ? 1 : 0; i < messages.size(); ++i) {
      turn(messages[i].role, messages[i].content);
    }
  } else {
    if (!messages.empty()) out = bos_;  // In front of the first message.
    for (const ChatMessage& m : messages) turn(m.role, m.content);
  }
  absl::StrAppend(&out, "<|start_header_id|>assistant<|end_header_id|>\n\n");
  return out;
}

// GLM-4.5's template, plain conversations: an assistant's reasoning (its
// text before </think>, as the template cuts it) kept after the last user
// turn only, every answer stripped.
absl::StatusOr<std::string> ChatTemplate::RenderGlm(
    absl::Span<const ChatMessage> messages,
    std::optional<bool> enable_thinking) const {
  const bool no_think = enable_thinking.has_value() && !*enable_thinking;
  // The template's ns.last_user_index: -1 without a user turn.
  ptrdiff_t last_user = -1;
  for (size_t i = 0; i < messages.size(); ++i) {
    const std::string& role = messages[i].role;
    if (role != "system" && role != "user" && role != "assistant") {
      return absl::InvalidArgumentError(
          absl::StrCat("messages[", i, "].role '", role,
                       "' is not system, user or assistant"));
    }
    if (role == "user") last_user = static_cast<ptrdiff_t>(i);
  }
  std::string out = "[gMASK]<sop>";
  for (size_t i = 0; i < messages.size(); ++i) {
    const ChatMessage& m = messages[i];
    if (m.role == "system") {
      absl::StrAppend(&out, "<|system|>\n", m.content);
    } else if (m.role == "user") {
      absl::StrAppend(
          &out, "<|user|>", m.content,
          no_think && !m.content.ends_with("/nothink") ? "/nothink" : "");
    } else {
      const auto [reasoning, content] = SplitThink(m.content);
      if (static_cast<ptrdiff_t>(i) > last_user && !reasoning.empty()) {
        absl::StrAppend(&out, "<|assistant|>\n<think>", Sv(Trim(reasoning)),
                        "</think>");
      } else {
        absl::StrAppend(&out, "<|assistant|>\n<think></think>");
      }
      if (!Trim(content).empty())
        absl::StrAppend(&out, "\n", Sv(Trim(content)));
    }
  }
  absl::StrAppend(&out, "<|assistant|>", no_think ? "\n<think></think>" : "");
  return out;
}

// Llama 2 and Mistral v0.3: an optional leading system message, then
// turns alternating from a user's (both templates raise otherwise).
absl::StatusOr<std::string> ChatTemplate::RenderInst(
    absl::Span<const ChatMessage> messages) const {
  if (messages.empty()) {
    return absl::InvalidArgumentError("messages is empty");
  }
  const bool system = messages[0].role == "system";
  const absl::Span<const ChatMessage> turns = messages.subspan(system ? 1 : 0);
  for (size_t i = 0; i < turns.size(); ++i) {
    if ((turns[i].role == "user") != (i % 2 == 0)) {
      return absl::InvalidArgumentError(
          "this model's chat format needs roles alternating user, "
          "assistant, user, ... from a user's, after an optional system "
          "message");
    }
  }
  std::string out;
  if (format_ == Format::kLlama2) {
    for (size_t i = 0; i < turns.size(); ++i) {
      std::string content = turns[i].content;
      if (i == 0 && system) {
        content = absl::StrCat("<<SYS>>\n", messages[0].content,
                               "\n<</SYS>>\n\n", content);
      }
      if (turns[i].role == "user") {
        absl::StrAppend(&out, bos_, "[INST] ", Sv(Trim(content)), " [/INST]");
      } else if (turns[i].role == "assistant") {
        absl::StrAppend(&out, " ", Sv(Trim(content)), " ", eos_);
      }  // A later system message: the template writes nothing.
    }
    return out;
  }
  out = bos_;
  for (size_t i = 0; i < turns.size(); ++i) {
    const ChatMessage& m = turns[i];
    if (m.role == "user") {
      if (system && i + 1 == turns.size()) {
        absl::StrAppend(&out, "[INST] ", messages[0].content, "\n\n", m.content,
                        "[/INST]");
      } else {
        absl::StrAppend(&out, "[INST] ", m.content, "[/INST]");
      }
    } else if (m.role == "assistant") {
      absl::StrAppend(&out, " ", Sv(Trim(m.content)), eos_);
    } else {
      return absl::InvalidArgumentError(
          "this model's chat format takes a system message only first");
    }
  }
  return out;
}

std::string ChatTemplate::Describe() const {
  if (format_ == Format::kHarmony) {
    return absl::StrCat(
        "harmony (gpt-oss; dated ", date_, ", reasoning medium by default",
        tool_format_ == ToolCallFormat::kHarmony ? ", functions as tools)"
                                                 : ")");
  }
  if (format_ == Format::kDeepSeek) {
    if (deepseek_v31_) return "deepseek v3.1 (<think> with enable_thinking)";
    return absl::StrCat(
        "deepseek", prompt_suffix_.empty() ? "" : " (the prompt opens <think>)",
        system_join_ ? "" : " (last system message only)");
  }
  if (format_ == Format::kGlm) return "glm-4.5 (<think>, /nothink)";
  if (format_ == Format::kMistralInst) return "mistral [INST]";
  if (format_ == Format::kLlama2) return "llama2 [INST] <<SYS>>";
  if (format_ == Format::kMistralV3) return "mistral v0.3 [INST]";
  if (format_ == Format::kGemma) {
    return refuses_system_ ? "gemma <start_of_turn> (no system role)"
                           : "gemma <start_of_turn>";
  }
  if (format_ == Format::kLlama3) {
    return dated_system_
               ? absl::StrCat("llama3 (3.1+ system block dated ", date_, ")",
                              tool_format_ == ToolCallFormat::kLlamaJson
                                  ? " with JSON tool calls"
                                  : "")
               : "llama3";
  }
  if (!from_template_) return "chatml (no template in the model)";
  if (qwen3_) return "chatml with Hermes <tool_call> tools (qwen3, <think>)";
  if (tool_format_ == ToolCallFormat::kHermes) {
    return absl::StrCat(
        "chatml with Hermes <tool_call> tools (default system "
        "prompt \"",
        default_system_, "\")");
  }
  return default_system_.empty()
             ? "chatml"
             : absl::StrCat("chatml (default system prompt \"", default_system_,
                            "\")");
}

std::string ReadTemplateLiteral(std::string_view source, size_t* pos) {
  const char quote = source[(*pos)++];
  std::string out;
  while (*pos < source.size() && source[*pos] != quote) {
    char c = source[(*pos)++];
    if (c == '\\' && *pos < source.size()) {
      const char e = source[(*pos)++];
      c = e == 'n' ? '\n' : e == 't' ? '\t' : e == 'r' ? '\r' : e;
    }
    out.push_back(c);
  }
  if (*pos < source.size()) ++*pos;
  return out;
}

bool HasLiteral(const std::vector<std::string>& literals,
                std::string_view what) {
  return std::find(literals.begin(), literals.end(), what) != literals.end();
}

bool LiteralWrites(const std::vector<std::string>& literals,
                   std::string_view what) {
  return std::any_of(literals.begin(), literals.end(),
                     [what](const std::string& l) {
                       return l.find(what) != std::string::npos;
                     });
}

}  // namespace shardlm
