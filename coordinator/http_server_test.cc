#include "coordinator/http_server.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"

namespace shardlm {
namespace {

// A connection to 127.0.0.1:port, or -1.
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
  return fd;
}

// Connects to 127.0.0.1:port, sends `request`, returns all it reads until
// the server closes.
std::string RoundTrip(int port, const std::string& request) {
  const int fd = Connect(port);
  if (fd < 0) return "connect failed";
  ::send(fd, request.data(), request.size(), MSG_NOSIGNAL);
  std::string out;
  char buf[4096];
  ssize_t n;
  while ((n = ::recv(fd, buf, sizeof(buf), 0)) > 0) out.append(buf, n);
  ::close(fd);
  return out;
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
  const std::string get =
      RoundTrip(server->port(), "GET /a/b?x=1 HTTP/1.1\r\nX-Key:  v \r\n\r\n");
  EXPECT_EQ(get.rfind("HTTP/1.1 200 OK\r\n", 0), 0u) << get;
  EXPECT_NE(get.find("X-Test: 1\r\n"), std::string::npos);
  EXPECT_NE(get.find("Connection: close"), std::string::npos);
  EXPECT_NE(get.find("\r\n\r\nGET /a/b x=1 [v] "), std::string::npos) << get;
  const std::string post =
      RoundTrip(server->port(),
                "POST /p HTTP/1.1\r\nContent-Length: 11\r\n\r\nhello world");
  EXPECT_NE(post.find("Content-Length: 23\r\n"), std::string::npos) << post;
  EXPECT_NE(post.find("POST /p  [] hello world"), std::string::npos) << post;
}

TEST(HttpServerTest, StreamsUntilTheHandlerReturns) {
  auto server = Echo();
  const std::string got =
      RoundTrip(server->port(), "GET /stream HTTP/1.1\r\n\r\n");
  EXPECT_NE(got.find("Content-Type: text/event-stream"), std::string::npos);
  EXPECT_NE(got.find("\r\n\r\ndata: 0\n\ndata: 1\n\ndata: 2\n\n"),
            std::string::npos)
      << got;
}

TEST(HttpServerTest, BadRequestsGetPreciseStatuses) {
  auto server = Echo({.max_header_bytes = 1024,
                      .max_body_bytes = 16,
                      .header_timeout = std::chrono::milliseconds(300),
                      .read_timeout = std::chrono::milliseconds(300)});
  const int port = server->port();
  const auto status = [&](const std::string& request) {
    const std::string got = RoundTrip(port, request);
    return got.substr(0, got.find("\r\n"));
  };
  EXPECT_EQ(status("NONSENSE\r\n\r\n"), "HTTP/1.1 400 Bad Request");
  EXPECT_EQ(status("GET nopath HTTP/1.1\r\n\r\n"), "HTTP/1.1 400 Bad Request");
  EXPECT_EQ(status("GET / HTTP/2.0\r\n\r\n"),
            "HTTP/1.1 505 HTTP Version Not Supported");
  EXPECT_EQ(status("GET / HTTP/1.1\r\nno colon\r\n\r\n"),
            "HTTP/1.1 400 Bad Request");
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

TEST(HttpServerTest, IdleConnectionsTakeNoThreadAndProbesOutliveBusyOnes) {
  // Two handler threads, both held by streams; 50 idle connections.
  std::atomic<bool> release{false};
  std::atomic<int> streaming{0};
  auto server = HttpServer::Start(
      {.max_connections = 2, .probe_paths = {"/health"}},
      [&](const HttpRequest& req, HttpResponse& res) {
        if (req.path != "/hold") {
          res.Send(200, "text/plain", "ok");
          return;
        }
        res.Start(200, "text/event-stream");
        ++streaming;
        while (!release)
          std::this_thread::sleep_for(std::chrono::milliseconds(5));
      });
  ASSERT_TRUE(server.ok()) << server.status();
  const int port = (*server)->port();
  std::vector<int> idle;
  for (int i = 0; i < 50; ++i) {
    idle.push_back(Connect(port));
    ASSERT_GE(idle.back(), 0);
  }
  const auto status = [&](const std::string& path) {
    const std::string got =
        RoundTrip(port, absl::StrCat("GET ", path, " HTTP/1.1\r\n\r\n"));
    return got.substr(0, got.find("\r\n"));
  };
  EXPECT_EQ(status("/x"), "HTTP/1.1 200 OK");  // Idle ones hold no thread.
  std::vector<std::thread> holders;
  for (int i = 0; i < 2; ++i) holders.emplace_back([&] { status("/hold"); });
  while (streaming < 2)
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  EXPECT_EQ(status("/x"), "HTTP/1.1 503 Service Unavailable");
  EXPECT_EQ(status("/health"), "HTTP/1.1 200 OK");
  release = true;
  for (auto& t : holders) t.join();
  for (int fd : idle) ::close(fd);
}

TEST(HttpServerTest, ShutdownEndsStreamsWhoseClientsStayConnected) {
  std::atomic<bool> write_failed{false};
  std::atomic<bool> streaming{false};
  auto server = HttpServer::Start({}, [&](const HttpRequest&, HttpResponse& r) {
    r.Start(200, "text/event-stream");
    streaming = true;
    while (r.Write("data: x\n\n")) {
      std::this_thread::sleep_for(std::chrono::milliseconds(5));
    }
    write_failed = true;
  });
  ASSERT_TRUE(server.ok()) << server.status();
  std::thread client(
      [&] { RoundTrip((*server)->port(), "GET / HTTP/1.1\r\n\r\n"); });
  while (!streaming) std::this_thread::sleep_for(std::chrono::milliseconds(5));
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

}  // namespace
}  // namespace shardlm
