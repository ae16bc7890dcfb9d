// DeepSeek's chat formats (ChatTemplate::Format::kDeepSeek): V3's and
// R1's templates (one layout; R1's generation prompt opens a <think>
// block), R1's first distilled models' (the last system message alone) and
// V3.1's (a <think> or </think> after each user turn's <｜Assistant｜>),
// rendered as their templates render plain conversations:
// tests/reference/check_chat_template.py compares them with jinja2.
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "absl/strings/str_cat.h"
#include "core/status.h"
#include "model/chat_template.h"
#include "model/template_source.h"

namespace shardlm {
namespace {

constexpr std::string_view kUser = "<｜User｜>";
constexpr std::string_view kAssistant = "<｜Assistant｜>";
constexpr std::string_view kEnd = "<｜end▁of▁sentence｜>";

bool Contains(std::string_view s, std::string_view what) {
  return s.find(what) != std::string_view::npos;
}

// The separator in `ns.system_prompt = ns.system_prompt + SEP +
// message['content']`, decoded; nullopt without that expression (the
// first system message's `ns.system_prompt + message['content']` is not
// it).
std::optional<std::string> SystemJoin(std::string_view source) {
  constexpr std::string_view kAppend = "ns.system_prompt = ns.system_prompt +";
  for (size_t at = source.find(kAppend); at != std::string_view::npos;
       at = source.find(kAppend, at + 1)) {
    size_t i = source.find_first_not_of(' ', at + kAppend.size());
    if (i == std::string_view::npos ||
        (source[i] != '\'' && source[i] != '"')) {
      continue;
    }
    std::string sep = ReadTemplateLiteral(source, &i);
    i = source.find_first_not_of(' ', i);
    if (i != std::string_view::npos &&
        source.substr(i).starts_with("+ message['content']")) {
      return sep;
    }
  }
  return std::nullopt;
}

}  // namespace

std::optional<absl::StatusOr<ChatTemplate>> ChatTemplate::DeepSeekFromSource(
    std::string_view source, const std::vector<std::string>& literals,
    const std::string& bos) {
  const auto literal = [&](std::string_view what) {
    return HasLiteral(literals, what);
  };
  const auto writes = [&](std::string_view what) {
    return LiteralWrites(literals, what);
  };
  if (!writes(kUser) || !writes(kAssistant) || !writes(kEnd)) {
    return std::nullopt;
  }
  const auto refuse = [](std::string_view why) {
    return absl::UnimplementedError(absl::StrCat(
        "the model's chat template is not one shardlm renders: a DeepSeek "
        "template whose ",
        Sv(why),
        " (DeepSeek V3's, R1's and V3.1's are rendered); use completions "
        "with a prompt in its own format"));
  };
  ChatTemplate t;
  t.from_template_ = true;
  t.format_ = Format::kDeepSeek;
  t.bos_ = bos;
  t.system_join_ = SystemJoin(source);
  if (!t.system_join_ &&
      !Contains(source, "set ns.system_prompt = message['content']")) {
    return refuse("system messages are put together in another way");
  }
  if (!literal(kUser) ||
      Contains(source, "message['content'] + '<｜Assistant｜>'")) {
    return refuse("user turns are written another way");
  }
  if (Contains(source, "is_last_user") &&
      Contains(source, "set thinking = enable_thinking") &&
      literal("<think>") && literal("</think>") && literal(kAssistant) &&
      Contains(source, "content.split('</think>', 1)[1]")) {
    t.deepseek_v31_ = true;
    return t;
  }
  if (!Contains(source,
                "'<｜Assistant｜>' + content + '<｜end▁of▁sentence｜>'")) {
    return refuse("answers are written another way");
  }
  t.split_think_ = Contains(source, "content.split('</think>')[-1]");
  if (literal("<｜Assistant｜><think>\n")) {
    t.prompt_suffix_ = "<think>\n";
  } else if (!literal(kAssistant) || writes("<think>")) {
    return refuse("generation prompt is another");
  }
  return t;
}

// Plain conversations only: Render(messages, tools) refused tools, tool
// calls and tool results before this (tool_format() is kNone).
absl::StatusOr<std::string> ChatTemplate::RenderDeepSeek(
    absl::Span<const ChatMessage> messages,
    std::optional<bool> enable_thinking) const {
  std::string system;
  bool first_system = true;
  for (size_t i = 0; i < messages.size(); ++i) {
    const ChatMessage& m = messages[i];
    if (m.role != "system" && m.role != "user" && m.role != "assistant") {
      return absl::InvalidArgumentError(
          absl::StrCat("messages[", i, "].role '", m.role,
                       "' is not system, user or assistant"));
    }
    if (m.role != "system") continue;
    if (!system_join_) {
      system = m.content;  // The last one.
    } else {
      absl::StrAppend(&system, first_system ? "" : *system_join_, m.content);
    }
    first_system = false;
  }
  std::string out = absl::StrCat(bos_, system);
  bool last_user = false;  // V3.1: the last turn written was a user's.
  for (const ChatMessage& m : messages) {
    std::string_view content = m.content;
    if (m.role == "user") {
      absl::StrAppend(&out, Sv(kUser), Sv(content));
      last_user = true;
    } else if (m.role == "assistant" && deepseek_v31_) {
      if (last_user) absl::StrAppend(&out, Sv(kAssistant), "</think>");
      last_user = false;
      // Python's content.split('</think>', 1)[1].
      if (const size_t at = content.find("</think>");
          at != std::string_view::npos) {
        content.remove_prefix(at + 8);
      }
      absl::StrAppend(&out, Sv(content), Sv(kEnd));
    } else if (m.role == "assistant") {
      // Python's content.split('</think>')[-1].
      if (const size_t at = content.rfind("</think>");
          split_think_ && at != std::string_view::npos) {
        content.remove_prefix(at + 8);
      }
      absl::StrAppend(&out, Sv(kAssistant), Sv(content), Sv(kEnd));
    }
  }
  if (!deepseek_v31_) {
    absl::StrAppend(&out, Sv(kAssistant), prompt_suffix_);
  } else if (last_user) {
    absl::StrAppend(&out, Sv(kAssistant),
                    enable_thinking.value_or(false) ? "<think>" : "</think>");
  }
  return out;
}

}  // namespace shardlm
