// Request heads: parsed by Boost.Beast's HTTP/1 parser (the request line,
// the header fields, the framing), then checked for what this server
// serves, before the server reads a body or runs a handler
// (http_server.h). Beast is kept here, in one file: nothing else includes
// it.
#include <algorithm>
#include <cstdint>
#include <limits>
#include <optional>

#include "absl/strings/ascii.h"
#include "boost/beast/core/buffers_prefix.hpp"
#include "boost/beast/http/basic_parser.hpp"
#include "boost/beast/http/error.hpp"
#include "http/http_message.h"

namespace shardlm {
namespace {

namespace http = boost::beast::http;
using boost::beast::error_code;
using boost::beast::string_view;

// More header lines than any real client sends.
constexpr size_t kMaxHeaders = 100;

absl::string_view View(string_view s) { return {s.data(), s.size()}; }

// A request target: visible ASCII only (no spaces, controls or raw bytes
// over 0x7e; anything else must be percent-encoded). Beast's grammar lets
// obs-text (bytes >= 0x80) through.
bool IsTarget(absl::string_view s) {
  return std::all_of(s.begin(), s.end(), [](char c) {
    return static_cast<unsigned char>(c) > 0x20 &&
           static_cast<unsigned char>(c) < 0x7f;
  });
}
// A header value: no control characters but tab (obs-text, bytes >= 0x80,
// is allowed as RFC 9110 says; handlers must not assume UTF-8).
bool IsFieldValue(absl::string_view s) {
  return std::all_of(s.begin(), s.end(), [](char c) {
    const auto u = static_cast<unsigned char>(c);
    return u == '\t' || (u >= 0x20 && u != 0x7f);
  });
}

// Beast's request parser with its callbacks filling an HttpRequest; it
// stops after the head (no body is given to it). What Beast's grammar
// accepts and this server does not serve (other versions, targets not in
// origin form, control bytes) is refused in the callbacks, which set
// `refusal` and stop the parse.
class HeadParser : public http::basic_parser<true> {
 public:
  explicit HeadParser(HttpRequest& req) : req_(req) {}

  // Set when a callback refused what it saw; else the parse error decides.
  std::optional<std::pair<int, const char*>> refusal;
  bool request_line_done = false;

 private:
  void on_request_impl(http::verb, string_view method, string_view target,
                       int version, error_code& ec) override {
    request_line_done = true;
    if (version != 11 && version != 10) {
      return Refuse(505, "only HTTP/1.0 and HTTP/1.1 are served", ec);
    }
    if (target.empty() || target[0] != '/' || !IsTarget(View(target))) {
      return Refuse(400, "malformed request target", ec);
    }
    req_.method = std::string(View(method));
    req_.path = std::string(View(target));
    if (const size_t q = req_.path.find('?'); q != std::string::npos) {
      req_.query = req_.path.substr(q + 1);
      req_.path.resize(q);
    }
  }
  void on_field_impl(http::field, string_view name, string_view value,
                     error_code& ec) override {
    if (!IsFieldValue(View(value))) {
      return Refuse(400, "control bytes in a header value", ec);
    }
    if (req_.headers.size() == kMaxHeaders) {
      return Refuse(431, "too many header lines", ec);
    }
    req_.headers.emplace_back(
        absl::AsciiStrToLower(View(name)),
        std::string(absl::StripAsciiWhitespace(View(value))));
  }
  void on_header_impl(error_code&) override {}
  void on_body_init_impl(const boost::optional<std::uint64_t>&,
                         error_code&) override {}
  std::size_t on_body_impl(string_view body, error_code&) override {
    return body.size();
  }
  void on_chunk_header_impl(std::uint64_t, string_view, error_code&) override {}
  std::size_t on_chunk_body_impl(std::uint64_t, string_view body,
                                 error_code&) override {
    return body.size();
  }
  void on_finish_impl(error_code&) override {}
  // The response callback of the base; a request parser never calls it.
  void on_response_impl(int, string_view, int, error_code&) override {}

  void Refuse(int status, const char* why, error_code& ec) {
    refusal = {status, why};
    ec = http::error::bad_value;  // Any error: it stops the parse.
  }

  HttpRequest& req_;
};

// The status and reason for a parse error Beast reported.
std::pair<int, const char*> ForParseError(const error_code& ec,
                                          bool request_line_done) {
  if (ec == http::error::bad_version) {
    return {505, "only HTTP/1.0 and HTTP/1.1 are served"};
  }
  if (ec == http::error::bad_method) return {400, "malformed method"};
  if (ec == http::error::bad_target) return {400, "malformed request target"};
  if (ec == http::error::bad_content_length) return {400, "bad Content-Length"};
  if (ec == http::error::bad_transfer_encoding) {
    // Two Transfer-Encodings, or one beside a Content-Length.
    return {411,
            "chunked request bodies are not supported; send "
            "Content-Length"};
  }
  if (ec == http::error::bad_value) {
    return {400, "control bytes in a header value"};
  }
  if (ec == http::error::header_limit)
    return {431, "request headers too large"};
  return {400, request_line_done ? "malformed header line"
                                 : "malformed request line"};
}

}  // namespace

std::pair<int, const char*> ParseHttpHead(absl::string_view head,
                                          HttpRequest& req,
                                          uint64_t* body_length) {
  // The server found the blank line that ends the head and bounded its
  // size (max_header_bytes): Beast gets the head with it, and no limit of
  // its own.
  std::string bytes(head);
  bytes += "\r\n\r\n";
  HeadParser parser(req);
  parser.header_limit(std::numeric_limits<std::uint32_t>::max());
  parser.body_limit(std::numeric_limits<std::uint64_t>::max());
  parser.eager(false);  // Stop after the head.
  error_code ec;
  parser.put(boost::asio::buffer(bytes), ec);
  if (parser.refusal.has_value()) return *parser.refusal;
  if (ec || !parser.is_header_done()) {
    return ForParseError(ec, parser.request_line_done);
  }
  if (std::any_of(req.headers.begin(), req.headers.end(), [](const auto& h) {
        return h.first == "transfer-encoding";
      })) {
    return {411,
            "chunked request bodies are not supported; send "
            "Content-Length"};
  }
  if (body_length != nullptr) {
    *body_length = parser.content_length().value_or(0);
  }
  return {0, ""};
}

const char* HttpReason(int status) {
  switch (status) {
    case 200:
      return "OK";
    case 400:
      return "Bad Request";
    case 401:
      return "Unauthorized";
    case 404:
      return "Not Found";
    case 405:
      return "Method Not Allowed";
    case 408:
      return "Request Timeout";
    case 411:
      return "Length Required";
    case 413:
      return "Payload Too Large";
    case 429:
      return "Too Many Requests";
    case 431:
      return "Request Header Fields Too Large";
    case 499:
      return "Client Closed Request";
    case 500:
      return "Internal Server Error";
    case 501:
      return "Not Implemented";
    case 503:
      return "Service Unavailable";
    case 504:
      return "Gateway Timeout";
    case 505:
      return "HTTP Version Not Supported";
  }
  return "Unknown";
}

std::string HttpRequest::Header(const std::string& name) const {
  for (const auto& [k, v] : headers) {
    if (k == name) return v;
  }
  return "";
}

}  // namespace shardlm
