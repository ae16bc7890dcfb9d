// A small HTTP/1.1 server for the OpenAI-style API, metrics and probes
// (DESIGN.md section 6). One request per connection (the response says
// "Connection: close"), a thread per connection up to a limit, bounded
// request sizes and read timeouts. Responses are either whole (with
// Content-Length) or streamed until the connection closes (server-sent
// events). No TLS: put a proxy in front for that.
#ifndef SHARDLM_COORDINATOR_HTTP_SERVER_H_
#define SHARDLM_COORDINATOR_HTTP_SERVER_H_

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "absl/container/flat_hash_set.h"
#include "absl/status/statusor.h"

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

struct HttpServerOptions {
  std::string listen_address = "127.0.0.1:0";  // host:port; port 0: any.
  int max_connections = 256;                   // Beyond: 503 at once.
  size_t max_header_bytes = 64 * 1024;
  size_t max_body_bytes = 8 * 1024 * 1024;
  // A client that sends its request slower than this is dropped (408).
  std::chrono::milliseconds read_timeout{30000};
};

class HttpServer {
 public:
  // Binds and starts accepting. Unavailable naming the address when it
  // cannot bind; InvalidArgument for a malformed address.
  static absl::StatusOr<std::unique_ptr<HttpServer>> Start(
      HttpServerOptions options, HttpHandler handler);
  ~HttpServer();
  HttpServer(const HttpServer&) = delete;
  HttpServer& operator=(const HttpServer&) = delete;

  int port() const { return port_; }
  // Stops accepting, closes open connections (streaming handlers see their
  // writes fail) and joins every thread. Idempotent.
  void Shutdown();

 private:
  HttpServer(HttpServerOptions options, HttpHandler handler)
      : options_(std::move(options)), handler_(std::move(handler)) {}
  void AcceptLoop();
  void Serve(int fd);

  HttpServerOptions options_;
  HttpHandler handler_;
  int listen_fd_ = -1;
  int port_ = 0;
  std::atomic<bool> stopping_{false};
  std::thread accept_thread_;
  std::mutex mu_;
  std::condition_variable idle_cv_;
  absl::flat_hash_set<int> open_fds_;  // Guarded by mu_.
  int active_ = 0;  // Connection threads (detached) running; guarded by mu_.
};

// The reason phrase of a status code ("OK", "Not Found", ...).
const char* HttpReason(int status);

}  // namespace shardlm

#endif  // SHARDLM_COORDINATOR_HTTP_SERVER_H_
