// JSON Schema -> Grammar: the subset of JSON Schema that structured outputs
// accept (docs/api.md lists it), compiled into a byte grammar whose every
// sentence is a JSON text valid against the schema.
#ifndef SHARDLM_GRAMMAR_JSON_SCHEMA_H_
#define SHARDLM_GRAMMAR_JSON_SCHEMA_H_

#include <cstddef>
#include <string_view>

#include "absl/status/statusor.h"
#include "grammar/grammar.h"

namespace shardlm {

// Limits on a schema, checked before anything else is done with it.
inline constexpr size_t kMaxJsonSchemaBytes = 64 * 1024;
inline constexpr int kMaxJsonSchemaDepth = 32;  // Nesting of JSON values.
// minItems / maxItems / minLength / maxLength above this are refused (each
// bounded repetition costs grammar rules).
inline constexpr int kMaxJsonSchemaRepeat = 1000;

// The grammar of `schema_json` (a JSON Schema as JSON text).
// InvalidArgument, naming the keyword and where it is ("json_schema:
// 'pattern' is not supported (at #/properties/name)"), for a schema outside
// the subset, malformed JSON, or one over the limits. Nothing is kept.
//
// What the grammar generates (a subset of what the schema allows, never
// more): properties in the schema's order, no properties beyond those
// declared, integers of at most 15 digits, numbers with at most 10
// fraction digits and a 3-digit exponent, and no whitespace except up to
// 20 spaces or tabs after a newline or one space between tokens.
absl::StatusOr<Grammar> CompileJsonSchema(std::string_view schema_json);

// The grammar of tool calls (tool_choice required, or a named function).
// `spec_json`: {"open": TEXT, "close": TEXT, "separator": TEXT, "multiple":
// bool, "arguments_key": KEY, "tools": [{"index": i, "name": NAME,
// "parameters": SCHEMA or null}]}. A sentence is one call (`multiple`
// false) or one or more separated by `separator`; a call is
//   open {"name": "NAME", "KEY": ARGS} close
// (KEY "arguments" unless given; Llama 3.1 writes "parameters")
// with NAME one of the tools' and ARGS a JSON object valid against that
// tool's parameters (any object when null), within the subset above.
// InvalidArgument naming "tools[i].function.parameters" and the keyword for
// a schema outside it.
absl::StatusOr<Grammar> CompileToolCalls(std::string_view spec_json);

// The grammar of any JSON object (response_format json_object).
Grammar JsonObjectGrammar();

}  // namespace shardlm

#endif  // SHARDLM_GRAMMAR_JSON_SCHEMA_H_
