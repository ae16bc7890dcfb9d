#include "api/grpc_request_scan.h"

#include <string>

#include "gtest/gtest.h"
#include "shardlm/v1/inference.pb.h"

namespace shardlm {
namespace {

std::string Varint(uint64_t v) {
  std::string out;
  do {
    const uint8_t b = v & 0x7F;
    v >>= 7;
    out.push_back(static_cast<char>(b | (v ? 0x80 : 0)));
  } while (v);
  return out;
}

std::string Field(int number, const std::string& bytes) {
  return Varint(static_cast<uint64_t>(number) << 3 | 2) + Varint(bytes.size()) +
         bytes;
}

std::string Scalar(int number, uint64_t value) {
  return Varint(static_cast<uint64_t>(number) << 3) + Varint(value);
}

TEST(GrpcRequestScanTest, AcceptsWhatTheServiceAccepts) {
  v1::GenerateRequest req;
  req.set_prompt("h\xC3\xA9llo \xF0\x9F\x98\x80");
  for (int i = 0; i < 300; ++i) req.add_prompt_token_ids(i);
  req.set_max_tokens(4);
  req.mutable_sampling()->set_temperature(0.5f);
  req.mutable_sampling()->set_seed(7);
  req.mutable_sampling()->set_presence_penalty(0.5f);
  req.mutable_sampling()->set_frequency_penalty(-1);
  req.mutable_sampling()->set_repetition_penalty(1.1f);
  for (int i = 0; i < 300; ++i) {
    (*req.mutable_sampling()->mutable_logit_bias())[i * 7] = -1.5f;
  }
  req.set_min_tokens(2);
  for (int i = 0; i < 8; ++i) req.add_stop("x");
  for (int i = 0; i < 256; ++i) req.add_stop_token_ids(i);
  EXPECT_TRUE(ScanGenerateRequest(req.SerializeAsString()).ok());

  v1::GenerateRequest chat;
  for (int i = 0; i < 256; ++i) {
    v1::ChatMessage* m = chat.add_messages();
    m->set_role("user");
    m->set_content("caf\xC3\xA9");
  }
  EXPECT_TRUE(ScanGenerateRequest(chat.SerializeAsString()).ok());
  EXPECT_TRUE(ScanGenerateRequest("").ok());
  v1::TokenizeRequest tok;
  tok.set_text("tokens");
  EXPECT_TRUE(ScanTokenizeRequest(tok.SerializeAsString()).ok());
}

TEST(GrpcRequestScanTest, CountsAreRefusedWithTheServicesMessages) {
  std::string wide;
  for (int i = 0; i < 2'000'000; ++i) wide += Field(11, "");
  absl::Status s = ScanGenerateRequest(wide);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(s.message(), "at most 256 messages, got 2000000");

  std::string stops;
  for (int i = 0; i < 9; ++i) stops += Field(8, "x");
  EXPECT_EQ(ScanGenerateRequest(stops).message(),
            "at most 8 stop strings, got 9");

  // Packed and unpacked token ids count alike.
  std::string ids(300000, '\x01');
  EXPECT_EQ(ScanGenerateRequest(Field(2, ids)).message(),
            "at most 262144 prompt_token_ids, got 300000");
  EXPECT_EQ(ScanGenerateRequest(Field(20, ids)).message(),
            "at most 262144 resume_token_ids, got 300000");
  // Resume fields are known: 300 resumed ids are not 300 unknown fields.
  std::string resume(300, '\x01');
  EXPECT_TRUE(ScanGenerateRequest(Field(20, resume) + Scalar(21, 300)).ok());
  std::string unpacked;
  for (int i = 0; i < 257; ++i) unpacked += Scalar(5, 1);
  EXPECT_EQ(ScanGenerateRequest(unpacked).message(),
            "at most 256 stop_token_ids, got 257");

  // logit_bias map entries (key 1, value 2), counted before any is read.
  std::string bias;
  for (int i = 0; i < 301; ++i) bias += Field(8, Scalar(1, i));
  EXPECT_EQ(ScanGenerateRequest(Field(4, bias)).message(),
            "sampling: at most 300 logit_bias entries, got 301");
  // An entry's unknown fields count against the request's budget.
  std::string odd;
  for (int i = 0; i < 257; ++i) odd += Scalar(9, 1);
  EXPECT_EQ(ScanGenerateRequest(Field(4, Field(8, odd))).message(),
            "more than 256 unknown fields in the request");
}

// Packed token ids whose varints are cut short or longer than 10 bytes
// (the fuzzer's finding: 19 continuation bytes): the scan refuses what
// libprotobuf's parser refuses, and passes a 10-byte varint (a negative
// int32), which it parses.
TEST(GrpcRequestScanTest, MalformedPackedVarintsAreRefusedAsTheParserDoes) {
  const std::string ten = std::string(9, '\xff') + '\x01';
  const struct {
    std::string ids;
    bool parses;
  } cases[] = {
      {"\x03" + ten + "\x05", true},
      {"\x03" + std::string(10, '\xff') + "\x01", false},
      {"\x03" + std::string(19, '\xff') + "\x01\x0a", false},
      {"\x03\x80", false},
  };
  for (const auto& c : cases) {
    const std::string wire = Field(2, c.ids);
    v1::GenerateRequest parsed;
    ASSERT_EQ(parsed.ParseFromString(wire), c.parses) << c.ids.size();
    EXPECT_EQ(ScanGenerateRequest(wire).ok(), c.parses) << c.ids.size();
  }
}

// Nested messages are parsed by libprotobuf too: what the scan passes
// there, it parses (the fuzzer's finding: a ChatMessage whose content's
// tag had one bit flipped, making its bytes a tool call that is none).
TEST(GrpcRequestScanTest, NestedMessagesAreScannedAsTheParserParsesThem) {
  const std::string call = Field(1, "c1") + Field(2, "add") + Field(3, "{}");
  const std::string tool = Field(1, "add") + Field(3, "{}");
  const struct {
    const char* what;
    std::string wire;
  } cases[] = {
      {"a tool call", Field(11, Field(1, "assistant") + Field(3, call))},
      {"content's tag made tool_calls (the finding)",
       Field(11, Field(1, "system") + Field(3, "Be briaf."))},
      {"a tool call's name not UTF-8", Field(11, Field(3, Field(2, "ad\xFF")))},
      {"a tool", Field(22, tool) + Field(23, "auto")},
      {"a tool cut short", Field(22, tool.substr(0, 4))},
      {"a tool's parameters not UTF-8", Field(22, Field(3, "\xC0\x80"))},
      {"tool_choice not UTF-8", Field(23, "\xFF")},
      {"tool_choice_function not UTF-8", Field(24, "a\xE2\x82")},
      {"a constraint", Field(13, Scalar(1, 1))},
      {"a constraint of bytes that are none", Field(13, "Be briaf.")},
      {"a grammar not UTF-8", Field(13, Field(3, "\xED\xA0\x80"))},
  };
  for (const auto& c : cases) {
    v1::GenerateRequest parsed;
    EXPECT_EQ(ScanGenerateRequest(c.wire).ok(), parsed.ParseFromString(c.wire))
        << c.what;
  }
  const absl::Status named = ScanGenerateRequest(
      Field(11, Field(1, "user")) + Field(11, Field(3, Field(2, "\xFF"))));
  EXPECT_EQ(named.message(),
            "messages[1].tool_calls[0].name is not valid UTF-8 (byte 0)");
}

TEST(GrpcRequestScanTest, UnknownFieldsAreBounded) {
  std::string some, many;
  for (int i = 0; i < 256; ++i) some += Scalar(100, 1);
  EXPECT_TRUE(ScanGenerateRequest(some).ok());
  many = some + Scalar(101, 1);
  EXPECT_EQ(ScanGenerateRequest(many).code(),
            absl::StatusCode::kInvalidArgument);
  // Inside a message too, and a known number with the wrong wire type.
  EXPECT_EQ(ScanGenerateRequest(some + Field(11, Scalar(9, 1))).code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(ScanGenerateRequest(some + Field(3, "x")).code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(ScanTokenizeRequest(many).code(),
            absl::StatusCode::kInvalidArgument);
}

TEST(GrpcRequestScanTest, InvalidUtf8NamesTheFieldAndByte) {
  const auto message = [](const std::string& wire) {
    absl::Status s = ScanGenerateRequest(wire);
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
    return std::string(s.message());
  };
  EXPECT_EQ(message(Field(1, "ab\xFF")), "prompt is not valid UTF-8 (byte 2)");
  EXPECT_EQ(message(Field(8, "ok") + Field(8, "\xC0\x80")),
            "stop[1] is not valid UTF-8 (byte 0)");
  const std::string user = Field(1, "user") + Field(2, "hi");
  EXPECT_EQ(message(Field(11, user) +
                    Field(11, Field(1, "user") + Field(2, "\xED\xA0\x80"))),
            "messages[1].content is not valid UTF-8 (byte 0)");
  EXPECT_EQ(message(Field(11, Field(1, "\xF4\x90\x80\x80"))),
            "messages[0].role is not valid UTF-8 (byte 0)");
  absl::Status t = ScanTokenizeRequest(Field(1, "x\xE2\x82"));
  EXPECT_EQ(t.message(), "text is not valid UTF-8 (byte 1)");
}

TEST(GrpcRequestScanTest, MalformedBytesAreInternalAsBefore) {
  EXPECT_EQ(ScanGenerateRequest(std::string(64, '\xFF')).code(),
            absl::StatusCode::kInternal);
  EXPECT_EQ(ScanGenerateRequest(Field(1, "abc").substr(0, 3)).code(),
            absl::StatusCode::kInternal);
  EXPECT_EQ(ScanGenerateRequest(std::string("\x00", 1)).code(),
            absl::StatusCode::kInternal);
}

// What the scan accepts, libprotobuf parses; UTF-8 as libprotobuf checks it.
TEST(GrpcRequestScanTest, Utf8AsProtobufChecksIt) {
  for (const std::string& s :
       {std::string("plain"), std::string("\xC3\xA9"),
        std::string("\xEF\xBF\xBF"), std::string("\xF4\x8F\xBF\xBF"),
        std::string("\xC1\xBF"), std::string("\xE0\x80\x80"),
        std::string("\xED\xBF\xBF"), std::string("\xF5\x80\x80\x80"),
        std::string("\x80"), std::string("\xE2\x82")}) {
    v1::TokenizeRequest req;
    const bool parses = req.ParseFromString(Field(1, s));
    EXPECT_EQ(FirstInvalidUtf8(s) == absl::string_view::npos, parses)
        << testing::PrintToString(s);
  }
}

}  // namespace
}  // namespace shardlm
