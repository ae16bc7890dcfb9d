// gpt-oss's harmony chat format (ChatTemplate::Format::kHarmony), rendered
// as the template gpt-oss ships (chat_template.jinja) renders it:
// tests/reference/check_chat_template.py compares the two with jinja2.
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "core/status.h"
#include "model/chat_json.h"
#include "model/chat_template.h"
#include "nlohmann/json.hpp"

namespace shardlm {
namespace {

// Jinja's `spec.key` on a JSON Schema: nullptr when `j` is not an object
// or has no such member.
const OrderedJson* Member(const OrderedJson& j, std::string_view key) {
  if (!j.is_object()) return nullptr;
  const auto it = j.find(key);
  return it == j.end() ? nullptr : &*it;
}

// Jinja's truth of a member: absent, null, false, 0, "" and empty
// containers are false.
bool Truthy(const OrderedJson* j) {
  if (j == nullptr || j->is_null()) return false;
  if (j->is_boolean()) return j->get<bool>();
  if (j->is_number()) return j->get<double>() != 0;
  if (j->is_string()) return !j->get_ref<const std::string&>().empty();
  return !j->empty();
}

bool IsString(const OrderedJson* j, std::string_view s) {
  return j != nullptr && j->is_string() &&
         j->get_ref<const std::string&>() == s;
}

std::string PythonJson(const OrderedJson& j) {
  std::string out;
  AppendPythonJson(j, out);
  return out;
}

// What the template's `"text" + value` writes: a string as it is. Any
// other value, where that concatenation would raise, as JSON.
std::string Text(const OrderedJson& j) {
  return j.is_string() ? j.get<std::string>() : PythonJson(j);
}

// Python's `name in required` for a schema's "required" (a list, or a
// string, where `in` is a substring test).
bool Required(const OrderedJson* required, const std::string& name) {
  if (required == nullptr) return false;
  if (required->is_string()) {
    return required->get_ref<const std::string&>().find(name) !=
           std::string::npos;
  }
  if (!required->is_array()) return false;
  for (const OrderedJson& r : *required) {
    if (r.is_string() && r.get_ref<const std::string&>() == name) return true;
  }
  return false;
}

// Jinja's `length` of a string: its characters, not its bytes.
size_t Length(std::string_view s) {
  size_t n = 0;
  for (char c : s) n += (static_cast<uint8_t>(c) & 0xc0) != 0x80;
  return n;
}

// The template's render_typescript_type: a JSON Schema as a TypeScript
// type, with its whitespace (a nested object's member types follow a line
// break and 16 spaces, a oneOf's variants are joined by " | \n", a
// variant's default follows 20 spaces).
std::string TypeScript(const OrderedJson& spec) {
  const OrderedJson* type = Member(spec, "type");
  const char* null_suffix = Truthy(Member(spec, "nullable")) ? " | null" : "";
  if (IsString(type, "array")) {
    const OrderedJson* items = Member(spec, "items");
    if (items == nullptr) return absl::StrCat("any[]", null_suffix);
    const OrderedJson* item_type = Member(*items, "type");
    std::string inner;
    if (IsString(item_type, "string")) {
      inner = "string";
    } else if (IsString(item_type, "number") ||
               IsString(item_type, "integer")) {
      inner = "number";
    } else if (IsString(item_type, "boolean")) {
      inner = "boolean";
    } else {
      inner = TypeScript(*items);
      if (inner == "object | object" || Length(inner) > 50) inner = "any";
    }
    return absl::StrCat(inner, "[]", null_suffix);
  }
  if (type != nullptr && type->is_array() && !type->empty()) {
    std::vector<std::string> names;
    for (const OrderedJson& t : *type) names.push_back(Text(t));
    return absl::StrJoin(names, " | ");
  }
  if (const OrderedJson* one_of = Member(spec, "oneOf"); Truthy(one_of)) {
    // The macro's test for object variants sets a variable inside its
    // loop, which Jinja's scoping forgets: every variant is written.
    if (!one_of->is_array()) return "any";
    std::string out;
    for (size_t i = 0; i < one_of->size(); ++i) {
      const OrderedJson& variant = (*one_of)[i];
      out += TypeScript(variant);
      if (const OrderedJson* d = Member(variant, "description"); Truthy(d)) {
        absl::StrAppend(&out, "// ", Text(*d));
      }
      if (const OrderedJson* d = Member(variant, "default")) {
        absl::StrAppend(&out, std::string(20, ' '),
                        "// default: ", PythonJson(*d));
      }
      if (i + 1 < one_of->size()) out += " | \n";
    }
    return out;
  }
  if (IsString(type, "string")) {
    const OrderedJson* values = Member(spec, "enum");
    if (!Truthy(values) || !values->is_array()) {
      return absl::StrCat("string", null_suffix);
    }
    std::vector<std::string> texts;
    for (const OrderedJson& v : *values) texts.push_back(Text(v));
    return absl::StrCat("\"", absl::StrJoin(texts, "\" | \""), "\"");
  }
  if (IsString(type, "number") || IsString(type, "integer")) return "number";
  if (IsString(type, "boolean")) return "boolean";
  if (IsString(type, "object")) {
    const OrderedJson* properties = Member(spec, "properties");
    if (!Truthy(properties) || !properties->is_object()) return "object";
    const OrderedJson* required = Member(spec, "required");
    std::string out = "{\n";
    bool first = true;
    for (const auto& [name, property] : properties->items()) {
      if (!first) out += ", ";
      first = false;
      absl::StrAppend(&out, name, Required(required, name) ? "" : "?", ": \n",
                      std::string(16, ' '), TypeScript(property));
    }
    return out + "}";
  }
  return "any";
}

// The template's render_tool_namespace("functions", tools): each tool as a
// TypeScript function type taking one object. The template fails on a tool
// without a description; its comment line is left out here instead.
absl::Status AppendToolNamespace(absl::Span<const ChatTool> tools,
                                 std::string& out) {
  out += "## functions\n\nnamespace functions {\n\n";
  for (size_t i = 0; i < tools.size(); ++i) {
    const ChatTool& tool = tools[i];
    if (!tool.description.empty()) {
      absl::StrAppend(&out, "// ", tool.description, "\n");
    }
    absl::StrAppend(&out, "type ", tool.name, " = ");
    OrderedJson parameters;
    if (!tool.parameters.empty()) {
      parameters = OrderedJson::parse(tool.parameters, nullptr,
                                      /*allow_exceptions=*/false);
      if (parameters.is_discarded()) {
        return absl::InvalidArgumentError(
            absl::StrCat("tools[", i, "].function.parameters is not JSON"));
      }
    }
    const OrderedJson* properties = Member(parameters, "properties");
    if (!Truthy(properties) || !properties->is_object()) {
      out += "() => any;\n\n";
      continue;
    }
    out += "(_: {\n";
    const OrderedJson* required = Member(parameters, "required");
    for (const auto& [name, spec] : properties->items()) {
      if (const OrderedJson* d = Member(spec, "description"); Truthy(d)) {
        absl::StrAppend(&out, "// ", Text(*d), "\n");
      }
      absl::StrAppend(&out, name, Required(required, name) ? "" : "?", ": ",
                      TypeScript(spec));
      if (const OrderedJson* d = Member(spec, "default")) {
        if (Truthy(Member(spec, "enum"))) {
          absl::StrAppend(&out, ", // default: ", Text(*d));
        } else if (Truthy(Member(spec, "oneOf"))) {
          absl::StrAppend(&out, "// default: ", Text(*d));
        } else {
          absl::StrAppend(&out, ", // default: ", PythonJson(*d));
        }
      }
      out += ",\n";
    }
    out += "}) => any;\n\n";
  }
  out += "} // namespace functions";
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<std::string> ChatTemplate::RenderHarmony(
    absl::Span<const ChatMessage> messages, absl::Span<const ChatTool> tools,
    std::string_view reasoning_effort) const {
  if (reasoning_effort.empty()) reasoning_effort = "medium";
  if (reasoning_effort != "low" && reasoning_effort != "medium" &&
      reasoning_effort != "high") {
    return absl::InvalidArgumentError(
        absl::StrCat("reasoning_effort '", Sv(reasoning_effort),
                     "' is not low, medium or high"));
  }
  std::string out = absl::StrCat(
      "<|start|>system<|message|>You are ChatGPT, a large language model "
      "trained by OpenAI.\nKnowledge cutoff: 2024-06\nCurrent date: ",
      date_, "\n\nReasoning: ", Sv(reasoning_effort),
      "\n\n# Valid channels: analysis, commentary, final. Channel must be "
      "included for every message.");
  if (!tools.empty()) {
    out +=
        "\nCalls to these tools must go to the commentary channel: "
        "'functions'.";
  }
  out += "<|end|>";
  size_t first = 0;
  std::string_view instructions;
  if (!messages.empty() &&
      (messages[0].role == "system" || messages[0].role == "developer")) {
    instructions = messages[0].content;
    first = 1;
  }
  if (!instructions.empty() || !tools.empty()) {
    out += "<|start|>developer<|message|>";
    if (!instructions.empty()) {
      absl::StrAppend(&out, "# Instructions\n\n", Sv(instructions), "\n\n");
    }
    if (!tools.empty()) {
      out += "# Tools\n\n";
      RETURN_IF_ERROR(AppendToolNamespace(tools, out));
    }
    out += "<|end|>";
  }
  // The calls of the last assistant message that made any, until an
  // answer: the tool results that follow answer them.
  absl::Span<const ChatToolCall> calls;
  for (size_t i = first; i < messages.size(); ++i) {
    const ChatMessage& m = messages[i];
    if (m.role != "assistant" && !m.tool_calls.empty()) {
      return absl::InvalidArgumentError(absl::StrCat(
          "messages[", i, "].tool_calls: only an assistant makes calls"));
    }
    if (m.role == "user") {
      absl::StrAppend(&out, "<|start|>user<|message|>", m.content, "<|end|>");
    } else if (m.role == "assistant") {
      // The template refuses an answer holding channel markup.
      for (std::string_view tag :
           {"<|channel|>analysis<|message|>", "<|channel|>final<|message|>"}) {
        if (m.content.find(tag) != std::string::npos) {
          return absl::InvalidArgumentError(
              absl::StrCat("messages[", i, "].content holds ", Sv(tag),
                           "; give the final answer only (harmony channels are "
                           "written by the template)"));
        }
      }
      if (m.tool_calls.empty()) {
        absl::StrAppend(&out, "<|start|>assistant<|channel|>final<|message|>",
                        m.content, "<|end|>");
        calls = {};
        continue;
      }
      // The text beside calls is reasoning, kept until an answer follows
      // (reasoning of answered turns is dropped, as the template does).
      bool answered = false;
      for (size_t j = i + 1; j < messages.size(); ++j) {
        answered |=
            messages[j].role == "assistant" && messages[j].tool_calls.empty();
      }
      if (!m.content.empty() && !answered) {
        absl::StrAppend(&out,
                        "<|start|>assistant<|channel|>analysis<|message|>",
                        m.content, "<|end|>");
      }
      // One message per call. The template writes only the first (gpt-oss
      // makes one call per message); a history holding several keeps them.
      for (size_t c = 0; c < m.tool_calls.size(); ++c) {
        ASSIGN_OR_RETURN(const OrderedJson args,
                         CallArguments(m.tool_calls[c], i, c));
        absl::StrAppend(&out, "<|start|>assistant to=functions.",
                        m.tool_calls[c].name,
                        "<|channel|>commentary json<|message|>");
        AppendPythonJson(args, out);
        out += "<|call|>";
      }
      calls = m.tool_calls;
    } else if (m.role == "tool") {
      if (calls.empty()) {
        return absl::InvalidArgumentError(absl::StrCat(
            "messages[", i,
            "].role 'tool' answers no call: no assistant message with "
            "tool_calls comes before it"));
      }
      // The call it answers, by tool_call_id; the first, as the template
      // takes it, when the id names none.
      const ChatToolCall* call = &calls[0];
      for (const ChatToolCall& c : calls) {
        if (!m.tool_call_id.empty() && c.id == m.tool_call_id) call = &c;
      }
      absl::StrAppend(&out, "<|start|>functions.", call->name,
                      " to=assistant<|channel|>commentary<|message|>");
      AppendPythonJson(OrderedJson(m.content), out);
      out += "<|end|>";
    } else if (m.role != "system" && m.role != "developer") {
      return absl::InvalidArgumentError(
          absl::StrCat("messages[", i, "].role '", m.role,
                       "' is not system, developer, user, assistant or tool"));
    }
  }
  out += "<|start|>assistant";
  return out;
}

}  // namespace shardlm
