#include "grammar/json_schema.h"

#include <string>

#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"

namespace shardlm {
namespace {

Grammar Compile(const std::string& schema) {
  absl::StatusOr<Grammar> g = CompileJsonSchema(schema);
  EXPECT_TRUE(g.ok()) << g.status() << " for " << schema;
  return g.ok() ? *std::move(g) : Grammar();
}

void ExpectRefused(const std::string& schema, const std::string& words) {
  absl::StatusOr<Grammar> g = CompileJsonSchema(schema);
  ASSERT_FALSE(g.ok()) << schema.substr(0, 200);
  EXPECT_EQ(g.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(g.status().message().find(words), std::string::npos)
      << g.status().message().substr(0, 300) << "; wanted: " << words;
}

TEST(JsonSchemaTest, ObjectPropertiesInOrderRequiredAndOptional) {
  const Grammar g = Compile(R"({
    "type": "object",
    "properties": {"name": {"type": "string"}, "age": {"type": "integer"},
                   "ok": {"type": "boolean"}},
    "required": ["name", "ok"], "additionalProperties": false})");
  EXPECT_TRUE(g.Accepts(R"({"name":"x","age":3,"ok":true})"));
  EXPECT_TRUE(g.Accepts(R"({"name": "x", "ok": false})"));
  EXPECT_TRUE(g.Accepts("{\n  \"name\": \"\\u00e9\\n\",\n  \"ok\": true\n}"));
  EXPECT_TRUE(g.Accepts("{\"name\":\"\xc3\xa9\",\"ok\":true}"));
  EXPECT_FALSE(g.Accepts(R"({"name":"x"})"));             // ok missing.
  EXPECT_FALSE(g.Accepts(R"({"ok":true,"name":"x"})"));   // Out of order.
  EXPECT_FALSE(g.Accepts(R"({"name":"x","ok":true,})"));  // Trailing comma.
  EXPECT_FALSE(g.Accepts(R"({"name":"x","ok":1})"));
  EXPECT_FALSE(g.Accepts(R"({"name":"x","zz":1,"ok":true})"));
  EXPECT_FALSE(g.Accepts("{\"name\":\"\xc3\",\"ok\":true}"));  // Cut UTF-8.
  EXPECT_FALSE(g.Accepts("{\"name\":\"\x01\",\"ok\":true}"));
}

TEST(JsonSchemaTest, ArraysEnumsConstNullableAnyOf) {
  const Grammar g = Compile(R"({"type": "array",
    "items": {"anyOf": [{"enum": ["red", 2, null]}, {"const": {"a": [1]}},
                        {"type": ["number", "null"]}]},
    "minItems": 1, "maxItems": 3})");
  EXPECT_TRUE(g.Accepts(R"(["red"])"));
  EXPECT_TRUE(g.Accepts(R"([2, {"a":[1]}, -1.5e3])"));
  EXPECT_TRUE(g.Accepts(R"([null,null,null])"));
  EXPECT_FALSE(g.Accepts("[]"));
  EXPECT_FALSE(g.Accepts("[1,2,3,4]"));
  EXPECT_FALSE(g.Accepts(R"(["blue"])"));
  EXPECT_FALSE(g.Accepts(R"([{"a":[2]}])"));
  const Grammar nullable =
      Compile(R"({"type": "string", "nullable": true, "maxLength": 2})");
  EXPECT_TRUE(nullable.Accepts("null"));
  EXPECT_TRUE(nullable.Accepts(R"("ab")"));
  EXPECT_FALSE(nullable.Accepts(R"("abc")"));
}

TEST(JsonSchemaTest, RecursionThroughDefsAndRef) {
  const Grammar g = Compile(R"({
    "$defs": {"node": {"type": "object",
      "properties": {"v": {"type": "integer"},
                     "kids": {"type": "array", "items": {"$ref": "#/$defs/node"}}},
      "required": ["v"]}},
    "$ref": "#/$defs/node"})");
  EXPECT_TRUE(g.Accepts(R"({"v":1})"));
  EXPECT_TRUE(
      g.Accepts(R"({"v":1,"kids":[{"v":2,"kids":[{"v":3}]},{"v":4}]})"));
  EXPECT_FALSE(g.Accepts(R"({"v":1,"kids":[{"kids":[]}]})"));
}

TEST(JsonSchemaTest, IntegerBoundsAreExact) {
  const struct {
    const char* schema;
    int lo, hi;
  } cases[] = {
      {R"({"type":"integer","minimum":-37,"maximum":1205})", -37, 1205},
      {R"({"type":"integer","minimum":7})", 7, 100000},
      {R"({"type":"integer","maximum":-3})", -100000, -3},
      {R"({"type":"integer","exclusiveMinimum":0,"exclusiveMaximum":10})", 1,
       9},
      {R"({"type":"integer","minimum":0.5,"maximum":99.9})", 1, 99},
  };
  for (const auto& c : cases) {
    const Grammar g = Compile(c.schema);
    for (int v = -1500; v <= 1500; ++v) {
      const bool in = v >= c.lo && v <= c.hi;
      EXPECT_EQ(g.Accepts(std::to_string(v)), in) << c.schema << " " << v;
    }
    EXPECT_FALSE(g.Accepts("01"));
    EXPECT_FALSE(g.Accepts("1.0"));
  }
}

TEST(JsonSchemaTest, NumberBoundsNeverExceeded) {
  const Grammar g = Compile(R"({"type":"number","minimum":-2.5,"maximum":3})");
  EXPECT_TRUE(g.Accepts("3"));
  EXPECT_TRUE(g.Accepts("-2"));
  EXPECT_TRUE(g.Accepts("2.75"));
  EXPECT_TRUE(g.Accepts("-1.5"));
  EXPECT_TRUE(g.Accepts("0.001"));
  EXPECT_FALSE(g.Accepts("3.5"));
  EXPECT_FALSE(g.Accepts("-2.75"));
  EXPECT_FALSE(g.Accepts("4"));
  EXPECT_FALSE(g.Accepts("1e2"));
  // A subset: -2.25 is in range but its whole unit (-3, -2) is not.
  EXPECT_FALSE(g.Accepts("-2.25"));
}

TEST(JsonSchemaTest, Formats) {
  const Grammar date = Compile(R"({"type":"string","format":"date"})");
  EXPECT_TRUE(date.Accepts(R"("2024-12-31")"));
  EXPECT_TRUE(date.Accepts(R"("2023-04-30")"));
  EXPECT_FALSE(date.Accepts(R"("2023-04-31")"));
  EXPECT_FALSE(date.Accepts(R"("2023-02-30")"));
  EXPECT_FALSE(date.Accepts(R"("2023-13-01")"));
  EXPECT_TRUE(date.Accepts(R"("0001-01-01")"));
  EXPECT_FALSE(date.Accepts(R"("0000-01-20")"));  // No year 0.
  const Grammar dt = Compile(R"({"type":"string","format":"date-time"})");
  EXPECT_TRUE(dt.Accepts(R"("2024-01-02T03:04:05Z")"));
  EXPECT_TRUE(dt.Accepts(R"("2024-01-02T23:59:59.123+05:30")"));
  EXPECT_FALSE(dt.Accepts(R"("2024-01-02T24:00:00Z")"));
  EXPECT_FALSE(dt.Accepts(R"("2024-01-02 03:04:05Z")"));
  const Grammar uuid = Compile(R"({"type":"string","format":"uuid"})");
  EXPECT_TRUE(uuid.Accepts(R"("123e4567-e89b-12d3-a456-426614174000")"));
  EXPECT_FALSE(uuid.Accepts(R"("123e4567e89b12d3a456426614174000")"));
}

TEST(JsonSchemaTest, JsonObjectIsAnyObject) {
  const Grammar g = JsonObjectGrammar();
  EXPECT_TRUE(g.Accepts(R"({})"));
  EXPECT_TRUE(g.Accepts(R"({"a": [1, {"b": null}, "x", true], "c": -0.5})"));
  EXPECT_FALSE(g.Accepts(R"([1])"));
  EXPECT_FALSE(g.Accepts(R"("x")"));
  EXPECT_FALSE(g.Accepts(R"({"a":})"));
}

TEST(JsonSchemaTest, RefusesWhatIsOutsideTheSubsetNamingTheKeyword) {
  ExpectRefused(R"({"type":"string","pattern":"^a"})",
                "'pattern' is not supported (at #)");
  ExpectRefused(R"({"type":"object","properties":{"a":{"type":"array",
                   "items":{"type":"string","format":"email"}}}})",
                "format 'email' is not supported");
  ExpectRefused(R"({"allOf":[{"type":"string"}]})", "'allOf' is not supported");
  ExpectRefused(R"({"type":"object","additionalProperties":{"type":"string"}})",
                "'additionalProperties' must be true or false");
  ExpectRefused(R"({"$ref":"#/$defs/missing"})", "does not resolve");
  ExpectRefused(R"({"$ref":"https://example.com/s.json"})",
                "only local references");
  ExpectRefused(R"({"$ref":"#"})", "left-recursive");
  ExpectRefused(R"({"type":"integer","minimum":5,"maximum":4})", "no integer");
  ExpectRefused(R"({"type":"array","maxItems":100000})",
                "'maxItems' above 1000");
  ExpectRefused(R"({"type":"object","properties":{},"required":["x"]})",
                "'required' names 'x'");
  ExpectRefused(R"({"type":"texty"})", "type 'texty'");
  ExpectRefused("{\"type\": ", "not JSON");
  ExpectRefused("false", "admits no value");
  // Depth 200 and 1 MB: refused before parsing.
  std::string deep;
  for (int i = 0; i < 200; ++i) deep += R"({"type":"array","items":)";
  deep += "{}";
  for (int i = 0; i < 200; ++i) deep += "}";
  ExpectRefused(deep, "levels deep; at most 32");
  std::string big = R"({"type":"object","description":")";
  big += std::string(1 << 20, 'x') + "\"}";
  ExpectRefused(big, "bytes; at most 65536");
}

constexpr char kToolSpec[] = R"({"open": "<tool_call>\n",
  "close": "\n</tool_call>", "separator": "\n", "multiple": MULTI,
  "tools": [
    {"index": 0, "name": "get_weather", "parameters": {"type": "object",
      "properties": {"city": {"type": "string", "maxLength": 10},
                     "unit": {"enum": ["c", "f"]}},
      "required": ["city"], "additionalProperties": false}},
    {"index": 2, "name": "now", "parameters": null},
    {"index": 3, "name": "tree", "parameters": {"$ref": "#/$defs/n",
      "$defs": {"n": {"type": "object", "properties": {
        "kids": {"type": "array", "items": {"$ref": "#/$defs/n"}}},
        "additionalProperties": false}}}}]})";

Grammar ToolCalls(bool multiple) {
  std::string spec = kToolSpec;
  spec.replace(spec.find("MULTI"), 5, multiple ? "true" : "false");
  absl::StatusOr<Grammar> g = CompileToolCalls(spec);
  EXPECT_TRUE(g.ok()) << g.status();
  return g.ok() ? *std::move(g) : Grammar();
}

TEST(ToolCallGrammarTest, OneCallOfAnOfferedFunctionWithValidArguments) {
  const Grammar g = ToolCalls(false);
  const std::string weather =
      "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": "
      "{\"city\": \"Paris\", \"unit\": \"c\"}}\n</tool_call>";
  EXPECT_TRUE(g.Accepts(weather));
  EXPECT_TRUE(g.Accepts(
      "<tool_call>\n{\"name\": \"now\", \"arguments\": {}}\n</tool_call>"));
  EXPECT_TRUE(
      g.Accepts("<tool_call>\n{\"name\": \"now\", \"arguments\": "
                "{\"any\": [1, null]}}\n</tool_call>"));
  // Each tool's $ref resolves in its own schema.
  EXPECT_TRUE(
      g.Accepts("<tool_call>\n{\"name\": \"tree\", \"arguments\": "
                "{\"kids\": [{}, {\"kids\": []}]}}\n</tool_call>"));
  EXPECT_FALSE(g.Accepts(weather + "\n" + weather));  // One call only.
  EXPECT_FALSE(g.Accepts(                             // city is required.
      "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": "
      "{\"unit\": \"c\"}}\n</tool_call>"));
  EXPECT_FALSE(g.Accepts(  // Not offered.
      "<tool_call>\n{\"name\": \"rm\", \"arguments\": {}}\n</tool_call>"));
  EXPECT_FALSE(g.AcceptsPrefix("Sure! <tool_call>"));
  const Grammar many = ToolCalls(true);
  EXPECT_TRUE(many.Accepts(weather));
  EXPECT_TRUE(many.Accepts(weather + "\n" + weather));
  EXPECT_FALSE(many.Accepts(""));
}

TEST(ToolCallGrammarTest, LlamaCallsUseParametersWithoutTags) {
  absl::StatusOr<Grammar> g = CompileToolCalls(
      R"({"open": "", "close": "", "arguments_key": "parameters",
          "tools": [{"index": 0, "name": "add", "parameters": {
            "type": "object", "properties": {"a": {"type": "integer"}},
            "required": ["a"], "additionalProperties": false}}]})");
  ASSERT_TRUE(g.ok()) << g.status();
  EXPECT_TRUE(g->Accepts(R"({"name": "add", "parameters": {"a": 2}})"));
  EXPECT_FALSE(g->Accepts(R"({"name": "add", "arguments": {"a": 2}})"));
  EXPECT_FALSE(g->Accepts(R"({"name": "add", "parameters": {}})"));
}

TEST(ToolCallGrammarTest, RefusalsNameTheTool) {
  absl::StatusOr<Grammar> g = CompileToolCalls(
      R"({"tools": [{"index": 0, "name": "a", "parameters": null},
                    {"index": 1, "name": "b", "parameters":
                      {"type": "string", "pattern": "x+"}}]})");
  ASSERT_FALSE(g.ok());
  EXPECT_EQ(g.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(g.status().message().find("tools[1].function.parameters"),
            std::string::npos)
      << g.status();
  EXPECT_NE(g.status().message().find("'pattern'"), std::string::npos);
  EXPECT_FALSE(CompileToolCalls(R"({"tools": []})").ok());
  EXPECT_FALSE(CompileToolCalls("not json").ok());
}

}  // namespace
}  // namespace shardlm
