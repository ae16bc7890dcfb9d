// The worker agent against coordinators that are not there or go silent.
#include <chrono>
#include <cstdio>
#include <thread>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "cluster/cluster_test_util.h"
#include "cluster/remote_executor.h"
#include "core/status.h"
#include "grpcpp/grpcpp.h"
#include "gtest/gtest.h"
#include "model/in_memory_weights.h"
#include "step/step_codec.h"

namespace shardlm {
namespace {

using cluster_testing::Clock;
using cluster_testing::RandomConfig;
using cluster_testing::Since;
using cluster_testing::TestHost;

TEST(WorkerAgentTest, UnreachableCoordinatorIsNamed) {
  auto source = RandomLlamaWeights(RandomConfig(), 3);
  TestHost host(*source, {});
  const Clock::time_point start = Clock::now();
  absl::Status s = RunWorkerAgent({.coordinator = "127.0.0.1:1",
                                   .rank = 1,
                                   .connect_timeout = absl::Milliseconds(500)},
                                  host);
  EXPECT_LT(Since(start), 5.0);
  EXPECT_EQ(s.code(), absl::StatusCode::kUnavailable);
  EXPECT_TRUE(absl::StrContains(s.message(), "127.0.0.1:1")) << s;
  EXPECT_FALSE(absl::StrContains(s.message(), "does not resolve")) << s;
}

// A coordinator that assigns and then goes silent.
class SilentCoordinator final : public v1::Control::Service {
 public:
  grpc::Status Connect(
      grpc::ServerContext* context,
      grpc::ServerReaderWriter<v1::CoordinatorMessage, v1::WorkerMessage>*
          stream) override {
    v1::WorkerMessage in;
    if (!stream->Read(&in)) return grpc::Status::OK;
    v1::CoordinatorMessage out;
    out.mutable_assignment()->set_tp(1);
    out.mutable_assignment()->set_pp(1);
    out.mutable_assignment()->set_threads(1);
    EncodeKvCacheOptions({.dtype = DType::kF16},
                         out.mutable_assignment()->mutable_kv());
    EncodeBatchLimits({}, out.mutable_assignment()->mutable_limits());
    stream->Write(out);
    while (stream->Read(&in)) {
    }
    return grpc::Status::OK;
  }
};

TEST(WorkerAgentTest, SilentCoordinatorIsDetected) {
  auto source = RandomLlamaWeights(RandomConfig(), 3);
  SilentCoordinator coordinator;
  int port = 0;
  grpc::ServerBuilder builder;
  builder.AddListeningPort("127.0.0.1:0", grpc::InsecureServerCredentials(),
                           &port);
  builder.RegisterService(&coordinator);
  auto server = builder.BuildAndStart();
  TestHost host(*source, {});
  const std::string address = absl::StrCat("127.0.0.1:", port);
  absl::Status s =
      RunWorkerAgent({.coordinator = address,
                      .rank = 1,
                      .heartbeat_interval = absl::Milliseconds(100),
                      .coordinator_timeout = absl::Seconds(1)},
                     host);
  EXPECT_EQ(s.code(), absl::StatusCode::kUnavailable) << s;
  EXPECT_TRUE(absl::StrContains(s.message(), address)) << s;
  EXPECT_TRUE(absl::StrContains(s.message(), "no message for 1s")) << s;
  server->Shutdown(std::chrono::system_clock::now() + std::chrono::seconds(2));
  server->Wait();
}

}  // namespace
}  // namespace shardlm
