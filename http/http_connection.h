// The bytes of one HTTP connection, for HttpServer (http/http_server.cc)
// alone: reading and writing a socket or TLS session without blocking, the
// refusals written before a request is handed on, a request's stream over
// a connection, the response exchange between a handler (which pushes)
// and the connection thread (which writes), and the response's framing.
// Internal: included by the server only.
#ifndef SHARDLM_HTTP_HTTP_CONNECTION_H_
#define SHARDLM_HTTP_HTTP_CONNECTION_H_

#include <netinet/in.h>
#include <openssl/ssl.h>
#include <poll.h>
#include <sys/socket.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstring>
#include <string>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "http/http_message.h"

namespace shardlm::http_internal {

using Clock = std::chrono::steady_clock;

// A handler's streamed bytes not yet taken by the client; past this its
// Write() waits (backpressure instead of memory).
inline constexpr size_t kMaxQueuedStreamBytes = 1 << 20;

// An accepted connection: its socket (non-blocking) and, on a TLS server,
// its session.
struct HttpConn {
  int fd = -1;
  SSL* ssl = nullptr;
};

// {"error": {"message", "type", "code"}} as the transport's own refusals
// write it.
std::string ErrorBody(int status, absl::string_view message);

// Ends the session (a close_notify, best effort) and closes the socket.
void CloseConn(HttpConn& conn);

// Waits until `fd` has `events` or `deadline` passes; false on timeout.
bool WaitFor(int fd, short events, Clock::time_point deadline);

// Up to n bytes without waiting: how many (> 0), 0 when the peer closed, -1
// on an error, -2 when nothing is there yet; for TLS, -3 when the session
// needs to write first.
ssize_t ReceiveNow(const HttpConn& conn, char* buf, size_t n);

// Writes without waiting: bytes written (> 0), -2 when the socket is full
// (-3: a TLS session must read first), -1 on an error.
ssize_t SendNow(const HttpConn& conn, const char* data, size_t n);

// A refusal written from the loop thread before any thread is spent on the
// connection: best effort, never waits (a client that does not read it
// loses it).
void SendRefusal(const HttpConn& conn, int status, absl::string_view why);

// Sends `refusal` on a connection whose request body is left unread, then
// closes its sending side and reads (discarding) what the client still
// sends for up to a second: closing at once with bytes unread would make the
// kernel reset the connection, and the client could lose the answer.
void RefuseUnread(const HttpConn& conn, const HttpRefusal& refusal);

// One connection for one request: first the bytes the loop thread already
// has (whatever of the body came with the head), then the socket, with a
// deadline for reading the request and a timeout on each write. Bytes past
// the request stay buffered for the next one (pipelining).
class ConnStream {
 public:
  ConnStream(HttpConn conn, std::string buffered,
             Clock::time_point read_deadline,
             std::chrono::milliseconds write_timeout)
      : conn_(conn),
        buf_(std::move(buffered)),
        read_deadline_(read_deadline),
        write_timeout_(write_timeout) {}

  // Up to `size` bytes of the request (buffered first), waiting up to the
  // read deadline; -1 on close, error or timeout.
  ssize_t Read(char* ptr, size_t size) {
    if (pos_ == buf_.size() && !Fill()) return -1;
    const size_t n = std::min(size, buf_.size() - pos_);
    std::memcpy(ptr, buf_.data() + pos_, n);
    pos_ += n;
    consumed_ += n;
    return static_cast<ssize_t>(n);
  }
  // All of `size` bytes, each write within the write timeout; -1 when the
  // client is gone or took nothing for that long.
  ssize_t Write(const char* ptr, size_t size) {
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
  bool WriteAll(absl::string_view data) {
    return Write(data.data(), data.size()) >= 0;
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
// pushes) and the connection thread (which writes it).
struct Exchange {
  Exchange(int fd, const std::atomic<bool>* stopping)
      : fd(fd), stopping(stopping) {}
  enum class State { kUnanswered, kWhole, kStreamed };

  const int fd;  // For ClientGone's poll only.
  const std::atomic<bool>* const stopping;
  HttpRequest request;  // Set before the handler starts; read-only then.
  absl::Mutex mu;
  absl::CondVar cv;  // A field below changed.
  State state ABSL_GUARDED_BY(mu) = State::kUnanswered;
  int status ABSL_GUARDED_BY(mu) = 0;
  std::string content_type ABSL_GUARDED_BY(mu);
  std::string body ABSL_GUARDED_BY(mu);  // Of a whole response.
  std::vector<std::pair<std::string, std::string>> headers ABSL_GUARDED_BY(mu);
  std::string queued ABSL_GUARDED_BY(mu);  // Streamed, not yet written.
  // The handler returned (or threw).
  bool handler_done ABSL_GUARDED_BY(mu) = false;
  // The connection thread stopped writing: the client is gone.
  bool writer_gone ABSL_GUARDED_BY(mu) = false;

  bool Stopping() const { return stopping->load(); }
};

// The handler's side of an Exchange.
class BridgeResponse : public HttpResponse {
 public:
  explicit BridgeResponse(Exchange& ex) : ex_(ex) {}

  bool Send(int status, const std::string& content_type,
            const std::string& body) override {
    absl::MutexLock lock(&ex_.mu);
    if (ex_.state != Exchange::State::kUnanswered) return false;
    ex_.state = Exchange::State::kWhole;
    ex_.status = status;
    ex_.content_type = content_type;
    ex_.body = body;
    ex_.cv.SignalAll();
    return !ex_.writer_gone;
  }
  bool Start(int status, const std::string& content_type) override {
    absl::MutexLock lock(&ex_.mu);
    if (ex_.state != Exchange::State::kUnanswered) return false;
    ex_.state = Exchange::State::kStreamed;
    ex_.status = status;
    ex_.content_type = content_type;
    ex_.cv.SignalAll();
    return !ex_.writer_gone;
  }
  bool Write(const std::string& data) override {
    absl::MutexLock lock(&ex_.mu);
    if (ex_.state != Exchange::State::kStreamed) return false;
    while (ex_.queued.size() > kMaxQueuedStreamBytes && !ex_.writer_gone &&
           !ex_.Stopping()) {
      ex_.cv.WaitWithTimeout(&ex_.mu, absl::Milliseconds(100));
    }
    if (ex_.writer_gone || ex_.Stopping()) return false;
    ex_.queued += data;
    ex_.cv.SignalAll();
    return true;
  }
  void AddHeader(std::string name, std::string value) override {
    absl::MutexLock lock(&ex_.mu);
    if (ex_.state == Exchange::State::kUnanswered) {
      ex_.headers.emplace_back(std::move(name), std::move(value));
    }
  }
  bool ClientGone() const override {
    {
      absl::MutexLock lock(&ex_.mu);
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

// What a handler's stream has for the connection thread: data to write,
// the end (the handler returned and all of it was taken), or a gone client.
enum class Pull { kData, kDone, kGone };
// Waits for the handler to queue data (or finish); moves it into `data`.
Pull PullStream(Exchange& ex, std::string& data);

// How a response is framed, from its request: as cpp-httplib 0.11.4 framed
// it while the server used it (the bytes on the wire did not change when it
// went; docs/design-notes.md section 6).
struct ResponseFraming {
  bool head_only = false;  // HEAD: the head, no body.
  // A stream is chunked (HTTP/1.1), or delimited by closing (HTTP/1.0).
  bool chunked = true;
  bool close_delimited = false;
  // "Connection: close": the request said close, or was the connection's
  // last; else "Keep-Alive: <keep_alive>".
  bool close_header = false;
  std::string keep_alive;
  // The connection closes after the response (close_header, or HTTP/1.0
  // without keep-alive).
  bool close_after = false;
};
ResponseFraming FramingFor(absl::string_view method, absl::string_view version,
                           absl::string_view connection_lower, bool last,
                           std::chrono::milliseconds keep_alive_timeout,
                           int max_requests_per_connection);

// Whether a request of `method` has its body read (POST, PUT, PATCH,
// DELETE); another method's body is left unread and its connection closed.
bool MethodReadsBody(absl::string_view method);

// Writes a whole response: the status line, `headers` and the framing's
// sorted by name case-insensitively, Content-Type, Content-Length, then the
// body (not for HEAD). False when the client is gone.
bool WriteWhole(ConnStream& stream, const ResponseFraming& framing, int status,
                const std::string& content_type, const std::string& body,
                std::vector<std::pair<std::string, std::string>> headers);
// Writes a streamed response's head (chunked, or close-delimited).
bool WriteStreamHead(ConnStream& stream, const ResponseFraming& framing,
                     int status, const std::string& content_type,
                     std::vector<std::pair<std::string, std::string>> headers);
// One chunk of a chunked body: its size in hex, CRLF, the data, CRLF.
std::string Chunk(const std::string& data);

}  // namespace shardlm::http_internal

#endif  // SHARDLM_HTTP_HTTP_CONNECTION_H_
