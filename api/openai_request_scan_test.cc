#include "api/openai_request_scan.h"

#include <string>

#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"

namespace shardlm {
namespace {

// `n` copies of `item` joined by commas, in brackets.
std::string Array(const std::string& item, size_t n) {
  std::string out = "[";
  for (size_t i = 0; i < n; ++i) {
    if (i > 0) out += ",";
    out += item;
  }
  return out + "]";
}

TEST(OpenAiRequestScanTest, AcceptsOrdinaryRequests) {
  EXPECT_TRUE(ScanOpenAiRequest(R"({"prompt": "hi", "max_tokens": 4})").ok());
  EXPECT_TRUE(ScanOpenAiRequest(
                  R"({"messages": [{"role": "user", "content": [
                        {"type": "text", "text": "hi"}]}],
                      "stop": ["a", "b"], "logit_bias": {"1": 2}})")
                  .ok());
}

TEST(OpenAiRequestScanTest, LimitsAreInclusive) {
  EXPECT_TRUE(
      ScanOpenAiRequest(absl::StrCat(R"({"stop": )", Array("\"x\"", 8), "}"))
          .ok());
  EXPECT_TRUE(ScanOpenAiRequest(
                  absl::StrCat(R"({"prompt": )", Array("1", 1 << 18), "}"))
                  .ok());
}

TEST(OpenAiRequestScanTest, RefusesEachFieldPastItsLimitNamingIt) {
  struct Case {
    std::string body;
    std::string message;
  };
  const Case cases[] = {
      {absl::StrCat(R"({"stop": )", Array("{}", 9), "}"),
       "at most 8 stop strings in 'stop'"},
      {absl::StrCat(R"({"messages": )", Array("{}", 257), "}"),
       "at most 256 messages in 'messages'"},
      {absl::StrCat(R"({"prompt": )", Array("1", (1 << 18) + 1), "}"),
       "at most 262144 prompt token ids in 'prompt'"},
      {absl::StrCat(R"({"tools": )", Array("0", 129), "}"),
       "at most 128 tools in 'tools'"},
      {absl::StrCat(R"({"messages": [{"content": )", Array("{}", 257), "}]}"),
       "at most 256 content parts in 'messages[].content'"},
      {absl::StrCat(R"({"x": )", Array("[]", 1025), "}"),
       "at most 1024 items in 'x'"},
      {absl::StrCat(R"({"prompt": [)", Array("0", 1025), "]}"),
       "at most 1024 items in 'prompt[]'"},
  };
  for (const Case& c : cases) {
    const absl::Status s = ScanOpenAiRequest(c.body);
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << c.message;
    EXPECT_EQ(s.message(), c.message);
  }
}

TEST(OpenAiRequestScanTest, RefusesObjectsWithTooManyKeys) {
  std::string bias = "{";
  for (int i = 0; i < 301; ++i) {
    absl::StrAppend(&bias, i > 0 ? "," : "", "\"", i, "\": 1");
  }
  bias += "}";
  const absl::Status s =
      ScanOpenAiRequest(absl::StrCat(R"({"logit_bias": )", bias, "}"));
  EXPECT_EQ(s.message(), "at most 300 logit_bias entries in 'logit_bias'");

  std::string body = "{";
  for (int i = 0; i < 1025; ++i) {
    absl::StrAppend(&body, i > 0 ? "," : "", "\"k", i, "\": 1");
  }
  EXPECT_EQ(ScanOpenAiRequest(body + "}").message(),
            "at most 1024 fields in the body");
}

TEST(OpenAiRequestScanTest, RefusesTooManyValuesInAll) {
  // 400 arrays of 1000 numbers: each container is within its limit, the
  // body is not.
  const std::string body =
      absl::StrCat(R"({"x": )", Array(Array("0", 1000), 400), "}");
  OpenAiScanStats stats;
  const absl::Status s = ScanOpenAiRequest(body, {}, &stats);
  EXPECT_EQ(s.message(), "at most 327680 JSON values in the body");
  EXPECT_EQ(stats.values, 327'681u);
}

TEST(OpenAiRequestScanTest, RefusesDeepNestingBeforeReadingFurther) {
  const std::string deep32 = std::string(31, '[') + std::string(31, ']');
  EXPECT_TRUE(ScanOpenAiRequest(absl::StrCat(R"({"x": )", deep32, "}")).ok());
  const std::string deep = std::string(100000, '[');  // Never closed.
  EXPECT_EQ(ScanOpenAiRequest(absl::StrCat(R"({"x": )", deep)).message(),
            "the body nests deeper than 32");
}

TEST(OpenAiRequestScanTest, RefusesTextThatIsNotJson) {
  for (const char* body : {"", "{", "{\"a\": }", "{} x", "nul"}) {
    EXPECT_EQ(ScanOpenAiRequest(body).message(),
              "the body is not a JSON object")
        << body;
  }
}

TEST(OpenAiRequestScanTest, LongKeysAreCutInMessages) {
  const std::string key(100000, 'k');
  const absl::Status s = ScanOpenAiRequest(
      absl::StrCat(R"({")", key, R"(": )", Array("0", 1025), "}"));
  EXPECT_EQ(s.message(),
            absl::StrCat("at most 1024 items in '", std::string(64, 'k'), "'"));
}

}  // namespace
}  // namespace shardlm
