#include "coordinator/http_server.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <openssl/err.h>
#include <openssl/ssl.h>
#include <poll.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <optional>

#include "absl/strings/ascii.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "core/status.h"

namespace shardlm {
namespace {

// More header lines than any real client sends.
constexpr size_t kMaxHeaders = 100;

bool SendAll(const HttpConn& conn, const char* data, size_t n) {
  if (conn.ssl != nullptr) {
    while (n > 0) {
      const int w = SSL_write(conn.ssl, data,
                              static_cast<int>(std::min<size_t>(n, 1 << 30)));
      if (w <= 0) return false;
      data += w;
      n -= static_cast<size_t>(w);
    }
    return true;
  }
  const int fd = conn.fd;
  while (n > 0) {
    const ssize_t w = ::send(fd, data, n, MSG_NOSIGNAL);
    if (w < 0 && errno == EINTR) continue;
    if (w <= 0) return false;
    data += w;
    n -= static_cast<size_t>(w);
  }
  return true;
}

// Up to n bytes: how many (> 0), 0 when the peer closed, -1 on an error,
// -2 when nothing is there yet (non-blocking sockets).
ssize_t Receive(const HttpConn& conn, char* buf, size_t n) {
  if (conn.ssl == nullptr) {
    const ssize_t r = ::recv(conn.fd, buf, n, 0);
    if (r < 0) return errno == EAGAIN || errno == EWOULDBLOCK ? -2 : -1;
    return r;
  }
  const int r = SSL_read(conn.ssl, buf, static_cast<int>(n));
  if (r > 0) return r;
  switch (SSL_get_error(conn.ssl, r)) {
    case SSL_ERROR_WANT_READ:
    case SSL_ERROR_WANT_WRITE:
      return -2;
    case SSL_ERROR_ZERO_RETURN:
      return 0;
    default:
      ERR_clear_error();
      return -1;
  }
}

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

void SetNonBlocking(int fd, bool on) {
  const int flags = ::fcntl(fd, F_GETFL, 0);
  ::fcntl(fd, F_SETFL, on ? flags | O_NONBLOCK : flags & ~O_NONBLOCK);
}

class Response : public HttpResponse {
 public:
  explicit Response(HttpConn conn) : conn_(conn) {}

  bool Send(int status, const std::string& content_type,
            const std::string& body) override {
    if (started_) return false;
    started_ = true;
    std::string head = Head(status, content_type);
    absl::StrAppend(&head, "Content-Length: ", body.size(), "\r\n\r\n");
    return SendAll(conn_, head.data(), head.size()) &&
           SendAll(conn_, body.data(), body.size());
  }
  bool Start(int status, const std::string& content_type) override {
    if (started_) return false;
    started_ = true;
    std::string head = Head(status, content_type);
    absl::StrAppend(&head, "Cache-Control: no-cache\r\n\r\n");
    return ok_ = SendAll(conn_, head.data(), head.size());
  }
  bool Write(const std::string& data) override {
    if (!started_ || !ok_) return false;
    return ok_ = SendAll(conn_, data.data(), data.size());
  }
  void AddHeader(std::string name, std::string value) override {
    extra_.emplace_back(std::move(name), std::move(value));
  }
  bool ClientGone() const override {
    pollfd p{.fd = conn_.fd, .events = POLLRDHUP};
    return !ok_ || (::poll(&p, 1, 0) > 0 &&
                    (p.revents & (POLLRDHUP | POLLHUP | POLLERR)) != 0);
  }
  bool started() const { return started_; }

 private:
  std::string Head(int status, const std::string& content_type) const {
    std::string head = absl::StrCat(
        "HTTP/1.1 ", status, " ", HttpReason(status),
        "\r\nContent-Type: ", content_type, "\r\nConnection: close\r\n");
    for (const auto& [k, v] : extra_)
      absl::StrAppend(&head, k, ": ", v, "\r\n");
    return head;
  }

  HttpConn conn_;
  bool started_ = false;
  bool ok_ = true;
  std::vector<std::pair<std::string, std::string>> extra_;
};

// Reads until `pred(buffer)` holds, the limit is passed, the peer closes or
// the deadline passes. Returns false on timeout, close or error.
bool ReadUntil(const HttpConn& conn, std::string& buf, size_t limit,
               std::chrono::steady_clock::time_point deadline,
               const std::function<bool(const std::string&)>& done) {
  char chunk[8192];
  while (!done(buf)) {
    if (buf.size() > limit) return false;
    const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
        deadline - std::chrono::steady_clock::now());
    if (left.count() <= 0) return false;
    // TLS may hold decrypted bytes the socket no longer shows.
    if (conn.ssl == nullptr || SSL_pending(conn.ssl) == 0) {
      pollfd p{.fd = conn.fd, .events = POLLIN};
      const int r = ::poll(&p, 1, static_cast<int>(left.count()));
      if (r < 0 && errno == EINTR) continue;
      if (r <= 0) return false;
    }
    const ssize_t n = Receive(conn, chunk, sizeof(chunk));
    if (n == -2 || (n < 0 && errno == EINTR)) continue;
    if (n <= 0) return false;
    buf.append(chunk, static_cast<size_t>(n));
  }
  return true;
}

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

std::string ErrorBody(int status, absl::string_view message) {
  return absl::StrCat("{\"error\":{\"message\":\"", message,
                      "\",\"type\":\"invalid_request_error\",\"code\":", status,
                      "}}");
}

// An OpenSSL BIO over PEM text.
struct PemBio {
  explicit PemBio(const std::string& pem)
      : bio(BIO_new_mem_buf(pem.data(), static_cast<int>(pem.size()))) {}
  ~PemBio() { BIO_free(bio); }
  BIO* bio;
};

std::string OpenSslError() {
  const unsigned long e = ERR_get_error();
  ERR_clear_error();
  if (e == 0) return "unknown error";
  char text[256];
  ERR_error_string_n(e, text, sizeof(text));
  return text;
}

// A server context for `tls`: TLS 1.2 and later, its certificate chain and
// key (which must match), and with a client CA, peers must present a
// certificate it signed.
absl::StatusOr<SSL_CTX*> NewTlsContext(const TlsConfig& tls) {
  SSL_CTX* ctx = SSL_CTX_new(TLS_server_method());
  if (ctx == nullptr) return absl::InternalError("SSL_CTX_new failed");
  const auto fail = [&](const std::string& what) {
    SSL_CTX_free(ctx);
    return absl::InvalidArgumentError(
        absl::StrCat("TLS: ", what, ": ", OpenSslError()));
  };
  SSL_CTX_set_min_proto_version(ctx, TLS1_2_VERSION);
  SSL_CTX_set_mode(ctx, SSL_MODE_AUTO_RETRY);
  {
    PemBio in(tls.cert_chain_pem);
    X509* cert = PEM_read_bio_X509_AUX(in.bio, nullptr, nullptr, nullptr);
    if (cert == nullptr || SSL_CTX_use_certificate(ctx, cert) != 1) {
      X509_free(cert);
      return fail("the certificate (--tls-cert) does not load");
    }
    X509_free(cert);
    while (X509* extra = PEM_read_bio_X509(in.bio, nullptr, nullptr, nullptr)) {
      if (SSL_CTX_add_extra_chain_cert(ctx, extra) != 1) {
        X509_free(extra);
        return fail("a chain certificate in --tls-cert does not load");
      }
    }
    ERR_clear_error();  // The end of the PEM text.
  }
  {
    PemBio in(tls.private_key_pem);
    EVP_PKEY* key = PEM_read_bio_PrivateKey(in.bio, nullptr, nullptr, nullptr);
    const bool ok = key != nullptr && SSL_CTX_use_PrivateKey(ctx, key) == 1;
    EVP_PKEY_free(key);
    if (!ok) return fail("the key (--tls-key) does not load");
  }
  if (SSL_CTX_check_private_key(ctx) != 1) {
    return fail("--tls-key does not match --tls-cert");
  }
  if (!tls.client_ca_pem.empty()) {
    X509_STORE* store = SSL_CTX_get_cert_store(ctx);
    PemBio in(tls.client_ca_pem);
    int loaded = 0;
    while (X509* ca = PEM_read_bio_X509(in.bio, nullptr, nullptr, nullptr)) {
      loaded += X509_STORE_add_cert(store, ca) == 1;
      X509_free(ca);
    }
    ERR_clear_error();
    if (loaded == 0) return fail("no certificate in --tls-client-ca");
    SSL_CTX_set_verify(ctx, SSL_VERIFY_PEER | SSL_VERIFY_FAIL_IF_NO_PEER_CERT,
                       nullptr);
  }
  return ctx;
}

}  // namespace

std::pair<int, const char*> ParseHttpHead(absl::string_view head,
                                          HttpRequest& req) {
  return ParseHead(head, req);
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

absl::StatusOr<std::unique_ptr<HttpServer>> HttpServer::Start(
    HttpServerOptions options, HttpHandler handler) {
  const std::string& address = options.listen_address;
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
  std::unique_ptr<HttpServer> server(
      new HttpServer(std::move(options), std::move(handler)));
  if (server->options_.tls.enabled()) {
    absl::StatusOr<SSL_CTX*> ctx = NewTlsContext(server->options_.tls);
    if (!ctx.ok()) return ctx.status();
    server->tls_ = *ctx;
  }
  int fd = -1;
  std::string why = "no address";
  for (addrinfo* a = found; a != nullptr && fd < 0; a = a->ai_next) {
    fd = ::socket(a->ai_family, a->ai_socktype | SOCK_CLOEXEC, a->ai_protocol);
    if (fd < 0) continue;
    const int one = 1;
    ::setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
    if (::bind(fd, a->ai_addr, a->ai_addrlen) != 0 || ::listen(fd, 128) != 0) {
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
  server->port_ = ntohs(bound.ss_family == AF_INET6
                            ? reinterpret_cast<sockaddr_in6*>(&bound)->sin6_port
                            : reinterpret_cast<sockaddr_in*>(&bound)->sin_port);
  server->listen_fd_ = fd;
  server->accept_thread_ = std::thread([s = server.get()] { s->AcceptLoop(); });
  return server;
}

HttpServer::~HttpServer() {
  Shutdown();
  SSL_CTX_free(tls_);
}

void HttpServer::Shutdown() {
  if (stopping_.exchange(true)) return;
  ::shutdown(listen_fd_, SHUT_RDWR);
  if (accept_thread_.joinable()) accept_thread_.join();
  ::close(listen_fd_);
  std::unique_lock<std::mutex> lock(mu_);
  for (int fd : open_fds_) ::shutdown(fd, SHUT_RDWR);
  idle_cv_.wait(lock, [&] { return active_ + probe_active_ == 0; });
}

void HttpServer::AcceptLoop() {
  // Connections whose request head has not arrived yet: they cost an fd
  // here, not a thread, so idle or slow clients cannot take the server's
  // threads (or its probes) away.
  // On a TLS server their sockets are non-blocking until the head is in,
  // and the handshake runs here too.
  struct Pending {
    HttpConn conn;
    std::string buf;
    std::chrono::steady_clock::time_point accepted;
    bool handshaken = false;
    bool wants_write = false;  // The handshake waits to send.
  };
  std::vector<Pending> pending;
  std::vector<pollfd> polled;
  const auto drop = [&](size_t i) {
    CloseConn(pending[i].conn);
    pending[i] = std::move(pending.back());
    pending.pop_back();
  };
  while (!stopping_.load()) {
    const auto now = std::chrono::steady_clock::now();
    // Heads past their time: 408 (silently closed when nothing came).
    for (size_t i = pending.size(); i-- > 0;) {
      if (now - pending[i].accepted < options_.header_timeout) continue;
      if (!pending[i].buf.empty()) {
        Response(pending[i].conn)
            .Send(408, "application/json",
                  ErrorBody(408, "request not received in time"));
      }
      drop(i);
    }
    polled.assign(1, pollfd{.fd = listen_fd_, .events = POLLIN});
    for (const Pending& p : pending) {
      polled.push_back(pollfd{.fd = p.conn.fd,
                              .events = static_cast<short>(
                                  POLLIN | (p.wants_write ? POLLOUT : 0))});
    }
    if (::poll(polled.data(), polled.size(), 100) <= 0) continue;
    // Read what arrived; hand whole heads to a thread. Backwards, so that
    // drop() (which moves the last entry into i) skips nothing.
    for (size_t i = pending.size(); i-- > 0;) {
      if (polled[i + 1].revents == 0) continue;
      Pending& p = pending[i];
      if (p.conn.ssl != nullptr && !p.handshaken) {
        const int r = SSL_accept(p.conn.ssl);
        if (r != 1) {
          const int e = SSL_get_error(p.conn.ssl, r);
          if (e == SSL_ERROR_WANT_READ || e == SSL_ERROR_WANT_WRITE) {
            p.wants_write = e == SSL_ERROR_WANT_WRITE;
            continue;
          }
          // Plaintext, an untrusted client certificate, a bad hello: no
          // HTTP answer can reach such a client.
          ERR_clear_error();
          drop(i);
          continue;
        }
        p.handshaken = true;
        p.wants_write = false;
      }
      char chunk[8192];
      ssize_t n = 0;
      bool closed = false;
      do {  // TLS may decrypt more than one read's worth at once.
        n = Receive(p.conn, chunk, sizeof(chunk));
        if (n > 0) p.buf.append(chunk, static_cast<size_t>(n));
        closed = n == 0 || (n == -1 && errno != EINTR);
      } while (n > 0 && p.conn.ssl != nullptr && SSL_pending(p.conn.ssl) > 0);
      if (closed && p.buf.find("\r\n\r\n") == std::string::npos) {
        drop(i);  // Closed (or failed) before sending a request.
        continue;
      }
      std::string& buf = p.buf;
      const size_t head_end = buf.find("\r\n\r\n");
      if ((head_end == std::string::npos ? buf.size() : head_end) >
          options_.max_header_bytes) {
        Response(p.conn).Send(431, "application/json",
                              ErrorBody(431, "request headers too large"));
        drop(i);
        continue;
      }
      if (head_end == std::string::npos) continue;
      if (p.conn.ssl != nullptr) SetNonBlocking(p.conn.fd, false);
      Dispatch(p.conn, std::move(buf), head_end, p.accepted);
      pending[i] = std::move(pending.back());
      pending.pop_back();
    }
    if ((polled[0].revents & POLLIN) != 0) {
      const int fd = ::accept4(listen_fd_, nullptr, nullptr, SOCK_CLOEXEC);
      if (fd < 0) {
        // Out of fds: the connection stays in the backlog; do not spin.
        if (errno == EMFILE || errno == ENFILE) {
          std::this_thread::sleep_for(std::chrono::milliseconds(50));
        }
        continue;
      }
      if (static_cast<int>(pending.size()) >= options_.max_pending) {
        if (tls_ == nullptr) {  // A TLS client could not read it.
          Response(HttpConn{.fd = fd})
              .Send(503, "application/json",
                    ErrorBody(503, "too many connections"));
        }
        ::close(fd);
        continue;
      }
      // A client that stops reading cannot hold a thread in send() forever.
      const timeval send_timeout{
          .tv_sec = static_cast<time_t>(options_.read_timeout.count() / 1000),
          .tv_usec = static_cast<suseconds_t>(options_.read_timeout.count() %
                                              1000 * 1000)};
      ::setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &send_timeout,
                   sizeof(send_timeout));
      HttpConn conn{.fd = fd};
      if (tls_ != nullptr) {
        // Nor one that stalls inside a TLS record.
        ::setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &send_timeout,
                     sizeof(send_timeout));
        SetNonBlocking(fd, true);
        conn.ssl = SSL_new(tls_);
        if (conn.ssl == nullptr || SSL_set_fd(conn.ssl, fd) != 1) {
          CloseConn(conn);
          continue;
        }
      }
      pending.push_back(
          {.conn = conn, .accepted = std::chrono::steady_clock::now()});
    }
  }
  for (Pending& p : pending) CloseConn(p.conn);
}

void HttpServer::Dispatch(HttpConn conn, std::string buf, size_t head_end,
                          std::chrono::steady_clock::time_point accepted) {
  HttpRequest req;
  const auto [status, why] =
      ParseHead(absl::string_view(buf).substr(0, head_end), req);
  if (status != 0) {
    Response(conn).Send(status, "application/json", ErrorBody(status, why));
    CloseConn(conn);
    return;
  }
  // Probes have connections of their own past max_connections, so that
  // API clients holding every connection cannot fail a liveness probe.
  const bool probe =
      std::find(options_.probe_paths.begin(), options_.probe_paths.end(),
                req.path) != options_.probe_paths.end();
  std::lock_guard<std::mutex> lock(mu_);
  const bool over = active_ >= options_.max_connections;
  if (stopping_.load() ||
      (over &&
       (!probe || probe_active_ >= options_.reserved_probe_connections))) {
    Response(conn).Send(503, "application/json",
                        ErrorBody(503, "too many connections"));
    CloseConn(conn);
    return;
  }
  int HttpServer::*counter =
      over ? &HttpServer::probe_active_ : &HttpServer::active_;
  ++(this->*counter);
  open_fds_.insert(conn.fd);
  std::thread([this, conn, counter, buf = std::move(buf), head_end, accepted,
               req = std::move(req)]() mutable {
    try {
      Serve(conn, std::move(buf), head_end, accepted, std::move(req));
    } catch (const std::exception& e) {  // Out of memory, say.
      std::fprintf(stderr, "[shardlm] HTTP connection failed: %s\n", e.what());
    }
    std::lock_guard<std::mutex> lock(mu_);
    open_fds_.erase(conn.fd);
    CloseConn(conn);
    --(this->*counter);
    if (active_ + probe_active_ == 0) idle_cv_.notify_all();
  }).detach();
}

void HttpServer::Serve(HttpConn conn, std::string buf, size_t head_end,
                       std::chrono::steady_clock::time_point accepted,
                       HttpRequest req) {
  Response response(conn);
  const auto fail = [&](int status, absl::string_view message) {
    response.Send(status, "application/json", ErrorBody(status, message));
  };
  if (!req.Header("transfer-encoding").empty()) {
    fail(411, "chunked request bodies are not supported; send Content-Length");
    return;
  }
  const int64_t length = ContentLength(req);
  if (length < 0) {
    fail(400, "bad Content-Length");
    return;
  }
  if (static_cast<uint64_t>(length) > options_.max_body_bytes) {
    fail(413,
         absl::StrCat("request body over ", options_.max_body_bytes, " bytes"));
    return;
  }
  const size_t body_start = head_end + 4;
  const size_t body_end = body_start + static_cast<size_t>(length);
  if (!ReadUntil(conn, buf, body_end, accepted + options_.read_timeout,
                 [&](const std::string& b) { return b.size() >= body_end; })) {
    fail(408, "request body not received in time");
    return;
  }
  req.body = buf.substr(body_start, static_cast<size_t>(length));
  buf.clear();
  buf.shrink_to_fit();
  // No handler's mistake may take the server down: a throw answers 500
  // (if nothing was sent yet) and ends this connection only.
  std::string thrown;
  try {
    handler_(req, response);
  } catch (const std::exception& e) {
    thrown = e.what();
  } catch (...) {
    thrown = "an exception that is not a std::exception";
  }
  if (!thrown.empty()) {
    std::fprintf(stderr, "[shardlm] HTTP handler for %s %s threw: %s\n",
                 req.method.c_str(), req.path.c_str(), thrown.c_str());
    if (!response.started()) fail(500, "internal error");
    return;
  }
  if (!response.started()) fail(500, "the handler sent no response");
}

}  // namespace shardlm
