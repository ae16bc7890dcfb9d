// RouterService against in-process fake replicas: what each replica is
// sent (the resume fields after a mid-stream failure, the key, the
// deadline), when a call is retried or resumed and when it is not.
#include "router/router_service.h"

#include <atomic>
#include <chrono>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "grpcpp/create_channel.h"
#include "grpcpp/security/credentials.h"
#include "grpcpp/security/server_credentials.h"
#include "grpcpp/server_builder.h"
#include "gtest/gtest.h"
#include "router/replica_set.h"
#include "shardlm/v1/replica_state.grpc.pb.h"

namespace shardlm {
namespace {

// What a fake replica's Generate does: send `tokens` (one response each),
// then end with `end` (a finish_reason "length" response first when OK).
struct Script {
  std::vector<int32_t> tokens;
  grpc::Status end = grpc::Status::OK;
  absl::Duration gap = absl::ZeroDuration();  // Before each token.
};

class FakeReplica final : public v1::Inference::Service,
                          public v1::ReplicaState::Service {
 public:
  explicit FakeReplica(Script script) : script_(std::move(script)) {
    grpc::ServerBuilder b;
    b.AddListeningPort("127.0.0.1:0", grpc::InsecureServerCredentials(),
                       &port_);
    b.RegisterService(static_cast<v1::Inference::Service*>(this));
    b.RegisterService(static_cast<v1::ReplicaState::Service*>(this));
    server_ = b.BuildAndStart();
  }
  ~FakeReplica() override {
    {
      absl::MutexLock lock(&mu_);
      stopping_ = true;
    }
    server_->Shutdown(std::chrono::system_clock::now());
  }
  std::string address() const { return "127.0.0.1:" + std::to_string(port_); }

  grpc::Status GetModelInfo(grpc::ServerContext*,
                            const v1::GetModelInfoRequest*,
                            v1::ModelInfo* info) override {
    info->set_name("fake-model");
    return grpc::Status::OK;
  }
  grpc::Status WatchState(
      grpc::ServerContext* context, const v1::WatchStateRequest*,
      grpc::ServerWriter<v1::ReplicaStateUpdate>* writer) override {
    v1::ReplicaStateUpdate u;
    u.set_ready(true);
    u.set_block_size(16);
    u.set_kv_total_blocks(100);
    while (!context->IsCancelled()) {
      {
        absl::MutexLock lock(&mu_);
        if (stopping_) break;
      }
      if (!muted_.load() && !writer->Write(u)) break;
      absl::SleepFor(absl::Milliseconds(50));
    }
    return grpc::Status::OK;
  }
  grpc::Status Generate(
      grpc::ServerContext* context, const v1::GenerateRequest* request,
      grpc::ServerWriter<v1::GenerateResponse>* writer) override {
    {
      absl::MutexLock lock(&mu_);
      requests_.push_back(*request);
      const auto& md = context->client_metadata();
      const auto it = md.find("authorization");
      keys_.push_back(it == md.end()
                          ? "(none)"
                          : std::string(it->second.data(), it->second.size()));
      deadlines_.push_back(context->deadline());
    }
    for (int32_t t : script_.tokens) {
      absl::SleepFor(script_.gap);
      v1::GenerateResponse r;
      r.add_token_ids(t);
      r.set_text(absl::StrCat("<", t, ">"));
      writer->Write(r);
    }
    if (script_.end.ok()) {
      v1::GenerateResponse last;
      last.set_finish_reason("length");
      writer->Write(last);
    }
    return script_.end;
  }

  // Muted: the state stream stays open and says nothing (a hung replica).
  void Mute() { muted_ = true; }

  std::vector<v1::GenerateRequest> requests() {
    absl::MutexLock lock(&mu_);
    return requests_;
  }
  std::vector<std::string> keys() {
    absl::MutexLock lock(&mu_);
    return keys_;
  }
  std::vector<std::chrono::system_clock::time_point> deadlines() {
    absl::MutexLock lock(&mu_);
    return deadlines_;
  }

 private:
  const Script script_;
  int port_ = 0;
  std::unique_ptr<grpc::Server> server_;
  absl::Mutex mu_;
  bool stopping_ = false;
  std::atomic<bool> muted_{false};
  std::vector<v1::GenerateRequest> requests_;
  std::vector<std::string> keys_;
  std::vector<std::chrono::system_clock::time_point> deadlines_;
};

// A replica that answers GetModelInfo with `name` only.
class FakeModelInfoReplica final : public v1::Inference::Service {
 public:
  explicit FakeModelInfoReplica(std::string name) : name_(std::move(name)) {
    grpc::ServerBuilder b;
    b.AddListeningPort("127.0.0.1:0", grpc::InsecureServerCredentials(),
                       &port_);
    b.RegisterService(this);
    server_ = b.BuildAndStart();
  }
  ~FakeModelInfoReplica() override {
    server_->Shutdown(std::chrono::system_clock::now());
  }
  std::string address() const { return "127.0.0.1:" + std::to_string(port_); }
  grpc::Status GetModelInfo(grpc::ServerContext*,
                            const v1::GetModelInfoRequest*,
                            v1::ModelInfo* info) override {
    info->set_name(name_);
    return grpc::Status::OK;
  }

 private:
  std::string name_;
  int port_ = 0;
  std::unique_ptr<grpc::Server> server_;
};

struct Streamed {
  grpc::Status status;
  std::vector<int32_t> tokens;
  std::string text;
};

// A router (round-robin: the first call goes to replica 0) over `fakes`.
class RouterTest : public ::testing::Test {
 protected:
  void Start(const std::vector<FakeReplica*>& fakes) {
    std::vector<std::string> addresses;
    for (FakeReplica* f : fakes) addresses.push_back(f->address());
    StartAt(addresses, static_cast<int>(fakes.size()));
  }
  // Waits (10 s at most) until `ready` replicas are.
  void StartAt(const std::vector<std::string>& addresses, int ready) {
    ReplicaSetOptions o;
    o.addresses = addresses;
    o.call_timeout = absl::Milliseconds(500);
    auto set = ReplicaSet::Start(o);
    ASSERT_TRUE(set.ok()) << set.status();
    set_ = *std::move(set);
    const absl::Time end = absl::Now() + absl::Seconds(10);
    while (set_->ready_count() < ready && absl::Now() < end) {
      absl::SleepFor(absl::Milliseconds(10));
    }
    ASSERT_EQ(set_->ready_count(), ready);
    RouterServiceOptions so;
    so.routing.kind = RoutingPolicyKind::kRoundRobin;
    service_ = std::make_unique<RouterService>(set_.get(), nullptr, so);
    wire_ = RouterWireService(service_.get());
    grpc::ServerBuilder b;
    int port = 0;
    b.AddListeningPort("127.0.0.1:0", grpc::InsecureServerCredentials(), &port);
    b.RegisterService(wire_.get());
    server_ = b.BuildAndStart();
    stub_ = v1::Inference::NewStub(
        grpc::CreateChannel("127.0.0.1:" + std::to_string(port),
                            grpc::InsecureChannelCredentials()));
  }
  void TearDown() override {
    if (server_) server_->Shutdown(std::chrono::system_clock::now());
  }
  Streamed Call(const v1::GenerateRequest& req, const std::string& key = "") {
    grpc::ClientContext ctx;
    ctx.set_deadline(std::chrono::system_clock::now() +
                     std::chrono::seconds(30));
    if (!key.empty()) ctx.AddMetadata("authorization", key);
    Streamed out;
    auto reader = stub_->Generate(&ctx, req);
    v1::GenerateResponse r;
    while (reader->Read(&r)) {
      out.tokens.insert(out.tokens.end(), r.token_ids().begin(),
                        r.token_ids().end());
      out.text += r.text();
    }
    out.status = reader->Finish();
    return out;
  }

  std::unique_ptr<ReplicaSet> set_;
  std::unique_ptr<RouterService> service_;
  std::unique_ptr<grpc::Service> wire_;
  std::unique_ptr<grpc::Server> server_;
  std::unique_ptr<v1::Inference::Stub> stub_;
};

v1::GenerateRequest Request() {
  v1::GenerateRequest r;
  r.set_prompt("hello");
  r.set_max_tokens(10);
  r.set_priority(3);
  r.mutable_sampling()->set_seed(42);
  return r;
}

TEST_F(RouterTest, AMidStreamFailureResumesElsewhereFromTheTokensSent) {
  FakeReplica dies(
      {.tokens = {5, 6, 7},
       .end = grpc::Status(grpc::StatusCode::UNAVAILABLE, "gone")});
  FakeReplica takes_over({.tokens = {8, 9}});
  Start({&dies, &takes_over});
  const Streamed s = Call(Request(), "Bearer client-key");
  ASSERT_TRUE(s.status.ok()) << s.status.error_message();
  EXPECT_EQ(s.tokens, (std::vector<int32_t>{5, 6, 7, 8, 9}));
  EXPECT_EQ(s.text, "<5><6><7><8><9>");
  ASSERT_EQ(takes_over.requests().size(), 1u);
  v1::GenerateRequest want = Request();
  want.add_resume_token_ids(5);
  want.add_resume_token_ids(6);
  want.add_resume_token_ids(7);
  want.set_resume_position(3);
  EXPECT_EQ(takes_over.requests()[0].SerializeAsString(),
            want.SerializeAsString())
      << takes_over.requests()[0].DebugString();
  // The first replica got the request as the client sent it.
  EXPECT_EQ(dies.requests()[0].SerializeAsString(),
            Request().SerializeAsString());
  // The client's key and deadline went to both.
  for (FakeReplica* f : {&dies, &takes_over}) {
    EXPECT_EQ(f->keys(), std::vector<std::string>{"Bearer client-key"});
    const auto left = f->deadlines()[0] - std::chrono::system_clock::now();
    EXPECT_GT(left, std::chrono::seconds(20));
    // gRPC sends timeouts rounded up to its wire units: a little over.
    EXPECT_LE(left, std::chrono::seconds(31));
  }
  EXPECT_EQ(service_->resumes(), 1);
  EXPECT_EQ(service_->retries(), 0);
}

TEST_F(RouterTest, AFailureBeforeAnyTokenIsRetriedOnceElsewhere) {
  FakeReplica refuses(
      {.end = grpc::Status(grpc::StatusCode::UNAVAILABLE, "draining")});
  FakeReplica serves({.tokens = {1, 2}});
  Start({&refuses, &serves});
  const Streamed s = Call(Request());
  ASSERT_TRUE(s.status.ok()) << s.status.error_message();
  EXPECT_EQ(s.tokens, (std::vector<int32_t>{1, 2}));
  ASSERT_EQ(serves.requests().size(), 1u);
  EXPECT_EQ(serves.requests()[0].resume_token_ids_size(), 0);
  EXPECT_EQ(serves.keys()[0], "(none)");
  EXPECT_EQ(service_->retries(), 1);
}

TEST_F(RouterTest, OnlyOneRetryAndTheErrorNamesTheReplica) {
  FakeReplica a({.end = grpc::Status(grpc::StatusCode::UNAVAILABLE, "a down")});
  FakeReplica b({.end = grpc::Status(grpc::StatusCode::UNAVAILABLE, "b down")});
  FakeReplica c({.tokens = {1}});
  Start({&a, &b, &c});
  const Streamed s = Call(Request());
  EXPECT_EQ(s.status.error_code(), grpc::StatusCode::UNAVAILABLE);
  EXPECT_NE(
      s.status.error_message().find("replica " + b.address() + ": b down"),
      std::string::npos)
      << s.status.error_message();
  EXPECT_TRUE(c.requests().empty()) << "retried twice";
}

TEST_F(RouterTest, OtherErrorsAreNotRetried) {
  FakeReplica a(
      {.end = grpc::Status(grpc::StatusCode::INVALID_ARGUMENT, "bad field")});
  FakeReplica b({.tokens = {1}});
  Start({&a, &b});
  const Streamed s = Call(Request());
  EXPECT_EQ(s.status.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_EQ(s.status.error_message(), "replica " + a.address() + ": bad field");
  EXPECT_TRUE(b.requests().empty());
}

TEST_F(RouterTest, AStreamIsResumedAtMostTwice) {
  const grpc::Status down(grpc::StatusCode::UNAVAILABLE, "down");
  FakeReplica a({.tokens = {1}, .end = down});
  FakeReplica b({.tokens = {2}, .end = down});
  FakeReplica c({.tokens = {3}, .end = down});
  FakeReplica d({.tokens = {4}});
  Start({&a, &b, &c, &d});
  const Streamed s = Call(Request());
  EXPECT_EQ(s.status.error_code(), grpc::StatusCode::UNAVAILABLE);
  EXPECT_EQ(s.tokens, (std::vector<int32_t>{1, 2, 3}));
  EXPECT_EQ(service_->resumes(), 2);
  EXPECT_TRUE(d.requests().empty());
}

TEST_F(RouterTest, ReplicasCanBeAddedRemovedAndAddedAgain) {
  FakeReplica a({.tokens = {1}});
  FakeReplica b({.tokens = {2}});
  Start({&a});
  const auto ready_within = [&](int n) {
    const absl::Time end = absl::Now() + absl::Seconds(10);
    while (set_->ready_count() != n && absl::Now() < end) {
      absl::SleepFor(absl::Milliseconds(10));
    }
    return set_->ready_count() == n;
  };
  ASSERT_TRUE(set_->SetAddresses({a.address(), b.address()}).ok());
  ASSERT_TRUE(ready_within(2));
  EXPECT_EQ(set_->size(), 2);
  ASSERT_TRUE(set_->SetAddresses({b.address()}).ok());
  ASSERT_TRUE(ready_within(1));
  const size_t a_before = a.requests().size();
  for (int i = 0; i < 4; ++i) {
    EXPECT_EQ(Call(Request()).tokens, std::vector<int32_t>{2});
  }
  EXPECT_EQ(a.requests().size(), a_before) << "a removed replica was used";
  ASSERT_TRUE(set_->SetAddresses({a.address(), b.address()}).ok());
  ASSERT_TRUE(ready_within(2));
  EXPECT_EQ(set_->size(), 2);  // The same entry again, not a new one.
  std::vector<std::string> many;
  for (int i = 0; i <= ReplicaSet::kMaxReplicas; ++i) {
    many.push_back("127.0.0.1:" + std::to_string(10000 + i));
  }
  const absl::Status too_many = set_->SetAddresses(many);
  EXPECT_EQ(too_many.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(set_->size(), 2) << "a refused list changed something";
}

// A replica taken out of the list finishes what it runs: its silence (it
// is no longer watched) does not cancel its calls.
TEST_F(RouterTest, ARemovedReplicaFinishesItsCalls) {
  FakeReplica slow({.tokens = {1, 2, 3, 4, 5}, .gap = absl::Milliseconds(800)});
  FakeReplica other({.tokens = {9}});
  Start({&slow, &other});
  Streamed s;
  std::thread call([&] { s = Call(Request()); });  // Round-robin: `slow`.
  absl::SleepFor(absl::Milliseconds(300));
  ASSERT_TRUE(set_->SetAddresses({other.address()}).ok());
  call.join();  // 4 s: past the 3 s a silent replica is given.
  ASSERT_TRUE(s.status.ok()) << s.status.error_message();
  EXPECT_EQ(s.tokens, (std::vector<int32_t>{1, 2, 3, 4, 5}));
  EXPECT_EQ(service_->resumes(), 0);
  EXPECT_TRUE(other.requests().empty());
}

// A replica whose state goes silent mid-stream (hung) has its call
// cancelled after stall_after and the stream resumed elsewhere.
TEST_F(RouterTest, ASilentReplicasCallsAreResumedElsewhere) {
  FakeReplica hangs(
      {.tokens = {1, 2, 3, 4, 5, 6, 7, 8}, .gap = absl::Milliseconds(700)});
  FakeReplica other({.tokens = {9}});
  Start({&hangs, &other});
  Streamed s;
  std::thread call([&] { s = Call(Request()); });  // Round-robin: `hangs`.
  absl::SleepFor(absl::Milliseconds(900));         // Token 1 is out.
  hangs.Mute();
  call.join();
  ASSERT_TRUE(s.status.ok()) << s.status.error_message();
  EXPECT_EQ(service_->resumes(), 1);
  const std::vector<v1::GenerateRequest> sent = other.requests();
  ASSERT_EQ(sent.size(), 1u);
  const v1::GenerateRequest& resumed = sent[0];
  // Resumed from exactly what the client had: the tokens before 9.
  std::vector<int32_t> before(s.tokens.begin(), s.tokens.end() - 1);
  EXPECT_EQ(std::vector<int32_t>(resumed.resume_token_ids().begin(),
                                 resumed.resume_token_ids().end()),
            before);
  EXPECT_EQ(resumed.resume_position(), static_cast<int>(before.size()));
  EXPECT_EQ(s.tokens.back(), 9);
  EXPECT_LT(before.size(), 8u) << "the silent replica was never cut off";
}

// The HTTP API's path (RouterService::Run, which OpenAiApi calls): routed,
// resumed and keyed as a gRPC call is.
TEST_F(RouterTest, RunResumesAMidStreamFailureAsGenerateDoes) {
  FakeReplica dies(
      {.tokens = {5, 6},
       .end = grpc::Status(grpc::StatusCode::UNAVAILABLE, "gone")});
  FakeReplica takes_over({.tokens = {7}});
  Start({&dies, &takes_over});
  std::vector<int32_t> tokens;
  std::string finish;
  const absl::Status s = service_->Run(
      Request(), absl::Now() + absl::Seconds(20), [] { return false; },
      [&](const v1::GenerateResponse& r) {
        tokens.insert(tokens.end(), r.token_ids().begin(), r.token_ids().end());
        if (!r.finish_reason().empty()) finish = r.finish_reason();
        return true;
      });
  ASSERT_TRUE(s.ok()) << s;
  EXPECT_EQ(tokens, (std::vector<int32_t>{5, 6, 7}));
  EXPECT_EQ(finish, "length");
  ASSERT_EQ(takes_over.requests().size(), 1u);
  EXPECT_EQ(takes_over.requests()[0].resume_position(), 2);
  // No key configured: none is sent; the deadline travels.
  EXPECT_EQ(takes_over.keys()[0], "(none)");
  const auto left =
      takes_over.deadlines()[0] - std::chrono::system_clock::now();
  EXPECT_GT(left, std::chrono::seconds(10));
  EXPECT_LT(left, std::chrono::seconds(21));
}

TEST_F(RouterTest, RunStopsWhenTheClientGoes) {
  FakeReplica slow({.tokens = {1, 2, 3, 4, 5, 6, 7, 8, 9, 10},
                    .gap = absl::Milliseconds(300)});
  Start({&slow});
  std::atomic<bool> gone{false};
  std::atomic<int> written{0};
  std::thread leave([&] {
    absl::SleepFor(absl::Milliseconds(450));
    gone = true;
  });
  const absl::Time start = absl::Now();
  const absl::Status s = service_->Run(
      Request(), absl::InfiniteFuture(), [&] { return gone.load(); },
      [&](const v1::GenerateResponse&) {
        ++written;
        return true;
      });
  leave.join();
  EXPECT_EQ(s.code(), absl::StatusCode::kCancelled) << s;
  // Cut by the watchdog (every 100 ms), not after the 3 s stream.
  EXPECT_LT(absl::Now() - start, absl::Seconds(2));
  EXPECT_LE(written.load(), 2);
}

TEST_F(RouterTest, DrainingRefusesNewCallsOnBothApis) {
  FakeReplica replica({.tokens = {1}});
  Start({&replica});
  service_->StartDraining();
  const Streamed s = Call(Request());
  EXPECT_EQ(s.status.error_code(), grpc::StatusCode::UNAVAILABLE);
  EXPECT_NE(s.status.error_message().find("draining"), std::string::npos);
  const absl::Status r = service_->Run(
      Request(), absl::InfiniteFuture(), [] { return false; },
      [](const v1::GenerateResponse&) { return true; });
  EXPECT_EQ(r.code(), absl::StatusCode::kUnavailable) << r;
  EXPECT_TRUE(replica.requests().empty());
  EXPECT_EQ(service_->in_flight(), 0);
}

TEST_F(RouterTest, NoReadyReplicaIsUnavailableNamingThem) {
  StartAt({"127.0.0.1:1"}, 0);  // Nothing listens there.
  const Streamed s = Call(Request());
  EXPECT_EQ(s.status.error_code(), grpc::StatusCode::UNAVAILABLE);
  EXPECT_NE(s.status.error_message().find("no replica is ready: 127.0.0.1:1 ("),
            std::string::npos)
      << s.status.error_message();
}

TEST_F(RouterTest, TwoModelsRefuseToStartNamingBoth) {
  FakeReplica a({.tokens = {1}});
  FakeModelInfoReplica other("other-model");
  ReplicaSetOptions o;
  o.addresses = {a.address(), other.address()};
  auto set = ReplicaSet::Start(o);
  ASSERT_FALSE(set.ok());
  EXPECT_EQ(set.status().code(), absl::StatusCode::kInvalidArgument);
  const std::string m(set.status().message());
  EXPECT_NE(m.find("'fake-model'"), std::string::npos) << m;
  EXPECT_NE(m.find("'other-model'"), std::string::npos) << m;
  EXPECT_NE(m.find(other.address()), std::string::npos) << m;
}

}  // namespace
}  // namespace shardlm
