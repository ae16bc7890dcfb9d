#include "coordinator/http_server.h"

#include <arpa/inet.h>
#include <netdb.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

#include "absl/strings/ascii.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "core/status.h"

namespace shardlm {
namespace {

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

// Parses the request line and headers in `head` (up to the blank line).
// The status to answer with on failure.
int ParseHead(absl::string_view head, HttpRequest& req) {
  size_t eol = head.find("\r\n");
  const absl::string_view line = head.substr(0, eol);
  const size_t sp1 = line.find(' ');
  const size_t sp2 = line.rfind(' ');
  if (sp1 == absl::string_view::npos || sp2 == sp1) return 400;
  req.method = std::string(line.substr(0, sp1));
  std::string target(line.substr(sp1 + 1, sp2 - sp1 - 1));
  const absl::string_view version = line.substr(sp2 + 1);
  if (version != "HTTP/1.1" && version != "HTTP/1.0") return 505;
  if (target.empty() || target[0] != '/') return 400;
  if (const size_t q = target.find('?'); q != std::string::npos) {
    req.query = target.substr(q + 1);
    target.resize(q);
  }
  req.path = std::move(target);
  while (eol != absl::string_view::npos && eol + 2 < head.size()) {
    const size_t start = eol + 2;
    eol = head.find("\r\n", start);
    const absl::string_view h =
        head.substr(start, eol == absl::string_view::npos ? head.size() - start
                                                          : eol - start);
    if (h.empty()) break;
    const size_t colon = h.find(':');
    if (colon == absl::string_view::npos || colon == 0) return 400;
    req.headers.emplace_back(
        absl::AsciiStrToLower(h.substr(0, colon)),
        std::string(absl::StripAsciiWhitespace(h.substr(colon + 1))));
  }
  return 0;
}

std::string ErrorBody(int status, absl::string_view message) {
  return absl::StrCat("{\"error\":{\"message\":\"", message,
                      "\",\"type\":\"invalid_request_error\",\"code\":", status,
                      "}}");
}

}  // namespace

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
  idle_cv_.wait(lock, [&] { return active_ == 0; });
}

void HttpServer::AcceptLoop() {
  while (!stopping_.load()) {
    pollfd p{.fd = listen_fd_, .events = POLLIN};
    const int r = ::poll(&p, 1, 200);
    if (r <= 0) continue;
    const int fd = ::accept4(listen_fd_, nullptr, nullptr, SOCK_CLOEXEC);
    if (fd < 0) continue;
    std::lock_guard<std::mutex> lock(mu_);
    if (stopping_.load() || active_ >= options_.max_connections) {
      Response(fd).Send(503, "application/json",
                        ErrorBody(503, "too many connections"));
      ::close(fd);
      continue;
    }
    ++active_;
    open_fds_.insert(fd);
    std::thread([this, fd] {
      Serve(fd);
      std::lock_guard<std::mutex> lock(mu_);
      open_fds_.erase(fd);
      ::close(fd);
      if (--active_ == 0) idle_cv_.notify_all();
    }).detach();
  }
}

void HttpServer::Serve(int fd) {
  Response response(fd);
  const auto fail = [&](int status, absl::string_view message) {
    response.Send(status, "application/json", ErrorBody(status, message));
  };
  const auto deadline =
      std::chrono::steady_clock::now() + options_.read_timeout;
  std::string buf;
  const bool got_head = ReadUntil(
      fd, buf, options_.max_header_bytes, deadline, [](const std::string& b) {
        return b.find("\r\n\r\n") != std::string::npos;
      });
  const size_t head_end = buf.find("\r\n\r\n");
  if (!got_head || head_end == std::string::npos) {
    if (buf.size() > options_.max_header_bytes) {
      fail(431, "request headers too large");
    } else if (!buf.empty()) {
      fail(408, "request not received in time");
    }
    return;
  }
  HttpRequest req;
  if (const int status =
          ParseHead(absl::string_view(buf).substr(0, head_end), req);
      status != 0) {
    fail(status, "malformed request");
    return;
  }
  if (!req.Header("transfer-encoding").empty()) {
    fail(411, "chunked request bodies are not supported; send Content-Length");
    return;
  }
  size_t length = 0;
  if (const std::string cl = req.Header("content-length"); !cl.empty()) {
    if (!absl::SimpleAtoi(cl, &length)) {
      fail(400, "bad Content-Length");
      return;
    }
  }
  if (length > options_.max_body_bytes) {
    fail(413,
         absl::StrCat("request body over ", options_.max_body_bytes, " bytes"));
    return;
  }
  const size_t body_start = head_end + 4;
  if (!ReadUntil(fd, buf, body_start + length, deadline,
                 [&](const std::string& b) {
                   return b.size() >= body_start + length;
                 })) {
    fail(408, "request body not received in time");
    return;
  }
  req.body = buf.substr(body_start, length);
  handler_(req, response);
  if (!response.started()) fail(500, "the handler sent no response");
}

}  // namespace shardlm
