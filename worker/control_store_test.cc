// The coordinator's rendezvous store over gRPC (ControlService::StoreSet /
// StoreGet through ControlPlaneStore): values round-trip, a missing key
// times out, strangers and oversized entries are refused, and two Gloo
// ranks meet through it.
#include "worker/control_store.h"

#include <thread>

#include "cluster/control_service.h"
#include "collectives/collective_checks.h"
#include "gmock/gmock.h"
#include "grpcpp/grpcpp.h"
#include "gtest/gtest.h"

namespace shardlm {
namespace {

using ::testing::HasSubstr;

class ControlStoreTest : public ::testing::Test {
 protected:
  void SetUp() override {
    service_ = std::make_unique<ControlService>(
        ClusterOptions{.tp = 2, .pp = 1, .cluster_token = "right-token"});
    grpc::ServerBuilder builder;
    builder.AddListeningPort("127.0.0.1:0", grpc::InsecureServerCredentials(),
                             &port_);
    AddControlService(builder, service_.get());
    server_ = builder.BuildAndStart();
    ASSERT_NE(server_, nullptr);
    address_ = "127.0.0.1:" + std::to_string(port_);
  }
  void TearDown() override {
    server_->Shutdown();
    server_->Wait();
  }
  ControlPlaneStore Store(const std::string& token) {
    return ControlPlaneStore(
        grpc::CreateChannel(address_, grpc::InsecureChannelCredentials()),
        address_, token);
  }

  std::unique_ptr<ControlService> service_;
  std::unique_ptr<grpc::Server> server_;
  int port_ = 0;
  std::string address_;
};

TEST_F(ControlStoreTest, SetThenGetAndWaitForALateSet) {
  ControlPlaneStore store = Store("right-token");
  const std::string binary("a\0b\xff", 4);
  ASSERT_TRUE(store.Set("k", binary).ok());
  auto v = store.Get("k", absl::Seconds(1));
  ASSERT_TRUE(v.ok()) << v.status();
  EXPECT_EQ(*v, binary);
  std::thread late([&] {
    std::this_thread::sleep_for(std::chrono::milliseconds(300));
    ControlPlaneStore other = Store("right-token");
    EXPECT_TRUE(other.Set("late", "x").ok());
  });
  v = store.Get("late", absl::Seconds(10));
  late.join();
  ASSERT_TRUE(v.ok()) << v.status();
  EXPECT_EQ(*v, "x");
}

TEST_F(ControlStoreTest, MissingKeyTimesOutNamingIt) {
  ControlPlaneStore store = Store("right-token");
  auto v = store.Get("nobody/0", absl::Milliseconds(300));
  EXPECT_EQ(v.status().code(), absl::StatusCode::kDeadlineExceeded);
  EXPECT_THAT(std::string(v.status().message()), HasSubstr("'nobody/0'"));
}

TEST_F(ControlStoreTest, StrangersAndOversizedEntriesAreRefused) {
  ControlPlaneStore stranger = Store("wrong-token");
  EXPECT_EQ(stranger.Set("k", "v").code(), absl::StatusCode::kUnauthenticated);
  EXPECT_EQ(stranger.Get("k", absl::Seconds(1)).status().code(),
            absl::StatusCode::kUnauthenticated);
  ControlPlaneStore store = Store("right-token");
  EXPECT_EQ(store.Set(std::string(513, 'k'), "v").code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(store.Set("k", std::string((64 << 10) + 1, 'v')).code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(store.Set("", "v").code(), absl::StatusCode::kInvalidArgument);
  // The refused writes left nothing behind.
  EXPECT_EQ(store.Get("k", absl::Milliseconds(100)).status().code(),
            absl::StatusCode::kDeadlineExceeded);
}

TEST_F(ControlStoreTest, GlooRanksMeetThroughIt) {
  std::vector<std::thread> ranks;
  for (int r = 0; r < 2; ++r) {
    ranks.emplace_back([&, r] {
      ControlPlaneStore store = Store("right-token");
      auto transport = GlooTransport::Create("127.0.0.1");
      ASSERT_TRUE(transport.ok()) << transport.status();
      auto c = GlooCommunicator::Connect(store, "run-1", *transport,
                                         "tp group of stage 0", r, 2,
                                         {.timeout = absl::Seconds(20)});
      ASSERT_TRUE(c.ok()) << c.status();
      CheckExactResults(**c);
    });
  }
  for (auto& t : ranks) t.join();
}

}  // namespace
}  // namespace shardlm
