#include "http/http_server.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <openssl/err.h>
#include <openssl/ssl.h>
#include <poll.h>
#include <signal.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <deque>
#include <system_error>
#include <thread>

#include "absl/container/flat_hash_set.h"
#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "http/http_connection.h"
#include "http/http_pool.h"

namespace shardlm {
namespace {

using namespace http_internal;  // This server's connection plumbing.

// The methods served; any other token is answered 501 (as cpp-httplib
// 0.11.4, which the server used to frame requests, routed these).
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

}  // namespace

// The server: one loop thread for connections that wait for a head, and
// two bounded pools, one for connections with a request (reading its body,
// writing its response) and one for handlers.
class HttpServer::Impl {
 public:
  Impl(HttpServerOptions options, HttpHandler handler);
  ~Impl();

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

  // The loop thread: accepts, handshakes, reads heads, dispatches.
  void AcceptLoop();
  // Reads what arrived on `p`; true when it is to be dropped from the loop
  // (dispatched, refused or closed).
  bool Advance(Pending& p);
  // Checks the whole head in p.buf[0, head_end) and hands it to a
  // connection thread, or refuses it.
  void Dispatch(Pending p, size_t head_end);
  // On a connection thread: one request (its admission, its body, its
  // handler, its response); the connection then goes back to the loop
  // (keep-alive) or is closed.
  void Serve(Pending p, size_t head_end, HttpRequest req, uint64_t length,
             bool probe);
  // Reads the body, runs the handler and writes its response on `stream`;
  // true when the connection may serve another request.
  bool ServeRequest(ConnStream& stream, const HttpRequest& head,
                    uint64_t length, const ResponseFraming& framing, int fd);
  void RunHandler(Exchange& ex);

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
  absl::Mutex mu_;
  absl::flat_hash_set<int> serving_fds_ ABSL_GUARDED_BY(mu_);
  std::vector<Pending> returned_ ABSL_GUARDED_BY(mu_);  // Kept alive.
  // Connection threads serving, within max_connections and past it
  // (probes).
  int active_ ABSL_GUARDED_BY(mu_) = 0;
  int probe_active_ ABSL_GUARDED_BY(mu_) = 0;
};

HttpServer::Impl::Impl(HttpServerOptions options, HttpHandler handler)
    : options_(std::move(options)),
      handler_(std::move(handler)),
      connections_(PoolOptions(options_)),
      handlers_(PoolOptions(options_)) {}

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
  loop_thread_ = std::thread([this] { AcceptLoop(); });
  return absl::OkStatus();
}

void HttpServer::Impl::Shutdown() {
  if (stopping_.exchange(true)) return;
  if (loop_thread_.joinable()) {
    const uint64_t one = 1;
    (void)!::write(wake_fd_, &one, sizeof(one));
    loop_thread_.join();
  }
  // The port is free from here (a server taking it over may bind now).
  if (listen_fd_ >= 0) ::close(listen_fd_);
  listen_fd_ = -1;
  {
    absl::MutexLock lock(&mu_);
    for (int fd : serving_fds_) ::shutdown(fd, SHUT_RDWR);
    const auto idle = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
      return active_ + probe_active_ == 0;
    };
    mu_.Await(absl::Condition(&idle));
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
      absl::MutexLock lock(&mu_);
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
  absl::MutexLock lock(&mu_);
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
  const std::string connection =
      absl::AsciiStrToLower(req.Header("connection"));
  const bool last =
      p.served + 1 >= options_.max_requests_per_connection || stopping_.load();
  const ResponseFraming framing = FramingFor(
      req.method, line.substr(line.rfind(' ') + 1), connection, last,
      options_.keep_alive_timeout, options_.max_requests_per_connection);
  ConnStream stream(p.conn, p.buf.substr(head_end + 4),
                    p.head_start + options_.read_timeout,
                    options_.write_timeout);
  p.buf.clear();
  bool keep = false;
  // The body is charged before a byte of it is read: one that does not fit
  // the budget, or whose head the head check refuses, is not read at all,
  // and the connection is closed.
  MemoryShare body_share;
  bool admitted = true;
  if (options_.head_check && length > 0) {
    if (std::optional<HttpRefusal> refusal = options_.head_check(req)) {
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
  try {
    if (admitted) keep = ServeRequest(stream, req, length, framing, p.conn.fd);
  } catch (const std::exception& e) {  // Out of memory, say.
    std::fprintf(stderr, "[shardlm] HTTP connection failed: %s\n", e.what());
    keep = false;
  }
  body_share.Release();
  absl::MutexLock lock(&mu_);
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
  --(probe ? probe_active_ : active_);  // Shutdown's Await sees it.
}

bool HttpServer::Impl::ServeRequest(ConnStream& stream, const HttpRequest& head,
                                    uint64_t length,
                                    const ResponseFraming& framing, int fd) {
  if (length > 0 &&
      absl::EqualsIgnoreCase(head.Header("expect"), "100-continue") &&
      !stream.WriteAll("HTTP/1.1 100 Continue\r\n\r\n")) {
    return false;
  }
  // The body of the methods that carry one, read to the byte; another
  // method's body is left unread (and the connection then closed).
  std::string body;
  const bool reads_body = MethodReadsBody(head.method);
  if (reads_body && length > 0) {
    body.reserve(static_cast<size_t>(length));
    char chunk[16384];
    while (body.size() < length) {
      const ssize_t n = stream.Read(
          chunk, std::min<uint64_t>(sizeof(chunk), length - body.size()));
      if (n <= 0) break;
      body.append(chunk, static_cast<size_t>(n));
    }
    if (body.size() < length) {  // Late (408), or cut short (400).
      const int status = stream.read_timed_out() ? 408 : 400;
      WriteWhole(
          stream, framing, status, "application/json",
          ErrorBody(status, status == 408 ? "request body not received in time"
                                          : HttpReason(status)),
          {});
      return false;
    }
  }
  const bool consumed = reads_body || length == 0;

  auto ex = std::make_shared<Exchange>(fd, &stopping_);
  ex->request = head;
  ex->request.body = std::move(body);
  if (!handlers_.Submit([this, ex] { RunHandler(*ex); })) {
    // Stopping, or no thread to be had.
    return WriteWhole(stream, framing, 503, "application/json",
                      ErrorBody(503, "shutting down"), {}) &&
           consumed && !framing.close_after;
  }
  absl::MutexLock lock(&ex->mu);
  while (ex->state == Exchange::State::kUnanswered && !ex->handler_done) {
    ex->cv.Wait(&ex->mu);
  }
  if (ex->state != Exchange::State::kStreamed) {
    while (!ex->handler_done) ex->cv.Wait(&ex->mu);
    const bool written = WriteWhole(stream, framing, ex->status,
                                    ex->content_type, ex->body, ex->headers);
    return written && consumed && !framing.close_after && !stream.failed();
  }
  // A stream: the handler pushes, this thread writes what it queued.
  std::vector<std::pair<std::string, std::string>> headers = ex->headers;
  headers.emplace_back("Cache-Control", "no-cache");
  const int status = ex->status;
  const std::string content_type = ex->content_type;
  ex->mu.Unlock();
  bool written = WriteStreamHead(stream, framing, status, content_type,
                                 std::move(headers));
  std::string data;
  while (written && !framing.head_only) {
    const Pull pulled = PullStream(*ex, data);
    if (pulled == Pull::kGone) {
      written = false;
    } else if (pulled == Pull::kDone) {
      if (framing.chunked) written = stream.WriteAll("0\r\n\r\n");
      break;
    } else if (!stream.WriteAll(framing.chunked ? Chunk(data) : data)) {
      written = false;
    }
  }
  // Done with the response (written, failed, or HEAD): the handler's
  // writes fail from now on, and this thread waits for it to return.
  ex->mu.Lock();
  ex->writer_gone = true;
  ex->cv.SignalAll();
  while (!ex->handler_done) ex->cv.Wait(&ex->mu);
  return written && consumed && !framing.close_after &&
         !framing.close_delimited && !stream.failed();
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
  absl::MutexLock lock(&ex.mu);
  if (ex.state == Exchange::State::kUnanswered) {
    ex.state = Exchange::State::kWhole;
    ex.status = 500;
    ex.content_type = "application/json";
    ex.body = ErrorBody(500, thrown.empty() ? "the handler sent no response"
                                            : "internal error");
  }
  ex.handler_done = true;
  ex.cv.SignalAll();
}

HttpServer::HttpServer(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}

HttpServer::~HttpServer() = default;

absl::StatusOr<std::unique_ptr<HttpServer>> HttpServer::Start(
    HttpServerOptions options, HttpHandler handler) {
  // A write to a connection the peer closed must fail, not kill the
  // process: plain sends use MSG_NOSIGNAL, but OpenSSL writes TLS records
  // with write(). (cpp-httplib's Server, which this server used, did this
  // in its constructor.)
  ::signal(SIGPIPE, SIG_IGN);
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
