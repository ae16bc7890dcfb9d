// The HTTP/1.1 server of the OpenAI-style API, metrics and probes (DESIGN.md
// section 6), behind this small interface. The server is ours end to end
// (cpp-httplib, which framed requests until issue 42, is gone; the bytes on
// the wire did not change: docs/design-notes.md section 6):
//
// - One loop thread accepts, runs TLS handshakes and reads every request
//   head with poll(), so an idle, keep-alive or slow client costs an fd, not
//   a thread (up to max_pending; a head must be whole within
//   header_timeout, an idle keep-alive connection is closed after
//   keep_alive_timeout).
// - A whole head is checked byte by byte (ParseHttpHead): methods and
//   header names are RFC 9110 tokens, targets visible ASCII, header values
//   free of control bytes, Content-Length digits only and never two that
//   differ, Transfer-Encoding refused. Handlers see the checked original.
// - Before a body is read, options.head_check may refuse the request from
//   its head (the API key), and its share of options.memory_budget is
//   taken: a request refused there costs no body.
// - Whole heads run on a bounded pool of threads (http/http_pool.h),
//   up to max_connections; past that up to reserved_probe_connections more
//   serve probe_paths only, so that clients holding every API thread cannot
//   make a liveness probe restart a healthy server. That thread reads the
//   body (Content-Length, Expect: 100-continue) and writes the response
//   (Content-Length; streams chunked for HTTP/1.1, close-delimited for
//   HTTP/1.0; keep-alive). A handler runs on a thread of a second pool of
//   the same bound, so that it can push a stream while the connection
//   thread writes it. Threads above a base exit when idle.
// - A handler that throws gets a 500 for its request alone.
//
// With options.tls, connections are TLS (our OpenSSL context; mutual TLS
// when a client CA is given).
//
// Thread-safety: Start, port and Shutdown may be called from any thread;
// handlers run concurrently, one thread each.
#ifndef SHARDLM_HTTP_HTTP_SERVER_H_
#define SHARDLM_HTTP_HTTP_SERVER_H_

#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "http/http_message.h"
#include "http/memory_budget.h"
#include "http/tls.h"

namespace shardlm {

struct HttpServerOptions {
  std::string listen_address = "127.0.0.1:0";  // host:port; port 0: any.
  // Requests being handled at once (pool threads); beyond: 503.
  int max_connections = 256;
  // Connections waiting for a request head (new or kept alive); beyond: a
  // new one gets 503.
  int max_pending = 1024;
  size_t max_header_bytes = 64 * 1024;      // Beyond: 431.
  size_t max_body_bytes = 8 * 1024 * 1024;  // Beyond: 413, before reading.
  // A head not whole this long after the connection opened (or after its
  // first byte, on a kept-alive connection) is answered 408; a connection
  // that sent nothing by then is closed.
  std::chrono::milliseconds header_timeout{10000};
  // A request whose body is not in this long after its head began: 408.
  std::chrono::milliseconds read_timeout{30000};
  // A client that takes no response bytes for this long is dropped (a
  // stream's handler then sees ClientGone()).
  std::chrono::milliseconds write_timeout{30000};
  // Keep-alive: an idle connection is closed after keep_alive_timeout, and
  // every connection after max_requests_per_connection requests (the last
  // response says "Connection: close").
  std::chrono::milliseconds keep_alive_timeout{5000};
  int max_requests_per_connection = 100;
  // Paths still served past max_connections, on up to
  // reserved_probe_connections more threads (e.g. "/health").
  std::vector<std::string> probe_paths;
  int reserved_probe_connections = 8;
  TlsConfig tls;  // Not enabled(): plaintext.
  // When set (not owned; outlives the server), a request's body is charged
  // to it before it is read (kBodyChargeFactor times its declared length);
  // a body that does not fit is answered 429 with Retry-After and its
  // connection closed unread.
  MemoryBudget* memory_budget = nullptr;
  // Run on the head of each request that declares a body (see
  // HttpHeadCheck); none when empty.
  HttpHeadCheck head_check;
  // Pool threads kept however long they idle; those above it exit after
  // idle_thread_timeout without work, so that a burst's threads do not
  // stay for good.
  int base_threads = 4;
  std::chrono::milliseconds idle_thread_timeout{10000};
};

// What a body costs while it is served, per byte of it: the bytes as read,
// and the handler's copy of them.
inline constexpr int64_t kBodyChargeFactor = 2;

class HttpServer {
 public:
  // Binds and starts accepting. Unavailable naming the address when it
  // cannot bind; InvalidArgument for a malformed address or bad TLS files.
  static absl::StatusOr<std::unique_ptr<HttpServer>> Start(
      HttpServerOptions options, HttpHandler handler);
  ~HttpServer();
  HttpServer(const HttpServer&) = delete;
  HttpServer& operator=(const HttpServer&) = delete;

  int port() const;
  // Stops accepting, closes open connections (streaming handlers see their
  // writes fail) and joins every thread. Idempotent.
  void Shutdown();

  // Threads the server runs now (loop, connection and handler threads);
  // for tests that check idle clients cost none.
  int threads() const;
  // Waits until no request is being served and every connection and
  // handler thread is back waiting for work (a client can read its answer
  // before the thread that wrote it is done); false after `timeout`. For
  // tests that count threads.
  bool WaitUntilIdle(std::chrono::milliseconds timeout);

 private:
  class Impl;
  explicit HttpServer(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

// An HttpServer on options.listen_address serving `api` (not owned; any
// type with CheckHead and Handle: OpenAiApi, the router's RouterHttpApi).
// Requests without the key are refused before their body is read, and the
// probes and metrics keep answering when API clients hold every thread.
template <typename Api>
absl::StatusOr<std::unique_ptr<HttpServer>> StartApiHttp(
    Api* api, HttpServerOptions options) {
  if (options.probe_paths.empty()) {
    options.probe_paths = {"/health", "/ready", "/metrics"};
  }
  options.head_check = [api](const HttpRequest& head) {
    return api->CheckHead(head);
  };
  return HttpServer::Start(std::move(options),
                           [api](const HttpRequest& req, HttpResponse& res) {
                             api->Handle(req, res);
                           });
}

}  // namespace shardlm

#endif  // SHARDLM_HTTP_HTTP_SERVER_H_
