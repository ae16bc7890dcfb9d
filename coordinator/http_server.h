// A small HTTP/1.1 server for the OpenAI-style API, metrics and probes
// (DESIGN.md section 6). One request per connection (the response says
// "Connection: close"), a thread per connection up to a limit, bounded
// request sizes and read timeouts. Responses are either whole (with
// Content-Length) or streamed until the connection closes (server-sent
// events). With options.tls, connections are TLS (OpenSSL; mutual TLS when
// a client CA is given): the handshake happens in the loop thread like the
// head's reading, so a client that never finishes it costs an fd only.
//
// Hostile input: the request line and headers are checked byte by byte
// (methods and header names are RFC 9110 tokens, targets visible ASCII,
// header values free of control bytes, Content-Length digits only and never
// two that differ); a handler that throws gets a 500 for its connection
// alone.
//
// Threads: one loop thread accepts connections and reads request heads for
// all of them with poll(), so an idle or slow client costs an fd, not a
// thread (up to max_pending; it is dropped after header_timeout). A whole
// head gets a thread of its own for the body, the handler and the response,
// up to max_connections; past that a few more serve probe_paths only, so
// that clients holding every connection cannot make a liveness probe
// restart a healthy server.
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
#include "absl/strings/string_view.h"
#include "coordinator/tls.h"

struct ssl_st;      // OpenSSL's SSL.
struct ssl_ctx_st;  // OpenSSL's SSL_CTX.

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

// Parses a request head (the request line and headers, without the blank
// line that ends them) into `req`: {0, ""} when it is well formed, else
// the status to answer with and why. What the server runs on every
// connection's head; public for the fuzzer (tests/fuzz/).
std::pair<int, const char*> ParseHttpHead(absl::string_view head,
                                          HttpRequest& req);

struct HttpServerOptions {
  std::string listen_address = "127.0.0.1:0";  // host:port; port 0: any.
  // Requests being handled at once (threads); beyond: 503.
  int max_connections = 256;
  // Connections still sending their request head; beyond: 503.
  int max_pending = 1024;
  size_t max_header_bytes = 64 * 1024;
  size_t max_body_bytes = 8 * 1024 * 1024;
  // A client that has not sent its request line and headers this long
  // after connecting is dropped (408), and one whose whole request takes
  // longer than read_timeout.
  std::chrono::milliseconds header_timeout{10000};
  std::chrono::milliseconds read_timeout{30000};
  // Paths still served past max_connections, on up to
  // reserved_probe_connections more threads (e.g. "/health").
  std::vector<std::string> probe_paths;
  int reserved_probe_connections = 8;
  TlsConfig tls;  // Not enabled(): plaintext.
};

// An accepted connection: its socket and, on a TLS server, its session.
struct HttpConn {
  int fd = -1;
  ssl_st* ssl = nullptr;
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
  // The loop thread: accepts, reads heads, dispatches.
  void AcceptLoop();
  // Parses the head in buf[0, head_end) and starts a thread to serve it,
  // or answers an error and closes `conn`.
  void Dispatch(HttpConn conn, std::string buf, size_t head_end,
                std::chrono::steady_clock::time_point accepted);
  // On a connection's thread: reads the body, runs the handler.
  void Serve(HttpConn conn, std::string buf, size_t head_end,
             std::chrono::steady_clock::time_point accepted, HttpRequest req);

  HttpServerOptions options_;
  HttpHandler handler_;
  ssl_ctx_st* tls_ = nullptr;  // Owned; null: plaintext.
  int listen_fd_ = -1;
  int port_ = 0;
  std::atomic<bool> stopping_{false};
  std::thread accept_thread_;
  std::mutex mu_;
  std::condition_variable idle_cv_;
  absl::flat_hash_set<int> open_fds_;  // Guarded by mu_.
  // Connection threads (detached) running, within max_connections and
  // past it (probes); guarded by mu_.
  int active_ = 0;
  int probe_active_ = 0;
};

// The reason phrase of a status code ("OK", "Not Found", ...).
const char* HttpReason(int status);

}  // namespace shardlm

#endif  // SHARDLM_COORDINATOR_HTTP_SERVER_H_
