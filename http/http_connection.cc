#include "http/http_connection.h"

#include <netdb.h>
#include <openssl/err.h>
#include <unistd.h>

#include <cerrno>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"

namespace shardlm::http_internal {

std::string ErrorBody(int status, absl::string_view message) {
  return absl::StrCat("{\"error\":{\"message\":\"", message,
                      "\",\"type\":\"invalid_request_error\",\"code\":", status,
                      "}}");
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
void SendRefusal(const HttpConn& conn, int status, absl::string_view why) {
  const std::string body = ErrorBody(status, why);
  const std::string all = absl::StrCat(
      "HTTP/1.1 ", status, " ", HttpReason(status),
      "\r\nContent-Type: application/json\r\nConnection: close\r\n",
      "Content-Length: ", body.size(), "\r\n\r\n", body);
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

Pull PullStream(Exchange& ex, std::string& data) {
  data.clear();
  absl::MutexLock lock(&ex.mu);
  while (ex.queued.empty() && !ex.handler_done && !ex.writer_gone) {
    if (ex.Stopping()) ex.writer_gone = true;
    ex.cv.WaitWithTimeout(&ex.mu, absl::Milliseconds(100));
  }
  if (ex.writer_gone) return Pull::kGone;
  data.swap(ex.queued);
  ex.cv.SignalAll();  // Room for a waiting Write().
  return data.empty() ? Pull::kDone : Pull::kData;
}

ResponseFraming FramingFor(absl::string_view method, absl::string_view version,
                           absl::string_view connection_lower, bool last,
                           std::chrono::milliseconds keep_alive_timeout,
                           int max_requests_per_connection) {
  const bool http10 = version == "HTTP/1.0";
  const bool says_close = absl::StrContains(connection_lower, "close");
  const bool says_keep =
      !says_close && absl::StrContains(connection_lower, "keep-alive");
  ResponseFraming f;
  f.head_only = method == "HEAD";
  f.chunked = !http10;
  f.close_delimited = http10;
  f.close_header = last || says_close;
  f.close_after = f.close_header || (http10 && !says_keep);
  f.keep_alive =
      absl::StrCat("timeout=", (keep_alive_timeout.count() + 999) / 1000,
                   ", max=", std::max(1, max_requests_per_connection));
  return f;
}

bool MethodReadsBody(absl::string_view method) {
  return method == "POST" || method == "PUT" || method == "PATCH" ||
         method == "DELETE";
}

namespace {

// The reason phrase on the status line, as cpp-httplib wrote it (499, which
// is no standard code, as "Internal Server Error").
const char* WireReason(int status) {
  const char* reason = HttpReason(status);
  return status == 499 || absl::string_view(reason) == "Unknown"
             ? "Internal Server Error"
             : reason;
}

bool LessIgnoringCase(const std::pair<std::string, std::string>& a,
                      const std::pair<std::string, std::string>& b) {
  return std::lexicographical_compare(
      a.first.begin(), a.first.end(), b.first.begin(), b.first.end(),
      [](char x, char y) {
        return absl::ascii_tolower(x) < absl::ascii_tolower(y);
      });
}

// The status line and the headers, sorted by name (equal names in the
// order they were added), then the blank line.
std::string Head(int status,
                 std::vector<std::pair<std::string, std::string>> headers) {
  std::stable_sort(headers.begin(), headers.end(), LessIgnoringCase);
  std::string head =
      absl::StrCat("HTTP/1.1 ", status, " ", WireReason(status), "\r\n");
  for (const auto& [name, value] : headers) {
    absl::StrAppend(&head, name, ": ", value, "\r\n");
  }
  absl::StrAppend(&head, "\r\n");
  return head;
}

void AddConnectionHeaders(
    const ResponseFraming& framing,
    std::vector<std::pair<std::string, std::string>>& headers) {
  if (framing.close_header) {
    headers.emplace_back("Connection", "close");
  } else {
    headers.emplace_back("Keep-Alive", framing.keep_alive);
  }
  if (framing.head_only) headers.emplace_back("Accept-Ranges", "bytes");
}

}  // namespace

bool WriteWhole(ConnStream& stream, const ResponseFraming& framing, int status,
                const std::string& content_type, const std::string& body,
                std::vector<std::pair<std::string, std::string>> headers) {
  AddConnectionHeaders(framing, headers);
  headers.emplace_back("Content-Type", content_type);
  headers.emplace_back("Content-Length", std::to_string(body.size()));
  std::string all = Head(status, std::move(headers));
  if (!framing.head_only) all += body;
  return stream.WriteAll(all);
}

bool WriteStreamHead(ConnStream& stream, const ResponseFraming& framing,
                     int status, const std::string& content_type,
                     std::vector<std::pair<std::string, std::string>> headers) {
  if (framing.close_delimited) headers.emplace_back("Connection", "close");
  AddConnectionHeaders(framing, headers);
  headers.emplace_back("Content-Type", content_type);
  if (framing.chunked) headers.emplace_back("Transfer-Encoding", "chunked");
  return stream.WriteAll(Head(status, std::move(headers)));
}

std::string Chunk(const std::string& data) {
  return absl::StrCat(absl::Hex(data.size()), "\r\n", data, "\r\n");
}

}  // namespace shardlm::http_internal
