#include "model/tool_calls.h"

#include <algorithm>
#include <utility>

#include "model/chat_json.h"
#include "nlohmann/json.hpp"

namespace shardlm {
namespace {

constexpr std::string_view kOpen = "<tool_call>";
constexpr std::string_view kClose = "</tool_call>";
constexpr std::string_view kPythonTag = "<|python_tag|>";

bool IsJsonSpace(char c) {
  return c == ' ' || c == '\n' || c == '\t' || c == '\r';
}

// The length of the longest suffix of `text` that is a proper prefix of
// `tag` (text that may be the tag's beginning).
size_t PartialTagSuffix(std::string_view text, std::string_view tag) {
  for (size_t n = std::min(text.size(), tag.size() - 1); n > 0; --n) {
    if (tag.starts_with(text.substr(text.size() - n))) return n;
  }
  return 0;
}

// The end of the JSON object that starts at text[0] ("{"): the index past
// its closing brace, or npos when it is not closed in `text`.
size_t ObjectEnd(std::string_view text) {
  int depth = 0;
  bool in_string = false;
  for (size_t i = 0; i < text.size(); ++i) {
    const char c = text[i];
    if (in_string) {
      if (c == '\\') {
        ++i;
      } else if (c == '"') {
        in_string = false;
      }
    } else if (c == '"') {
      in_string = true;
    } else if (c == '{' || c == '[') {
      ++depth;
    } else if (c == '}' || c == ']') {
      if (--depth == 0) return i + 1;
    }
  }
  return std::string_view::npos;
}

// The reasoning block in front of a Qwen3 answer.
constexpr std::string_view kThinkOpen = "<think>";
constexpr std::string_view kThinkClose = "</think>";

// Harmony's markup (gpt-oss).
constexpr std::string_view kHarmonyStart = "<|start|>";
constexpr std::string_view kHarmonyChannel = "<|channel|>";
constexpr std::string_view kHarmonyMessage = "<|message|>";
constexpr std::string_view kHarmonyEnds[] = {"<|end|>", "<|call|>",
                                             "<|return|>"};

// The recipient in front of the channel, when the output goes on from the
// prompt's <|start|>assistant: " to=functions.NAME<|channel|>...".
constexpr std::string_view kHarmonyTo = " to=";
constexpr std::string_view kHarmonyFunctions = "functions.";

// Whether `text` is, or may become, a harmony header's beginning (`first`:
// the output's first, which may open with the recipient).
bool MayOpenHarmonyHeader(std::string_view text, bool first) {
  for (std::string_view tag : {kHarmonyStart, kHarmonyChannel, kHarmonyTo}) {
    if (tag == kHarmonyTo && !first) continue;
    if (text.starts_with(tag) || tag.starts_with(text)) return true;
  }
  return false;
}

}  // namespace

ToolCallEvents ToolCallStream::Push(std::string_view text) {
  ToolCallEvents events;
  if (passthrough_) {
    events.content = std::string(text);
    return events;
  }
  held_ += text;
  if (think_ != Think::kDone) {
    DrainThink(events, /*finish=*/false);
    if (think_ != Think::kDone) return events;
  }
  if (format_ == ToolCallFormat::kLlamaJson) {
    DrainLlama(events);
  } else if (format_ == ToolCallFormat::kHarmony) {
    DrainHarmony(events, /*finish=*/false);
  } else {
    Drain(events);
  }
  return events;
}

void ToolCallStream::DrainThink(ToolCallEvents& events, bool finish) {
  if (think_ == Think::kStart) {
    // Newlines may come first (GLM-4.5 writes one before <think>).
    const size_t lead = std::min(held_.size(), held_.find_first_not_of('\n'));
    const std::string_view rest = std::string_view(held_).substr(lead);
    if (!finish && rest.size() < kThinkOpen.size() &&
        kThinkOpen.starts_with(rest)) {
      return;  // It may still open.
    }
    if (!rest.starts_with(kThinkOpen)) {
      think_ = Think::kDone;  // No reasoning: all is the answer.
      return;
    }
    held_.erase(0, lead + kThinkOpen.size());
    think_ = Think::kLead;
  }
  if (think_ == Think::kLead) {  // The reasoning's leading newlines.
    held_.erase(0, std::min(held_.size(), held_.find_first_not_of('\n')));
    if (held_.empty() && !finish) return;
    think_ = Think::kIn;
  }
  if (think_ == Think::kIn) {
    const size_t close = held_.find(kThinkClose);
    if (close == std::string::npos) {
      // Held back: a suffix that may begin </think>, and the newlines in
      // front of it (dropped if it does). Unclosed at the end: all of it.
      size_t end = held_.size();
      if (!finish) {
        end -= PartialTagSuffix(held_, kThinkClose);
        while (end > 0 && held_[end - 1] == '\n') --end;
      }
      events.reasoning += held_.substr(0, end);
      held_.erase(0, end);
      return;
    }
    size_t end = close;
    while (end > 0 && held_[end - 1] == '\n') --end;
    events.reasoning += held_.substr(0, end);
    held_.erase(0, close + kThinkClose.size());
    think_ = Think::kTrail;
  }
  // The answer's leading newlines.
  held_.erase(0, std::min(held_.size(), held_.find_first_not_of('\n')));
  if (held_.empty() && !finish) return;
  think_ = Think::kDone;
}

bool ToolCallStream::Named(const std::string& name) const {
  return std::find(names_.begin(), names_.end(), name) != names_.end();
}

void ToolCallStream::DrainLlama(ToolCallEvents& events) {
  if (in_calls_) return;  // Held to the end.
  size_t at = 0;
  while (at < held_.size() && IsJsonSpace(held_[at])) ++at;
  const std::string_view rest = std::string_view(held_).substr(at);
  if (rest.empty()) return;
  if (rest.starts_with("{") || rest.starts_with(kPythonTag)) {
    in_calls_ = true;
    return;
  }
  if (kPythonTag.starts_with(rest)) return;  // Maybe the tag: wait.
  passthrough_ = true;
  events.content = std::move(held_);
  held_.clear();
}

bool ToolCallStream::ParseLlamaCalls(std::vector<ChatToolCall>& calls) const {
  using OrderedJson = nlohmann::ordered_json;
  std::string_view rest = held_;
  const auto skip_space = [&] {
    while (!rest.empty() && IsJsonSpace(rest.front())) rest.remove_prefix(1);
  };
  skip_space();
  if (rest.starts_with(kPythonTag)) rest.remove_prefix(kPythonTag.size());
  while (true) {
    skip_space();
    if (!rest.starts_with("{")) return false;
    const size_t end = ObjectEnd(rest);
    if (end == std::string_view::npos) return false;
    const OrderedJson j = OrderedJson::parse(rest.substr(0, end), nullptr,
                                             /*allow_exceptions=*/false);
    rest.remove_prefix(end);
    const char* key =
        j.is_object() && j.contains("parameters") ? "parameters" : "arguments";
    if (!j.is_object() || j.size() != 2 || !j.contains("name") ||
        !j["name"].is_string() || !j.contains(key) || !j[key].is_object() ||
        !Named(j["name"].get<std::string>())) {
      return false;
    }
    absl::StatusOr<std::string> args = PythonJsonDumps(j[key].dump());
    if (!args.ok()) return false;
    calls.push_back(
        {.name = j["name"].get<std::string>(), .arguments = *std::move(args)});
    skip_space();
    if (rest.empty()) return true;
    if (!rest.starts_with(";")) return false;
    rest.remove_prefix(1);
  }
}

void ToolCallStream::Drain(ToolCallEvents& events) {
  using OrderedJson = nlohmann::ordered_json;
  if (!in_calls_) {
    const size_t open = held_.find(kOpen);
    if (open == std::string::npos) {
      const size_t keep = PartialTagSuffix(held_, kOpen);
      events.content += held_.substr(0, held_.size() - keep);
      held_.erase(0, held_.size() - keep);
      return;
    }
    events.content += held_.substr(0, open);
    held_.erase(0, open);
    in_calls_ = true;
  }
  while (!passthrough_) {
    // Between calls: whitespace, then the next <tool_call>.
    size_t at = 0;
    while (at < held_.size() && IsJsonSpace(held_[at])) ++at;
    const std::string_view rest = std::string_view(held_).substr(at);
    if (rest.size() < kOpen.size() && kOpen.starts_with(rest)) return;
    if (!rest.starts_with(kOpen)) break;  // Other text: malformed.
    const size_t close = held_.find(kClose, at);
    if (close == std::string::npos) return;  // The call is not over yet.
    const std::string_view body = std::string_view(held_).substr(
        at + kOpen.size(), close - at - kOpen.size());
    const OrderedJson j =
        OrderedJson::parse(body, nullptr, /*allow_exceptions=*/false);
    const bool ok = j.is_object() && j.size() == 2 && j.contains("name") &&
                    j["name"].is_string() && j.contains("arguments") &&
                    j["arguments"].is_object() &&
                    std::find(names_.begin(), names_.end(),
                              j["name"].get<std::string>()) != names_.end();
    if (!ok) break;
    absl::StatusOr<std::string> args = PythonJsonDumps(j["arguments"].dump());
    if (!args.ok()) break;
    events.calls.push_back(
        {.name = j["name"].get<std::string>(), .arguments = *std::move(args)});
    ++calls_;
    held_.erase(0, close + kClose.size());
  }
  if (passthrough_ || !in_calls_) return;
  // Malformed: all that is held, and all that follows, is content.
  passthrough_ = true;
  events.content += held_;
  held_.clear();
}

void ToolCallStream::DrainHarmony(ToolCallEvents& events, bool finish) {
  while (!held_.empty()) {
    if (!in_message_) {
      const bool first = !opened_;
      const size_t open = held_.find(kHarmonyMessage);
      const std::string_view header = std::string_view(held_).substr(
          0, open == std::string::npos ? held_.size() : open);
      if (!MayOpenHarmonyHeader(header, first) ||
          (open != std::string::npos && !header.starts_with(kHarmonyStart) &&
           !header.starts_with(kHarmonyChannel) &&
           !(first && header.starts_with(kHarmonyTo)))) {
        passthrough_ = true;  // Not harmony: content as it came.
        events.content += held_;
        held_.clear();
        return;
      }
      if (open == std::string::npos) {
        if (finish) {  // A header the output ended in: content.
          events.content += held_;
          held_.clear();
        }
        return;
      }
      // The channel's name and the recipient each run to a space or the
      // next tag.
      const auto field = [&](std::string_view key) {
        const size_t at = header.find(key);
        if (at == std::string_view::npos) return std::string_view();
        const std::string_view rest = header.substr(at + key.size());
        return rest.substr(0, rest.find_first_of(" <"));
      };
      reasoning_ = field(kHarmonyChannel) == "analysis";
      const std::string_view recipient = field(kHarmonyTo);
      call_.clear();
      if (recipient.starts_with(kHarmonyFunctions)) {
        const std::string name(recipient.substr(kHarmonyFunctions.size()));
        if (Named(name)) call_ = name;
      }
      in_message_ = true;
      opened_ = true;
      held_.erase(0, open + kHarmonyMessage.size());
      continue;
    }
    size_t end = std::string::npos, tag = 0;
    for (std::string_view t : kHarmonyEnds) {
      if (const size_t at = held_.find(t); at < end) {
        end = at;
        tag = t.size();
      }
    }
    if (!call_.empty()) {
      // A call's text, its arguments, is held whole until its end.
      if (end == std::string::npos && !finish) return;
      const size_t size = std::min(end, held_.size());
      EndHarmonyCall(held_.substr(0, size), events);
      held_.erase(0, end == std::string::npos ? size : end + tag);
      in_message_ = false;
      continue;
    }
    std::string& out = reasoning_ ? events.reasoning : events.content;
    if (end == std::string::npos) {
      size_t keep = 0;
      if (!finish) {
        for (std::string_view t : kHarmonyEnds) {
          keep = std::max(keep, PartialTagSuffix(held_, t));
        }
      }
      out += held_.substr(0, held_.size() - keep);
      held_.erase(0, held_.size() - keep);
      return;
    }
    out += held_.substr(0, end);
    held_.erase(0, end + tag);
    in_message_ = false;
  }
}

void ToolCallStream::EndHarmonyCall(std::string_view text,
                                    ToolCallEvents& events) {
  const OrderedJson args =
      OrderedJson::parse(text, nullptr, /*allow_exceptions=*/false);
  if (args.is_object()) {
    std::string python;
    AppendPythonJson(args, python);
    events.calls.push_back({.name = call_, .arguments = std::move(python)});
    ++calls_;
  } else {
    events.content += text;  // Not an object: the text, as it came.
  }
  call_.clear();
}

ToolCallEvents ToolCallStream::Finish() {
  ToolCallEvents events;
  if (think_ != Think::kDone && !passthrough_) {
    DrainThink(events, /*finish=*/true);
  }
  if (format_ == ToolCallFormat::kHarmony) {
    if (!passthrough_) DrainHarmony(events, /*finish=*/true);
    events.content += held_;
    held_.clear();
    return events;
  }
  if (format_ == ToolCallFormat::kLlamaJson) {
    if (in_calls_ && !passthrough_ && ParseLlamaCalls(events.calls)) {
      calls_ += static_cast<int>(events.calls.size());
    } else {
      events.calls.clear();
      events.content += held_;
    }
    held_.clear();
    return events;
  }
  // Whitespace after the last call is dropped; anything else held (a part
  // of a tag, an open call) is content.
  if (in_calls_ && !passthrough_ &&
      std::all_of(held_.begin(), held_.end(), IsJsonSpace)) {
    held_.clear();
  }
  events.content += held_;
  held_.clear();
  return events;
}

}  // namespace shardlm
