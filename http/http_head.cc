// Request heads: parsed and checked byte by byte before the server reads a
// body or runs a handler (http_server.h).
#include <algorithm>
#include <cctype>
#include <cstring>
#include <optional>

#include "absl/strings/ascii.h"
#include "absl/strings/numbers.h"
#include "http/http_message.h"

namespace shardlm {
namespace {

// More header lines than any real client sends.
constexpr size_t kMaxHeaders = 100;

// RFC 9110 token characters (methods and header names).
bool IsTokenChar(unsigned char c) {
  return std::isalnum(c) || std::strchr("!#$%&'*+-.^_`|~", c) != nullptr;
}
bool IsToken(absl::string_view s) {
  return !s.empty() && std::all_of(s.begin(), s.end(), [](char c) {
    return c != '\0' && IsTokenChar(static_cast<unsigned char>(c));
  });
}
// A request target: visible ASCII only (no spaces, controls or raw bytes
// over 0x7e; anything else must be percent-encoded).
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

// Parses the request line and headers in `head` (up to the blank line).
// The status to answer with on failure, and why.
std::pair<int, const char*> ParseHead(absl::string_view head,
                                      HttpRequest& req) {
  size_t eol = head.find("\r\n");
  const absl::string_view line = head.substr(0, eol);
  const size_t sp1 = line.find(' ');
  const size_t sp2 = line.rfind(' ');
  if (sp1 == absl::string_view::npos || sp2 == sp1) {
    return {400, "malformed request line"};
  }
  const absl::string_view method = line.substr(0, sp1);
  const absl::string_view target = line.substr(sp1 + 1, sp2 - sp1 - 1);
  const absl::string_view version = line.substr(sp2 + 1);
  if (!IsToken(method)) return {400, "malformed method"};
  if (version != "HTTP/1.1" && version != "HTTP/1.0") {
    return {505, "only HTTP/1.0 and HTTP/1.1 are served"};
  }
  if (target.empty() || target[0] != '/' || !IsTarget(target)) {
    return {400, "malformed request target"};
  }
  req.method = std::string(method);
  req.path = std::string(target);
  if (const size_t q = req.path.find('?'); q != std::string::npos) {
    req.query = req.path.substr(q + 1);
    req.path.resize(q);
  }
  while (eol != absl::string_view::npos && eol + 2 < head.size()) {
    const size_t start = eol + 2;
    eol = head.find("\r\n", start);
    const absl::string_view h =
        head.substr(start, eol == absl::string_view::npos ? head.size() - start
                                                          : eol - start);
    if (h.empty()) break;
    const size_t colon = h.find(':');
    if (colon == absl::string_view::npos || !IsToken(h.substr(0, colon))) {
      return {400, "malformed header line"};
    }
    const absl::string_view value = h.substr(colon + 1);
    if (!IsFieldValue(value)) return {400, "control bytes in a header value"};
    req.headers.emplace_back(absl::AsciiStrToLower(h.substr(0, colon)),
                             std::string(absl::StripAsciiWhitespace(value)));
  }
  if (req.headers.size() > kMaxHeaders) return {431, "too many header lines"};
  return {0, ""};
}

// The body length the headers declare: absent is 0; every Content-Length
// must be the same run of digits (a request smuggler's favourite is two
// that differ). -1 when malformed.
int64_t ContentLength(const HttpRequest& req) {
  std::optional<absl::string_view> seen;
  for (const auto& [name, value] : req.headers) {
    if (name != "content-length") continue;
    if (value.empty() || value.size() > 18 ||
        !std::all_of(value.begin(), value.end(), absl::ascii_isdigit) ||
        (seen.has_value() && *seen != value)) {
      return -1;
    }
    seen = value;
  }
  int64_t n = 0;
  if (seen.has_value() && !absl::SimpleAtoi(*seen, &n)) return -1;
  return n;
}

}  // namespace

std::pair<int, const char*> ParseHttpHead(absl::string_view head,
                                          HttpRequest& req,
                                          uint64_t* body_length) {
  if (const auto parsed = ParseHead(head, req); parsed.first != 0) {
    return parsed;
  }
  if (std::any_of(req.headers.begin(), req.headers.end(), [](const auto& h) {
        return h.first == "transfer-encoding";
      })) {
    return {411,
            "chunked request bodies are not supported; send "
            "Content-Length"};
  }
  const int64_t length = ContentLength(req);
  if (length < 0) return {400, "bad Content-Length"};
  if (body_length != nullptr) *body_length = static_cast<uint64_t>(length);
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
