// Bad cluster startups (cluster_test_util.h): model files, ranks, devices,
// tokens, block counts and load failures are refused naming who and why.
#include <chrono>
#include <cstdio>
#include <thread>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "cluster/cluster_test_util.h"
#include "cluster/remote_executor.h"
#include "core/status.h"
#include "grpcpp/grpcpp.h"
#include "grpcpp/security/credentials.h"
#include "gtest/gtest.h"
#include "model/in_memory_weights.h"
#include "step/step_codec.h"

namespace shardlm {
namespace {

using cluster_testing::Clock;
using cluster_testing::Options;
using cluster_testing::RandomConfig;
using cluster_testing::Since;
using cluster_testing::TestCluster;
using cluster_testing::WaitFor;

TEST(ClusterStartupTest, DifferentModelFilesNameBothRanks) {
  auto source = RandomLlamaWeights(RandomConfig(), 3);
  TestCluster cluster(*source, Options(2, 1));
  cluster.StartWorker(cluster.AgentOptions(1));
  // Rank 2 starts once rank 1 is in, so that rank 1 is the reference.
  ASSERT_TRUE(WaitFor([&] {
    return !absl::StrContains(cluster.service().Health().message(),
                              "waiting for worker ranks 1,");
  })) << "rank 1 never joined: "
      << cluster.service().Health();
  WorkerAgentOptions o2 = cluster.AgentOptions(2);
  o2.model_digest = "fedcba9876543210";
  cluster.StartWorker(o2);
  auto executor = RemoteExecutor::WaitForWorkers(
      cluster.service(), source->config(), absl::Seconds(30));
  ASSERT_FALSE(executor.ok());
  const absl::Status& s = executor.status();
  std::printf("%s\n", s.ToString().c_str());
  EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition) << s;
  EXPECT_TRUE(absl::StrContains(s.message(), "model files differ")) << s;
  EXPECT_TRUE(absl::StrContains(s.message(), "rank 1")) << s;
  EXPECT_TRUE(absl::StrContains(s.message(), "rank 2")) << s;
  EXPECT_TRUE(absl::StrContains(s.message(), "fedcba9876543210")) << s;
  std::vector<absl::Status> agents = cluster.Stop();
  EXPECT_EQ(agents[1].code(), absl::StatusCode::kFailedPrecondition)
      << agents[1];
}

TEST(ClusterStartupTest, DuplicateAndOutOfRangeRanksAreRejected) {
  auto source = RandomLlamaWeights(RandomConfig(), 3);
  {
    TestCluster cluster(*source, Options(2, 1));
    cluster.StartWorker(cluster.AgentOptions(1));
    cluster.StartWorker(cluster.AgentOptions(1), 2);
    auto executor = RemoteExecutor::WaitForWorkers(
        cluster.service(), source->config(), absl::Seconds(30));
    ASSERT_FALSE(executor.ok());
    EXPECT_EQ(executor.status().code(), absl::StatusCode::kAlreadyExists)
        << executor.status();
    EXPECT_TRUE(absl::StrContains(executor.status().message(),
                                  "registered as rank 1, which worker at"))
        << executor.status();
    std::vector<absl::Status> agents = cluster.Stop();
    EXPECT_TRUE(agents[0].code() == absl::StatusCode::kAlreadyExists ||
                agents[1].code() == absl::StatusCode::kAlreadyExists);
  }
  {
    TestCluster cluster(*source, Options(2, 1));
    cluster.StartWorker(cluster.AgentOptions(3), 2);
    auto executor = RemoteExecutor::WaitForWorkers(
        cluster.service(), source->config(), absl::Seconds(30));
    ASSERT_FALSE(executor.ok());
    EXPECT_EQ(executor.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_TRUE(absl::StrContains(executor.status().message(),
                                  "registered as rank 3, but worker ranks "
                                  "are 1..2 (tp 2 x pp 1)"))
        << executor.status();
    std::vector<absl::Status> agents = cluster.Stop();
    EXPECT_EQ(agents[0].code(), absl::StatusCode::kInvalidArgument);
    EXPECT_TRUE(absl::StrContains(agents[0].message(), "registered as rank 3"))
        << agents[0];
  }
}

// GPU clusters: a worker reports its device and GPU at registration; the
// coordinator refuses a worker of another kind than the cluster's, and two
// workers on one GPU (naming both), unless allow_shared_gpu. (The shards
// here run on the CPU: what is tested is the coordinator's bookkeeping.)
TEST(ClusterStartupTest, GpuWorkersOnOneGpuAreRefusedNamingBoth) {
  auto source = RandomLlamaWeights(RandomConfig(), 3);
  const auto gpu_worker = [](TestCluster& c, int rank, std::string uuid) {
    WorkerAgentOptions o = c.AgentOptions(rank);
    o.device = "cuda";
    o.gpu_uuid = std::move(uuid);
    o.gpu_ordinal = rank - 1;
    return o;
  };
  ClusterOptions options = Options(2, 1);
  options.device = "cuda";
  {
    TestCluster cluster(*source, options);
    cluster.StartWorker(gpu_worker(cluster, 1, "GPU-aaaa"));
    ASSERT_TRUE(WaitFor([&] {
      return !absl::StrContains(cluster.service().Health().message(),
                                "waiting for worker ranks 1,");
    })) << "rank 1 never joined: "
        << cluster.service().Health();
    cluster.StartWorker(gpu_worker(cluster, 2, "GPU-aaaa"));
    auto executor = RemoteExecutor::WaitForWorkers(
        cluster.service(), source->config(), absl::Seconds(30));
    ASSERT_FALSE(executor.ok());
    const absl::Status& s = executor.status();
    EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition) << s;
    EXPECT_TRUE(absl::StrContains(s.message(), "worker rank 2")) << s;
    EXPECT_TRUE(absl::StrContains(s.message(), "worker rank 1")) << s;
    EXPECT_TRUE(absl::StrContains(s.message(), "both use GPU GPU-aaaa")) << s;
    cluster.Stop();
  }
  {  // Distinct GPUs form; the assignment carries the GPU sizing settings.
    options.limits.max_batched_tokens = 96;
    options.limits.max_seqs = 7;
    options.kv.gpu_memory_utilization = 0.5;
    TestCluster cluster(*source, options);
    cluster.StartWorker(gpu_worker(cluster, 1, "GPU-aaaa"));
    cluster.StartWorker(gpu_worker(cluster, 2, "GPU-bbbb"));
    auto executor = RemoteExecutor::WaitForWorkers(
        cluster.service(), source->config(), absl::Seconds(30));
    ASSERT_TRUE(executor.ok()) << executor.status();
    EXPECT_STREQ((*executor)->backend(), "cuda");
    for (int r = 1; r <= 2; ++r) {
      const WorkerAssignment& a = cluster.host(r).assignment;
      EXPECT_EQ(a.limits.max_batched_tokens, 96);
      EXPECT_EQ(a.limits.max_seqs, 7);
      EXPECT_EQ(a.kv.gpu_memory_utilization, 0.5);
      EXPECT_EQ(a.step_timeout, options.step_timeout);
      EXPECT_EQ(a.rendezvous_prefix, options.rendezvous_prefix);
    }
    cluster.Stop();
  }
  {  // allow_shared_gpu (tests): one GPU may hold both.
    options.allow_shared_gpu = true;
    TestCluster cluster(*source, options);
    cluster.StartWorker(gpu_worker(cluster, 1, "GPU-aaaa"));
    cluster.StartWorker(gpu_worker(cluster, 2, "GPU-aaaa"));
    auto executor = RemoteExecutor::WaitForWorkers(
        cluster.service(), source->config(), absl::Seconds(30));
    EXPECT_TRUE(executor.ok()) << executor.status();
    cluster.Stop();
  }
}

TEST(ClusterStartupTest, WorkerOfAnotherDeviceKindIsRefused) {
  auto source = RandomLlamaWeights(RandomConfig(), 3);
  ClusterOptions options = Options(1, 1);
  options.device = "cuda";
  TestCluster cluster(*source, options);
  cluster.StartWorker(cluster.AgentOptions(1));  // A CPU worker.
  auto executor = RemoteExecutor::WaitForWorkers(
      cluster.service(), source->config(), absl::Seconds(30));
  ASSERT_FALSE(executor.ok());
  EXPECT_EQ(executor.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_TRUE(absl::StrContains(executor.status().message(),
                                "runs on cpu but this cluster's workers run "
                                "on cuda (the coordinator's --device)"))
      << executor.status();
  std::vector<absl::Status> agents = cluster.Stop();
  EXPECT_EQ(agents[0].code(), absl::StatusCode::kFailedPrecondition)
      << agents[0];
}

TEST(ClusterStartupTest, StrangersWithoutTheTokenAreRefusedAndStartupGoesOn) {
  auto source = RandomLlamaWeights(RandomConfig(), 3);
  ClusterOptions options = Options(2, 1);
  options.cluster_token = "the-cluster-token";
  TestCluster cluster(*source, options);
  // A stranger claims rank 1 first, without the token, then with a wrong
  // one; the real workers come after.
  WorkerAgentOptions stranger = cluster.AgentOptions(1);
  cluster.StartWorker(stranger);
  stranger.cluster_token = "the-cluster-tokeX";
  cluster.StartWorker(stranger);
  for (int r = 1; r <= 2; ++r) {
    WorkerAgentOptions o = cluster.AgentOptions(r);
    o.cluster_token = "the-cluster-token";
    cluster.StartWorker(o);
  }
  auto executor = RemoteExecutor::WaitForWorkers(
      cluster.service(), source->config(), absl::Seconds(30));
  ASSERT_TRUE(executor.ok()) << executor.status();
  Engine* engine = cluster.Keep(Engine::Create(std::move(*executor), {}));
  ASSERT_NE(engine, nullptr);
  auto r = engine->Generate({.prompt = {1, 2, 3}, .max_tokens = 3});
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->tokens.size(), 3u);
  std::vector<absl::Status> agents = cluster.Stop();
  for (int i : {0, 1}) {
    EXPECT_EQ(agents[i].code(), absl::StatusCode::kUnauthenticated)
        << agents[i];
    EXPECT_TRUE(absl::StrContains(agents[i].message(), "cluster token"))
        << agents[i];
  }
  EXPECT_TRUE(agents[2].ok()) << agents[2];
  EXPECT_TRUE(agents[3].ok()) << agents[3];
}

// A call to `method` of the control service opened as a bidirectional
// stream from which nothing is sent: only its headers (with `token` as
// the cluster token's metadata, unless empty) reach the coordinator.
// Returns how the call ended, or DEADLINE_EXCEEDED if the coordinator
// waited for a message until `deadline` instead of refusing the call.
grpc::Status OpenWithoutMessage(const std::string& address, const char* method,
                                const std::string& token,
                                std::chrono::seconds deadline) {
  auto channel =
      grpc::CreateChannel(address, grpc::InsecureChannelCredentials());
  grpc::ClientContext context;
  context.set_deadline(std::chrono::system_clock::now() + deadline);
  if (!token.empty()) context.AddMetadata(kClusterTokenMetadata, token);
  const grpc::internal::RpcMethod rpc(
      method, grpc::internal::RpcMethod::BIDI_STREAMING, channel);
  std::unique_ptr<
      grpc::ClientReaderWriter<v1::StoreGetRequest, v1::StoreGetResponse>>
      call(grpc::internal::ClientReaderWriterFactory<
           v1::StoreGetRequest, v1::StoreGetResponse>::Create(channel.get(),
                                                              rpc, &context));
  v1::StoreGetResponse ignored;
  while (call->Read(&ignored)) {
  }
  return call->Finish();
}

// The token is checked from the call's headers, before any message of the
// call is read (gRPC buffers a whole message before it applies its size
// limit): a stranger's first message, however large, is never buffered or
// parsed, on Connect and on the store's calls alike.
TEST(ClusterStartupTest, TheTokenIsCheckedBeforeAnyMessageIsRead) {
  auto source = RandomLlamaWeights(RandomConfig(), 3);
  ClusterOptions options = Options(2, 1);
  options.cluster_token = "the-cluster-token";
  TestCluster cluster(*source, options);
  for (const char* method :
       {"/shardlm.v1.Control/Connect", "/shardlm.v1.Control/StoreSet",
        "/shardlm.v1.Control/StoreGet"}) {
    for (const std::string token : {"", "the-cluster-tokeX"}) {
      // Refused at once: long before the call's deadline (generous, so
      // that a slow machine's connection setup cannot reach it).
      const Clock::time_point start = Clock::now();
      const grpc::Status s = OpenWithoutMessage(
          cluster.address(), method, token, std::chrono::seconds(30));
      EXPECT_EQ(s.error_code(), grpc::StatusCode::UNAUTHENTICATED)
          << method << " token '" << token << "': " << s.error_message();
      EXPECT_TRUE(absl::StrContains(s.error_message(), "cluster token"))
          << s.error_message();
      EXPECT_LT(Since(start), 10.0) << method;
    }
  }
  // With the right token the coordinator does wait for the message.
  EXPECT_EQ(
      OpenWithoutMessage(cluster.address(), "/shardlm.v1.Control/StoreGet",
                         "the-cluster-token", std::chrono::seconds(3))
          .error_code(),
      grpc::StatusCode::DEADLINE_EXCEEDED);

  // A 64 MiB Register, with the right token inside it but not in the
  // call's metadata: refused without being read.
  {
    auto channel = grpc::CreateCustomChannel(
        cluster.address(), grpc::InsecureChannelCredentials(), [] {
          grpc::ChannelArguments args;
          args.SetMaxSendMessageSize(-1);
          return args;
        }());
    auto stub = v1::Control::NewStub(channel);
    grpc::ClientContext context;
    context.set_deadline(std::chrono::system_clock::now() +
                         std::chrono::seconds(30));
    auto stream = stub->Connect(&context);
    v1::WorkerMessage msg;
    msg.mutable_register_()->set_rank(1);
    msg.mutable_register_()->set_cluster_token("the-cluster-token");
    msg.mutable_register_()->set_host(std::string(64 << 20, 'x'));
    stream->Write(msg);  // May fail: the coordinator has refused the call.
    stream->WritesDone();
    v1::CoordinatorMessage in;
    EXPECT_FALSE(stream->Read(&in));
    const grpc::Status s = stream->Finish();
    EXPECT_EQ(s.error_code(), grpc::StatusCode::UNAUTHENTICATED)
        << s.error_message();
  }
  // The real workers start the cluster, which serves.
  for (int r = 1; r <= 2; ++r) {
    WorkerAgentOptions o = cluster.AgentOptions(r);
    o.cluster_token = "the-cluster-token";
    cluster.StartWorker(o);
  }
  auto executor = RemoteExecutor::WaitForWorkers(
      cluster.service(), source->config(), absl::Seconds(30));
  ASSERT_TRUE(executor.ok()) << executor.status();
  Engine* engine = cluster.Keep(Engine::Create(std::move(*executor), {}));
  ASSERT_NE(engine, nullptr);
  auto r = engine->Generate({.prompt = {1, 2, 3}, .max_tokens = 3});
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->tokens.size(), 3u);
  for (const absl::Status& s : cluster.Stop()) EXPECT_TRUE(s.ok()) << s;
}

TEST(ClusterStartupTest, OutOfRangeBlockCountsAreRefused) {
  auto source = RandomLlamaWeights(RandomConfig(), 3);
  for (int64_t blocks : {int64_t{-5}, int64_t{0}, int64_t{1} << 50}) {
    TestCluster cluster(*source, Options(2, 1));
    cluster.host(2).reported_blocks = blocks;
    cluster.StartAll();
    auto executor = RemoteExecutor::WaitForWorkers(
        cluster.service(), source->config(), absl::Seconds(30));
    ASSERT_FALSE(executor.ok()) << blocks;
    EXPECT_EQ(executor.status().code(), absl::StatusCode::kInvalidArgument)
        << executor.status();
    EXPECT_TRUE(absl::StrContains(executor.status().message(),
                                  absl::StrCat("worker rank 2 (pp 0, tp 1)")))
        << executor.status();
    EXPECT_TRUE(absl::StrContains(executor.status().message(),
                                  absl::StrCat("reported ", blocks, " device")))
        << executor.status();
    cluster.Stop();
  }
}

TEST(ClusterStartupTest, LoadFailureIsReported) {
  auto source = RandomLlamaWeights(RandomConfig(), 3);
  TestCluster cluster(*source, Options(2, 1));
  cluster.host(2).load_error =
      absl::NotFoundError("cannot open /models/x.gguf: no such file");
  cluster.StartAll();
  auto executor = RemoteExecutor::WaitForWorkers(
      cluster.service(), source->config(), absl::Seconds(30));
  ASSERT_FALSE(executor.ok());
  EXPECT_EQ(executor.status().code(), absl::StatusCode::kNotFound)
      << executor.status();
  EXPECT_TRUE(absl::StrContains(executor.status().message(),
                                "worker rank 2 (pp 0, tp 1)"))
      << executor.status();
  EXPECT_TRUE(absl::StrContains(executor.status().message(),
                                "cannot open /models/x.gguf"))
      << executor.status();
  std::vector<absl::Status> agents = cluster.Stop();
  EXPECT_EQ(agents[1].code(), absl::StatusCode::kNotFound);
}

TEST(ClusterStartupTest, RegistrationTimeoutNamesMissingRanks) {
  auto source = RandomLlamaWeights(RandomConfig(), 3);
  TestCluster cluster(*source, Options(2, 2));
  cluster.StartWorker(cluster.AgentOptions(2));
  // Rank 2 in before the short wait starts, however slow this machine.
  const absl::Time until = absl::Now() + absl::Seconds(30);
  while (!cluster.host(2).registered && absl::Now() < until) {
    absl::SleepFor(absl::Milliseconds(5));
  }
  ASSERT_TRUE(cluster.host(2).registered);
  auto executor = RemoteExecutor::WaitForWorkers(
      cluster.service(), source->config(), absl::Seconds(1));
  ASSERT_FALSE(executor.ok());
  EXPECT_EQ(executor.status().code(), absl::StatusCode::kDeadlineExceeded);
  EXPECT_TRUE(absl::StrContains(executor.status().message(),
                                "ranks 1, 3, 4 never registered"))
      << executor.status();
  cluster.Stop();
}

// Certificates made by the openssl command in a fresh directory: the
// cluster CA (ca.pem), a certificate for 127.0.0.1 it signed (node.pem,
// node.key), and another CA's (other.pem, other.key). Nullopt when openssl

}  // namespace
}  // namespace shardlm
