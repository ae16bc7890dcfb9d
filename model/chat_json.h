// JSON as chat templates write it: Python's json.dumps layout, which
// transformers' `tojson` filter and the Hermes and harmony templates use,
// and the tool-call arguments they read.
#ifndef SHARDLM_MODEL_CHAT_JSON_H_
#define SHARDLM_MODEL_CHAT_JSON_H_

#include <cstddef>
#include <string>
#include <string_view>

#include "absl/status/statusor.h"
#include "model/chat_template.h"
#include "nlohmann/json_fwd.hpp"

namespace shardlm {

using OrderedJson = nlohmann::ordered_json;

// `j` as Python's json.dumps(j, ensure_ascii=False) writes it: keys in
// their order, ", " and ": " between items, non-ASCII characters as they
// are, strings escaped as Python's (\" \\ \b \f \n \r \t, other control
// bytes \u00xx), numbers as repr() prints them.
void AppendPythonJson(const OrderedJson& j, std::string& out);
// The same with indent=4 at nesting `level`: each member on its own line,
// "," and ": " between, empty containers as {} and [].
void AppendPythonJsonIndented(const OrderedJson& j, int level,
                              std::string& out);

// `json_text` (valid JSON) written as AppendPythonJson writes it.
// InvalidArgument when it is not JSON.
absl::StatusOr<std::string> PythonJsonDumps(std::string_view json_text);

// messages[i].tool_calls[c]'s arguments, which must be a JSON object
// (InvalidArgument naming the field otherwise).
absl::StatusOr<OrderedJson> CallArguments(const ChatToolCall& call, size_t i,
                                          size_t c);

}  // namespace shardlm

#endif  // SHARDLM_MODEL_CHAT_JSON_H_
