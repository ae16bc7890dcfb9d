// RouterHttpApi's own answers (the OpenAI layer itself is
// api/openai_api_test.cc's, and end to end
// tests/cli/check_router_http.py's): the probes, the key before anything
// else, and 503 naming the replicas until one has reported its model.
#include "router/router_http.h"

#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "gtest/gtest.h"

namespace shardlm {
namespace {

class RecordedResponse final : public HttpResponse {
 public:
  bool Send(int s, const std::string& type, const std::string& b) override {
    status = s;
    content_type = type;
    body = b;
    return true;
  }
  bool Start(int s, const std::string& type) override {
    status = s;
    content_type = type;
    return true;
  }
  bool Write(const std::string& data) override {
    body += data;
    return true;
  }
  void AddHeader(std::string name, std::string value) override {
    headers.emplace_back(std::move(name), std::move(value));
  }
  bool ClientGone() const override { return false; }

  int status = 0;
  std::string content_type, body;
  std::vector<std::pair<std::string, std::string>> headers;
};

class RouterHttpTest : public ::testing::Test {
 protected:
  void SetUp() override {
    ReplicaSetOptions o;
    o.addresses = {"127.0.0.1:1"};  // Nothing listens there.
    o.call_timeout = absl::Milliseconds(200);
    auto set = ReplicaSet::Start(o);
    ASSERT_TRUE(set.ok()) << set.status();
    set_ = *std::move(set);
    service_ = std::make_unique<RouterService>(set_.get(), nullptr,
                                               RouterServiceOptions());
  }
  RecordedResponse Get(RouterHttpApi& api, const std::string& path,
                       const std::string& key = "") {
    HttpRequest req;
    req.method = path == "/v1/completions" ? "POST" : "GET";
    req.path = path;
    if (!key.empty()) req.headers.push_back({"authorization", key});
    RecordedResponse res;
    api.Handle(req, res);
    return res;
  }

  std::unique_ptr<ReplicaSet> set_;
  std::unique_ptr<RouterService> service_;
};

TEST_F(RouterHttpTest, ProbesAndMetricsBeforeAnyReplicaAnswers) {
  RouterHttpApi api(set_.get(), service_.get(), {});
  EXPECT_EQ(Get(api, "/health").status, 200);
  const RecordedResponse ready = Get(api, "/ready");
  EXPECT_EQ(ready.status, 503);
  EXPECT_NE(ready.body.find("127.0.0.1:1"), std::string::npos) << ready.body;
  const RecordedResponse metrics = Get(api, "/metrics");
  EXPECT_EQ(metrics.status, 200);
  EXPECT_NE(metrics.body.find("shardlm_router_replicas_ready 0"),
            std::string::npos);
}

TEST_F(RouterHttpTest, TheApiIs503NamingTheReplicasUntilOneAnswers) {
  RouterHttpApi api(set_.get(), service_.get(), {});
  for (const char* path : {"/v1/models", "/v1/completions"}) {
    const RecordedResponse r = Get(api, path);
    EXPECT_EQ(r.status, 503) << path;
    EXPECT_NE(r.body.find("\"type\":\"server_error\""), std::string::npos);
    EXPECT_NE(r.body.find("no replica has reported its model yet: "
                          "127.0.0.1:1"),
              std::string::npos)
        << r.body;
  }
}

TEST_F(RouterHttpTest, TheKeyComesFirst) {
  RouterHttpApi api(set_.get(), service_.get(),
                    {.api_key = "k", .metrics_auth = true});
  HttpRequest head;
  head.method = "POST";
  head.path = "/v1/completions";
  const std::optional<HttpRefusal> refused = api.CheckHead(head);
  ASSERT_TRUE(refused.has_value());
  EXPECT_EQ(refused->status, 401);
  head.headers.push_back({"authorization", "Bearer k"});
  EXPECT_FALSE(api.CheckHead(head).has_value());
  EXPECT_EQ(Get(api, "/v1/models").status, 401);
  EXPECT_EQ(Get(api, "/v1/models", "Bearer wrong").status, 401);
  EXPECT_EQ(Get(api, "/v1/models", "Bearer k").status, 503);
  EXPECT_EQ(Get(api, "/metrics").status, 401);
  EXPECT_EQ(Get(api, "/metrics", "Bearer k").status, 200);
  EXPECT_EQ(Get(api, "/health").status, 200);  // Probes stay open.
}

}  // namespace
}  // namespace shardlm
