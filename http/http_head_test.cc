// The head parser alone (ParseHttpHead: Boost.Beast's grammar plus what
// this server serves), case by case: the status each head gets, what a
// well-formed head yields, and the framing (the body length declared).
#include <cstdint>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "http/http_message.h"

namespace shardlm {
namespace {

int Status(const std::string& head, uint64_t* length = nullptr) {
  HttpRequest req;
  return ParseHttpHead(head, req, length).first;
}

TEST(HttpHeadTest, AWellFormedHeadYieldsItsParts) {
  HttpRequest req;
  uint64_t length = 7;
  const auto [status, why] = ParseHttpHead(
      "POST /v1/completions?stream=1 HTTP/1.1\r\nHost: x\r\n"
      "Content-Type:  application/json \r\nContent-Length: 12\r\n"
      "X-Bytes: \xff\xfe",
      req, &length);
  ASSERT_EQ(status, 0) << why;
  EXPECT_EQ(req.method, "POST");
  EXPECT_EQ(req.path, "/v1/completions");
  EXPECT_EQ(req.query, "stream=1");
  // Names lower-cased, values trimmed, obs-text kept as bytes.
  EXPECT_EQ(req.Header("content-type"), "application/json");
  EXPECT_EQ(req.Header("x-bytes"), "\xff\xfe");
  EXPECT_EQ(req.headers.size(), 4u);
  EXPECT_EQ(length, 12u);
  ASSERT_EQ(Status("GET /health HTTP/1.0", &length), 0);
  EXPECT_EQ(length, 0u);  // No Content-Length: no body.
}

TEST(HttpHeadTest, MalformedHeadsGetTheirStatus) {
  const std::vector<std::pair<std::string, int>> cases = {
      {"", 400},
      {"GET", 400},
      {"NONSENSE", 400},
      {"G\x01T / HTTP/1.1", 400},
      {"\xff\xfe /v1/models HTTP/1.1", 400},
      {"GET /\xff HTTP/1.1", 400},            // Raw bytes in the target.
      {"GET /health\x7f HTTP/1.1", 400},      // DEL.
      {"GET http://x/health HTTP/1.1", 400},  // Absolute form.
      {"OPTIONS * HTTP/1.1", 400},            // Asterisk form.
      {"GET nopath HTTP/1.1", 400},
      {"GET / HTTP/2.0", 505},
      {"GET / HTTP/\xff", 505},
      {"GET / HTTP/1.1\r\nno colon", 400},
      {"GET / HTTP/1.1\r\nBad Name: x", 400},
      {"GET / HTTP/1.1\r\n\xff: x", 400},
      {"GET / HTTP/1.1\r\nX-A: a\x01"
       "b",
       400},
      {"GET / HTTP/1.1\r\nX-A: a\nInjected: b", 400},  // A bare LF.
      {"POST / HTTP/1.1\r\nContent-Length: x", 400},
      {"POST / HTTP/1.1\r\nContent-Length: -1", 400},
      {"POST / HTTP/1.1\r\nContent-Length: +2", 400},
      {"POST / HTTP/1.1\r\nContent-Length: " + std::string(30, '9'), 400},
      // Smuggling: two lengths that differ, in two fields or one list.
      {"POST / HTTP/1.1\r\nContent-Length: 2\r\nContent-Length: 3", 400},
      {"POST / HTTP/1.1\r\nContent-Length: 2, 3", 400},
      // No chunked bodies, and no Transfer-Encoding of any kind.
      {"POST / HTTP/1.1\r\nTransfer-Encoding: chunked", 411},
      {"POST / HTTP/1.1\r\nTransfer-Encoding: gzip", 411},
      {"POST / HTTP/1.1\r\nContent-Length: 2\r\nTransfer-Encoding: chunked",
       411},
  };
  for (const auto& [head, status] : cases) {
    EXPECT_EQ(Status(head), status) << head;
  }
}

TEST(HttpHeadTest, HeaderLinesAreCounted) {
  std::string head = "GET / HTTP/1.1";
  for (int i = 0; i < 100; ++i) head += "\r\nX-A: b";
  EXPECT_EQ(Status(head), 0);
  EXPECT_EQ(Status(head + "\r\nX-A: b"), 431);
}

// RFC 9110 8.6: the same length repeated (in fields or a list) is one
// length; Beast takes it, and so does the server.
TEST(HttpHeadTest, ARepeatedEqualContentLengthIsOneLength) {
  uint64_t length = 0;
  EXPECT_EQ(Status("POST / HTTP/1.1\r\nContent-Length: 2\r\n"
                   "Content-Length: 2",
                   &length),
            0);
  EXPECT_EQ(length, 2u);
  EXPECT_EQ(Status("POST / HTTP/1.1\r\nContent-Length: 5, 5", &length), 0);
  EXPECT_EQ(length, 5u);
}

}  // namespace
}  // namespace shardlm
