// What an HTTP handler sees and writes: the request, the response it
// writes, the refusal a head check sends instead of reading a body, and
// the head parser every request goes through. HttpServer (http_server.h)
// runs handlers; a connection (http_connection.h) implements HttpResponse.
#ifndef SHARDLM_HTTP_HTTP_MESSAGE_H_
#define SHARDLM_HTTP_HTTP_MESSAGE_H_

#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/string_view.h"

namespace shardlm {

struct HttpRequest {
  std::string method;  // "GET", "POST", ...
  std::string path;    // Without the query string.
  std::string query;   // After '?', undecoded; may be empty.
  // Header names lower-cased, values trimmed.
  std::vector<std::pair<std::string, std::string>> headers;
  std::string body;

  // The first header of that (lower-case) name, or empty.
  std::string Header(const std::string& name) const;
};

// Writes one response. Either Send() once, or Start() then Write()s.
class HttpResponse {
 public:
  virtual ~HttpResponse() = default;
  // A whole response. False when the client is gone.
  virtual bool Send(int status, const std::string& content_type,
                    const std::string& body) = 0;
  // Starts a response streamed until the handler returns.
  virtual bool Start(int status, const std::string& content_type) = 0;
  // False once the client is gone (the handler should stop).
  virtual bool Write(const std::string& data) = 0;
  // Adds a header to the response (before Send or Start).
  virtual void AddHeader(std::string name, std::string value) = 0;
  // Whether the client has closed its side (cheap; does not block).
  virtual bool ClientGone() const = 0;
};

using HttpHandler = std::function<void(const HttpRequest&, HttpResponse&)>;

// A whole response sent in place of reading a request's body.
struct HttpRefusal {
  int status = 400;
  std::string content_type = "application/json";
  std::string body;
  std::vector<std::pair<std::string, std::string>> headers;
};

// Runs on a request's checked head before its body is read (`head.body` is
// empty); a refusal it returns is sent instead and the connection closed
// with the body unread, so that what needs no body to decide (the API key)
// costs a caller who fails it no body. Thread-safe; called concurrently.
using HttpHeadCheck =
    std::function<std::optional<HttpRefusal>(const HttpRequest& head)>;

// Parses and checks a request head (the request line and headers, without
// the blank line that ends them) into `req`: {0, ""} when it is well formed,
// else the status to answer with and why. The framing is checked too:
// Transfer-Encoding is refused (411) and every Content-Length must be the
// same run of digits (400); `body_length`, when given, gets the length
// declared (0 without one). What the server runs on every head; public for
// the fuzzer (tests/fuzz/).
std::pair<int, const char*> ParseHttpHead(absl::string_view head,
                                          HttpRequest& req,
                                          uint64_t* body_length = nullptr);

// The reason phrase of a status code ("OK", "Not Found", ...).
const char* HttpReason(int status);

}  // namespace shardlm

#endif  // SHARDLM_HTTP_HTTP_MESSAGE_H_
