#include "coordinator/http_connection.h"

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

// httplib's content provider for a streamed response: writes what the
// handler queued, ends the body once the handler returned.
bool PullStream(Exchange& ex, httplib::DataSink& sink) {
  std::string data;
  {
    absl::MutexLock lock(&ex.mu);
    while (ex.queued.empty() && !ex.handler_done && !ex.writer_gone) {
      if (ex.Stopping()) ex.writer_gone = true;
      ex.cv.WaitWithTimeout(&ex.mu, absl::Milliseconds(100));
    }
    if (ex.writer_gone) return false;
    data.swap(ex.queued);
    ex.cv.SignalAll();  // Room for a waiting Write().
  }
  if (data.empty()) {  // The handler is done and all of it was written.
    sink.done();
    return true;
  }
  if (!sink.write(data.data(), data.size())) {
    absl::MutexLock lock(&ex.mu);
    ex.writer_gone = true;
    ex.cv.SignalAll();
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

}  // namespace shardlm::http_internal
