#include "coordinator/http_server.h"

#include <arpa/inet.h>
#include <netdb.h>
#include <netinet/in.h>
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

bool SendAll(int fd, const char* data, size_t n) {
  while (n > 0) {
    const ssize_t w = ::send(fd, data, n, MSG_NOSIGNAL);
    if (w < 0 && errno == EINTR) continue;
    if (w <= 0) return false;
    data += w;
    n -= static_cast<size_t>(w);
  }
  return true;
}

class Response : public HttpResponse {
 public:
  explicit Response(int fd) : fd_(fd) {}

  bool Send(int status, const std::string& content_type,
            const std::string& body) override {
    if (started_) return false;
    started_ = true;
    std::string head = Head(status, content_type);
    absl::StrAppend(&head, "Content-Length: ", body.size(), "\r\n\r\n");
    return SendAll(fd_, head.data(), head.size()) &&
           SendAll(fd_, body.data(), body.size());
  }
  bool Start(int status, const std::string& content_type) override {
    if (started_) return false;
    started_ = true;
    std::string head = Head(status, content_type);
    absl::StrAppend(&head, "Cache-Control: no-cache\r\n\r\n");
    return ok_ = SendAll(fd_, head.data(), head.size());
  }
  bool Write(const std::string& data) override {
    if (!started_ || !ok_) return false;
    return ok_ = SendAll(fd_, data.data(), data.size());
  }
  void AddHeader(std::string name, std::string value) override {
    extra_.emplace_back(std::move(name), std::move(value));
  }
  bool ClientGone() const override {
    pollfd p{.fd = fd_, .events = POLLRDHUP};
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

  int fd_;
  bool started_ = false;
  bool ok_ = true;
  std::vector<std::pair<std::string, std::string>> extra_;
};

// Reads until `pred(buffer)` holds, the limit is passed, the peer closes or
// the deadline passes. Returns false on timeout, close or error.
bool ReadUntil(int fd, std::string& buf, size_t limit,
               std::chrono::steady_clock::time_point deadline,
               const std::function<bool(const std::string&)>& done) {
  char chunk[8192];
  while (!done(buf)) {
    if (buf.size() > limit) return false;
    const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
        deadline - std::chrono::steady_clock::now());
    if (left.count() <= 0) return false;
    pollfd p{.fd = fd, .events = POLLIN};
    const int r = ::poll(&p, 1, static_cast<int>(left.count()));
    if (r < 0 && errno == EINTR) continue;
    if (r <= 0) return false;
    const ssize_t n = ::recv(fd, chunk, sizeof(chunk), 0);
    if (n < 0 && errno == EINTR) continue;
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

HttpServer::~HttpServer() { Shutdown(); }

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
  struct Pending {
    int fd;
    std::string buf;
    std::chrono::steady_clock::time_point accepted;
  };
  std::vector<Pending> pending;
  std::vector<pollfd> polled;
  const auto drop = [&](size_t i) {
    ::close(pending[i].fd);
    pending[i] = std::move(pending.back());
    pending.pop_back();
  };
  while (!stopping_.load()) {
    const auto now = std::chrono::steady_clock::now();
    // Heads past their time: 408 (silently closed when nothing came).
    for (size_t i = pending.size(); i-- > 0;) {
      if (now - pending[i].accepted < options_.header_timeout) continue;
      if (!pending[i].buf.empty()) {
        Response(pending[i].fd)
            .Send(408, "application/json",
                  ErrorBody(408, "request not received in time"));
      }
      drop(i);
    }
    polled.assign(1, pollfd{.fd = listen_fd_, .events = POLLIN});
    for (const Pending& p : pending) {
      polled.push_back(pollfd{.fd = p.fd, .events = POLLIN});
    }
    if (::poll(polled.data(), polled.size(), 100) <= 0) continue;
    // Read what arrived; hand whole heads to a thread. Backwards, so that
    // drop() (which moves the last entry into i) skips nothing.
    for (size_t i = pending.size(); i-- > 0;) {
      if (polled[i + 1].revents == 0) continue;
      char chunk[8192];
      const ssize_t n =
          ::recv(pending[i].fd, chunk, sizeof(chunk), MSG_DONTWAIT);
      if (n < 0 && (errno == EINTR || errno == EAGAIN)) continue;
      if (n <= 0) {  // Closed before sending a request.
        drop(i);
        continue;
      }
      std::string& buf = pending[i].buf;
      buf.append(chunk, static_cast<size_t>(n));
      const size_t head_end = buf.find("\r\n\r\n");
      if ((head_end == std::string::npos ? buf.size() : head_end) >
          options_.max_header_bytes) {
        Response(pending[i].fd)
            .Send(431, "application/json",
                  ErrorBody(431, "request headers too large"));
        drop(i);
        continue;
      }
      if (head_end == std::string::npos) continue;
      Dispatch(pending[i].fd, std::move(buf), head_end, pending[i].accepted);
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
        Response(fd).Send(503, "application/json",
                          ErrorBody(503, "too many connections"));
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
      pending.push_back({fd, "", std::chrono::steady_clock::now()});
    }
  }
  for (const Pending& p : pending) ::close(p.fd);
}

void HttpServer::Dispatch(int fd, std::string buf, size_t head_end,
                          std::chrono::steady_clock::time_point accepted) {
  HttpRequest req;
  const auto [status, why] =
      ParseHead(absl::string_view(buf).substr(0, head_end), req);
  if (status != 0) {
    Response(fd).Send(status, "application/json", ErrorBody(status, why));
    ::close(fd);
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
    Response(fd).Send(503, "application/json",
                      ErrorBody(503, "too many connections"));
    ::close(fd);
    return;
  }
  int HttpServer::*counter =
      over ? &HttpServer::probe_active_ : &HttpServer::active_;
  ++(this->*counter);
  open_fds_.insert(fd);
  std::thread([this, fd, counter, buf = std::move(buf), head_end, accepted,
               req = std::move(req)]() mutable {
    try {
      Serve(fd, std::move(buf), head_end, accepted, std::move(req));
    } catch (const std::exception& e) {  // Out of memory, say.
      std::fprintf(stderr, "[shardlm] HTTP connection failed: %s\n", e.what());
    }
    std::lock_guard<std::mutex> lock(mu_);
    open_fds_.erase(fd);
    ::close(fd);
    --(this->*counter);
    if (active_ + probe_active_ == 0) idle_cv_.notify_all();
  }).detach();
}

void HttpServer::Serve(int fd, std::string buf, size_t head_end,
                       std::chrono::steady_clock::time_point accepted,
                       HttpRequest req) {
  Response response(fd);
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
  if (!ReadUntil(fd, buf, body_end, accepted + options_.read_timeout,
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
