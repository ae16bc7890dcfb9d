#include "coordinator/http_server.h"

// With the flags of Debian's cpp-httplib.pc (CPPHTTPLIB_OPENSSL_SUPPORT,
// ..._ZLIB_..., ..._BROTLI_...): the split library was built with them, and
// its classes' layout depends on them.
#include <arpa/inet.h>
#include <fcntl.h>
#include <httplib.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <openssl/err.h>
#include <openssl/ssl.h>
#include <poll.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <condition_variable>
#include <cstdio>
#include <cstring>
#include <deque>
#include <mutex>
#include <system_error>
#include <thread>

#include "absl/container/flat_hash_set.h"
#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "coordinator/http_pool.h"

namespace shardlm {
namespace {

using Clock = std::chrono::steady_clock;

// A handler's streamed bytes not yet taken by the client; past this its
// Write() waits (backpressure instead of memory).
constexpr size_t kMaxQueuedStreamBytes = 1 << 20;

// The methods httplib 0.11.4 routes; any other token is answered 501.
bool IsServedMethod(absl::string_view m) {
  return m == "GET" || m == "HEAD" || m == "POST" || m == "PUT" ||
         m == "DELETE" || m == "OPTIONS" || m == "PATCH";
}

// Both pools: every thread a request may need, trimmed to the base when
// idle.
HttpPoolOptions PoolOptions(const HttpServerOptions& options) {
  return {.max_threads =
              options.max_connections + options.reserved_probe_connections,
          .base_threads = options.base_threads,
          .idle_timeout = absl::FromChrono(options.idle_thread_timeout)};
}

std::string ErrorBody(int status, absl::string_view message) {
  return absl::StrCat("{\"error\":{\"message\":\"", message,
                      "\",\"type\":\"invalid_request_error\",\"code\":", status,
                      "}}");
}

// An accepted connection: its socket (non-blocking) and, on a TLS server,
// its session.
struct HttpConn {
  int fd = -1;
  SSL* ssl = nullptr;
};

// Ends the session (a close_notify, best effort) and closes the socket.
void CloseConn(HttpConn& conn) {
  if (conn.ssl != nullptr) {
    SSL_shutdown(conn.ssl);
    SSL_free(conn.ssl);
    conn.ssl = nullptr;
    ERR_clear_error();
  }
  if (conn.fd >= 0) ::close(conn.fd);
  conn.fd = -1;
}

// Waits until `fd` has `events` or `deadline` passes; false on timeout.
bool WaitFor(int fd, short events, Clock::time_point deadline) {
  while (true) {
    const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
        deadline - Clock::now());
    if (left.count() <= 0) return false;
    pollfd p{.fd = fd, .events = events};
    const int r = ::poll(&p, 1, static_cast<int>(left.count()) + 1);
    if (r > 0) return true;
    if (r < 0 && errno != EINTR) return true;  // Let the I/O call fail.
  }
}

// Up to n bytes without waiting: how many (> 0), 0 when the peer closed, -1
// on an error, -2 when nothing is there yet; for TLS, -3 when the session
// needs to write first.
ssize_t ReceiveNow(const HttpConn& conn, char* buf, size_t n) {
  if (conn.ssl == nullptr) {
    while (true) {
      const ssize_t r = ::recv(conn.fd, buf, n, 0);
      if (r >= 0) return r;
      if (errno == EINTR) continue;
      return errno == EAGAIN || errno == EWOULDBLOCK ? -2 : -1;
    }
  }
  const int r = SSL_read(conn.ssl, buf, static_cast<int>(n));
  if (r > 0) return r;
  switch (SSL_get_error(conn.ssl, r)) {
    case SSL_ERROR_WANT_READ:
      return -2;
    case SSL_ERROR_WANT_WRITE:
      return -3;
    case SSL_ERROR_ZERO_RETURN:
      return 0;
    default:
      ERR_clear_error();
      return -1;
  }
}

// Writes without waiting: bytes written (> 0), -2 when the socket is full
// (-3: a TLS session must read first), -1 on an error.
ssize_t SendNow(const HttpConn& conn, const char* data, size_t n) {
  if (conn.ssl == nullptr) {
    while (true) {
      const ssize_t w = ::send(conn.fd, data, n, MSG_NOSIGNAL);
      if (w > 0) return w;
      if (w < 0 && errno == EINTR) continue;
      return w < 0 && (errno == EAGAIN || errno == EWOULDBLOCK) ? -2 : -1;
    }
  }
  const int w =
      SSL_write(conn.ssl, data, static_cast<int>(std::min<size_t>(n, 1 << 30)));
  if (w > 0) return w;
  switch (SSL_get_error(conn.ssl, w)) {
    case SSL_ERROR_WANT_WRITE:
      return -2;
    case SSL_ERROR_WANT_READ:
      return -3;
    default:
      ERR_clear_error();
      return -1;
  }
}

// A refusal written from the loop thread before any thread is spent on the
// connection: best effort, never waits (a client that does not read it
// loses it).
// `extra_headers`: whole lines, each ending in CRLF.
void SendRefusal(const HttpConn& conn, int status, absl::string_view why,
                 absl::string_view extra_headers = "") {
  const std::string body = ErrorBody(status, why);
  const std::string all = absl::StrCat(
      "HTTP/1.1 ", status, " ", HttpReason(status),
      "\r\nContent-Type: application/json\r\nConnection: close\r\n",
      extra_headers, "Content-Length: ", body.size(), "\r\n\r\n", body);
  size_t done = 0;
  while (done < all.size()) {
    const ssize_t w = SendNow(conn, all.data() + done, all.size() - done);
    if (w <= 0) return;
    done += static_cast<size_t>(w);
  }
}

// Sends `refusal` on a connection whose request body is left unread, then
// closes its sending side and reads (discarding) what the client still
// sends for up to a second: closing at once with bytes unread would make the
// kernel reset the connection, and the client could lose the answer.
void RefuseUnread(const HttpConn& conn, const HttpRefusal& refusal) {
  std::string all = absl::StrCat(
      "HTTP/1.1 ", refusal.status, " ", HttpReason(refusal.status),
      "\r\nContent-Type: ", refusal.content_type, "\r\nConnection: close\r\n");
  for (const auto& [name, value] : refusal.headers) {
    absl::StrAppend(&all, name, ": ", value, "\r\n");
  }
  absl::StrAppend(&all, "Content-Length: ", refusal.body.size(), "\r\n\r\n",
                  refusal.body);
  const auto deadline = Clock::now() + std::chrono::seconds(1);
  size_t done = 0;
  while (done < all.size()) {
    const ssize_t w = SendNow(conn, all.data() + done, all.size() - done);
    if (w > 0) {
      done += static_cast<size_t>(w);
    } else if (w == -1 ||
               !WaitFor(conn.fd, w == -2 ? POLLOUT : POLLIN, deadline)) {
      return;
    }
  }
  if (conn.ssl != nullptr) SSL_shutdown(conn.ssl);
  ::shutdown(conn.fd, SHUT_WR);
  char sink[16384];
  while (true) {
    const ssize_t n = ReceiveNow(conn, sink, sizeof(sink));
    if (n == 0 || n == -1) return;
    if (n < 0 && !WaitFor(conn.fd, n == -2 ? POLLIN : POLLOUT, deadline)) {
      return;
    }
  }
}

// "1.2.3.4" and 80 for a socket address.
void AddressOf(const sockaddr_storage& a, socklen_t len, std::string& ip,
               int& port) {
  char host[NI_MAXHOST];
  char serv[NI_MAXSERV];
  if (::getnameinfo(reinterpret_cast<const sockaddr*>(&a), len, host,
                    sizeof(host), serv, sizeof(serv),
                    NI_NUMERICHOST | NI_NUMERICSERV) == 0) {
    ip = host;
    port = std::atoi(serv);
  }
}

// httplib's view of one connection for one request: first the bytes the
// loop thread already has (the normalised head, then whatever of the body
// came with it), then the socket, with a deadline for reading the request
// and a timeout on each write. Bytes past the request stay buffered for the
// next one (pipelining).
class ConnStream final : public httplib::Stream {
 public:
  ConnStream(HttpConn conn, std::string buffered,
             Clock::time_point read_deadline,
             std::chrono::milliseconds write_timeout)
      : conn_(conn),
        buf_(std::move(buffered)),
        read_deadline_(read_deadline),
        write_timeout_(write_timeout) {}

  bool is_readable() const override {
    return pos_ < buf_.size() ||
           (conn_.ssl != nullptr && SSL_pending(conn_.ssl) > 0);
  }
  bool is_writable() const override {
    pollfd p{.fd = conn_.fd, .events = POLLOUT};
    return !write_failed_ && ::poll(&p, 1, 0) > 0 && (p.revents & POLLOUT) != 0;
  }
  ssize_t read(char* ptr, size_t size) override {
    if (pos_ == buf_.size() && !Fill()) return -1;
    const size_t n = std::min(size, buf_.size() - pos_);
    std::memcpy(ptr, buf_.data() + pos_, n);
    pos_ += n;
    consumed_ += n;
    return static_cast<ssize_t>(n);
  }
  ssize_t write(const char* ptr, size_t size) override {
    size_t done = 0;
    auto deadline = Clock::now() + write_timeout_;
    while (done < size && !write_failed_) {
      const ssize_t w = SendNow(conn_, ptr + done, size - done);
      if (w > 0) {
        done += static_cast<size_t>(w);
        deadline = Clock::now() + write_timeout_;
      } else if (w == -1 ||
                 !WaitFor(conn_.fd, w == -2 ? POLLOUT : POLLIN, deadline)) {
        write_failed_ = true;  // Gone, or took nothing for write_timeout.
      }
    }
    return write_failed_ ? -1 : static_cast<ssize_t>(size);
  }
  void get_remote_ip_and_port(std::string& ip, int& port) const override {
    sockaddr_storage a{};
    socklen_t len = sizeof(a);
    if (::getpeername(conn_.fd, reinterpret_cast<sockaddr*>(&a), &len) == 0) {
      AddressOf(a, len, ip, port);
    }
  }
  void get_local_ip_and_port(std::string& ip, int& port) const override {
    sockaddr_storage a{};
    socklen_t len = sizeof(a);
    if (::getsockname(conn_.fd, reinterpret_cast<sockaddr*>(&a), &len) == 0) {
      AddressOf(a, len, ip, port);
    }
  }
  // httplib reads this only to refuse fds its select()-based streams
  // cannot wait on (past FD_SETSIZE); this stream polls, so such an fd is
  // not reported.
  socket_t socket() const override {
    return conn_.fd < FD_SETSIZE ? conn_.fd : INVALID_SOCKET;
  }

  size_t consumed() const { return consumed_; }
  bool read_timed_out() const { return read_timed_out_; }
  // A read or a write failed (or timed out): the connection is done.
  bool failed() const { return read_failed_ || write_failed_; }
  std::string TakeLeftover() { return buf_.substr(pos_); }

 private:
  // Appends what the socket has (waiting up to the read deadline); false
  // on close, error or timeout.
  bool Fill() {
    buf_.clear();
    pos_ = 0;
    char chunk[16384];
    while (!read_failed_) {
      const ssize_t n = ReceiveNow(conn_, chunk, sizeof(chunk));
      if (n > 0) {
        buf_.assign(chunk, static_cast<size_t>(n));
        return true;
      }
      if (n == 0 || n == -1) {
        read_failed_ = true;
      } else if (!WaitFor(conn_.fd, n == -2 ? POLLIN : POLLOUT,
                          read_deadline_)) {
        read_failed_ = read_timed_out_ = true;
      }
    }
    return false;
  }

  HttpConn conn_;
  std::string buf_;
  size_t pos_ = 0;
  size_t consumed_ = 0;
  const Clock::time_point read_deadline_;
  const std::chrono::milliseconds write_timeout_;
  bool read_failed_ = false;
  bool write_failed_ = false;
  bool read_timed_out_ = false;
};

// One request's response between the handler (on a handler thread, which
// pushes) and httplib (on the connection thread, which pulls).
struct Exchange {
  Exchange(int fd, const std::atomic<bool>* stopping)
      : fd(fd), stopping(stopping) {}
  enum class State { kUnanswered, kWhole, kStreamed };

  const int fd;  // For ClientGone's poll only.
  const std::atomic<bool>* const stopping;
  HttpRequest request;
  std::mutex mu;
  std::condition_variable cv;
  // Guarded by mu.
  State state = State::kUnanswered;
  int status = 0;
  std::string content_type;
  std::string body;  // Of a whole response.
  std::vector<std::pair<std::string, std::string>> headers;
  std::string queued;         // Streamed bytes not yet written.
  bool handler_done = false;  // The handler returned (or threw).
  bool writer_gone = false;   // httplib stopped writing: client gone.

  bool Stopping() const { return stopping->load(); }
};

// The handler's side of an Exchange.
class BridgeResponse : public HttpResponse {
 public:
  explicit BridgeResponse(Exchange& ex) : ex_(ex) {}

  bool Send(int status, const std::string& content_type,
            const std::string& body) override {
    std::lock_guard<std::mutex> lock(ex_.mu);
    if (ex_.state != Exchange::State::kUnanswered) return false;
    ex_.state = Exchange::State::kWhole;
    ex_.status = status;
    ex_.content_type = content_type;
    ex_.body = body;
    ex_.cv.notify_all();
    return !ex_.writer_gone;
  }
  bool Start(int status, const std::string& content_type) override {
    std::lock_guard<std::mutex> lock(ex_.mu);
    if (ex_.state != Exchange::State::kUnanswered) return false;
    ex_.state = Exchange::State::kStreamed;
    ex_.status = status;
    ex_.content_type = content_type;
    ex_.cv.notify_all();
    return !ex_.writer_gone;
  }
  bool Write(const std::string& data) override {
    std::unique_lock<std::mutex> lock(ex_.mu);
    if (ex_.state != Exchange::State::kStreamed) return false;
    while (ex_.queued.size() > kMaxQueuedStreamBytes && !ex_.writer_gone &&
           !ex_.Stopping()) {
      ex_.cv.wait_for(lock, std::chrono::milliseconds(100));
    }
    if (ex_.writer_gone || ex_.Stopping()) return false;
    ex_.queued += data;
    ex_.cv.notify_all();
    return true;
  }
  void AddHeader(std::string name, std::string value) override {
    std::lock_guard<std::mutex> lock(ex_.mu);
    if (ex_.state == Exchange::State::kUnanswered) {
      ex_.headers.emplace_back(std::move(name), std::move(value));
    }
  }
  bool ClientGone() const override {
    {
      std::lock_guard<std::mutex> lock(ex_.mu);
      if (ex_.writer_gone) return true;
    }
    if (ex_.Stopping()) return true;
    pollfd p{.fd = ex_.fd, .events = POLLRDHUP};
    return ::poll(&p, 1, 0) > 0 &&
           (p.revents & (POLLRDHUP | POLLHUP | POLLERR)) != 0;
  }

 private:
  Exchange& ex_;
};

// httplib's content provider for a streamed response: writes what the
// handler queued, ends the body once the handler returned.
bool PullStream(Exchange& ex, httplib::DataSink& sink) {
  std::string data;
  {
    std::unique_lock<std::mutex> lock(ex.mu);
    while (ex.queued.empty() && !ex.handler_done && !ex.writer_gone) {
      if (ex.Stopping()) ex.writer_gone = true;
      ex.cv.wait_for(lock, std::chrono::milliseconds(100));
    }
    if (ex.writer_gone) return false;
    data.swap(ex.queued);
    ex.cv.notify_all();  // Room for a waiting Write().
  }
  if (data.empty()) {  // The handler is done and all of it was written.
    sink.done();
    return true;
  }
  if (!sink.write(data.data(), data.size())) {
    std::lock_guard<std::mutex> lock(ex.mu);
    ex.writer_gone = true;
    ex.cv.notify_all();
    return false;
  }
  return true;
}

// The normalised head httplib parses: method, version, the body's length
// and the Connection and Expect semantics of the checked original.
std::string NormalisedHead(const HttpRequest& req, absl::string_view version,
                           uint64_t body_length) {
  std::string head = absl::StrCat(req.method, " / ", version,
                                  "\r\nContent-Length: ", body_length, "\r\n");
  const std::string connection =
      absl::AsciiStrToLower(req.Header("connection"));
  if (absl::StrContains(connection, "close")) {
    absl::StrAppend(&head, "Connection: close\r\n");
  } else if (absl::StrContains(connection, "keep-alive")) {
    absl::StrAppend(&head, "Connection: Keep-Alive\r\n");
  }
  if (body_length > 0 &&
      absl::EqualsIgnoreCase(req.Header("expect"), "100-continue")) {
    absl::StrAppend(&head, "Expect: 100-continue\r\n");
  }
  absl::StrAppend(&head, "\r\n");
  return head;
}

}  // namespace

// httplib's Server, for its protected process_request: one request (head,
// body, routing, response) on a Stream of ours. Its own listener, thread
// pool and sockets are not used.
class HttpServer::Impl : private httplib::Server {
 public:
  Impl(HttpServerOptions options, HttpHandler handler);
  ~Impl() override;

  absl::Status Listen();
  void Shutdown();
  int port() const { return port_; }
  int threads() const {
    return 1 + connections_.threads() + handlers_.threads();
  }
  bool WaitUntilIdle(std::chrono::milliseconds timeout) {
    const absl::Time deadline = absl::Now() + absl::FromChrono(timeout);
    return connections_.WaitIdle(deadline) && handlers_.WaitIdle(deadline);
  }

 private:
  // A connection waiting for a request head, new or kept alive.
  struct Pending {
    HttpConn conn;
    std::string buf;
    Clock::time_point since;       // Accepted, or back from a request.
    Clock::time_point head_start;  // This head's first byte (new: since).
    bool kept = false;             // Back from a request (keep-alive).
    bool handshaken = false;       // TLS.
    bool wants_write = false;      // The TLS handshake waits to send.
    int served = 0;                // Requests answered on it.
  };
  // What the route handler needs of the request on its thread.
  struct RequestContext {
    HttpRequest request;
    ConnStream* stream;
    int fd;
    bool routed = false;  // The handler ran (httplib accepted the request).
    bool close = false;   // The response is close-delimited.
  };

  // The loop thread: accepts, handshakes, reads heads, dispatches.
  void AcceptLoop();
  // Reads what arrived on `p`; true when it is to be dropped from the loop
  // (dispatched, refused or closed).
  bool Advance(Pending& p);
  // Checks the whole head in p.buf[0, head_end) and hands it to a
  // connection thread, or refuses it.
  void Dispatch(Pending p, size_t head_end);
  // On a connection thread: one request through httplib; the connection
  // then goes back to the loop (keep-alive) or is closed.
  void Serve(Pending p, size_t head_end, HttpRequest req, uint64_t length,
             bool probe);
  // httplib's route handler (on the connection thread): runs the handler
  // on a handler thread and gives httplib its response.
  void Route(const httplib::Request& hreq, httplib::Response& hres);
  void RunHandler(Exchange& ex);

  // The request a connection thread is serving (process_request calls the
  // route handler on the calling thread).
  static thread_local RequestContext* current_;

  HttpServerOptions options_;
  HttpHandler handler_;
  SSL_CTX* tls_ = nullptr;  // Owned; null: plaintext.
  int listen_fd_ = -1;
  int wake_fd_ = -1;  // eventfd: a connection came back to the loop.
  int port_ = 0;
  std::atomic<bool> stopping_{false};
  std::thread loop_thread_;
  HttpPool connections_;
  HttpPool handlers_;
  std::mutex mu_;
  std::condition_variable idle_cv_;
  absl::flat_hash_set<int> serving_fds_;  // Guarded by mu_.
  std::vector<Pending> returned_;         // Kept alive; guarded by mu_.
  // Connection threads serving, within max_connections and past it
  // (probes); guarded by mu_.
  int active_ = 0;
  int probe_active_ = 0;
};

thread_local HttpServer::Impl::RequestContext* HttpServer::Impl::current_ =
    nullptr;

HttpServer::Impl::Impl(HttpServerOptions options, HttpHandler handler)
    : options_(std::move(options)),
      handler_(std::move(handler)),
      connections_(PoolOptions(options_)),
      handlers_(PoolOptions(options_)) {
  // The normalised head always has path "/": no route regex ever runs on
  // a client's bytes.
  const auto route = [this](const httplib::Request& req,
                            httplib::Response& res) { Route(req, res); };
  Get("/", route);  // And HEAD.
  Post("/", route);
  Put("/", route);
  Patch("/", route);
  Delete("/", route);
  Options("/", route);
  set_payload_max_length(options_.max_body_bytes);
  // For the Keep-Alive header httplib writes.
  set_keep_alive_max_count(
      static_cast<size_t>(std::max(1, options_.max_requests_per_connection)));
  set_keep_alive_timeout(
      static_cast<time_t>((options_.keep_alive_timeout.count() + 999) / 1000));
  // httplib's own refusals (a body cut short or late, ...) get JSON bodies
  // like ours; a late body is 408, not httplib's 400.
  set_error_handler(
      HandlerWithResponse([](const httplib::Request&, httplib::Response& res) {
        if (current_ != nullptr && current_->stream->read_timed_out()) {
          res.status = 408;
          res.set_content(ErrorBody(408, "request body not received in time"),
                          "application/json");
          return HandlerResponse::Handled;
        }
        if (!res.body.empty() || res.content_provider_) {
          return HandlerResponse::Unhandled;
        }
        res.set_content(ErrorBody(res.status, HttpReason(res.status)),
                        "application/json");
        return HandlerResponse::Handled;
      }));
  set_exception_handler(
      [](const httplib::Request&, httplib::Response& res, std::exception_ptr) {
        res.status = 500;
        res.set_content(ErrorBody(500, "internal error"), "application/json");
      });
}

HttpServer::Impl::~Impl() {
  Shutdown();
  if (listen_fd_ >= 0) ::close(listen_fd_);
  if (wake_fd_ >= 0) ::close(wake_fd_);
  SSL_CTX_free(tls_);
}

absl::Status HttpServer::Impl::Listen() {
  const std::string& address = options_.listen_address;
  const size_t colon = address.rfind(':');
  int port = -1;
  if (colon == std::string::npos ||
      !absl::SimpleAtoi(address.substr(colon + 1), &port) || port < 0 ||
      port > 65535) {
    return absl::InvalidArgumentError(
        absl::StrCat("HTTP listen address '", address, "' is not host:port"));
  }
  std::string host = address.substr(0, colon);
  if (host.size() >= 2 && host.front() == '[' && host.back() == ']') {
    host = host.substr(1, host.size() - 2);
  }
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = AI_PASSIVE;
  addrinfo* found = nullptr;
  if (const int e = ::getaddrinfo(host.empty() ? nullptr : host.c_str(),
                                  std::to_string(port).c_str(), &hints, &found);
      e != 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "HTTP listen address '", address, "': ", ::gai_strerror(e)));
  }
  if (options_.tls.enabled()) {
    absl::StatusOr<SSL_CTX*> ctx = NewServerTlsContext(options_.tls);
    if (!ctx.ok()) {
      ::freeaddrinfo(found);
      return ctx.status();
    }
    tls_ = *ctx;
  }
  int fd = -1;
  std::string why = "no address";
  for (addrinfo* a = found; a != nullptr && fd < 0; a = a->ai_next) {
    fd = ::socket(a->ai_family, a->ai_socktype | SOCK_CLOEXEC, a->ai_protocol);
    if (fd < 0) continue;
    const int one = 1;
    ::setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
    if (::bind(fd, a->ai_addr, a->ai_addrlen) != 0 || ::listen(fd, 512) != 0) {
      why = std::strerror(errno);
      ::close(fd);
      fd = -1;
    }
  }
  ::freeaddrinfo(found);
  if (fd < 0) {
    return absl::UnavailableError(
        absl::StrCat("cannot listen for HTTP on ", address, ": ", why));
  }
  sockaddr_storage bound{};
  socklen_t len = sizeof(bound);
  ::getsockname(fd, reinterpret_cast<sockaddr*>(&bound), &len);
  port_ = ntohs(bound.ss_family == AF_INET6
                    ? reinterpret_cast<sockaddr_in6*>(&bound)->sin6_port
                    : reinterpret_cast<sockaddr_in*>(&bound)->sin_port);
  listen_fd_ = fd;
  wake_fd_ = ::eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
  if (wake_fd_ < 0) return absl::InternalError("eventfd failed");
  // httplib ends streamed bodies once this is INVALID_SOCKET (Shutdown).
  svr_sock_ = fd;
  loop_thread_ = std::thread([this] { AcceptLoop(); });
  return absl::OkStatus();
}

void HttpServer::Impl::Shutdown() {
  if (stopping_.exchange(true)) return;
  svr_sock_ = INVALID_SOCKET;
  if (loop_thread_.joinable()) {
    const uint64_t one = 1;
    (void)!::write(wake_fd_, &one, sizeof(one));
    loop_thread_.join();
  }
  // The port is free from here (a server taking it over may bind now).
  if (listen_fd_ >= 0) ::close(listen_fd_);
  listen_fd_ = -1;
  {
    std::unique_lock<std::mutex> lock(mu_);
    for (int fd : serving_fds_) ::shutdown(fd, SHUT_RDWR);
    idle_cv_.wait(lock, [&] { return active_ + probe_active_ == 0; });
    for (Pending& p : returned_) CloseConn(p.conn);
    returned_.clear();
  }
  connections_.Join();
  handlers_.Join();
}

void HttpServer::Impl::AcceptLoop() {
  std::vector<Pending> pending;
  std::vector<pollfd> polled;
  const auto drop = [&](size_t i) {
    pending[i] = std::move(pending.back());
    pending.pop_back();
  };
  while (!stopping_.load()) {
    {
      std::lock_guard<std::mutex> lock(mu_);
      for (Pending& p : returned_) pending.push_back(std::move(p));
      returned_.clear();
    }
    bool ready_now = false;  // Bytes already buffered: no need to wait.
    for (const Pending& p : pending) {
      ready_now = ready_now ||
                  (p.conn.ssl != nullptr && SSL_pending(p.conn.ssl) > 0) ||
                  p.buf.find("\r\n\r\n") != std::string::npos;
    }
    polled.assign({pollfd{.fd = listen_fd_, .events = POLLIN},
                   pollfd{.fd = wake_fd_, .events = POLLIN}});
    for (const Pending& p : pending) {
      polled.push_back(pollfd{.fd = p.conn.fd,
                              .events = static_cast<short>(
                                  POLLIN | (p.wants_write ? POLLOUT : 0))});
    }
    const int n = ::poll(polled.data(), polled.size(), ready_now ? 0 : 100);
    if (n < 0) continue;
    if ((polled[1].revents & POLLIN) != 0) {
      uint64_t count;
      (void)!::read(wake_fd_, &count, sizeof(count));
    }
    // Reads first, then deadlines: bytes that arrived in time are taken
    // even when this thread comes late (a loaded machine), and a head still
    // incomplete past its deadline is refused however slowly it trickles.
    // Backwards, so that drop() (which moves the last entry into i) skips
    // nothing.
    const auto now = Clock::now();
    for (size_t i = pending.size(); i-- > 0;) {
      Pending& p = pending[i];
      const bool readable =
          polled[i + 2].revents != 0 ||
          (p.conn.ssl != nullptr && SSL_pending(p.conn.ssl) > 0) ||
          p.buf.find("\r\n\r\n") != std::string::npos;
      if (readable && Advance(p)) {
        drop(i);
        continue;
      }
      if (p.buf.empty()) {
        // Nothing sent: closed quietly once idle too long.
        const auto idle =
            p.kept ? options_.keep_alive_timeout : options_.header_timeout;
        if (now - p.since >= idle) {
          CloseConn(p.conn);
          drop(i);
        }
      } else if (now - p.head_start >= options_.header_timeout) {
        SendRefusal(p.conn, 408, "request not received in time");
        CloseConn(p.conn);
        drop(i);
      }
    }
    if ((polled[0].revents & POLLIN) == 0) continue;
    const int fd =
        ::accept4(listen_fd_, nullptr, nullptr, SOCK_CLOEXEC | SOCK_NONBLOCK);
    if (fd < 0) {
      // Out of fds: the connection stays in the backlog; do not spin.
      if (errno == EMFILE || errno == ENFILE) {
        std::this_thread::sleep_for(std::chrono::milliseconds(50));
      }
      continue;
    }
    if (static_cast<int>(pending.size()) >= options_.max_pending) {
      HttpConn conn{.fd = fd};
      if (tls_ == nullptr) {  // A TLS client could not read it.
        SendRefusal(conn, 503, "too many connections");
      }
      CloseConn(conn);
      continue;
    }
    // Small writes (a response head, an SSE event) go out at once.
    const int one = 1;
    ::setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
    HttpConn conn{.fd = fd};
    if (tls_ != nullptr) {
      conn.ssl = SSL_new(tls_);
      if (conn.ssl == nullptr || SSL_set_fd(conn.ssl, fd) != 1) {
        CloseConn(conn);
        continue;
      }
    }
    const auto accepted = Clock::now();
    pending.push_back(
        {.conn = conn, .since = accepted, .head_start = accepted});
  }
  for (Pending& p : pending) CloseConn(p.conn);
}

bool HttpServer::Impl::Advance(Pending& p) {
  if (p.conn.ssl != nullptr && !p.handshaken) {
    const int r = SSL_accept(p.conn.ssl);
    if (r != 1) {
      const int e = SSL_get_error(p.conn.ssl, r);
      if (e == SSL_ERROR_WANT_READ || e == SSL_ERROR_WANT_WRITE) {
        p.wants_write = e == SSL_ERROR_WANT_WRITE;
        return false;
      }
      // Plaintext, an untrusted client certificate, a bad hello: no HTTP
      // answer can reach such a client.
      ERR_clear_error();
      CloseConn(p.conn);
      return true;
    }
    p.handshaken = true;
    p.wants_write = false;
  }
  size_t head_end = p.buf.find("\r\n\r\n");
  if (head_end == std::string::npos) {
    char chunk[8192];
    ssize_t n = 0;
    bool closed = false;
    const bool was_empty = p.buf.empty();
    do {  // TLS may decrypt more than one read's worth at once.
      n = ReceiveNow(p.conn, chunk, sizeof(chunk));
      if (n > 0) p.buf.append(chunk, static_cast<size_t>(n));
      closed = n == 0 || n == -1;
    } while (n > 0 && p.conn.ssl != nullptr && SSL_pending(p.conn.ssl) > 0);
    if (was_empty && !p.buf.empty() && p.kept) p.head_start = Clock::now();
    head_end = p.buf.find("\r\n\r\n");
    if (closed && head_end == std::string::npos) {
      CloseConn(p.conn);  // Closed (or failed) before sending a request.
      return true;
    }
  }
  if ((head_end == std::string::npos ? p.buf.size() : head_end) >
      options_.max_header_bytes) {
    SendRefusal(p.conn, 431, "request headers too large");
    CloseConn(p.conn);
    return true;
  }
  if (head_end == std::string::npos) return false;
  Dispatch(std::move(p), head_end);
  return true;
}

void HttpServer::Impl::Dispatch(Pending p, size_t head_end) {
  HttpRequest req;
  uint64_t length = 0;
  const auto [status, why] =
      ParseHttpHead(absl::string_view(p.buf).substr(0, head_end), req, &length);
  HttpConn conn = p.conn;  // Still ours once p has moved into a job.
  const auto refuse = [&](int code, absl::string_view message) {
    SendRefusal(conn, code, message);
    CloseConn(conn);
  };
  if (status != 0) return refuse(status, why);
  if (!IsServedMethod(req.method)) {
    return refuse(501, "the method is not served here");
  }
  if (length > options_.max_body_bytes) {
    return refuse(413, absl::StrCat("request body over ",
                                    options_.max_body_bytes, " bytes"));
  }
  // Probes have threads of their own past max_connections, so that API
  // clients holding every thread cannot fail a liveness probe.
  const bool probe =
      std::find(options_.probe_paths.begin(), options_.probe_paths.end(),
                req.path) != options_.probe_paths.end();
  std::lock_guard<std::mutex> lock(mu_);
  const bool over = active_ >= options_.max_connections;
  if (stopping_.load() ||
      (over &&
       (!probe || probe_active_ >= options_.reserved_probe_connections))) {
    return refuse(503, "too many connections");
  }
  const bool as_probe = over;
  ++(as_probe ? probe_active_ : active_);
  serving_fds_.insert(conn.fd);
  const bool submitted =
      connections_.Submit([this, p = std::move(p), head_end,
                           req = std::move(req), length, as_probe]() mutable {
        Serve(std::move(p), head_end, std::move(req), length, as_probe);
      });
  if (!submitted) {  // Stopping, or no thread to be had.
    serving_fds_.erase(conn.fd);
    --(as_probe ? probe_active_ : active_);
    refuse(503, "too many connections");
  }
}

void HttpServer::Impl::Serve(Pending p, size_t head_end, HttpRequest req,
                             uint64_t length, bool probe) {
  const absl::string_view line =
      absl::string_view(p.buf).substr(0, p.buf.find("\r\n"));
  const absl::string_view version = line.substr(line.rfind(' ') + 1);
  std::string buffered = NormalisedHead(req, version, length);
  const size_t head_bytes = buffered.size();
  buffered.append(p.buf, head_end + 4);
  p.buf.clear();
  ConnStream stream(p.conn, std::move(buffered),
                    p.head_start + options_.read_timeout,
                    options_.write_timeout);
  RequestContext context{
      .request = std::move(req), .stream = &stream, .fd = p.conn.fd};
  const bool last =
      p.served + 1 >= options_.max_requests_per_connection || stopping_.load();
  bool client_closes = false;
  bool written = false;
  // The body is charged before a byte of it is read: one that does not fit
  // the budget is refused unread, and the connection closed.
  MemoryShare body_share;
  bool admitted = true;
  if (options_.head_check && length > 0) {
    if (std::optional<HttpRefusal> refusal =
            options_.head_check(context.request)) {
      admitted = false;
      RefuseUnread(p.conn, *refusal);
    }
  }
  if (admitted && options_.memory_budget != nullptr && length > 0) {
    absl::StatusOr<MemoryShare> share = options_.memory_budget->Take(
        static_cast<int64_t>(length) * kBodyChargeFactor, "the HTTP body");
    if (share.ok()) {
      body_share = *std::move(share);
    } else {
      admitted = false;
      RefuseUnread(p.conn, {.status = 429,
                            .body = ErrorBody(429, share.status().message()),
                            .headers = {{"Retry-After", "1"}}});
    }
  }
  current_ = &context;
  try {
    if (admitted)
      written = process_request(stream, last, client_closes, nullptr);
  } catch (const std::exception& e) {  // Out of memory, say.
    std::fprintf(stderr, "[shardlm] HTTP connection failed: %s\n", e.what());
  }
  current_ = nullptr;
  // Another request on this connection only after a clean one: answered
  // by the handler, written whole, its body read to the byte (httplib does
  // not read the body of a GET, say; what it left would be parsed as the
  // next request).
  const bool keep = written && !client_closes && !last && context.routed &&
                    !context.close && !stream.failed() &&
                    stream.consumed() == head_bytes + length;
  std::lock_guard<std::mutex> lock(mu_);
  serving_fds_.erase(p.conn.fd);
  if (keep && !stopping_.load()) {
    p.buf = stream.TakeLeftover();
    p.since = p.head_start = Clock::now();
    p.kept = true;
    ++p.served;
    returned_.push_back(std::move(p));
    const uint64_t one = 1;
    (void)!::write(wake_fd_, &one, sizeof(one));
  } else {
    CloseConn(p.conn);
  }
  --(probe ? probe_active_ : active_);
  if (active_ + probe_active_ == 0) idle_cv_.notify_all();
}

void HttpServer::Impl::Route(const httplib::Request& hreq,
                             httplib::Response& hres) {
  RequestContext& context = *current_;
  context.routed = true;
  auto ex = std::make_shared<Exchange>(context.fd, &stopping_);
  ex->request = std::move(context.request);
  ex->request.body = hreq.body;
  if (!handlers_.Submit([this, ex] { RunHandler(*ex); })) {
    hres.status = 503;  // Stopping, or no thread to be had.
    hres.set_content(ErrorBody(503, "shutting down"), "application/json");
    return;
  }
  std::unique_lock<std::mutex> lock(ex->mu);
  ex->cv.wait(lock, [&] {
    return ex->state != Exchange::State::kUnanswered || ex->handler_done;
  });
  for (const auto& [name, value] : ex->headers) hres.set_header(name, value);
  if (ex->state == Exchange::State::kStreamed) {
    hres.status = ex->status;
    hres.set_header("Cache-Control", "no-cache");
    auto pull = [ex](size_t, httplib::DataSink& sink) {
      return PullStream(*ex, sink);
    };
    // Once httplib is done with the response (written, failed, or HEAD):
    // the handler's writes fail from then on, and this thread waits for it
    // to return.
    auto release = [ex](bool) {
      std::unique_lock<std::mutex> lock(ex->mu);
      ex->writer_gone = true;
      ex->cv.notify_all();
      ex->cv.wait(lock, [&] { return ex->handler_done; });
    };
    if (hreq.version == "HTTP/1.0") {  // No chunked encoding: until close.
      context.close = true;
      hres.set_header("Connection", "close");
      hres.set_content_provider(ex->content_type, std::move(pull),
                                std::move(release));
    } else {
      hres.set_chunked_content_provider(ex->content_type, std::move(pull),
                                        std::move(release));
    }
    return;
  }
  ex->cv.wait(lock, [&] { return ex->handler_done; });
  hres.status = ex->status;
  hres.set_content(std::move(ex->body), ex->content_type);
}

void HttpServer::Impl::RunHandler(Exchange& ex) {
  BridgeResponse response(ex);
  std::string thrown;
  // No handler's mistake may take the server down: a throw answers 500 (if
  // nothing was sent yet) and ends this request only.
  try {
    handler_(ex.request, response);
  } catch (const std::exception& e) {
    thrown = e.what();
  } catch (...) {
    thrown = "an exception that is not a std::exception";
  }
  if (!thrown.empty()) {
    std::fprintf(stderr, "[shardlm] HTTP handler for %s %s threw: %s\n",
                 ex.request.method.c_str(), ex.request.path.c_str(),
                 thrown.c_str());
  }
  std::lock_guard<std::mutex> lock(ex.mu);
  if (ex.state == Exchange::State::kUnanswered) {
    ex.state = Exchange::State::kWhole;
    ex.status = 500;
    ex.content_type = "application/json";
    ex.body = ErrorBody(500, thrown.empty() ? "the handler sent no response"
                                            : "internal error");
  }
  ex.handler_done = true;
  ex.cv.notify_all();
}

HttpServer::HttpServer(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}

HttpServer::~HttpServer() = default;

absl::StatusOr<std::unique_ptr<HttpServer>> HttpServer::Start(
    HttpServerOptions options, HttpHandler handler) {
  auto impl = std::make_unique<Impl>(std::move(options), std::move(handler));
  if (absl::Status s = impl->Listen(); !s.ok()) return s;
  return std::unique_ptr<HttpServer>(new HttpServer(std::move(impl)));
}

int HttpServer::port() const { return impl_->port(); }

void HttpServer::Shutdown() { impl_->Shutdown(); }

int HttpServer::threads() const { return impl_->threads(); }

bool HttpServer::WaitUntilIdle(std::chrono::milliseconds timeout) {
  return impl_->WaitUntilIdle(timeout);
}

}  // namespace shardlm
