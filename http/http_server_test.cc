#include "http/http_server.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <optional>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/ascii.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"

namespace shardlm {
namespace {

using std::chrono::milliseconds;

// A connection to 127.0.0.1:port (reads time out after 5 s), or -1.
int Connect(int port) {
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(static_cast<uint16_t>(port));
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  if (::connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0) {
    ::close(fd);
    return -1;
  }
  const timeval timeout{.tv_sec = 5, .tv_usec = 0};
  ::setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &timeout, sizeof(timeout));
  return fd;
}

void SendAll(int fd, const std::string& data) {
  ::send(fd, data.data(), data.size(), MSG_NOSIGNAL);
}

struct Reply {
  std::string status;   // "HTTP/1.1 200 OK"; empty when nothing came.
  std::string head;     // The status line and headers.
  std::string body;     // De-chunked.
  bool closed = false;  // The server closed the connection after it.

  bool Has(const std::string& header_line) const {
    return head.find(header_line + "\r\n") != std::string::npos;
  }
};

// Reads one response from `fd`: by Content-Length, chunked, or until the
// server closes (only the head for a HEAD request). `buf` holds bytes read
// past it (the next response).
Reply ReadReply(int fd, std::string& buf, bool head_only = false) {
  Reply r;
  char chunk[4096];
  const auto more = [&] {
    const ssize_t n = ::recv(fd, chunk, sizeof(chunk), 0);
    if (n <= 0) {
      r.closed = true;
      return false;
    }
    buf.append(chunk, static_cast<size_t>(n));
    return true;
  };
  size_t end;
  while ((end = buf.find("\r\n\r\n")) == std::string::npos) {
    if (!more()) return r;
  }
  r.head = buf.substr(0, end + 2);
  buf.erase(0, end + 4);
  r.status = r.head.substr(0, r.head.find("\r\n"));
  const std::string lower = absl::AsciiStrToLower(r.head);
  if (head_only) return r;
  if (const size_t cl = lower.find("\r\ncontent-length: ");
      cl != std::string::npos) {
    size_t n = 0;
    const size_t from = cl + 18;
    EXPECT_TRUE(absl::SimpleAtoi(
        lower.substr(from, lower.find("\r\n", from) - from), &n));
    while (buf.size() < n && more()) {
    }
    r.body = buf.substr(0, n);
    buf.erase(0, std::min(n, buf.size()));
  } else if (lower.find("\r\ntransfer-encoding: chunked") !=
             std::string::npos) {
    while (true) {
      size_t eol;
      while ((eol = buf.find("\r\n")) == std::string::npos) {
        if (!more()) return r;
      }
      size_t n = 0;
      if (!absl::SimpleHexAtoi(buf.substr(0, eol), &n)) return r;
      while (buf.size() < eol + 2 + n + 2) {
        if (!more()) return r;
      }
      r.body += buf.substr(eol + 2, n);
      buf.erase(0, eol + 2 + n + 2);
      if (n == 0) break;
    }
  } else {
    while (more()) {
    }
    r.body = std::move(buf);
    buf.clear();
  }
  if (lower.find("\r\nconnection: close") != std::string::npos) {
    char c;
    r.closed = ::recv(fd, &c, 1, 0) <= 0;
  }
  return r;
}

// One request on a new connection; the response.
Reply RoundTrip(int port, const std::string& request) {
  const int fd = Connect(port);
  if (fd < 0) return {};
  SendAll(fd, request);
  std::string buf;
  Reply r = ReadReply(fd, buf, request.starts_with("HEAD "));
  ::close(fd);
  return r;
}

std::unique_ptr<HttpServer> Echo(HttpServerOptions options = {}) {
  auto server =
      HttpServer::Start(options, [](const HttpRequest& req, HttpResponse& res) {
        if (req.path == "/stream") {
          res.Start(200, "text/event-stream");
          for (int i = 0; i < 3; ++i)
            res.Write(absl::StrCat("data: ", i, "\n\n"));
          return;
        }
        if (req.path == "/silent") return;  // Forgets to answer.
        if (req.path == "/throw") throw std::runtime_error("handler bug");
        res.AddHeader("X-Test", "1");
        res.Send(200, "text/plain",
                 absl::StrCat(req.method, " ", req.path, " ", req.query, " [",
                              req.Header("x-key"), "] ", req.body));
      });
  EXPECT_TRUE(server.ok()) << server.status();
  return std::move(*server);
}

TEST(HttpServerTest, AnswersRequestsWithAndWithoutBodies) {
  auto server = Echo();
  const Reply get =
      RoundTrip(server->port(), "GET /a/b?x=1 HTTP/1.1\r\nX-Key:  v \r\n\r\n");
  EXPECT_EQ(get.status, "HTTP/1.1 200 OK") << get.head;
  EXPECT_TRUE(get.Has("X-Test: 1")) << get.head;
  EXPECT_TRUE(get.Has("Content-Type: text/plain")) << get.head;
  EXPECT_EQ(get.body, "GET /a/b x=1 [v] ");
  const Reply post =
      RoundTrip(server->port(),
                "POST /p HTTP/1.1\r\nContent-Length: 11\r\n\r\nhello world");
  EXPECT_TRUE(post.Has("Content-Length: 23")) << post.head;
  EXPECT_EQ(post.body, "POST /p  [] hello world");
  // Header values and targets reach the handler as sent: httplib would
  // percent-decode a header value; the target stays undecoded too.
  const Reply raw = RoundTrip(
      server->port(), "GET /%41?q=%42 HTTP/1.1\r\nX-Key: a%20b\r\n\r\n");
  EXPECT_EQ(raw.body, "GET /%41 q=%42 [a%20b] ");
  // HEAD is a GET without the body.
  const Reply head = RoundTrip(server->port(), "HEAD /h HTTP/1.1\r\n\r\n");
  EXPECT_EQ(head.status, "HTTP/1.1 200 OK");
  EXPECT_TRUE(head.Has("Content-Length: 12")) << head.head;
}

TEST(HttpServerTest, StreamsChunkedOrUntilCloseForHttp10) {
  auto server = Echo();
  const Reply got = RoundTrip(server->port(), "GET /stream HTTP/1.1\r\n\r\n");
  EXPECT_TRUE(got.Has("Content-Type: text/event-stream")) << got.head;
  EXPECT_TRUE(got.Has("Transfer-Encoding: chunked")) << got.head;
  EXPECT_TRUE(got.Has("Cache-Control: no-cache")) << got.head;
  EXPECT_EQ(got.body, "data: 0\n\ndata: 1\n\ndata: 2\n\n");
  // An HTTP/1.0 client knows no chunks: the body ends with the connection.
  const Reply old = RoundTrip(server->port(), "GET /stream HTTP/1.0\r\n\r\n");
  EXPECT_EQ(old.status, "HTTP/1.1 200 OK");
  EXPECT_FALSE(old.Has("Transfer-Encoding: chunked")) << old.head;
  EXPECT_TRUE(old.Has("Connection: close")) << old.head;
  EXPECT_EQ(old.body, "data: 0\n\ndata: 1\n\ndata: 2\n\n");
  EXPECT_TRUE(old.closed);
}

TEST(HttpServerTest, BadRequestsGetPreciseStatuses) {
  auto server = Echo({.max_header_bytes = 1024,
                      .max_body_bytes = 16,
                      .header_timeout = milliseconds(300),
                      .read_timeout = milliseconds(300)});
  const int port = server->port();
  const auto status = [&](const std::string& request) {
    const Reply r = RoundTrip(port, request);
    // Every refusal says why, in JSON.
    if (r.status.find(" 200 ") == std::string::npos) {
      EXPECT_NE(r.body.find("\"error\""), std::string::npos)
          << request << " -> " << r.head << r.body;
    }
    return r.status;
  };
  EXPECT_EQ(status("NONSENSE\r\n\r\n"), "HTTP/1.1 400 Bad Request");
  EXPECT_EQ(status("GET nopath HTTP/1.1\r\n\r\n"), "HTTP/1.1 400 Bad Request");
  EXPECT_EQ(status("GET / HTTP/2.0\r\n\r\n"),
            "HTTP/1.1 505 HTTP Version Not Supported");
  EXPECT_EQ(status("GET / HTTP/1.1\r\nno colon\r\n\r\n"),
            "HTTP/1.1 400 Bad Request");
  EXPECT_EQ(status("BREW / HTTP/1.1\r\n\r\n"), "HTTP/1.1 501 Not Implemented");
  EXPECT_EQ(status("POST / HTTP/1.1\r\nContent-Length: 17\r\n\r\n"),
            "HTTP/1.1 413 Payload Too Large");
  EXPECT_EQ(status("POST / HTTP/1.1\r\nContent-Length: x\r\n\r\n"),
            "HTTP/1.1 400 Bad Request");
  EXPECT_EQ(status("POST / HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n"),
            "HTTP/1.1 411 Length Required");
  EXPECT_EQ(status("GET / HTTP/1.1\r\nX: " + std::string(2000, 'a')),
            "HTTP/1.1 431 Request Header Fields Too Large");
  // A body that never arrives, and a head that never ends.
  EXPECT_EQ(status("POST / HTTP/1.1\r\nContent-Length: 5\r\n\r\nab"),
            "HTTP/1.1 408 Request Timeout");
  EXPECT_EQ(status("GET / HTTP/1.1\r\n"), "HTTP/1.1 408 Request Timeout");
  {
    // A head that trickles in a byte at a time, each in time for the next
    // poll, still has the head's deadline.
    const int fd = Connect(port);
    const std::string trickle = "GET / HTTP/1.1\r\nX: " + std::string(500, 'a');
    const auto start = std::chrono::steady_clock::now();
    pollfd answer{.fd = fd, .events = POLLIN};
    for (size_t i = 0; i < trickle.size(); ++i) {
      if (::poll(&answer, 1, 20) != 0) break;
      ::send(fd, &trickle[i], 1, MSG_NOSIGNAL);
    }
    std::string buf;
    EXPECT_EQ(ReadReply(fd, buf).status, "HTTP/1.1 408 Request Timeout");
    EXPECT_LT(std::chrono::steady_clock::now() - start, milliseconds(5000));
    ::close(fd);
  }
  EXPECT_EQ(status("GET /silent HTTP/1.1\r\n\r\n"),
            "HTTP/1.1 500 Internal Server Error");
  EXPECT_EQ(status("GET /throw HTTP/1.1\r\n\r\n"),
            "HTTP/1.1 500 Internal Server Error");
  // Byte by byte: methods and header names are tokens, targets visible
  // ASCII, header values free of controls (bytes >= 0x80 are allowed).
  EXPECT_EQ(status("GET /\xff HTTP/1.1\r\n\r\n"), "HTTP/1.1 400 Bad Request");
  EXPECT_EQ(status("G\xffT / HTTP/1.1\r\n\r\n"), "HTTP/1.1 400 Bad Request");
  EXPECT_EQ(status("GET / HTTP/1.1\r\nX\x01: a\r\n\r\n"),
            "HTTP/1.1 400 Bad Request");
  EXPECT_EQ(status("GET / HTTP/1.1\r\nX: a\nb\r\n\r\n"),
            "HTTP/1.1 400 Bad Request");
  EXPECT_EQ(status("GET / HTTP/1.1\r\nX: \xff\r\n\r\n"), "HTTP/1.1 200 OK");
  EXPECT_EQ(status("POST / HTTP/1.1\r\nContent-Length: 1\r\n"
                   "Content-Length: 2\r\n\r\nab"),
            "HTTP/1.1 400 Bad Request");
  EXPECT_EQ(status("POST / HTTP/1.1\r\nContent-Length: +1\r\n\r\na"),
            "HTTP/1.1 400 Bad Request");
  // Still serving.
  EXPECT_EQ(status("GET / HTTP/1.1\r\n\r\n"), "HTTP/1.1 200 OK");
}

TEST(HttpServerTest, KeepsConnectionsAliveWithinLimits) {
  auto server = Echo({.keep_alive_timeout = milliseconds(400),
                      .max_requests_per_connection = 3});
  const int fd = Connect(server->port());
  ASSERT_GE(fd, 0);
  std::string buf;
  // Two requests one after the other, then one pipelined behind a stream.
  SendAll(fd, "GET /1 HTTP/1.1\r\n\r\n");
  const Reply first = ReadReply(fd, buf);
  EXPECT_EQ(first.status, "HTTP/1.1 200 OK");
  EXPECT_TRUE(first.Has("Keep-Alive: timeout=1, max=3")) << first.head;
  EXPECT_FALSE(first.closed);
  SendAll(fd,
          "GET /stream HTTP/1.1\r\n\r\n"
          "POST /3 HTTP/1.1\r\nContent-Length: 2\r\n\r\nhi");
  const Reply second = ReadReply(fd, buf);
  EXPECT_EQ(second.body, "data: 0\n\ndata: 1\n\ndata: 2\n\n");
  // The third is the last one a connection gets.
  const Reply third = ReadReply(fd, buf);
  EXPECT_EQ(third.body, "POST /3  [] hi");
  EXPECT_TRUE(third.Has("Connection: close")) << third.head;
  EXPECT_TRUE(third.closed);
  ::close(fd);

  // An idle kept-alive connection is closed after the keep-alive timeout.
  // (From before the request: the server's idle clock starts after its
  // answer, so the lower bound holds however late this thread reads it.)
  const int idle = Connect(server->port());
  const auto t0 = std::chrono::steady_clock::now();
  SendAll(idle, "GET / HTTP/1.1\r\n\r\n");
  buf.clear();
  EXPECT_EQ(ReadReply(idle, buf).status, "HTTP/1.1 200 OK");
  char c;
  EXPECT_EQ(::recv(idle, &c, 1, 0), 0);  // Closed by the server.
  const auto waited = std::chrono::steady_clock::now() - t0;
  EXPECT_GE(waited, milliseconds(300));
  EXPECT_LT(waited, milliseconds(2000));
  ::close(idle);

  // "Connection: close", and a body httplib would not read (a GET's), end
  // the connection after their response: nothing of them is taken for a
  // next request.
  for (const char* request :
       {"GET / HTTP/1.1\r\nConnection: close\r\n\r\n",
        "GET / HTTP/1.1\r\nContent-Length: 19\r\n\r\nGET /smuggled HTTP/1.1"}) {
    const int fd2 = Connect(server->port());
    SendAll(fd2, std::string(request) + "\r\n\r\n");
    buf.clear();
    const Reply r = ReadReply(fd2, buf);
    EXPECT_EQ(r.status, "HTTP/1.1 200 OK") << request;
    EXPECT_EQ(r.body.find("smuggled"), std::string::npos);
    EXPECT_EQ(::recv(fd2, &c, 1, 0), 0) << request;
    ::close(fd2);
  }

  // Expect: 100-continue gets its interim answer before the body is sent.
  const int expect = Connect(server->port());
  SendAll(expect,
          "POST /e HTTP/1.1\r\nContent-Length: 2\r\nExpect: 100-continue"
          "\r\n\r\n");
  buf.clear();
  EXPECT_EQ(ReadReply(expect, buf).status, "HTTP/1.1 100 Continue");
  SendAll(expect, "ok");
  EXPECT_EQ(ReadReply(expect, buf).body, "POST /e  [] ok");
  ::close(expect);
}

TEST(HttpServerTest, IdleConnectionsTakeNoThreadAndProbesOutliveBusyOnes) {
  // Two handler threads, both held by streams; 50 idle connections and 50
  // kept-alive ones hold none.
  std::atomic<bool> release{false};
  std::atomic<int> streaming{0};
  auto server =
      HttpServer::Start({.max_connections = 2, .probe_paths = {"/health"}},
                        [&](const HttpRequest& req, HttpResponse& res) {
                          if (req.path != "/hold") {
                            res.Send(200, "text/plain", "ok");
                            return;
                          }
                          res.Start(200, "text/event-stream");
                          ++streaming;
                          while (!release)
                            std::this_thread::sleep_for(milliseconds(5));
                        });
  ASSERT_TRUE(server.ok()) << server.status();
  const int port = (*server)->port();
  // A client can read its answer before the threads that served it are
  // back waiting (one more request then would find them busy): each
  // request waits for that, so that each finds the one thread of each
  // pool free.
  const auto answered = [&](int fd) {
    SendAll(fd, "GET /x HTTP/1.1\r\n\r\n");
    std::string buf;
    const bool ok = ReadReply(fd, buf).status == "HTTP/1.1 200 OK";
    return (*server)->WaitUntilIdle(std::chrono::seconds(20)) && ok;
  };
  std::vector<int> idle;
  for (int i = 0; i < 100; ++i) {
    idle.push_back(Connect(port));
    ASSERT_GE(idle.back(), 0);
    // Every other one answered once, then kept alive doing nothing.
    if (i % 2 == 1) {
      EXPECT_TRUE(answered(idle.back()));
    }
  }
  const int one_more = Connect(port);
  EXPECT_TRUE(answered(one_more));
  ::close(one_more);
  // The loop thread and one connection and one handler thread, as one
  // request at a time was served: none per idle client.
  EXPECT_LE((*server)->threads(), 1 + 1 + 1);
  std::vector<std::thread> holders;
  for (int i = 0; i < 2; ++i) {
    holders.emplace_back(
        [&] { RoundTrip(port, "GET /hold HTTP/1.1\r\n\r\n"); });
  }
  const auto until =
      std::chrono::steady_clock::now() + std::chrono::seconds(20);
  while (streaming < 2 && std::chrono::steady_clock::now() < until) {
    std::this_thread::sleep_for(milliseconds(5));
  }
  EXPECT_EQ(streaming, 2);
  EXPECT_EQ(RoundTrip(port, "GET /x HTTP/1.1\r\n\r\n").status,
            "HTTP/1.1 503 Service Unavailable");
  // The probe is answered while both handler threads are still held (they
  // are released only below): it never waited for one. A probe that did
  // would get no reply within the socket's receive timeout.
  EXPECT_EQ(RoundTrip(port, "GET /health HTTP/1.1\r\n\r\n").status,
            "HTTP/1.1 200 OK");
  EXPECT_EQ(streaming, 2);
  release = true;
  for (auto& t : holders) t.join();
  for (int fd : idle) ::close(fd);
}

TEST(HttpServerTest, AStreamEndsWhenItsClientGoes) {
  std::atomic<bool> gone{false};
  std::atomic<bool> streaming{false};
  auto server = HttpServer::Start({}, [&](const HttpRequest&, HttpResponse& r) {
    r.Start(200, "text/event-stream");
    streaming = true;
    // Stops on a failed write or on ClientGone, whichever comes first.
    for (int i = 0; i < 2000 && !r.ClientGone(); ++i) {
      if (!r.Write("data: x\n\n")) break;
      std::this_thread::sleep_for(milliseconds(5));
    }
    gone = r.ClientGone();
  });
  ASSERT_TRUE(server.ok()) << server.status();
  const int fd = Connect((*server)->port());
  SendAll(fd, "GET / HTTP/1.1\r\n\r\n");
  while (!streaming) std::this_thread::sleep_for(milliseconds(5));
  ::close(fd);
  const auto t0 = std::chrono::steady_clock::now();
  while (!gone && std::chrono::steady_clock::now() - t0 < milliseconds(2000)) {
    std::this_thread::sleep_for(milliseconds(5));
  }
  EXPECT_TRUE(gone);
}

TEST(HttpServerTest, ShutdownEndsStreamsWhoseClientsStayConnected) {
  std::atomic<bool> write_failed{false};
  std::atomic<bool> streaming{false};
  auto server = HttpServer::Start({}, [&](const HttpRequest&, HttpResponse& r) {
    r.Start(200, "text/event-stream");
    streaming = true;
    while (r.Write("data: x\n\n")) {
      std::this_thread::sleep_for(milliseconds(5));
    }
    write_failed = true;
  });
  ASSERT_TRUE(server.ok()) << server.status();
  std::thread client(
      [&] { RoundTrip((*server)->port(), "GET / HTTP/1.1\r\n\r\n"); });
  while (!streaming) std::this_thread::sleep_for(milliseconds(5));
  (*server)->Shutdown();
  EXPECT_TRUE(write_failed);
  client.join();
}

TEST(HttpServerTest, RejectsBadListenAddresses) {
  EXPECT_EQ(
      HttpServer::Start({.listen_address = "nocolon"}, {}).status().code(),
      absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(HttpServer::Start({.listen_address = "127.0.0.1:99999"}, {})
                .status()
                .code(),
            absl::StatusCode::kInvalidArgument);
  auto first = Echo();
  auto taken = HttpServer::Start(
      {.listen_address = absl::StrCat("127.0.0.1:", first->port())}, {});
  EXPECT_EQ(taken.status().code(), absl::StatusCode::kUnavailable)
      << taken.status();
}

// Issue 39: threads a burst started exit once idle, down to the base.
TEST(HttpServerTest, IdleThreadsAboveTheBaseExit) {
  std::atomic<int> inside{0};
  std::atomic<bool> release{false};
  auto server = HttpServer::Start(
      {.base_threads = 1, .idle_thread_timeout = milliseconds(200)},
      [&](const HttpRequest&, HttpResponse& res) {
        ++inside;
        while (!release) std::this_thread::sleep_for(milliseconds(5));
        res.Send(200, "text/plain", "ok");
      });
  ASSERT_TRUE(server.ok()) << server.status();
  const int port = (*server)->port();
  std::vector<std::thread> clients;
  for (int i = 0; i < 12; ++i) {
    clients.emplace_back([&] { RoundTrip(port, "GET /x HTTP/1.1\r\n\r\n"); });
  }
  const auto until =
      std::chrono::steady_clock::now() + std::chrono::seconds(20);
  while (inside < 12 && std::chrono::steady_clock::now() < until) {
    std::this_thread::sleep_for(milliseconds(5));
  }
  ASSERT_EQ(inside, 12);
  // The loop, and a connection and a handler thread per request.
  EXPECT_GE((*server)->threads(), 1 + 12 + 12);
  release = true;
  for (auto& t : clients) t.join();
  ASSERT_TRUE((*server)->WaitUntilIdle(std::chrono::seconds(20)));
  while ((*server)->threads() > 1 + 1 + 1 &&
         std::chrono::steady_clock::now() < until) {
    std::this_thread::sleep_for(milliseconds(20));
  }
  EXPECT_EQ((*server)->threads(), 1 + 1 + 1);  // The loop and each base.
  // And the pool grows again for the next request.
  EXPECT_EQ(RoundTrip(port, "GET /x HTTP/1.1\r\n\r\n").status,
            "HTTP/1.1 200 OK");
}

// Issue 39: a head check refuses a request before its body is read, and a
// body that does not fit the memory budget gets 429 unread.
TEST(HttpServerTest, HeadCheckAndBudgetRefuseBeforeTheBody) {
  MemoryBudget budget(1000);
  std::atomic<int> handled{0};
  HttpServerOptions options;
  options.memory_budget = &budget;
  options.head_check =
      [](const HttpRequest& head) -> std::optional<HttpRefusal> {
    if (head.Header("x-key") == "right") return std::nullopt;
    return HttpRefusal{.status = 401,
                       .body = "{\"error\":\"key\"}",
                       .headers = {{"WWW-Authenticate", "Bearer"}}};
  };
  auto server = HttpServer::Start(
      options, [&](const HttpRequest& req, HttpResponse& res) {
        ++handled;
        res.Send(200, "text/plain", req.body);
      });
  ASSERT_TRUE(server.ok()) << server.status();
  const int port = (*server)->port();
  // Without the key: 401 from the head, though the body never comes.
  const int fd = Connect(port);
  SendAll(fd, "POST /x HTTP/1.1\r\nContent-Length: 100000\r\n\r\n");
  std::string buf;
  const Reply refused = ReadReply(fd, buf);
  ::close(fd);
  EXPECT_EQ(refused.status, "HTTP/1.1 401 Unauthorized");
  EXPECT_NE(refused.head.find("WWW-Authenticate: Bearer"), std::string::npos)
      << refused.head;
  // With it, a body of 2 x 600 bytes does not fit 1000: 429, unread.
  const Reply big = RoundTrip(
      port, "POST /x HTTP/1.1\r\nx-key: right\r\nContent-Length: 600\r\n\r\n");
  EXPECT_EQ(big.status, "HTTP/1.1 429 Too Many Requests");
  EXPECT_EQ(budget.refused(), 1);
  // A small one is served, its share given back afterwards.
  EXPECT_EQ(RoundTrip(port,
                      "POST /x HTTP/1.1\r\nx-key: right\r\nContent-Length: "
                      "2\r\n\r\nhi")
                .status,
            "HTTP/1.1 200 OK");
  EXPECT_EQ(handled, 1);
  ASSERT_TRUE((*server)->WaitUntilIdle(std::chrono::seconds(20)));
  EXPECT_EQ(budget.in_use(), 0);
  // Without a body the head check does not run: the handler decides.
  EXPECT_EQ(RoundTrip(port, "GET /x HTTP/1.1\r\n\r\n").status,
            "HTTP/1.1 200 OK");
}

}  // namespace
}  // namespace shardlm
