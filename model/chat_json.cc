#include "model/chat_json.h"

#include "absl/strings/str_cat.h"
#include "nlohmann/json.hpp"

namespace shardlm {

void AppendPythonJson(const OrderedJson& j, std::string& out) {
  if (j.is_object()) {
    out += '{';
    bool first = true;
    for (const auto& [key, value] : j.items()) {
      if (!first) out += ", ";
      first = false;
      out += OrderedJson(key).dump(-1, ' ', false);
      out += ": ";
      AppendPythonJson(value, out);
    }
    out += '}';
  } else if (j.is_array()) {
    out += '[';
    for (size_t i = 0; i < j.size(); ++i) {
      if (i > 0) out += ", ";
      AppendPythonJson(j[i], out);
    }
    out += ']';
  } else {
    // Strings escape as Python's (\" \\ \b \f \n \r \t, other control
    // bytes \u00xx); numbers print shortest round-trip, as repr().
    out += j.dump(-1, ' ', false, OrderedJson::error_handler_t::replace);
  }
}

void AppendPythonJsonIndented(const OrderedJson& j, int level,
                              std::string& out) {
  if (!(j.is_object() || j.is_array()) || j.empty()) {
    AppendPythonJson(j, out);
    return;
  }
  const std::string inner(4 * (level + 1), ' ');
  out += j.is_object() ? '{' : '[';
  bool first = true;
  for (const auto& [key, value] : j.items()) {
    absl::StrAppend(&out, first ? "\n" : ",\n", inner);
    first = false;
    if (j.is_object()) {
      absl::StrAppend(&out, OrderedJson(key).dump(-1, ' ', false), ": ");
    }
    AppendPythonJsonIndented(value, level + 1, out);
  }
  absl::StrAppend(&out, "\n", std::string(4 * level, ' '));
  out += j.is_object() ? '}' : ']';
}

absl::StatusOr<std::string> PythonJsonDumps(std::string_view json_text) {
  const OrderedJson j =
      OrderedJson::parse(json_text, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded()) return absl::InvalidArgumentError("not JSON");
  std::string out;
  AppendPythonJson(j, out);
  return out;
}

absl::StatusOr<OrderedJson> CallArguments(const ChatToolCall& call, size_t i,
                                          size_t c) {
  OrderedJson args =
      OrderedJson::parse(call.arguments, nullptr, /*allow_exceptions=*/false);
  if (!args.is_object()) {
    return absl::InvalidArgumentError(
        absl::StrCat("messages[", i, "].tool_calls[", c,
                     "].function.arguments must be a JSON object"));
  }
  return args;
}

}  // namespace shardlm
